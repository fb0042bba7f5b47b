"""The waiters duty (``waiter_duty``, run by ``ledger_sensor``): launches the run of a due that
waited for its turn without one.

Under overlap ``buffer_one``, a due whose tick finds its task at work is written ``queued``,
held, and no run is requested (``orchestration/overlap.py``, ``decide_at_tick``): nothing holds
a run worker while the task runs. This duty asks the ledger for the first held due of each task
that is free now (``released_waiters``) and requests its run, with run key
``<task>@<due>#waiter``: a tick that asks again before the run claims gets the same key, and
Dagster finds the run it made. A waiter whose due lies in a pause of its task
is written ``skipped`` with the pause's reason instead (``skip_paused_due``, the claim's own
decision), so no run starts only to skip itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import dagster as dg

from orchestration.overlap import released_waiters
from orchestration.pause import skip_paused_due
from orchestration.task_spec import TaskView
from resources.core.due import Due
from resources.core.entry import Status
from resources.ledger import RunLedger
from sensors.support import Duty, DutyContext, due_run_request


def waiter_duty(views: Sequence[TaskView]) -> Duty:
    """Waiters: each task's first held due gets its run once the task is free. Every task of
    ``views`` is asked, not only those under ``buffer_one`` now: a due held before its task's
    policy changed still gets its run (its claim decides under the policy of the day)."""
    by_key = {v.spec.key: v for v in views}

    def release(context: DutyContext, ledger: RunLedger, now: datetime) -> dg.SensorResult:
        requests: list[dg.RunRequest] = []
        said: list[str] = []
        for entry in released_waiters(ledger, list(by_key), now=now):
            view = by_key[entry.task_key]
            assert entry.due is not None  # a waiter held at its tick is a due's entry
            due = Due.coerce(entry.due)
            where = f"{entry.task_key}@{due} entry {entry.id}"
            skipped = skip_paused_due(ledger, entry, now)
            if skipped is not None and skipped.status == Status.SKIPPED:
                said.append(f"{where}: skipped ({skipped.error})")
                continue
            context.log.info(f"{where}: the task is free, launching the waiter's run")
            said.append(f"{where}: launched")
            requests.append(
                due_run_request(
                    view, due, due.waiter_run_key(view.spec.key), job_name=view.spec.job_name
                )
            )
        reason = "; ".join(said) if said else "no waiter to launch"
        return dg.SensorResult(run_requests=requests, skip_reason=None if requests else reason)

    return Duty(
        "waiters",
        release,
        "Launches the run of each buffer_one due that waited for its turn without a run, once "
        "its task is free; run_key <task>@<due>#waiter.",
    )
