"""Is a due missed? One answer from every reader, on both backends, and
Dagster's schedule state mirrored into the ledger by the outcome sensor's service.

Regression: a deployment started at 14:53 reported the 14:45 due of order_cleanup as missed
(`summary`, ledger_health, the slot-health alert) while the task's asset check said it passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
from dagster_internals import (
    CodeTarget,
    daemon_instance,
    daemon_workspace,
    run_scheduler_tick,
    start_schedules,
    stop_schedules,
)
from sensor_support import LEDGER_DEFS

from orchestration.missed_dues import audit_tasks
from orchestration.pause import observe_schedule, schedule_states, sync_schedules, task_pauses
from orchestration.services.accounting import (
    STATE_MISSED,
    STATE_NEW,
    STATE_PAUSED,
    STATE_SUCCESS,
    account_latest_due,
)
from orchestration.services.summary import ledger_summary
from orchestration.task_spec import TaskSpec, build_views
from orchestration.timetable import EverySlots
from resources.core.due import floor_to_slot, format_due
from resources.core.entry import Trigger, dedup_key_for_due
from resources.core.operators import UI_OPERATOR
from resources.ledger import RunLedger
from sensors.policies import observed_schedules

SLOT = timedelta(minutes=15)
SPEC = TaskSpec(
    key="order_cleanup",
    rule=EverySlots(1),
    declared_cadence="every slot",
    timeout=timedelta(minutes=5),
    lease_ttl=timedelta(minutes=10),
)
(VIEW,) = build_views([SPEC], 15, "UTC")
DAY = datetime(2026, 12, 4, tzinfo=UTC)


def sync(instance: dg.DagsterInstance, ledger: RunLedger, views, now: datetime) -> list[str]:
    """What ledger_sensor (policies) does each tick: Dagster's schedule states into the ledger."""
    return sync_schedules(ledger, views, observed_schedules(instance), now)


def at(hh: int, mm: int) -> datetime:
    return DAY.replace(hour=hh, minute=mm)


def ran(ledger: RunLedger, due: datetime, trigger: str = Trigger.SCHEDULE) -> None:
    entry = ledger.ensure_entry(
        task_key=SPEC.key, trigger=trigger, dedup_key=dedup_key_for_due(due), due=due, now=due
    )
    assert ledger.claim(entry.id, f"run-{due:%H%M}", lease_ttl=SLOT, now=due).claimed
    assert ledger.succeed(entry.id, f"run-{due:%H%M}", now=due + timedelta(minutes=1))


def dues(start: datetime, end: datetime) -> list[datetime]:
    out, due = [], start
    while due < end:
        out.append(due)
        due += SLOT
    return out


@dataclass(frozen=True)
class Case:
    """A ledger's history and what every reader must say of it at ``now``."""

    now: datetime
    missed: list[datetime]
    paused: list[datetime]
    check_state: str
    check_passed: bool


def fresh_start(ledger: RunLedger) -> Case:
    # The deployment's scheduler first ran the task's schedule at 14:53, and someone
    # launched the task by hand at 14:55 (its first activity is in the 14:45 slot).
    observe_schedule(
        ledger, SPEC.key, SPEC.schedule_name, running=True, started_at=at(14, 53), now=at(14, 53)
    )
    manual = ledger.ensure_entry(
        task_key=SPEC.key, trigger=Trigger.MANUAL, dedup_key="manual:first", now=at(14, 55)
    )
    assert ledger.claim(manual.id, "run-manual", lease_ttl=SLOT, now=at(14, 55)).claimed
    return Case(at(15, 7), [], [], STATE_NEW, True)


def downtime(ledger: RunLedger) -> Case:
    # Running since 10:00; the daemon was down from 12:00 until after 12:45.
    observe_schedule(
        ledger, SPEC.key, SPEC.schedule_name, running=True, started_at=at(10, 0), now=at(10, 0)
    )
    for due in dues(at(10, 0), at(12, 0)):
        ran(ledger, due)
    return Case(at(13, 7), dues(at(12, 0), at(13, 0)), [], STATE_MISSED, False)


def pause(ledger: RunLedger) -> Case:
    # Stopped in the Dagster UI at 11:50 (seen then), started again at 12:50.
    observe_schedule(
        ledger, SPEC.key, SPEC.schedule_name, running=True, started_at=at(10, 0), now=at(10, 0)
    )
    for due in dues(at(10, 0), at(12, 0)):
        ran(ledger, due)
    observe_schedule(
        ledger, SPEC.key, SPEC.schedule_name, running=False, started_at=None, now=at(11, 50)
    )
    observe_schedule(
        ledger, SPEC.key, SPEC.schedule_name, running=True, started_at=at(12, 50), now=at(12, 51)
    )
    return Case(at(13, 7), [], dues(at(12, 0), at(13, 0)), STATE_PAUSED, True)


def catch_up(ledger: RunLedger) -> Case:
    # The daemon was down from 12:00; the catch-up sensor launched each missed due since.
    observe_schedule(
        ledger, SPEC.key, SPEC.schedule_name, running=True, started_at=at(10, 0), now=at(10, 0)
    )
    for due in dues(at(10, 0), at(12, 0)):
        ran(ledger, due)
    for due in dues(at(12, 0), at(13, 0)):
        ran(ledger, due, trigger=Trigger.SENSOR)
    return Case(at(13, 7), [], [], STATE_SUCCESS, True)


@pytest.mark.parametrize("history", [fresh_start, downtime, pause, catch_up])
def test_summary_ledger_health_and_the_asset_check_give_one_answer(ledger, history) -> None:
    case = history(ledger)

    (audit,) = audit_tasks(ledger, [VIEW], case.now)
    summary = ledger_summary(ledger, [VIEW], case.now)
    check = account_latest_due(VIEW, ledger, case.now)

    assert list(audit.missed) == case.missed
    assert list(audit.paused) == case.paused
    (row,) = summary["tasks"]
    assert row["missed_dues"] == [format_due(d) for d in case.missed]
    assert (summary["missed_24h"], summary["paused_24h"]) == (len(case.missed), len(case.paused))
    assert (check.state, check.passed) == (case.check_state, case.check_passed)
    # The check's due is the audit's latest: missed for one, missed for the other.
    assert (check.state == STATE_MISSED) == (check.due is not None and check.due.at in audit.missed)


def test_a_task_nothing_ran_yet_is_not_audited(ledger) -> None:
    (audit,) = audit_tasks(ledger, [VIEW], at(13, 7))
    assert (audit.start, audit.missed) == (None, ())
    assert account_latest_due(VIEW, ledger, at(13, 7)).state == STATE_NEW


def test_a_restart_between_two_observations_is_recorded_as_a_pause(ledger) -> None:
    observe_schedule(
        ledger, SPEC.key, SPEC.schedule_name, running=True, started_at=at(10, 0), now=at(11, 55)
    )
    # Next seen at 13:00, running since 12:40: stopped and started again in between.
    changes = observe_schedule(
        ledger, SPEC.key, SPEC.schedule_name, running=True, started_at=at(12, 40), now=at(13, 0)
    )
    assert changes == [f"schedule {SPEC.schedule_name} restarted: the gap is a pause"]
    (gap,) = task_pauses(ledger, SPEC.key)
    assert (gap.start, gap.end, gap.by) == (at(11, 55), at(12, 40), UI_OPERATOR)
    assert schedule_states(ledger)[SPEC.key].first_started_at == at(10, 0)


# --- Dagster's schedule state, mirrored by the outcome sensor's service ----------------------


def test_sync_records_the_first_start_a_stop_and_a_restart_of_real_schedules(
    ledger_url: str, ledger: RunLedger, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DUELEDGER_DATABASE_URL", ledger_url)
    target = CodeTarget.from_file(LEDGER_DEFS, attribute="dispatch_defs")
    views = build_views([_strict()], 15, "UTC")
    first = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    with daemon_instance(temp_dir=tmp_path / "home") as instance:
        with daemon_workspace(instance, target) as ctx:
            # The daemon's first iteration records the schedule as running since then.
            run_scheduler_tick(ctx, first)
        assert sync_schedules(
            ledger, views, observed_schedules(instance), first + timedelta(minutes=1)
        ) == ["strict_task: schedule strict_task_schedule first seen running"]
        state = schedule_states(ledger)["strict_task"]
        assert (state.status, state.first_started_at) == ("running", first)
        assert (
            sync_schedules(
                ledger, views, observed_schedules(instance), first + timedelta(minutes=2)
            )
            == []
        )

        # The UI's toggle stops it: a pause by dagster-ui, open.
        assert stop_schedules(instance, target) == ["strict_task_schedule"]
        stopped_at = datetime.now(UTC)
        assert sync(instance, ledger, views, stopped_at) == [
            "strict_task: schedule strict_task_schedule stopped: paused"
        ]
        (opened,) = task_pauses(ledger, "strict_task")
        assert (opened.by, opened.end) == (UI_OPERATOR, None)
        assert "strict_task_schedule stopped in Dagster" in opened.reason

        # Started again: the pause closes; the first start stays the earliest.
        start_schedules(instance, target, ["strict_task_schedule"])
        assert sync_schedules(
            ledger, views, observed_schedules(instance), stopped_at + timedelta(minutes=1)
        ) == ["strict_task: schedule strict_task_schedule running again: resumed"]
        (closed,) = task_pauses(ledger, "strict_task")
        assert closed.end == stopped_at + timedelta(minutes=1)
        assert schedule_states(ledger)["strict_task"].first_started_at == first


def _strict() -> TaskSpec:
    from sensor_support import fixture_module

    return fixture_module().STRICT


def test_sync_ignores_schedules_the_scheduler_has_not_recorded(ledger: RunLedger) -> None:
    with dg.instance_for_test() as instance:
        assert sync(instance, ledger, [VIEW], at(13, 0)) == []
    assert schedule_states(ledger) == {}


# --- one pause, seen from both sides: the ledger's pauses on the UI's toggle ------------------


def _policy_tick(instance: dg.DagsterInstance, ledger: RunLedger, views) -> list[str]:
    """One evaluation of the real ledger_sensor (policies) against this Dagster instance; what it
    logged (its changes, in words)."""
    from sensors.policies import build_policy_sensor

    sensor = build_policy_sensor(views)
    logged: list[str] = []
    with dg.build_sensor_context(instance=instance, resources={"ledger": ledger}) as context:
        original = context.log.info
        context.log.info = lambda msg, *a, **k: (logged.append(str(msg)), original(msg, *a, **k))  # type: ignore[method-assign]
        sensor(context)
    return logged


SECOND = timedelta(seconds=1)


def _due_runs(instance: dg.DagsterInstance, due: datetime) -> list[dg.DagsterRun]:
    text = format_due(due)
    return [r for r in instance.get_runs() if r.tags.get("dueledger/due") == text]


def _toggle(instance: dg.DagsterInstance, name: str) -> str | None:
    """The schedule's state as the UI reads it: RUNNING/DECLARED_IN_CODE, STOPPED, or None (no
    stored state: the code's default, running)."""
    states = [s for s in instance.all_instigator_state() if s.instigator_name == name]
    return states[0].status.value if states else None


def test_a_cli_pause_stops_the_schedule_a_resume_starts_it_and_a_ui_start_resumes_a_pause(
    ledger_url: str, ledger: RunLedger, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestration.pause import open_pauses, pause_task, resume_task

    monkeypatch.setenv("DUELEDGER_DATABASE_URL", ledger_url)
    target = CodeTarget.from_file(LEDGER_DEFS, attribute="dispatch_defs")
    spec = _strict()
    views = build_views([spec], 15, "UTC")
    name = spec.schedule_name
    with daemon_instance(temp_dir=tmp_path / "home") as instance:
        with daemon_workspace(instance, target) as ctx:
            run_scheduler_tick(ctx, datetime.now(UTC) - timedelta(minutes=5))
        _policy_tick(instance, ledger, views)  # first seen running
        assert _toggle(instance, name) == "DECLARED_IN_CODE"

        # `dueledger pause`: the next tick turns the toggle off; the stop is that pause shown,
        # not a second pause by dagster-ui.
        pause_task(ledger, [spec], spec.key, operator="alice", reason="maintenance")
        said = _policy_tick(instance, ledger, views)
        assert _toggle(instance, name) == "STOPPED"
        assert any("stopped: paused by alice" in line for line in said), said
        _policy_tick(instance, ledger, views)  # the stop observed: still the one pause
        assert [(p.by, p.source) for p in open_pauses(ledger, spec.key)] == [("alice", "cli")]

        # `dueledger resume` just before a due: the toggle runs again, from the resume on, so
        # the due that fell before this sensor tick still runs (Dagster's scheduler fires the
        # ticks after a schedule's start time).
        boundary = floor_to_slot(datetime.now(UTC), 15) + 2 * SLOT
        resume_task(
            ledger, [spec], spec.key, operator="alice", reason="done", now=boundary - SECOND
        )
        with daemon_workspace(instance, target) as ctx:
            run_scheduler_tick(ctx, boundary + SECOND)  # still stopped: nothing
            assert _due_runs(instance, boundary) == []
            said = _policy_tick(instance, ledger, views)
            assert _toggle(instance, name) == "RUNNING", said
            run_scheduler_tick(ctx, boundary + 20 * SECOND)
            assert len(_due_runs(instance, boundary)) == 1
        _policy_tick(instance, ledger, views)
        assert open_pauses(ledger, spec.key) == []
        assert _toggle(instance, name) == "RUNNING"

        # Paused again, and started in the UI: the start resumes the pause, audited.
        pause_task(ledger, [spec], spec.key, operator="bob", reason="again")
        _policy_tick(instance, ledger, views)
        assert _toggle(instance, name) == "STOPPED"
        _policy_tick(instance, ledger, views)  # the stop observed
        start_schedules(instance, target, [name])
        said = _policy_tick(instance, ledger, views)
        assert open_pauses(ledger, spec.key) == [], said
        assert _toggle(instance, name) == "RUNNING"  # left running: nothing is paused
        (closed,) = [p for p in task_pauses(ledger, spec.key) if p.by == "bob"]
        assert closed.end is not None
        audit = ledger.recent_audit(action="task_resumed")
        assert audit[-1]["operator"] == UI_OPERATOR, audit

        # Stopped in the UI: a pause by dagster-ui, and `dueledger resume` ends it too.
        stop_schedules(instance, target)
        _policy_tick(instance, ledger, views)
        assert [p.source for p in open_pauses(ledger, spec.key)] == ["schedule_stopped"]
        resume_task(ledger, [spec], spec.key, operator="alice", reason="ui stop was a mistake")
        _policy_tick(instance, ledger, views)
        assert _toggle(instance, name) == "RUNNING"
