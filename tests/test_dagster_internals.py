"""Tests of tests/dagster_internals.py against tests/fixtures/tiny_defs.py.

They drive Dagster's real scheduler / sensor daemon code (frozen clock, in-process code
location, on-disk SQLite instance) and its debug crash points in spawned subprocesses.
"""

from __future__ import annotations

import datetime as dt
import signal
import sys
from pathlib import Path

import dagster as dg
import pytest

_TESTS_DIR = str(Path(__file__).parent)
if _TESTS_DIR not in sys.path:  # the lead's conftest may already do this
    sys.path.insert(0, _TESTS_DIR)

from dagster_internals import (  # noqa: E402
    CodeTarget,
    CrashPoint,
    TickStatus,
    crash_flags,
    daemon_instance,
    daemon_workspace,
    instigator_ticks,
    run_scheduler_tick,
    run_scheduler_tick_in_subprocess,
    run_sensor_tick,
    run_sensor_tick_in_subprocess,
)

pytestmark = pytest.mark.daemon

TARGET = CodeTarget.from_file(
    Path(__file__).parent / "fixtures" / "tiny_defs.py", location_name="tiny"
)
OUTPUT_ENV = "TINY_DEFS_OUTPUT"  # tiny_defs.OUTPUT_ENV
SCHEDULE = "tiny_schedule"
SENSOR = "tiny_sensor"
DUE = dt.datetime(2026, 3, 2, 10, 15, tzinfo=dt.UTC)  # on the */15 grid
KILLED = -signal.SIGKILL


def _runs(instance: dg.DagsterInstance, **tags: str) -> list[dg.DagsterRun]:
    return list(instance.get_runs(dg.RunsFilter(tags=tags)))


def _schedule_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    return _runs(instance, **{"dagster/schedule_name": SCHEDULE})


def _run_key(due: dt.datetime) -> str:
    return due.strftime("%Y-%m-%dT%H:%M:%SZ")


def _executions(path: Path) -> list[str]:
    """Run keys written by tiny_op, one per real execution."""
    if not path.exists():
        return []
    return [line.split("\t")[0] for line in path.read_text().splitlines()]


def test_same_due_evaluated_twice_gives_one_run() -> None:
    with daemon_instance("mocked") as instance, daemon_workspace(instance, TARGET) as ctx:
        run_scheduler_tick(ctx, DUE)
        run_scheduler_tick(ctx, DUE)  # a restarted daemon at the same instant
        run_scheduler_tick(ctx, DUE + dt.timedelta(minutes=3))  # later, same latest due

        runs = _schedule_runs(instance)
        assert len(runs) == 1
        assert runs[0].tags["dagster/run_key"] == _run_key(DUE)
        # MockedRunLauncher: launched (STARTING) but never executed.
        assert runs[0].status == dg.DagsterRunStatus.STARTING

        ticks = instigator_ticks(ctx, SCHEDULE)
        assert [t.status for t in ticks] == [TickStatus.SUCCESS]
        assert ticks[0].run_ids == [runs[0].run_id]
        assert ticks[0].timestamp == DUE.timestamp()


def test_first_tick_after_the_due_evaluates_nothing() -> None:
    """A RUNNING-by-default schedule with no stored state starts counting at its first tick."""
    with daemon_instance("mocked") as instance, daemon_workspace(instance, TARGET) as ctx:
        run_scheduler_tick(ctx, DUE + dt.timedelta(seconds=5))
        assert _schedule_runs(instance) == []
        assert instigator_ticks(ctx, SCHEDULE) == []

    with daemon_instance("mocked") as instance, daemon_workspace(instance, TARGET) as ctx:
        run_scheduler_tick(ctx, DUE - dt.timedelta(minutes=1))  # daemon already up before the due
        run_scheduler_tick(ctx, DUE + dt.timedelta(seconds=5))
        assert [r.tags["dagster/run_key"] for r in _schedule_runs(instance)] == [_run_key(DUE)]


def test_next_due_gives_a_second_run() -> None:
    with daemon_instance("mocked") as instance, daemon_workspace(instance, TARGET) as ctx:
        run_scheduler_tick(ctx, DUE)
        run_scheduler_tick(ctx, DUE + dt.timedelta(minutes=7))  # between dues: nothing new
        assert len(_schedule_runs(instance)) == 1

        run_scheduler_tick(ctx, DUE + dt.timedelta(minutes=15))
        keys = sorted(r.tags["dagster/run_key"] for r in _schedule_runs(instance))
        assert keys == [_run_key(DUE), _run_key(DUE + dt.timedelta(minutes=15))]
        assert [t.status for t in instigator_ticks(ctx, SCHEDULE)] == [TickStatus.SUCCESS] * 2


# What the crashed daemon left behind: (runs in the DB, status of that run).
_AFTER_CRASH: dict[CrashPoint, tuple[int, dg.DagsterRunStatus | None]] = {
    "TICK_CREATED": (0, None),
    "RUN_CREATED": (1, dg.DagsterRunStatus.NOT_STARTED),
    "RUN_LAUNCHED": (1, dg.DagsterRunStatus.SUCCESS),  # sync launcher ran it in the child
    "TICK_SUCCESS": (1, dg.DagsterRunStatus.SUCCESS),
}


@pytest.mark.parametrize("crash_point", list(_AFTER_CRASH))
def test_crash_then_resume_gives_exactly_one_launched_run(
    crash_point: CrashPoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "executions.txt"
    monkeypatch.setenv(OUTPUT_ENV, str(out))  # inherited by the spawned daemon
    with daemon_instance("sync") as instance, daemon_workspace(instance, TARGET) as ctx:
        code = run_scheduler_tick_in_subprocess(
            instance, TARGET, DUE, debug_crash_flags=crash_flags(SCHEDULE, crash_point)
        )
        assert code == KILLED

        n_runs, status = _AFTER_CRASH[crash_point]
        runs = _schedule_runs(instance)
        assert len(runs) == n_runs
        if status is not None:
            assert runs[0].status == status
        assert [t.status for t in instigator_ticks(ctx, SCHEDULE)] == [TickStatus.STARTED]

        run_scheduler_tick(ctx, DUE)  # the daemon comes back at the same instant

        runs = _schedule_runs(instance)
        assert len(runs) == 1
        assert runs[0].tags["dagster/run_key"] == _run_key(DUE)
        assert runs[0].status == dg.DagsterRunStatus.SUCCESS
        assert _executions(out) == [_run_key(DUE)]  # executed exactly once
        ticks = instigator_ticks(ctx, SCHEDULE)
        assert [t.status for t in ticks] == [TickStatus.SUCCESS]  # the same tick, resumed
        assert ticks[0].run_ids == [runs[0].run_id]


def test_crash_after_run_created_resumed_only_after_next_due_strands_the_run() -> None:
    """Dagster 1.13.27: a non-partitioned schedule evaluates only the LATEST due."""
    with daemon_instance("mocked") as instance, daemon_workspace(instance, TARGET) as ctx:
        code = run_scheduler_tick_in_subprocess(
            instance, TARGET, DUE, debug_crash_flags=crash_flags(SCHEDULE, "RUN_CREATED")
        )
        assert code == KILLED

        later = DUE + dt.timedelta(minutes=15)
        # The daemon is back (a normal tick, in a fresh process too) only after the next due.
        assert (
            run_scheduler_tick_in_subprocess(instance, TARGET, later + dt.timedelta(minutes=1)) == 0
        )

        by_key = {r.tags["dagster/run_key"]: r for r in _schedule_runs(instance)}
        assert set(by_key) == {_run_key(DUE), _run_key(later)}
        assert by_key[_run_key(DUE)].status == dg.DagsterRunStatus.NOT_STARTED  # stranded
        assert by_key[_run_key(later)].status == dg.DagsterRunStatus.STARTING
        ticks = instigator_ticks(ctx, SCHEDULE)
        assert [(t.timestamp, t.status) for t in ticks] == [
            (later.timestamp(), TickStatus.SUCCESS),
            (DUE.timestamp(), TickStatus.STARTED),  # never finished
        ]


def test_sensor_tick_produces_its_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "executions.txt"
    monkeypatch.setenv(OUTPUT_ENV, str(out))
    with daemon_instance("sync") as instance, daemon_workspace(instance, TARGET) as ctx:
        run_sensor_tick(ctx, DUE)
        runs = _runs(instance, **{"dagster/sensor_name": SENSOR})
        assert [r.tags["dagster/run_key"] for r in runs] == ["tiny-sensor-1"]
        assert runs[0].status == dg.DagsterRunStatus.SUCCESS
        assert _executions(out) == ["tiny-sensor-1"]

        run_sensor_tick(ctx, DUE + dt.timedelta(seconds=10))  # within minimum_interval: skipped
        assert len(_runs(instance, **{"dagster/sensor_name": SENSOR})) == 1

        run_sensor_tick(ctx, DUE + dt.timedelta(seconds=30))
        keys = sorted(r.tags["dagster/run_key"] for r in _runs(instance))
        assert keys == ["tiny-sensor-1", "tiny-sensor-2"]
        assert [t.status for t in instigator_ticks(ctx, SENSOR)] == [TickStatus.SUCCESS] * 2


def test_sensor_crash_at_run_created_then_resume() -> None:
    with daemon_instance("mocked") as instance, daemon_workspace(instance, TARGET) as ctx:
        code = run_sensor_tick_in_subprocess(
            instance, TARGET, DUE, debug_crash_flags=crash_flags(SENSOR, "RUN_CREATED")
        )
        assert code == KILLED
        runs = _runs(instance, **{"dagster/sensor_name": SENSOR})
        assert [r.status for r in runs] == [dg.DagsterRunStatus.NOT_STARTED]

        # Resuming needs the sensor's minimum interval to have passed since the crashed tick.
        run_sensor_tick(ctx, DUE + dt.timedelta(seconds=30))
        runs = _runs(instance, **{"dagster/sensor_name": SENSOR})
        assert [(r.tags["dagster/run_key"], r.status) for r in runs] == [
            ("tiny-sensor-1", dg.DagsterRunStatus.STARTING)
        ]
        ticks = instigator_ticks(ctx, SENSOR)
        assert [t.status for t in ticks] == [TickStatus.SUCCESS]
        assert ticks[0].run_ids == [runs[0].run_id]
