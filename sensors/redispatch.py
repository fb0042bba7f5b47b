"""``<task>_redispatch_sensor``: re-dispatches a task's ``dispatch_failed`` scheduled due
within its own slot (DESIGN rule 5; the plan and its run keys: ``resources/core/redispatch.py``).
"""

from __future__ import annotations

from datetime import datetime

import dagster as dg

from orchestration.services.dagster_runs import last_dispatch_failure_canceled
from resources.core.due import floor_to_slot, format_due
from resources.core.instants import Clock, utc_now
from resources.core.redispatch import (
    DEFAULT_MAX_REDISPATCHES,
    MAX_REDISPATCHES_LIMIT,
    plan_redispatch,
    redispatch_interval_seconds,
    redispatch_run_key,
)
from resources.core.registry import TaskView
from resources.ledger import MAX_DISPATCH_FAILURES, RunLedger, dedup_key_for_due
from sensors.support import due_run_request, ledger_sensor


def build_redispatch_sensor(
    view: TaskView,
    *,
    clock: Clock = utc_now,
    max_redispatches: int = DEFAULT_MAX_REDISPATCHES,
    minimum_interval_seconds: int | None = None,
) -> dg.SensorDefinition:
    """``<task>_redispatch_sensor``: re-dispatches the current slot's ``dispatch_failed``
    entry of one task, at most ``max_redispatches`` times per slot, evaluated every
    ``minimum_interval_seconds`` (default :func:`redispatch_interval_seconds` of the slot).

    One sensor per task, not one for all: Dagster looks a sensor's run keys up per sensor
    (``dagster/sensor_name`` and ``dagster/run_key``, whatever job a run is for), so two
    tasks re-dispatching the same due from one sensor would share ``<due>#redispatch-<n>``
    and the second run would never be created (docs/operations.md)."""
    if not 0 <= max_redispatches <= MAX_REDISPATCHES_LIMIT:
        raise ValueError(
            f"max_redispatches={max_redispatches} must be in 0..{MAX_REDISPATCHES_LIMIT} "
            f"(the ledger keeps the newest {MAX_DISPATCH_FAILURES} dispatch failures)"
        )
    spec = view.spec
    if minimum_interval_seconds is None:
        minimum_interval_seconds = redispatch_interval_seconds(view.slot_minutes)

    @ledger_sensor(
        f"{spec.key}_redispatch_sensor",
        job_name=spec.job_name,
        clock=clock,
        minimum_interval_seconds=minimum_interval_seconds,
        description=(
            f"Re-dispatches {spec.key}'s dispatch_failed entry within its own slot, at most "
            f"{max_redispatches} times; run_key <due>#redispatch-<n>."
        ),
    )
    def _redispatch(context: dg.SensorEvaluationContext, ledger: RunLedger, now: datetime):
        due = floor_to_slot(now, view.slot_minutes)
        entry = ledger.find(spec.key, dedup_key_for_due(due))
        canceled = entry is not None and last_dispatch_failure_canceled(context.instance, entry)
        plan = plan_redispatch(entry, max_redispatches, last_failure_canceled=canceled)
        if plan.number is None or entry is None:
            return dg.SkipReason(f"{spec.key}@{format_due(due)}: {plan.reason}")
        if plan.compare_and_set and not ledger.redispatch(entry.id, now=now):
            return dg.SkipReason(f"{spec.key}@{format_due(due)}: entry changed meanwhile")
        context.log.info(f"{spec.key}@{format_due(due)} entry {entry.id}: {plan.reason}")
        return due_run_request(view, due, redispatch_run_key(due, plan.number))

    return _redispatch
