"""``<task>_catch_up_sensor`` (``catch_up`` tasks): launches each missed due inside the
task's ``catch_up_window``, once each (the gap audit itself is orchestration/services/audit.py).

``run_key`` = the due: Dagster's sensor run-key dedup (kept forever) and the run it creates
— which the next audit sees — make a due launched once, however often the sensor runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import dagster as dg

from orchestration.registry import CATCH_UP, TaskView, partition_key_for
from orchestration.services.alerts import Clock
from orchestration.services.audit import MAX_CATCH_UP_PER_TICK, audit_task
from resources.core import tags as t
from resources.core.due import Due
from resources.ledger import RunLedger


def due_run_request(view: TaskView, due: Due | datetime, run_key: str) -> dg.RunRequest:
    """A sensor's request for the task's run of ``due``: tagged like the scheduled run
    (same ledger key ``due:<due>``, same partition) but ``dueledger/trigger=sensor``."""
    due = Due.coerce(due)
    tags = {
        t.TAG_TASK: view.spec.key,
        t.TAG_TRIGGER: t.TRIGGER_SENSOR,
        t.TAG_DUE: due.text,
    }
    partition_key = partition_key_for(view.spec, due)
    if partition_key is not None:
        tags[t.DAGSTER_PARTITION] = partition_key
    return dg.RunRequest(run_key=run_key, tags=tags, partition_key=partition_key)


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
    if spec.missed_slot_policy != CATCH_UP or spec.catch_up_window is None:
        raise ValueError(f"task {spec.key!r} is not a catch_up task; it has no catch-up sensor")
    window = spec.catch_up_window

    @dg.sensor(
        name=f"{spec.key}_catch_up_sensor",
        job_name=spec.job_name,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            f"Launches missed dues of {spec.key} within its catch-up window "
            f"({window}), run_key = the due, once each."
        ),
    )
    def _catch_up(context: dg.SensorEvaluationContext, ledger: RunLedger):
        now = clock()
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
