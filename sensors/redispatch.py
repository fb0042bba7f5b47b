"""``redispatch_sensor``: re-dispatches every task's ``dispatch_failed`` scheduled due within
its own slot (the plan and its run keys: ``resources/core/redispatch.py``).

One sensor for all tasks, so its cost follows the entries that need a re-dispatch, not the
number of tasks: each evaluation reads the current slot's ``dispatch_failed`` and ``queued``
entries by index (``RunLedger.entries_of_due``) and plans each one. Dagster looks a sensor's
run keys up by sensor name only (``fetch_existing_runs`` in ``dagster/_daemon/sensor.py``),
so when the sensor targets several task jobs its keys carry the task:
``<task>@<due>#redispatch-<n>``; the ledger's dedup key stays ``due:<due>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import dagster as dg

from orchestration.services.dagster_runs import last_dispatch_failure_canceled
from orchestration.task_defs import task_job
from orchestration.task_spec import TaskView
from resources.core.due import Due
from resources.core.entry import MAX_DISPATCH_FAILURES, Status
from resources.core.instants import Clock, utc_now
from resources.core.redispatch import (
    DEFAULT_MAX_REDISPATCHES,
    MAX_REDISPATCHES_LIMIT,
    REDISPATCH_STATUSES,
    plan_redispatch,
    redispatch_interval_seconds,
    redispatch_run_key,
)
from resources.ledger import RunLedger
from sensors.support import Duty, DutyContext, due_run_request, duty_sensor

SENSOR_NAME = "redispatch_sensor"
#: Entries a skip reason names one by one; the rest are counted.
_NAMED_IN_SKIP = 5


def build_redispatch_sensor(
    views: Sequence[TaskView],
    *,
    clock: Clock = utc_now,
    max_redispatches: int = DEFAULT_MAX_REDISPATCHES,
    minimum_interval_seconds: int | None = None,
) -> dg.SensorDefinition:
    """``redispatch_sensor``: the re-dispatch duty alone, as a sensor of its own, evaluated
    every ``minimum_interval_seconds`` (default :func:`redispatch_interval_seconds` of the
    slot)."""
    duty = redispatch_duty(views, max_redispatches=max_redispatches)
    if minimum_interval_seconds is None:
        minimum_interval_seconds = redispatch_interval_seconds(min(v.slot_minutes for v in views))
    return duty_sensor(
        SENSOR_NAME,
        duty,
        clock=clock,
        minimum_interval_seconds=minimum_interval_seconds,
        jobs=[task_job(v) for v in views],
    )


def redispatch_duty(
    views: Sequence[TaskView], *, max_redispatches: int = DEFAULT_MAX_REDISPATCHES
) -> Duty:
    """Re-dispatch: the current slot's ``dispatch_failed`` entries of the tasks of ``views``,
    each at most ``max_redispatches`` times per slot. The sensor that runs it targets the
    task jobs of ``views``.

    Its run keys are ``<task>@<due>#redispatch-<n>`` when it targets several task jobs and
    ``<due>#redispatch-<n>`` when it targets one (docs/operations.md)."""
    if not 0 <= max_redispatches <= MAX_REDISPATCHES_LIMIT:
        raise ValueError(
            f"max_redispatches={max_redispatches} must be in 0..{MAX_REDISPATCHES_LIMIT} "
            f"(the ledger keeps the newest {MAX_DISPATCH_FAILURES} dispatch failures)"
        )
    if not views:
        raise ValueError("a re-dispatch sensor needs at least one task")
    by_key = {v.spec.key: v for v in views}
    slots = sorted({v.slot_minutes for v in views})
    qualify = len(by_key) > 1

    description = (
        "Re-dispatches each task's dispatch_failed entry within its own slot, at most "
        f"{max_redispatches} times; run_key "
        + ("<task>@<due>#redispatch-<n>." if qualify else "<due>#redispatch-<n>.")
    )

    def redispatch(context: DutyContext, ledger: RunLedger, now: datetime) -> dg.SensorResult:
        requests: list[dg.RunRequest] = []
        skipped: list[str] = []
        for slot_minutes in slots:
            due = Due.of_slot(now, slot_minutes)
            for entry in ledger.entries_of_due(due, REDISPATCH_STATUSES):
                view = by_key.get(entry.task_key)
                if view is None or view.slot_minutes != slot_minutes:
                    continue  # not this location's task: the outcome sensor ends its entries
                where = f"{entry.task_key}@{due}"
                canceled = entry.status == Status.DISPATCH_FAILED and (
                    last_dispatch_failure_canceled(context.instance, entry)
                )
                plan = plan_redispatch(entry, max_redispatches, last_failure_canceled=canceled)
                if plan.number is None:
                    skipped.append(f"{where}: {plan.reason}")
                    continue
                if plan.compare_and_set and not ledger.redispatch(entry.id, now=now):
                    skipped.append(f"{where}: entry changed meanwhile")
                    continue
                context.log.info(f"{where} entry {entry.id}: {plan.reason}")
                key = view.spec.key if qualify else None
                requests.append(
                    due_run_request(
                        view,
                        due,
                        redispatch_run_key(due, plan.number, key),
                        job_name=view.spec.job_name,
                    )
                )
        if requests:
            return dg.SensorResult(run_requests=requests)
        return dg.SensorResult(skip_reason=_skip_reason(now, slots, skipped))

    return Duty("redispatch", redispatch, description)


def _skip_reason(now: datetime, slots: Sequence[int], skipped: Sequence[str]) -> str:
    if not skipped:
        dues = ", ".join(str(Due.of_slot(now, m)) for m in slots)
        return f"no entry of this slot's due ({dues}) to re-dispatch"
    named = "; ".join(skipped[:_NAMED_IN_SKIP])
    more = len(skipped) - _NAMED_IN_SKIP
    return named + (f"; and {more} more" if more > 0 else "")
