"""bench/run_cost.py at a tiny size: its rows have the table's shape, every ratio is formed
from both sides' measurements of the same repeats, and a failed run is a failed check."""

from __future__ import annotations

import argparse

import pytest
import run_cost
from run import KIND_CHECK, read_json

from orchestration.declarations import registered_tasks


def _costs(*cpu: float) -> list[run_cost.Cost]:
    return [run_cost.Cost(cpu=c, peak_mib=10 * c, ok=True) for c in cpu]


def test_the_ratio_is_the_median_of_the_paired_ratios_not_of_the_medians():
    # Pairs 2/1, 3/3, 8/2: paired ratios 2.0, 1.0, 4.0 (median 2.0); medians 3 / 2 = 1.5.
    cpu, memory = run_cost.ratio_rows("x", "1 run", "bare", 1.15, _costs(2, 3, 8), _costs(1, 3, 2))
    assert (cpu.unit, memory.unit) == ("s", "MiB")
    assert (cpu.value, cpu.baseline, cpu.ratio) == (3, 2, 2.0)
    assert (memory.value, memory.baseline, memory.ratio) == (30, 20, 2.0)
    assert cpu.met is False and cpu.target == "ratio <= 1.15"
    (within,) = run_cost.ratio_rows("x", "1 run", "bare", 1.15, _costs(1), _costs(1))[:1]
    assert within.met is True


def test_pairs_alternate_which_side_goes_first():
    order: list[str] = []

    def side(name: str):
        def measure() -> run_cost.Cost:
            order.append(name)
            return run_cost.Cost(1.0, 1.0, True)

        return measure

    run_cost.paired(4, 0, side("a"), side("b"))
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]


def test_tasks_are_checked_against_the_registry():
    assert run_cost.parse_tasks("all") == [s.key for s in registered_tasks()]
    assert run_cost.parse_tasks("order_cleanup, tick_every_slot") == [
        "order_cleanup",
        "tick_every_slot",
    ]
    with pytest.raises(argparse.ArgumentTypeError, match="nope"):
        run_cost.parse_tasks("nope")


def test_the_load_rows_measure_both_locations_in_fresh_processes(tmp_path):
    out = tmp_path / "rows.json"
    args = ["--repeat", "1", "--no-runs", "--services", "5"]
    assert run_cost.main([*args, "--out", str(tmp_path / "w"), "--json", str(out)]) == 0
    bench, rows = read_json(out)
    assert bench == "run_cost"
    cpu, memory, in_dagster_cpu, in_dagster_memory, check = rows
    for row in (cpu, memory, in_dagster_cpu, in_dagster_memory):
        assert row.area == run_cost.AREA and row.value > 0
        assert row.baseline is not None and row.baseline > 0
        # One pair: the ratio is that pair's, formed from both measurements.
        assert row.ratio == pytest.approx(row.value / row.baseline)
        assert row.target == "ratio <= 1.30" and row.met is not None
    assert "import orchestration.definitions" in cpu.measurement
    assert "defs()" in cpu.measurement  # the build is measured, not only the import
    assert "DagsterInstance.get()" in in_dagster_cpu.measurement
    assert [r.unit for r in rows[:4]] == ["s", "MiB", "s", "MiB"]
    assert check.kind == KIND_CHECK and check.met is True and check.value == 0


@pytest.mark.slow
def test_one_run_per_side_makes_a_run_row_pair(tmp_path):
    out = tmp_path / "rows.json"
    args = ["--repeat", "1", "--tasks", "tick_every_slot", "--services", "5"]
    assert run_cost.main([*args, "--out", str(tmp_path / "w"), "--json", str(out)]) == 0
    _, rows = read_json(out)
    runs = [r for r in rows if "tick_every_slot_job" in r.measurement]
    assert [r.unit for r in runs] == ["s", "MiB"]
    assert all(r.ratio == pytest.approx(r.value / r.baseline) for r in runs if r.baseline)
    assert all(r.target == "ratio <= 1.15" for r in runs)
    assert rows[-1].met is True and rows[-1].size == "2 timed runs"
