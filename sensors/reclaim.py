"""The reclaim duty (``reclaim_duty``; alone, ``lease_reclaim_sensor``): runs the reclaim rule
(``orchestration/reclaim.py``) each tick:
expired leases end ``lease_reclaimed`` and stranded launches (an entry whose run was never
created) ``dispatch_failed``, one alert line each. Each alert goes to the configured channels once,
and every tick, after its own work, retries the alert deliveries that are due
(orchestration/services/alerts.py).
"""

from __future__ import annotations

from datetime import datetime

import dagster as dg

from orchestration.reclaim import ALERT_KIND, reclaim_leases, sweep_stranded
from orchestration.reclaim import STRANDED_ALERT_KIND as STRANDED_KIND
from orchestration.services.alerts import Alerts
from orchestration.services.dagster_runs import has_dispatched_run, turn_off_dagster_retries
from resources.core.alerting import DELIVERY_DELIVERED, entry_subject
from resources.core.instants import Clock, utc_now
from resources.ledger import DeliveryRecord, RunLedger
from sensors.support import Duty, DutyContext, duty_sensor


def reclaim_duty() -> Duty:
    """Reclaim: expired leases end ``lease_reclaimed``, stranded launches
    ``dispatch_failed``; then every channel's alert deliveries that are due are retried."""

    def reclaim(context: DutyContext, ledger: RunLedger, now: datetime) -> dg.SkipReason:
        alerts = Alerts.from_environment(ledger, now=now, log=context.log)
        reclaims = reclaim_leases(ledger, now)
        for item in reclaims:
            alerts.emit(ALERT_KIND, entry_subject(item.entry_id), **item.as_json())
            # Dagster must not relaunch it if it fails later: a retry would be refused.
            turn_off_dagster_retries(context.instance, item.run_id, context.log)
        stranded = sweep_stranded(
            ledger, lambda entry: has_dispatched_run(context.instance, entry), now
        )
        for swept in stranded:
            alerts.emit(STRANDED_KIND, entry_subject(swept.entry.id), **swept.as_json())
        # After the duty's own work: its alerts, then every channel's due retries.
        attempts = alerts.deliver(retry=True)
        said = f"reclaimed {len(reclaims)} expired lease(s)" if reclaims else "no expired leases"
        if stranded:
            said += f"; {len(stranded)} stranded launch(es) recorded as dispatch_failed"
        return dg.SkipReason(said + delivery_summary(attempts))

    return Duty(
        "reclaim",
        reclaim,
        "Fails running ledger entries whose lease expired (kind lease_reclaimed), records "
        "launches whose run was never created as dispatch_failed, one structured alert line "
        "per entry, and retries the alert deliveries that are due; never launches a run.",
    )


def build_reclaim_sensor(
    *, clock: Clock = utc_now, minimum_interval_seconds: int = 30
) -> dg.SensorDefinition:
    """``lease_reclaim_sensor``: the reclaim duty alone, as a sensor of its own."""
    return duty_sensor(
        "lease_reclaim_sensor",
        reclaim_duty(),
        clock=clock,
        minimum_interval_seconds=minimum_interval_seconds,
    )


def delivery_summary(attempts: list[DeliveryRecord]) -> str:
    """``; alert deliveries: 2 delivered, 1 failed`` (empty when nothing was attempted)."""
    if not attempts:
        return ""
    delivered = sum(1 for a in attempts if a.status == DELIVERY_DELIVERED)
    failed = len(attempts) - delivered
    return f"; alert deliveries: {delivered} delivered, {failed} failed"
