"""The outcomes duty (``outcome_duty``; alone, ``ledger_outcome_sensor``): the ledger learns
what Dagster knows of task runs. Entries follow
the runs Dagster ended FAILURE or CANCELED without the run recording its outcome, and entries
left ``retrying`` for a retry that will not come are settled (the decision and its writes:
``orchestration/services/outcomes.py``). Launches nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import dagster as dg

from orchestration.services.alerts import Alerts
from orchestration.services.outcomes import alert_of, reconcile_events, settle_abandoned_retries
from orchestration.task_spec import TaskView
from resources.core.alerting import entry_subject
from resources.core.instants import Clock, utc_now
from resources.ledger import RunLedger
from sensors.support import Duty, DutyContext, duty_sensor


def outcome_duty(views: Sequence[TaskView]) -> Duty:
    """Outcomes: entries follow runs Dagster ended FAILURE or CANCELED without the run
    recording its outcome, and ``retrying`` entries whose retry will not come are settled."""

    def reconcile(context: DutyContext, ledger: RunLedger, now: datetime) -> dg.SensorResult:
        alerts = Alerts.from_environment(ledger, now=now, log=context.log)
        cursor, done = reconcile_events(
            context.instance, ledger, views, context.cursor, now, context.log
        )
        done += settle_abandoned_retries(context.instance, ledger, views, now, context.log)
        for item in done:
            alert = alert_of(item)
            if alert is not None and item.entry is not None:
                alerts.emit(alert[0], entry_subject(item.entry.id), **alert[1])
        alerts.deliver()  # this tick's alerts; the reclaim duty retries what fails
        summary = f"reconciled {len(done)} run(s)" if done else "nothing to reconcile"
        return dg.SensorResult(skip_reason=summary, cursor=cursor)

    return Duty(
        "outcomes",
        reconcile,
        "Reconciles ledger entries with task runs that Dagster ended FAILURE or CANCELED "
        "(killed worker, START_TIMEOUT, launch error, max runtime), ends entries of tasks no "
        "longer registered (unsupported_task); never a new run.",
    )


def build_outcome_sensor(
    views: Sequence[TaskView], *, clock: Clock = utc_now, minimum_interval_seconds: int = 30
) -> dg.SensorDefinition:
    """``ledger_outcome_sensor``: the outcomes duty alone, as a sensor of its own."""
    return duty_sensor(
        "ledger_outcome_sensor",
        outcome_duty(views),
        clock=clock,
        minimum_interval_seconds=minimum_interval_seconds,
    )
