"""bench/skipped_dues.py at a small size: through the real scheduler, a due the ledger skips
creates no Dagster run and is recorded once, and the rows are written for bench/run.py."""

from __future__ import annotations

import skipped_dues
from run import KIND_CHECK, read_json


def test_a_skipped_due_creates_no_run_and_is_recorded_once(tmp_path):
    path = tmp_path / "skipped.json"
    assert skipped_dues.main(["--tasks", "3", "--repeat", "1", "--json", str(path)]) == 0
    bench, rows = read_json(path)
    assert bench == "skipped_dues"
    runs, recorded = (r for r in rows if r.kind == KIND_CHECK)
    assert (runs.value, runs.baseline, runs.met) == (0.0, 1.0, True)
    assert (recorded.value, recorded.met) == (3.0, True)
    (cpu,) = [r for r in rows if r.kind != KIND_CHECK]
    assert cpu.value > 0 and cpu.baseline and cpu.ratio
