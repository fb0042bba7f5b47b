"""``ledger_policy_sensor``: the scheduling policies' ledger facts, every 30 s. Pauses
(``orchestration/pause.py``): each task's schedule state -- the UI's toggle -- mirrored into
the ledger (since when it runs; a stop is a pause), dues inside a pause written ``skipped``,
tasks paused after ``pause_after_failures`` consecutive failures (one ``task_paused`` alert).
Deadlines (``orchestration/deadline.py``): one ``deadline_missed`` alert per due. Overlap
(``orchestration/overlap.py``): the Dagster pools that hold one run of a ``queue`` task at a
time. Launches nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import dagster as dg

from orchestration.deadline import record_deadline_misses
from orchestration.overlap import ensure_task_pools
from orchestration.pause import (
    ObservedSchedule,
    pause_after_failures,
    record_paused_dues,
    sync_schedules,
)
from orchestration.services.alerts import Alerts
from orchestration.task_spec import TaskView
from resources.core.instants import Clock, utc_now
from resources.ledger import RunLedger
from sensors.support import ledger_sensor

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
        observed[state.instigator_name] = ObservedSchedule(running, started_at)
    return observed


def build_policy_sensor(
    views: Sequence[TaskView], *, clock: Clock = utc_now, minimum_interval_seconds: int = 30
) -> dg.SensorDefinition:
    """``ledger_policy_sensor``: pauses, deadlines and task pools, kept in the ledger and
    Dagster."""

    @ledger_sensor(
        "ledger_policy_sensor",
        clock=clock,
        minimum_interval_seconds=minimum_interval_seconds,
        description=(
            "Records each task schedule's start and stops (a stop in the UI is a pause), each "
            "due inside a pause as skipped (paused by NAME: REASON), pauses a task after "
            "pause_after_failures consecutive failures (task_paused alert), raises "
            "deadline_missed once per due not success by its deadline, and creates the task "
            "pools; never a run."
        ),
    )
    def ledger_policy_sensor(
        context: dg.SensorEvaluationContext, ledger: RunLedger, now: datetime
    ) -> dg.SkipReason:
        alerts = Alerts.from_environment(ledger, now=now, log=context.log)
        ensure_task_pools(context.instance, views)
        # The UI's toggle first, so a stop is a pause before this tick's dues are recorded.
        for change in sync_schedules(ledger, views, observed_schedules(context.instance), now):
            context.log.info(change)
        paused = pause_after_failures(ledger, views, now, alerts)
        skipped = record_paused_dues(ledger, views, now)
        missed = record_deadline_misses(ledger, views, now, alerts)
        for pause in paused:
            context.log.warning(f"paused after failures: {pause.skip_reason}")
        for entry in skipped:
            context.log.info(f"entry {entry.id} {entry.label}: skipped ({entry.error})")
        alerts.deliver()  # this tick's alerts; lease_reclaim_sensor retries what fails
        done = f"{len(paused)} paused, {len(skipped)} paused due(s) recorded, {len(missed)} "
        return dg.SkipReason(done + "deadline(s) missed")

    return ledger_policy_sensor
