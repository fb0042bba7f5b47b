"""``ledger_policy_sensor``: the scheduling policies' ledger facts, every 30 s: paused dues
written ``skipped`` and tasks paused after ``pause_after_failures`` consecutive failures (one
``task_paused`` alert; ``orchestration/pause.py``), missed deadlines (one ``deadline_missed``
alert each; ``orchestration/deadline.py``). Launches nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import dagster as dg

from orchestration.deadline import record_deadline_misses
from orchestration.pause import pause_after_failures, record_paused_dues
from orchestration.services.alerts import Alerts
from orchestration.task_spec import TaskView
from resources.core.instants import Clock, utc_now
from resources.ledger import RunLedger
from sensors.support import ledger_sensor


def build_policy_sensor(
    views: Sequence[TaskView], *, clock: Clock = utc_now, minimum_interval_seconds: int = 30
) -> dg.SensorDefinition:
    """``ledger_policy_sensor``: pauses and deadlines, recorded in the ledger."""

    @ledger_sensor(
        "ledger_policy_sensor",
        clock=clock,
        minimum_interval_seconds=minimum_interval_seconds,
        description=(
            "Records each due inside a pause as skipped (paused by NAME: REASON), pauses a "
            "task after pause_after_failures consecutive failures (task_paused alert), and "
            "raises deadline_missed once per due not success by its deadline; never a run."
        ),
    )
    def ledger_policy_sensor(
        context: dg.SensorEvaluationContext, ledger: RunLedger, now: datetime
    ) -> dg.SkipReason:
        alerts = Alerts.from_environment(ledger, now=now, log=context.log)
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
