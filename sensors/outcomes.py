"""``ledger_outcome_sensor``: the ledger learns what Dagster knows. Entries follow the task
runs Dagster ended FAILURE or CANCELED without the run recording its outcome (the service:
``orchestration/services/outcomes.py``; the decision: ``resources/core/outcomes.py``); each
task's schedule state -- the UI's toggle -- is mirrored into the ledger (since when it runs,
when it was stopped: ``orchestration/pause.py``). It also creates the pools that hold one run
of a ``queue`` task at a time (``orchestration/overlap.py``). Launches nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import dagster as dg

from orchestration.overlap import ensure_task_pools
from orchestration.pause import ObservedSchedule, sync_schedules
from orchestration.services.alerts import Alerts
from orchestration.services.outcomes import alert_of, reconcile_events, settle_abandoned_retries
from orchestration.task_spec import TaskView
from resources.core.alerting import entry_subject
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


def build_outcome_sensor(
    views: Sequence[TaskView], *, clock: Clock = utc_now, minimum_interval_seconds: int = 30
) -> dg.SensorDefinition:
    """``ledger_outcome_sensor``: brings entries in line with runs Dagster ended FAILURE or
    CANCELED without the run recording its outcome, and creates missing task pools."""

    @ledger_sensor(
        "ledger_outcome_sensor",
        clock=clock,
        minimum_interval_seconds=minimum_interval_seconds,
        description=(
            "Reconciles ledger entries with task runs that Dagster ended FAILURE or CANCELED "
            "(killed worker, START_TIMEOUT, launch error, max runtime), ends entries of "
            "tasks no longer registered (unsupported_task), and records each task schedule's "
            "start and stops (pauses); never a new run."
        ),
    )
    def ledger_outcome_sensor(
        context: dg.SensorEvaluationContext, ledger: RunLedger, now: datetime
    ) -> dg.SensorResult:
        alerts = Alerts.from_environment(ledger, now=now, log=context.log)
        ensure_task_pools(context.instance, views)
        # What Dagster knows of the schedules too: since when each runs, and stops (pauses).
        for change in sync_schedules(ledger, views, observed_schedules(context.instance), now):
            context.log.info(change)
        cursor, done = reconcile_events(
            context.instance, ledger, views, context.cursor, now, context.log
        )
        done += settle_abandoned_retries(context.instance, ledger, views, now, context.log)
        for item in done:
            alert = alert_of(item)
            if alert is not None and item.entry is not None:
                alerts.emit(alert[0], entry_subject(item.entry.id), **alert[1])
        alerts.deliver()  # this tick's alerts; lease_reclaim_sensor retries what fails
        summary = f"reconciled {len(done)} run(s)" if done else "nothing to reconcile"
        return dg.SensorResult(skip_reason=summary, cursor=cursor)

    return ledger_outcome_sensor
