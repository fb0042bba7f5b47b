"""Pauses, pause on failure and deadlines through the real scheduler and sensor daemon code
paths: tests/fixtures/policy_defs.py's tasks, the production schedule
factory and sensors (their clock Dagster's, frozen in each tick), runs executed as a worker
executes them. Dues lie just ahead of the wall clock, so the ledger's own stamps (the wall
clock) fall before them, as in production.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from alert_sinks import WebhookSink, start
from dagster_internals import instigator_ticks, run_sensor_tick, stop_schedules
from policy_support import POLICY_DEFS, World, policy_world, soon

from orchestration.deadline import ACTION_DEADLINE_MISSED
from orchestration.pause import open_pauses, pause_task, resume_task
from orchestration.services.accounting import account_latest_due
from orchestration.services.summary import ledger_summary
from orchestration.task_spec import TaskSpec, build_views
from orchestration.timetable import EverySlots
from resources.core import alerting as a
from resources.core import tags as t
from resources.core.due import Due
from resources.core.entry import Status, Trigger
from resources.ledger import RunLedger

pytestmark = pytest.mark.daemon

SENSOR_GAP = timedelta(seconds=31)  # past the sensors' minimum interval


def _spec(key: str, **kw: object) -> TaskSpec:
    base: dict[str, object] = {
        "rule": EverySlots(1),
        "declared_cadence": "every slot",
        "timeout": timedelta(minutes=1),
        "lease_ttl": timedelta(minutes=2),
        "max_attempts": 1,
    }
    return TaskSpec(key=key, **{**base, **kw})  # type: ignore[arg-type]


DEADLINE = _spec("deadline_task", deadline=timedelta(minutes=20))
FAILING = _spec("failing_task", pause_after_failures=2)


@pytest.fixture
def webhook(monkeypatch: pytest.MonkeyPatch) -> Iterator[WebhookSink]:
    with start(WebhookSink()) as sink:
        monkeypatch.setenv(a.ENV_WEBHOOK_URL, sink.url())
        monkeypatch.setenv(a.ENV_TIMEOUT, "5")
        yield sink


@pytest.fixture
def world(
    request: pytest.FixtureRequest,
    ledger_in_environment: RunLedger,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[World]:
    task = request.param
    with policy_world(task, ledger_in_environment, tmp_path, monkeypatch, soon()) as found:
        yield found


def _alerts(sink: WebhookSink, kind: str) -> list[dict[str, object]]:
    return [b for b in sink.bodies() if isinstance(b, dict) and b.get("alert") == kind]


def _stored_status(world: World) -> str:
    (state,) = [
        s
        for s in world.instance.all_instigator_state()
        if s.instigator_name == f"{world.task}_schedule"
    ]
    return state.status.value


def _schedule_said(world: World) -> str:
    (tick, *_) = instigator_ticks(world.ctx, f"{world.task}_schedule", limit=1)
    return " ".join(tick.skip_reason or "" for _ in [0])


@pytest.mark.parametrize("world", ["deadline_task"], indirect=True)
def test_a_paused_task_runs_no_due_and_each_due_is_recorded_skipped(world: World) -> None:
    ledger, key = world.ledger, "deadline_task"
    pause = pause_task(
        ledger, [DEADLINE], key, operator="alice", reason="db migration", now=world.at(0)
    )
    assert world.tick(0) == []  # the tick runs nothing and says why
    assert "paused by alice: db migration" in _schedule_said(world)
    run_sensor_tick(world.ctx, world.at(0) + timedelta(minutes=1))
    written = ledger.find(key, Due(world.at(0)).key)
    assert written is not None and written.status == Status.SKIPPED
    assert written.error == pause.skip_reason == "paused by alice: db migration"
    # A run that reaches a paused due anyway (a sensor's, created before the pause was seen)
    # ends CANCELED, its entry skipped for the pause.
    late = world.ui_launch(
        {
            t.TAG_TRIGGER: Trigger.SENSOR.value,
            t.TAG_DUE: Due(world.at(1)).text,
            t.DAGSTER_SENSOR_NAME: "deadline_task_redispatch_sensor",
        }
    )
    world.start(late).join(timeout=60)
    assert world.outcome(late) == ("CANCELED", t.OUTCOME_SKIPPED)
    assert world.entry_of(late).error == "paused by alice: db migration"
    # The sweep writes each due once: a second pass writes nothing.
    run_sensor_tick(world.ctx, world.at(1) + timedelta(minutes=2))
    assert len(ledger.list_entries(task_key=key)[0]) == 2
    views = build_views([DEADLINE], 15, "UTC")
    summary = ledger_summary(ledger, views, world.at(2))  # both slots are over
    assert (summary["paused_24h"], summary["missed_24h"], summary["skipped_24h"]) == (2, 0, 2)
    # The pause stopped the schedule in Dagster (the policy sensor's tick above); the resume
    # starts it again from the resume on, at the policy sensor's next tick.
    assert _stored_status(world) == "STOPPED"
    resume_task(ledger, [DEADLINE], key, operator="bob", reason="done", now=world.at(2))
    run_sensor_tick(world.ctx, world.at(2) + timedelta(seconds=1))
    assert _stored_status(world) == "RUNNING"
    assert len(world.tick(2)) == 1  # resumed: the next due runs


# The toggle's detection is the same code on both ledgers (tests/sensors/test_scheduling.py).
@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("world", ["deadline_task"], indirect=True)
def test_a_schedule_stopped_in_the_ui_is_a_pause_by_dagster_ui(world: World) -> None:
    ledger, key = world.ledger, "deadline_task"
    run_sensor_tick(world.ctx, world.at(0) - timedelta(seconds=30))  # schedule seen running
    stop_schedules(world.instance, _target())
    run_sensor_tick(world.ctx, world.at(0) + timedelta(minutes=1))  # seen stopped: a pause
    (pause,) = open_pauses(ledger, key)
    assert (pause.by, pause.source) == ("dagster-ui", "schedule_stopped")
    assert world.tick(1) == []  # a stopped schedule ticks nothing at all
    run_sensor_tick(world.ctx, world.at(1) + timedelta(minutes=1))
    entry = ledger.find(key, Due(world.at(1)).key)
    assert entry is not None and entry.status == Status.SKIPPED
    assert entry.error == "paused by dagster-ui: schedule deadline_task_schedule stopped in Dagster"


@pytest.mark.parametrize("world", ["failing_task"], indirect=True)
def test_pause_after_failures_pauses_once_with_one_alert(
    world: World, webhook: WebhookSink
) -> None:
    ledger, key = world.ledger, "failing_task"
    failed = []
    for slot in (0, 1):
        run = world.due(slot)
        world.start(run).join(timeout=60)
        failed.append(ledger.find(key, Due(world.at(slot)).key))
    assert [e.status for e in failed if e] == [Status.FAILED, Status.FAILED]
    run_sensor_tick(world.ctx, world.at(1) + timedelta(minutes=1))
    (pause,) = open_pauses(ledger, key)
    assert pause.by == "dueledger" and pause.source == "pause_after_failures"
    assert all(f"{e.id} (" in pause.reason for e in failed if e)
    run_sensor_tick(world.ctx, world.at(1) + timedelta(minutes=1) + SENSOR_GAP)
    assert len(open_pauses(ledger, key)) == 1
    (alert,) = _alerts(webhook, a.KIND_TASK_PAUSED)
    assert alert["subject"] == f"pause:{pause.id}"
    fields = alert["fields"]
    assert isinstance(fields, dict) and fields["task"] == key
    assert fields["entries"] == [e.id for e in reversed(failed) if e]
    # The pause shows on the UI's toggle: the schedule is stopped, and its due runs nothing.
    assert _stored_status(world) == "STOPPED"
    assert world.tick(2) == []
    resume_task(ledger, [FAILING], key, operator="alice", reason="fixed", now=world.at(2))
    run_sensor_tick(world.ctx, world.at(2) + timedelta(minutes=1))
    assert _stored_status(world) == "RUNNING"
    assert len(world.tick(3)) == 1


@pytest.mark.parametrize("world", ["deadline_task"], indirect=True)
def test_a_missed_deadline_alerts_once_and_fails_the_check(
    world: World, webhook: WebhookSink
) -> None:
    ledger, key = world.ledger, "deadline_task"
    # The outcome sensor sees the schedule start: no due before it is expected (or judged).
    run_sensor_tick(world.ctx, world.at(0) - timedelta(seconds=30))
    world.start(world.due(0)).join(timeout=60)  # succeeds well before its deadline
    (world.directory / "fail").touch()
    world.start(world.due(1)).join(timeout=60)
    late = ledger.find(key, Due(world.at(1)).key)
    assert late is not None and late.status == Status.FAILED
    past = world.at(1) + timedelta(minutes=21)  # due 1's deadline has passed
    run_sensor_tick(world.ctx, past)
    run_sensor_tick(world.ctx, past + SENSOR_GAP)
    (alert,) = _alerts(webhook, a.KIND_DEADLINE_MISSED)
    fields = alert["fields"]
    assert isinstance(fields, dict) and fields["entry_id"] == late.id
    assert fields["due"] == Due(world.at(1)).text
    audits = ledger.recent_audit(action=ACTION_DEADLINE_MISSED)
    assert [r["entry_id"] for r in audits] == [late.id]
    (view,) = build_views([DEADLINE], 15, "UTC")
    account = account_latest_due(view, ledger, past + SENSOR_GAP)
    assert (account.state, account.passed) == ("deadline_missed", False)
    assert f"entry {late.id} is failed" in account.detail
    summary = ledger_summary(ledger, [view], past + SENSOR_GAP)
    assert summary["deadline_missed_24h"] == 1


def _target():  # the code location the world loaded, for stop_schedules
    from dagster_internals import CodeTarget

    return CodeTarget.from_file(POLICY_DEFS, attribute="deadline_defs")
