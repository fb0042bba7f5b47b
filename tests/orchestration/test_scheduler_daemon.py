"""Due-keyed schedules through Dagster's REAL scheduler daemon code path.

Runs are recorded by MockedRunLauncher (nothing executes): these tests are about how many
Dagster runs the daemon creates for a due, including after a crash mid-tick.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
from dagster_internals import (
    CodeTarget,
    crash_flags,
    daemon_instance,
    daemon_workspace,
    run_scheduler_tick,
    run_scheduler_tick_in_subprocess,
)

from resources.core import tags as t
from resources.core.entry import Trigger

pytestmark = pytest.mark.daemon

SCHEDULE = "order_cleanup_schedule"
DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
TARGET = CodeTarget.from_module("orchestration.definitions", attribute="defs")


def _task_runs(instance: dg.DagsterInstance, **tags: str) -> list[dg.DagsterRun]:
    return list(
        instance.get_runs(
            dg.RunsFilter(tags={t.TAG_TASK: "order_cleanup", **tags}),
        )
    )


@pytest.fixture
def instance(tmp_path):
    with daemon_instance("mocked", temp_dir=tmp_path / "instance") as inst:
        # A schedule's first daemon iteration only records when it started (no runs);
        # it is evaluated for cron times after that. Start them just before the due.
        with daemon_workspace(inst, TARGET) as ctx:
            run_scheduler_tick(ctx, DUE - timedelta(minutes=1))
        yield inst


def test_the_same_due_evaluated_twice_creates_one_run(instance):
    with daemon_workspace(instance, TARGET) as ctx:
        run_scheduler_tick(ctx, DUE + timedelta(seconds=5))
        run_scheduler_tick(ctx, DUE + timedelta(seconds=30))  # a restarted daemon, same due
    runs = _task_runs(instance)
    assert [r.tags[t.DAGSTER_RUN_KEY] for r in runs] == ["2026-11-30T22:45:00Z"]
    assert runs[0].tags[t.TAG_DUE] == "2026-11-30T22:45:00Z"
    assert runs[0].tags[t.TAG_TRIGGER] == Trigger.SCHEDULE


def test_the_next_due_creates_a_second_run(instance):
    with daemon_workspace(instance, TARGET) as ctx:
        run_scheduler_tick(ctx, DUE + timedelta(seconds=5))
        run_scheduler_tick(ctx, DUE + timedelta(minutes=15, seconds=5))
    keys = sorted(r.tags[t.DAGSTER_RUN_KEY] for r in _task_runs(instance))
    assert keys == ["2026-11-30T22:45:00Z", "2026-11-30T23:00:00Z"]


@pytest.mark.parametrize("crash_point", ["TICK_CREATED", "RUN_CREATED", "RUN_LAUNCHED"])
def test_a_crash_mid_tick_then_resume_creates_exactly_one_launched_run(instance, crash_point):
    when = DUE + timedelta(seconds=5)
    code = run_scheduler_tick_in_subprocess(
        instance, TARGET, when, debug_crash_flags=crash_flags(SCHEDULE, crash_point)
    )
    assert code == -9, f"the daemon should have been killed at {crash_point}"
    with daemon_workspace(instance, TARGET) as ctx:
        run_scheduler_tick(ctx, when + timedelta(seconds=20))
    runs = _task_runs(instance)
    assert len(runs) == 1
    assert runs[0].tags[t.DAGSTER_RUN_KEY] == "2026-11-30T22:45:00Z"
    assert runs[0].status != dg.DagsterRunStatus.NOT_STARTED, "the resumed tick must launch it"


def test_a_manual_launch_at_the_same_instant_as_a_due_is_not_swallowed(instance):
    from orchestration.declarations import registered_tasks
    from orchestration.manual_launch import launch_manual
    from orchestration.services.hooks.registry import Hooks
    from resources.ledger import RunLedger

    ledger = RunLedger(database_url=f"sqlite:///{instance.root_directory}/ledger.sqlite")
    ledger.migrate()
    with daemon_workspace(instance, TARGET) as ctx:
        run_scheduler_tick(ctx, DUE)
    result = launch_manual(
        registered_tasks(),
        "order_cleanup",
        operator="ops",
        reason="run now",
        request_id="req-1",
        instance=instance,
        ledger=ledger,
        hooks=Hooks.from_environment(),
    )
    again = launch_manual(
        registered_tasks(),
        "order_cleanup",
        operator="ops",
        reason="run now",
        request_id="req-1",
        instance=instance,
        ledger=ledger,
        hooks=Hooks.from_environment(),
    )
    scheduled = _task_runs(instance, **{t.TAG_TRIGGER: Trigger.SCHEDULE.value})
    manual = _task_runs(instance, **{t.TAG_TRIGGER: Trigger.MANUAL.value})
    assert len(scheduled) == 1 and len(manual) == 1
    assert manual[0].run_id == result.run_id == again.run_id
    assert again.existing and not result.existing
    assert t.DAGSTER_RUN_KEY not in manual[0].tags
    assert manual[0].tags[t.TAG_REQUEST_ID] == "req-1"
    assert manual[0].tags[t.TAG_OPERATOR] == "ops"
