"""bench/scale.py: the generated tasks, the two locations it compares, and the whole bench at
its small sizes through ``bench/run.py --only scale`` -- what CI runs (about 3 minutes)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import run
import scale_grid
import scale_location
import scale_measure
from croniter import croniter

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("n", "slot"), [(10, 5), (100, 15), (500, 5), (500, 1)])
def test_the_generated_crons_give_every_slot_of_the_day_as_many_dues(n, slot):
    tasks = scale_grid.grid(n, slot)
    assert len({t.key for t in tasks}) == n
    start = datetime(2026, 12, 2, tzinfo=UTC)
    per_slot: Counter[datetime] = Counter()
    for task in tasks:
        itr = croniter(task.cron, start - timedelta(seconds=1))
        while (fire := itr.get_next(datetime)) < start + timedelta(days=1):
            assert fire.minute % slot == 0, task  # on the slot grid
            per_slot[fire] += 1
    counts = [per_slot[start + timedelta(minutes=slot * i)] for i in range(1440 // slot)]
    # A platform's mix: 1 % every slot, 9 % hourly, the rest daily, spread evenly.
    assert max(counts) - min(counts) <= 2, (min(counts), max(counts))
    assert sum(counts) == scale_grid.dues_per_day(tasks, slot)
    assert Counter(t.cadence for t in tasks)["every slot"] == max(1, round(n / 100))


def test_bad_grids_are_refused():
    with pytest.raises(ValueError, match="n must be"):
        scale_grid.grid(0, 5)
    with pytest.raises(ValueError, match="slot_minutes"):
        scale_grid.grid(10, 7)


def test_a_window_starts_the_same_lead_before_a_boundary():
    at = datetime(2026, 12, 2, 10, 1, 30, tzinfo=UTC)
    assert scale_measure.next_window_start(at, 5, 20) == pytest.approx(3 * 60 + 10)
    # Too close to the next boundary: the one after it.
    late = datetime(2026, 12, 2, 10, 4, 50, tzinfo=UTC)
    assert scale_measure.next_window_start(late, 5, 20) == pytest.approx(290)


def test_the_bench_location_is_the_real_assembly_over_the_generated_tasks(tmp_path, monkeypatch):
    # The bench builds dueledger's location like orchestration/definitions.py does; if that
    # assembly changes shape (a sensor, a resource), this shows it.
    import dagster as dg

    from orchestration.definitions import defs

    real = defs()

    locations = scale_location.write_locations(tmp_path, 3, 15)
    ours = locations[scale_location.DUELEDGER]
    for path in reversed(ours.env["PYTHONPATH"].split(":")):
        monkeypatch.syspath_prepend(path)
    for key, value in ours.env.items():
        if key != "PYTHONPATH":
            monkeypatch.setenv(key, value)
    bench = scale_location.dueledger_definitions()
    shared = {s.name for s in real.sensors or [] if not s.name.endswith("_catch_up_sensor")}
    assert {s.name for s in bench.sensors or []} == shared
    assert set(bench.resources or {}) == set(real.resources or {})
    tasks = [t.key for t in ours.tasks]
    repo = bench.get_repository_def()
    assert sorted(repo.job_names) == sorted([f"{k}_job" for k in tasks] + ["__ASSET_JOB"])
    assert sorted(s.name for s in repo.schedule_defs) == [f"{k}_schedule" for k in tasks]
    checks = {k.asset_key.to_user_string() for c in bench.asset_checks or [] for k in c.check_keys}
    assert checks == set(tasks)
    job = bench.resolve_job_def(f"{tasks[0]}_job")
    assert job.run_tags["dueledger/source"] == f"plugin:{ours.env['DUELEDGER_PLUGIN_TASKS']}"
    plain = locations[scale_location.PLAIN]
    text = plain.path.read_text()
    assert "dueledger" not in text.split('"""', 2)[-1]  # the baseline imports nothing of ours
    assert all(json.dumps(t.cron) in text for t in plain.tasks)  # at the very same crons
    assert isinstance(bench, dg.Definitions)


@pytest.mark.slow
def test_the_small_scale_bench_runs_every_part_and_its_checks_hold(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--only", "scale", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    log = (out / "scale.log").read_text(errors="replace") if (out / "scale.log").exists() else ""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:] + log[-3000:]
    _, rows = run.read_json(out / "scale.json")
    checks = [r for r in rows if r.kind == run.KIND_CHECK]
    assert len(checks) == 5 and all(r.met for r in checks), checks  # load, sched, sensors, ...
    speed = [r for r in rows if r.kind != run.KIND_CHECK]
    for part in ("code location", "scheduler daemon", "tick of redispatch_sensor", "dagster dev"):
        assert any(part in r.measurement for r in speed), part
    assert any(r.unit == "runs/min" for r in speed)
    for row in speed:
        if row.baseline is not None and "growth" not in row.measurement:
            # One pair per measurement at small sizes: the ratio is that pair's.
            assert row.ratio == pytest.approx(row.value / row.baseline, rel=1e-6), row
    assert "scale" in done.stdout and "speed target(s) missed" in done.stdout
