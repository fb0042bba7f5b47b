"""Ending the ledger entry of a run whose task is not registered (``unsupported_task``).

One rule, two callers: the run path (``orchestration/task_run.py``), when a run
that did start carries a ``dueledger/task`` the code location does not declare, and the outcome
sensor (``sensors/outcomes.py``), when Dagster ended a run of such a task before it could start --
a queued run whose job left the code location with its plugin -- or an entry waits in
``retrying`` for a retry that can no longer run. Either way the entry ends ``failed`` with
kind ``unsupported_task``, whatever attempts it had left, with one alert; never retried.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from orchestration.services.alerts import deliver_alert
from orchestration.task_spec import TaskSpec
from resources.core import tags as t
from resources.core.alerting import entry_subject
from resources.core.due import Due
from resources.core.entry import Entry, FailureKind, Status
from resources.ledger import Ledger

#: Lease an unsupported entry is held with between its claim and its failure (an instant).
UNSUPPORTED_LEASE: Final = timedelta(minutes=5)


def unsupported_message(
    task_key: str, run_id: str, why: str, registered: Sequence[TaskSpec], *, started: bool
) -> str:
    """The entry's error: which run, why the task is unsupported, and what to do instead."""
    did = "did nothing" if started else "never started the task"
    return (
        f"run {run_id} ({t.TAG_TASK}={task_key}) is unsupported, its task is not registered "
        f"in this code location: {why}. The run {did} and "
        f"is not retried. Registered tasks: {', '.join(s.key for s in registered)}; to run "
        f"the work, launch the task under its current key (`dueledger launch TASK ...`)."
    )


@dataclass(frozen=True)
class UnsupportedEnd:
    """What :func:`end_unsupported` did: the entry afterwards, the entry as this run claimed
    it (None: the claim was refused), and whether this call ended it (and alerted)."""

    entry: Entry
    claimed: Entry | None
    ended: bool
    refusal: str | None = None


def end_unsupported(
    ledger: Ledger,
    *,
    task_key: str,
    trigger: str,
    dedup_key: str,
    run_id: str,
    message: str,
    log: Any | None,
    due: Due | None = None,
    operator: str | None = None,
    reason: str | None = None,
    parent_id: int | None = None,
    source: str | None = None,
    now: datetime | None = None,
    alert: bool = True,
) -> UnsupportedEnd:
    """End the entry ``(task_key, dedup_key)`` ``failed``/``unsupported_task`` for ``run_id``.

    The entry is created when it does not exist (one attempt), claimed by ``run_id`` (the
    run that carried the task; re-entrant when it already owns the entry) and failed with
    ``message``. Only the call that ends it raises the alert (written and delivered at once;
    ``alert=False``: the caller raises it, as the outcome sensor does with the rest of its
    tick's alerts, from :func:`unsupported_alert`), so evaluating the same run again changes
    nothing and alerts nothing: a terminal entry refuses the claim, and the refusal is
    recorded in its ``late_job_rejections`` as for any late run.
    """
    entry = ledger.ensure_entry(
        task_key=task_key,
        trigger=trigger,
        dedup_key=dedup_key,
        due=due,
        max_attempts=1,
        operator=operator,
        reason=reason,
        parent_id=parent_id,
        now=now,
    )
    claim = ledger.claim(entry.id, run_id, lease_ttl=UNSUPPORTED_LEASE, now=now)
    if not claim.claimed:
        return UnsupportedEnd(claim.entry, None, False, claim.reason)
    # unsupported_task is final in the ledger, whatever attempts the entry has left.
    after = ledger.fail(entry.id, run_id, error=message, kind=FailureKind.UNSUPPORTED_TASK, now=now)
    ended = after.status == Status.FAILED and after.failure_kind == FailureKind.UNSUPPORTED_TASK
    if ended and alert:
        kind, fields = unsupported_alert(after, run_id, source=source)
        deliver_alert(ledger, log, kind, entry_subject(after.id), **fields)
    return UnsupportedEnd(after, claim.entry, ended)


def unsupported_alert(
    entry: Entry, run_id: str, *, source: str | None = None
) -> tuple[str, dict[str, Any]]:
    """The alert of an entry ended ``unsupported_task`` for ``run_id``: (kind, fields)."""
    fields: dict[str, Any] = {
        "task_key": entry.task_key,
        "entry_id": entry.id,
        "run_id": run_id,
        "trigger": entry.trigger,
        "dedup_key": entry.dedup_key,
        "status": entry.status,
    }
    if source:
        fields["source"] = source
    fields["message"] = entry.error
    return FailureKind.UNSUPPORTED_TASK, fields
