"""``lease_reclaim_sensor``: runs the lease reclaim (orchestration/services/reclaim.py) every
30 s and writes one alert line per reclaimed entry; the same tick records stranded launches
(orchestration/services/stranded.py: an entry whose run was never created) as
``dispatch_failed``, one alert line each. Each alert goes to the configured channels once,
and every tick, after its own work, retries the alert deliveries that are due
(orchestration/services/alerts.py).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import dagster as dg

from orchestration.services.alerts import Alerts, utc_now
from orchestration.services.reclaim import ALERT_KIND, reclaim_leases
from orchestration.services.stranded import ALERT_KIND as STRANDED_KIND
from orchestration.services.stranded import sweep_stranded
from resources.core import tags as t
from resources.core.alerting import DELIVERY_DELIVERED, entry_subject
from resources.ledger import DeliveryRecord, RunLedger


def build_reclaim_sensor(
    *, clock: Callable[[], datetime] = utc_now, minimum_interval_seconds: int = 30
) -> dg.SensorDefinition:
    """``lease_reclaim_sensor``: reclaims expired leases; one alert line per reclaim."""

    @dg.sensor(
        name="lease_reclaim_sensor",
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Fails running ledger entries whose lease expired (kind lease_reclaimed), and "
            "records launches whose run was never created as dispatch_failed; never "
            "launches a run. One structured alert line per entry."
        ),
    )
    def lease_reclaim_sensor(context: dg.SensorEvaluationContext, ledger: RunLedger):
        now = clock()
        alerts = Alerts.from_environment(ledger, now=now, log=context.log)
        reclaims = reclaim_leases(ledger, now)
        for item in reclaims:
            alerts.emit(ALERT_KIND, entry_subject(item.entry_id), **item.as_json())
            _stop_dagster_retries(context.instance, item.run_id)
        stranded = sweep_stranded(ledger, context.instance, now)
        for swept in stranded:
            alerts.emit(STRANDED_KIND, entry_subject(swept.entry.id), **swept.as_json())
        # After the tick's own work: this tick's alerts, then every channel's due retries.
        attempts = alerts.deliver(retry=True)
        said = f"reclaimed {len(reclaims)} expired lease(s)" if reclaims else "no expired leases"
        if stranded:
            said += f"; {len(stranded)} stranded launch(es) recorded as dispatch_failed"
        return dg.SkipReason(said + delivery_summary(attempts))

    return lease_reclaim_sensor


def delivery_summary(attempts: list[DeliveryRecord]) -> str:
    """``; alert deliveries: 2 delivered, 1 failed`` (empty when nothing was attempted)."""
    if not attempts:
        return ""
    delivered = sum(1 for a in attempts if a.status == DELIVERY_DELIVERED)
    failed = len(attempts) - delivered
    return f"; alert deliveries: {delivered} delivered, {failed} failed"


def _stop_dagster_retries(instance: dg.DagsterInstance, run_id: str | None) -> None:
    """If the reclaimed run is still alive in Dagster and fails later, Dagster's run retries
    must not relaunch it: its retry could only be refused by the ledger. Best effort."""
    if not run_id:
        return
    try:
        run = instance.get_run_by_id(run_id)
        if run is not None and not run.is_finished:
            instance.add_run_tags(run_id, {t.DAGSTER_MAX_RETRIES: "0"})
    except Exception:  # the ledger already holds the truth; this only avoids a no-op run
        return
