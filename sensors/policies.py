"""The policies duty (``policy_duty``; alone, ``ledger_policy_sensor``): the scheduling
policies' ledger facts, each tick. Pauses
(``orchestration/pause.py``): each task's schedule state -- the UI's toggle -- mirrored into
the ledger (since when it runs; a stop is a pause, a start resumes), and the toggle made to
show the ledger's pauses (stopped while one is open, running once none is), dues inside a
pause written ``skipped``, tasks paused after ``pause_after_failures`` consecutive failures
(one ``task_paused`` alert).
Deadlines (``orchestration/deadline.py``): one ``deadline_missed`` alert per due. Overlap
(``orchestration/overlap.py``): the Dagster pools that hold one run of a ``queue`` task at a
time. Launches nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import dagster as dg

from orchestration.deadline import record_deadline_misses
from orchestration.overlap import ensure_task_pools
from orchestration.pause import (
    ObservedSchedule,
    Pause,
    ToggleAction,
    last_resume,
    observe_schedule,
    open_pauses,
    pause_after_failures,
    record_paused_dues,
    schedule_states,
    sync_schedules,
    toggle_action,
)
from orchestration.services.alerts import Alerts
from orchestration.task_spec import TaskView
from resources.core.instants import Clock, iso, utc_now
from resources.ledger import RunLedger
from sensors.support import Duty, DutyContext, duty_sensor

#: Dagster's states of an instigator that runs (a schedule started in the UI, or running
#: because its code says so); STOPPED is the other one.
_RUNNING_STATUSES = frozenset({"RUNNING", "DECLARED_IN_CODE"})


def observed_schedules(instance: dg.DagsterInstance) -> dict[str, ObservedSchedule]:
    """Every schedule's state as Dagster stores it, by schedule name (one read per tick)."""
    observed = {}
    for state in instance.all_instigator_state():
        if state.instigator_type.value != "SCHEDULE":
            continue
        stamp = getattr(state.instigator_data, "start_timestamp", None)
        started_at = datetime.fromtimestamp(stamp, UTC) if stamp else None
        running = state.status.value in _RUNNING_STATUSES
        observed[state.instigator_name] = ObservedSchedule(
            running, started_at, state.instigator_origin_id, state.selector_id
        )
    return observed


def show_pauses_on_toggles(
    instance: dg.DagsterInstance,
    ledger: RunLedger,
    views: Sequence[TaskView],
    observed: dict[str, ObservedSchedule],
    now: datetime,
) -> list[str]:
    """Stop the schedule of every task with an open pause and start the schedule of every task
    whose pauses were all resumed (``toggle_action``); what was done, in words.

    Starting is what the UI's start does to the stored state (RUNNING, with a start time),
    but with the start time at the resume, not now: Dagster's scheduler fires the ticks after
    a schedule's start time, so a due that fell between the resume and this tick still runs
    (late by at most this sensor's interval) instead of being lost. Dagster's public API has
    no start without the code location's schedule object (which a sensor does not have):
    the new state is derived from the stored one by its own methods."""
    done: list[str] = []
    mirrored = schedule_states(ledger)
    pauses: dict[str, list[Pause]] = {}
    for pause in open_pauses(ledger):
        pauses.setdefault(pause.task_key, []).append(pause)
    for view in views:
        key, name = view.spec.key, view.spec.schedule_name
        state = observed.get(name)
        if state is None or state.origin_id is None or state.selector_id is None:
            continue
        action = toggle_action(mirrored.get(key), state, pauses.get(key, []))
        if action is ToggleAction.STOP:
            instance.stop_schedule(state.origin_id, state.selector_id)
            # Mirrored at once, while the pause is open: this stop is that pause, never one
            # of the UI's (were the pause resumed before the next tick saw the stop).
            observe_schedule(ledger, key, name, running=False, started_at=None, now=now)
            done.append(f"{key}: schedule {name} stopped: {pauses[key][0].words()}")
        elif action is ToggleAction.START:
            # From the resume, but no further back than a slot: a due older than that is the
            # missed-slot policy's to judge, not the scheduler's to fire late.
            resumed = max(
                last_resume(ledger, key) or now, now - timedelta(minutes=view.slot_minutes)
            )
            stored = instance.get_instigator_state(state.origin_id, state.selector_id)
            if stored is None:
                continue  # forgotten meanwhile: the code's default (running) holds
            # One second before the resume: a due at the resume's very instant is not paused.
            since = (resumed - timedelta(seconds=1)).timestamp()
            # Dagster checkpoints a stopped schedule's last iteration too, and fires only the
            # ticks after the later of the two: the checkpoint is cleared with the start.
            data = stored.instigator_data._replace(  # type: ignore[union-attr,call-arg]
                start_timestamp=since, last_iteration_timestamp=None
            )
            running = stored.with_status(type(stored.status).RUNNING).with_data(data)
            instance.update_instigator_state(running)
            observe_schedule(
                ledger,
                key,
                name,
                running=True,
                started_at=datetime.fromtimestamp(since, UTC),
                now=now,
            )
            done.append(f"{key}: schedule {name} running again since {iso(resumed)}: resumed")
    return done


def policy_duty(views: Sequence[TaskView]) -> Duty:
    """Policies: pauses (the UI's toggle and the ledger kept in step), pause after failures,
    missed deadlines, and the task pools."""

    def keep_policies(context: DutyContext, ledger: RunLedger, now: datetime) -> dg.SkipReason:
        alerts = Alerts.from_environment(ledger, now=now, log=context.log)
        ensure_task_pools(context.instance, views)
        # The UI's toggle first, so a stop is a pause before this tick's dues are recorded.
        observed = observed_schedules(context.instance)
        for change in sync_schedules(ledger, views, observed, now):
            context.log.info(change)
        paused = pause_after_failures(ledger, views, now, alerts)
        # Then the toggle shows the ledger: stopped while paused, running once resumed.
        for change in show_pauses_on_toggles(context.instance, ledger, views, observed, now):
            context.log.info(change)
        skipped = record_paused_dues(ledger, views, now)
        missed = record_deadline_misses(ledger, views, now, alerts)
        for pause in paused:
            context.log.warning(f"paused after failures: {pause.skip_reason}")
        for entry in skipped:
            context.log.info(f"entry {entry.id} {entry.label}: skipped ({entry.error})")
        alerts.deliver()  # this tick's alerts; the reclaim duty retries what fails
        done = f"{len(paused)} paused, {len(skipped)} paused due(s) recorded, {len(missed)} "
        return dg.SkipReason(done + "deadline(s) missed")

    return Duty(
        "policies",
        keep_policies,
        "Records each task schedule's start and stops (a stop in the UI is a pause, a start "
        "resumes), stops the schedule of a task paused by `dueledger pause` or its failures "
        "and starts it again once resumed, records each due inside a pause as skipped "
        "(paused by NAME: REASON), pauses a task after pause_after_failures consecutive "
        "failures (task_paused alert), raises deadline_missed once per due not success by "
        "its deadline, and creates the task pools; never a run.",
    )


def build_policy_sensor(
    views: Sequence[TaskView], *, clock: Clock = utc_now, minimum_interval_seconds: int = 30
) -> dg.SensorDefinition:
    """``ledger_policy_sensor``: the policies duty alone, as a sensor of its own."""
    return duty_sensor(
        "ledger_policy_sensor",
        policy_duty(views),
        clock=clock,
        minimum_interval_seconds=minimum_interval_seconds,
    )
