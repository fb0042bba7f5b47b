"""bench/reads.py at a small size (the target's 100,000 entries: ``bench/run.py --only reads
--full``): every read command answers with JSON and none imports Dagster, ledger_health
materializes, and the rows are written for bench/run.py."""

from __future__ import annotations

import os

import reads
from run import KIND_CHECK, read_json


def test_a_small_run_times_the_reads_and_checks_none_loads_dagster(tmp_path):
    path = tmp_path / "reads.json"
    before = dict(os.environ)
    assert reads.main(["--entries", "500", "--rounds", "1", "--json", str(path)]) == 0
    assert dict(os.environ) == before, "the bench must leave the caller's environment as it was"
    bench, rows = read_json(path)
    assert bench == "reads"
    commands = [r for r in rows if r.area == "CLI reads" and r.kind != KIND_CHECK]
    assert len(commands) == len(reads.COMMANDS)
    assert all(r.value > 0 and r.baseline and r.ratio for r in commands)
    (check,) = [r for r in rows if r.kind == KIND_CHECK]
    assert (check.met, check.value) == (True, 0.0)
    (zoned,) = [r for r in rows if r.area == "zoned dues"]
    assert zoned.value > 0 and zoned.baseline and zoned.ratio and zoned.target == "ratio <= 2"
    (health,) = [r for r in rows if r.area == "ledger_health"]
    assert health.value > 0 and health.baseline and health.target == "<= 5 s"
