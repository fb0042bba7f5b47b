"""bench/run_parts.py at one pair: both sides' runs succeed (a task that is not manually
triggerable runs with its schedule's tags), every part is timed, and a task whose asset does
not use pandas runs without importing it."""

from __future__ import annotations

import run_parts
from run import read_json


def test_one_pair_times_every_part_and_both_runs_succeed(tmp_path, capsys):
    path = tmp_path / "parts.json"
    code = run_parts.main(["--repeat", "1", "--services", "5", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out  # exit 1 names the failed runs
    assert "failed runs: none" in out
    assert "pandas imported: {'dueledger': [False], 'bare': [False]}" in out
    bench, rows = read_json(path)
    assert bench == "run_parts"
    assert [r.measurement.split(": ", 1)[1] for r in rows] == [
        f"{part}, CPU s" for part in (*run_parts.PARTS, "whole process (wait4)")
    ]
    assert all(r.value > 0 and r.baseline for r in rows if "resolve" not in r.measurement)
