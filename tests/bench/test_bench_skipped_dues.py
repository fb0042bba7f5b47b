"""bench/skipped_dues.py at a small size: through the real scheduler, a due the ledger skips
(overlap skip) or holds as its task's waiter (buffer_one) creates no Dagster run and is recorded
once, and the rows are written for bench/run.py."""

from __future__ import annotations

import skipped_dues
from run import KIND_CHECK, read_json


def test_a_skipped_or_held_due_creates_no_run_and_is_recorded_once(tmp_path):
    path = tmp_path / "skipped.json"
    assert skipped_dues.main(["--tasks", "3", "--repeat", "1", "--json", str(path)]) == 0
    bench, rows = read_json(path)
    assert bench == "skipped_dues"
    checks = [r for r in rows if r.kind == KIND_CHECK]
    assert [r.measurement.split("(overlap ")[1][:4] for r in checks] == 2 * ["skip"] + 2 * ["buff"]
    for runs, recorded in (checks[0:2], checks[2:4]):
        assert (runs.value, runs.baseline, runs.met) == (0.0, 1.0, True)
        assert (recorded.value, recorded.met) == (3.0, True)
    cpus = [r for r in rows if r.kind != KIND_CHECK]
    assert len(cpus) == 2
    assert all(c.value > 0 and c.baseline and c.ratio for c in cpus)
