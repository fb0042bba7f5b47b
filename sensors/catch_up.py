"""``<task>_catch_up_sensor`` (``catch_up`` tasks): launches each missed due inside the
task's ``catch_up_window``, once each (which due is missed: orchestration/missed_dues.py).

``run_key`` = the due: Dagster's sensor run-key dedup (kept forever) and the run it creates
— which the next audit sees — make a due launched once, however often the sensor runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import dagster as dg

from orchestration.missed_dues import MAX_CATCH_UP_PER_TICK, audit_task
from orchestration.task_spec import MissedSlotPolicy, TaskView
from resources.core.due import Due
from resources.core.instants import Clock
from resources.ledger import RunLedger
from sensors.support import due_run_request, ledger_sensor


def catch_up_run_requests(view: TaskView, missed: Sequence[datetime]) -> list[dg.RunRequest]:
    """One RunRequest per missed due, oldest first, run_key = the due (at most
    MAX_CATCH_UP_PER_TICK; the next evaluation continues)."""
    return [
        due_run_request(view, due, due.text)
        for due in sorted(Due.coerce(d) for d in missed)[:MAX_CATCH_UP_PER_TICK]
    ]


def build_catch_up_sensor(
    view: TaskView, *, clock: Clock, minimum_interval_seconds: int = 60
) -> dg.SensorDefinition:
    """``<task>_catch_up_sensor`` for a ``catch_up`` task: launches its missed dues that lie
    inside its ``catch_up_window`` (and after its first recorded run), once each."""
    spec = view.spec
    if spec.missed_slot_policy != MissedSlotPolicy.CATCH_UP or spec.catch_up_window is None:
        raise ValueError(f"task {spec.key!r} is not a catch_up task; it has no catch-up sensor")
    window = spec.catch_up_window

    @ledger_sensor(
        f"{spec.key}_catch_up_sensor",
        job_name=spec.job_name,
        clock=clock,
        minimum_interval_seconds=minimum_interval_seconds,
        description=(
            f"Launches missed dues of {spec.key} within its catch-up window "
            f"({window}), run_key = the due, once each."
        ),
    )
    def _catch_up(context: dg.SensorEvaluationContext, ledger: RunLedger, now: datetime):
        audit = audit_task(view, ledger, now, window=window, instance=context.instance)
        requests = catch_up_run_requests(view, audit.missed)
        if not requests:
            return dg.SkipReason(f"{spec.key}: no missed dues in the last {window}")
        context.log.info(
            f"{spec.key}: catching up {len(requests)} of {len(audit.missed)} missed dues: "
            + ", ".join(r.run_key or "" for r in requests)
        )
        return requests

    return _catch_up
