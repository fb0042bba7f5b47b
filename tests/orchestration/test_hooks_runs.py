"""Plugin hooks through real evaluations and runs: the code location's schedules
(dg.build_schedule_context), real asset runs (dg.materialize) and the real SQLite ledger.

Listeners are installed in code for these tests (``hook_support.SwappableHooks``, the hooks
object the schedules, assets and launches below are built with); discovery through entry
points and the config file is tested in test_hooks.py.
"""

import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
from hook_support import SwappableHooks, build
from run_support import refused, scheduled

from orchestration.declarations import registered_tasks, task_views
from orchestration.manual_launch import launch_manual
from orchestration.services.hooks.vocabulary import (
    AFTER_TASK_CREATE,
    BEFORE_TASK_CREATE,
    EVENTS,
    LOGGER,
    TAG_HOOKS,
    TASK_AFTER,
    TASK_BEFORE,
    TASK_FAILED,
    TICK_EVERY_FIVE_MINUTES,
    TICK_EVERY_MINUTE,
    TICK_EVERY_SLOT,
    HookContext,
    Listener,
    degrade,
    deny,
    listener,
)
from orchestration.task_defs import run_task, task_jobs_and_schedules
from orchestration.task_run import TaskRun
from orchestration.task_spec import TaskSpec
from orchestration.timetable import EverySlots
from resources.core import tags as t
from resources.core.entry import FailureKind, Status, Trigger
from resources.core.errors import Refused
from resources.ledger import RunLedger


@pytest.fixture
def ledger_url(sqlite_url: str) -> str:
    """This module's ledger is SQLite only."""
    return sqlite_url


DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
DUE_KEY = "2026-11-30T22:45:00Z"
# What each test installs; the code location's schedules and assets, built with it.
HOOKS = SwappableHooks()
SCHEDULES = {s.name: s for s in task_jobs_and_schedules(task_views(), hooks=HOOKS)[1]}
TICK_ASSETS = {
    k: build(k, HOOKS) for k in ("tick_every_slot", "tick_every_minute", "tick_every_five_minutes")
}
# A registered-by-its-own-asset task whose body always fails (not in the registry; its runs are
# supported because the run's task is the asset's own task).
PROBE = TaskSpec(
    key="hook_probe",
    rule=EverySlots(1),
    declared_cadence="every slot",
    timeout=timedelta(minutes=1),
    lease_ttl=timedelta(minutes=2),
)


def _fails(context: dg.AssetExecutionContext, run: TaskRun):
    raise ValueError("the source is down")
    yield  # a generator, like every body


@dg.asset(name="hook_probe", output_required=False)
def hook_probe(context: dg.AssetExecutionContext, ledger: RunLedger):
    yield from run_task(context, ledger, PROBE, _fails, hooks=HOOKS, tasks=registered_tasks())


@dataclass
class Recorder:
    """A listener on every event that remembers each context it got."""

    seen: list[HookContext] = field(default_factory=list)

    def listener(self, name: str = "recorder", **kw) -> Listener:
        return listener(*EVENTS, name=name, **kw)(self.seen.append)

    def events(self) -> list[str]:
        return [c.event for c in self.seen]

    def one(self, event: str) -> HookContext:
        (found,) = [c for c in self.seen if c.event == event]
        return found


@pytest.fixture
def install():
    """Install listeners for the test; none are left installed afterwards."""
    HOOKS.reset()
    yield HOOKS.install
    HOOKS.reset()


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    # Run retries on, as in production, so "no retry" is Dagster's own decision.
    with dg.instance_for_test(overrides={"run_retries": {"enabled": True}}) as inst:
        yield inst


def evaluate(schedule_name: str, when: datetime, instance: dg.DagsterInstance, ledger: RunLedger):
    schedule = SCHEDULES[schedule_name]
    with dg.build_schedule_context(
        instance=instance, scheduled_execution_time=when, resources={"ledger": ledger}
    ) as context:
        return schedule.evaluate_tick(context)


def materialize(asset, ledger, instance, tags, **kw):
    """Execute the asset in process as its run would: a scheduled request's run carries the
    schedule's name, which the daemon adds when it launches it."""
    if tags.get(t.TAG_TRIGGER) == Trigger.SCHEDULE:
        tags = scheduled(tags)
    return dg.materialize([asset], resources={"ledger": ledger}, instance=instance, tags=tags, **kw)


def hook_events(ledger: RunLedger, task_key: str, dedup_key: str) -> list[tuple[str, str, str]]:
    entry = ledger.find(task_key, dedup_key)
    assert entry is not None
    return [(h["event"], h["listener"], h["outcome"]) for h in entry.summary["hooks"]]


# --- every event once, with its context, through a real schedule evaluation and run ----------


def test_a_scheduled_slot_fires_every_event_once_with_the_full_context(install, ledger, instance):
    recorder = Recorder()
    install(recorder.listener())
    result = evaluate("tick_every_slot_schedule", DUE, instance, ledger)
    (request,) = result.run_requests
    assert recorder.events() == [BEFORE_TASK_CREATE, AFTER_TASK_CREATE]
    before = recorder.one(BEFORE_TASK_CREATE)
    assert (before.task_key, before.trigger, before.due, before.slot) == (
        "tick_every_slot",
        Trigger.SCHEDULE,
        DUE_KEY,
        DUE_KEY,
    )
    # Nothing exists yet at creation time of a scheduled run.
    assert (before.entry_id, before.attempt, before.run_id) == (None, None, None)
    assert TAG_HOOKS in request.tags

    run = materialize(TICK_ASSETS["tick_every_slot"], ledger, instance, request.tags)
    assert run.success
    assert recorder.events() == [
        BEFORE_TASK_CREATE,
        AFTER_TASK_CREATE,
        TASK_BEFORE,
        TICK_EVERY_SLOT,
        TASK_AFTER,
    ]
    entry = ledger.find("tick_every_slot", f"due:{DUE_KEY}")
    assert entry is not None and entry.status == Status.SUCCESS
    for event in (TASK_BEFORE, TICK_EVERY_SLOT, TASK_AFTER):
        ctx = recorder.one(event)
        assert (ctx.task_key, ctx.trigger, ctx.due, ctx.slot) == (
            "tick_every_slot",
            Trigger.SCHEDULE,
            DUE_KEY,
            DUE_KEY,
        )
        assert (ctx.entry_id, ctx.attempt, ctx.run_id) == (entry.id, 1, run.run_id)
    assert recorder.one(TASK_AFTER).status == Status.SUCCESS
    # Every outcome is on the entry, the creation ones carried in by the run's tag.
    assert hook_events(ledger, "tick_every_slot", f"due:{DUE_KEY}") == [
        (BEFORE_TASK_CREATE, "recorder", "allow"),
        (AFTER_TASK_CREATE, "recorder", "allow"),
        (TASK_BEFORE, "recorder", "allow"),
        (TICK_EVERY_SLOT, "recorder", "allow"),
        (TASK_AFTER, "recorder", "allow"),
    ]
    stored = entry.summary["hooks"][2]
    assert stored["run_id"] == run.run_id and stored["attempt"] == 1


@pytest.mark.parametrize(
    ("task_key", "event", "ticks_in_slot"),
    [
        ("tick_every_minute", TICK_EVERY_MINUTE, 15),
        ("tick_every_five_minutes", TICK_EVERY_FIVE_MINUTES, 3),
    ],
)
def test_legacy_tick_events_keep_their_names_and_fire_once_per_slot(
    task_key, event, ticks_in_slot, install, ledger, instance
):
    recorder = Recorder()
    install(recorder.listener())
    step = timedelta(minutes=15 // ticks_in_slot)
    # Every fire of the cron inside one 15-minute slot: only the first asks for a run.
    fires = [DUE + i * step for i in range(ticks_in_slot)]
    results = [evaluate(f"{task_key}_schedule", when, instance, ledger) for when in fires]
    (request,) = [r for result in results for r in result.run_requests]
    assert request.run_key == DUE_KEY
    assert all(result.skip_message for result in results[1:])
    assert recorder.events() == [BEFORE_TASK_CREATE, AFTER_TASK_CREATE]
    asset = TICK_ASSETS[task_key]
    first = materialize(asset, ledger, instance, request.tags)
    duplicate = materialize(asset, ledger, instance, request.tags, raise_on_error=False)
    assert first.success and refused(instance, duplicate.run_id)
    assert recorder.events().count(event) == 1
    assert recorder.one(event).slot == DUE_KEY
    entry = ledger.find(task_key, f"due:{DUE_KEY}")
    assert entry is not None and entry.status == Status.SUCCESS


# --- raising, slow and denying listeners ---------------------------------------------------------


def test_a_raising_and_a_slow_listener_do_not_stop_the_others_or_the_task(
    install, ledger, instance, caplog
):
    release = threading.Event()
    recorder = Recorder()

    @listener(TASK_BEFORE, TASK_AFTER)
    def raising(ctx):
        raise RuntimeError(f"plugin bug in {ctx.event}")

    @listener(TASK_BEFORE, timeout_seconds=0.3)
    def slow(ctx):
        release.wait(30)

    install(raising, slow, recorder.listener())
    caplog.set_level(logging.INFO, logger=LOGGER.name)
    tags = {
        t.TAG_TASK: "tick_every_slot",
        t.TAG_TRIGGER: Trigger.SCHEDULE.value,
        t.TAG_DUE: DUE_KEY,
    }
    try:
        run = materialize(TICK_ASSETS["tick_every_slot"], ledger, instance, tags)
    finally:
        release.set()
    assert run.success
    assert recorder.events() == [TASK_BEFORE, TICK_EVERY_SLOT, TASK_AFTER]
    entry = ledger.find("tick_every_slot", f"due:{DUE_KEY}")
    assert entry is not None and entry.status == Status.SUCCESS
    stored = {(h["event"], h["listener"]): h for h in entry.summary["hooks"]}
    assert stored[(TASK_BEFORE, "raising")]["outcome"] == "error"
    assert "RuntimeError: plugin bug in task_before" in stored[(TASK_BEFORE, "raising")]["error"]
    assert stored[(TASK_BEFORE, "slow")]["outcome"] == "timeout"
    assert stored[(TASK_AFTER, "raising")]["outcome"] == "error"
    assert stored[(TASK_AFTER, "recorder")]["outcome"] == "allow"
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == LOGGER.name]
    assert {(x["listener"], x["outcome"]) for x in lines} >= {
        ("raising", "error"),
        ("slow", "timeout"),
    }
    assert all(x["run_id"] == run.run_id and x["entry_id"] == entry.id for x in lines)


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "not_blocking"])
def test_a_deny_skips_the_due_only_when_the_listener_is_blocking(
    blocking, install, ledger, instance
):
    recorder = Recorder()

    @listener(BEFORE_TASK_CREATE, blocking=blocking)
    def freeze(ctx):
        return deny("change freeze")

    install(freeze, recorder.listener())
    result = evaluate("tick_every_slot_schedule", DUE, instance, ledger)
    if blocking:
        assert result.run_requests == []
        assert "change freeze" in (result.skip_message or "")
        assert "freeze" in (result.skip_message or "")
        # Denied: nothing was created, so after_task_create does not fire.
        assert recorder.events() == [BEFORE_TASK_CREATE]
        return
    (request,) = result.run_requests
    assert recorder.events() == [BEFORE_TASK_CREATE, AFTER_TASK_CREATE]
    run = materialize(TICK_ASSETS["tick_every_slot"], ledger, instance, request.tags)
    assert run.success
    events = hook_events(ledger, "tick_every_slot", f"due:{DUE_KEY}")
    assert events[0] == (BEFORE_TASK_CREATE, "freeze", "deny_ignored")


def test_a_failing_task_fires_task_failed_with_its_error_and_entry_status(
    install, ledger, instance
):
    recorder = Recorder()
    install(recorder.listener())
    tags = {
        t.TAG_TASK: "hook_probe",
        t.TAG_TRIGGER: Trigger.SCHEDULE.value,
        t.TAG_DUE: DUE_KEY,
        # As a task job's run tags set it: Dagster will retry a failure twice.
        t.DAGSTER_MAX_RETRIES: "2",
    }
    run = materialize(hook_probe, ledger, instance, tags, raise_on_error=False)
    assert not run.success
    assert recorder.events() == [TASK_BEFORE, TASK_FAILED]
    failed = recorder.one(TASK_FAILED)
    assert failed.error == "ValueError: the source is down"
    assert failed.status == Status.RETRYING  # attempts left: Dagster's retry comes next
    assert (failed.attempt, failed.run_id) == (1, run.run_id)


# --- manual launches ---------------------------------------------------------------------------


def test_a_manual_launch_fires_creation_events_with_its_run_id_and_entry(install, ledger, instance):
    recorder = Recorder()

    @listener(BEFORE_TASK_CREATE)
    def softer(ctx):
        return degrade({"plugin/checked": "yes"})

    install(softer, recorder.listener())
    submitted: list[dict[str, str]] = []
    result = launch_manual(
        registered_tasks(),
        "order_cleanup",
        operator="ops",
        reason="run now",
        request_id="req-hooks",
        instance=instance,
        ledger=ledger,
        hooks=HOOKS,
        submit=lambda job, run_id, tags: submitted.append(tags),
    )
    assert recorder.events() == [BEFORE_TASK_CREATE, AFTER_TASK_CREATE]
    before, after = recorder.seen
    assert (before.trigger, before.run_id, before.entry_id) == ("manual", result.run_id, None)
    assert (after.run_id, after.entry_id) == (result.run_id, result.entry_id)
    assert submitted[0]["plugin/checked"] == "yes"
    events = hook_events(ledger, "order_cleanup", "manual:req-hooks")
    assert [e[0] for e in events] == [
        BEFORE_TASK_CREATE,
        BEFORE_TASK_CREATE,
        AFTER_TASK_CREATE,
    ]


def test_a_blocking_deny_refuses_a_manual_launch_and_changes_nothing(install, ledger, instance):
    @listener(BEFORE_TASK_CREATE, blocking=True)
    def freeze(ctx):
        return deny("change freeze")

    install(freeze)
    submitted: list[str] = []
    with pytest.raises(Refused, match=r"denied by a blocking plugin listener.*change freeze"):
        launch_manual(
            registered_tasks(),
            "order_cleanup",
            operator="ops",
            reason="run now",
            request_id="req-frozen",
            instance=instance,
            ledger=ledger,
            hooks=HOOKS,
            submit=lambda job, run_id, tags: submitted.append(job),
        )
    assert submitted == []
    assert ledger.find("order_cleanup", "manual:req-frozen") is None


# --- unsupported tasks ---------------------------------------------------------------------------


def unsupported_tags(task_key: str = "tick_renamed_away") -> dict[str, str]:
    # As a run queued before a deploy that renamed the task (its asset stayed) carries them,
    # with the job's retry budget.
    return {
        t.TAG_TASK: task_key,
        t.TAG_TRIGGER: Trigger.SCHEDULE.value,
        t.TAG_DUE: DUE_KEY,
        t.DAGSTER_MAX_RETRIES: "2",
    }


def alerts(caplog) -> list[dict]:
    return [
        json.loads(r.getMessage())
        for r in caplog.records
        if r.name == "dueledger.alerts" and '"unsupported_task"' in r.getMessage()
    ]


def test_an_unsupported_task_fails_its_entry_once_with_one_alert_and_no_retry(
    install, ledger, instance, caplog
):
    recorder = Recorder()
    install(recorder.listener())
    caplog.set_level(logging.WARNING, logger="dueledger.alerts")
    asset = TICK_ASSETS["tick_every_slot"]
    run = materialize(asset, ledger, instance, unsupported_tags(), raise_on_error=False)
    assert not run.success
    entry = ledger.find("tick_renamed_away", f"due:{DUE_KEY}")
    assert entry is not None
    assert (entry.status, entry.failure_kind) == (Status.FAILED, FailureKind.UNSUPPORTED_TASK)
    assert (entry.attempt, entry.max_attempts) == (1, 1)
    assert "not registered" in (entry.error or "")
    # Dagster itself decided not to retry (run retries are enabled on this instance).
    stored = instance.get_run_by_id(run.run_id)
    assert stored is not None
    assert stored.tags.get(t.DAGSTER_WILL_RETRY) == "false"
    assert [a["entry_id"] for a in alerts(caplog)] == [entry.id]
    # The body never ran: no task_before, no tick event; task_failed once, with its kind.
    assert recorder.events() == [TASK_FAILED]
    assert recorder.one(TASK_FAILED).failure_kind == FailureKind.UNSUPPORTED_TASK

    again = materialize(asset, ledger, instance, unsupported_tags(), raise_on_error=False)
    assert not again.success
    after = ledger.get(entry.id)
    assert after is not None and after.status == Status.FAILED and after.attempt == 1
    assert len(alerts(caplog)) == 1, "one alert per entry, not one per run"


def test_a_supported_failing_task_is_still_retried_by_dagster(install, ledger, instance):
    # The control for the test above: same instance settings and retry budget, a registered
    # task whose body fails -> Dagster will retry it.
    run = materialize(
        hook_probe, ledger, instance, unsupported_tags("hook_probe"), raise_on_error=False
    )
    stored = instance.get_run_by_id(run.run_id)
    assert stored is not None and stored.tags.get(t.DAGSTER_WILL_RETRY) == "true"


def test_an_unsupported_run_of_an_entry_with_attempts_left_still_ends_failed(
    install, ledger, instance
):
    # The entry was made while the task existed (three attempts), then the task went away.
    made = ledger.ensure_entry(
        task_key="tick_renamed_away",
        trigger=Trigger.SCHEDULE,
        dedup_key=f"due:{DUE_KEY}",
        max_attempts=3,
    )
    run = materialize(
        TICK_ASSETS["tick_every_slot"], ledger, instance, unsupported_tags(), raise_on_error=False
    )
    assert not run.success
    entry = ledger.get(made.id)
    assert entry is not None
    assert (entry.status, entry.failure_kind) == (Status.FAILED, FailureKind.UNSUPPORTED_TASK)
