"""Manual retry of a failed ledger entry (DESIGN rule 4), from the CLI or the Dagster UI.

Three parts:

- **Pure checks** (`resources/core/retry_rules.py`): which rules a retry request passes,
  every one evaluated so the audit record shows them all.
- **One transaction** (`record_retry`): lock the parent row, re-decide the checks, and
  either write the refusal to the audit, or stamp the parent (``manual_retry_at/by``),
  create the child entry (trigger ``manual_retry``, dedup key ``retry:<parent>``) and write
  the audit record. Two concurrent retries of one parent serialise on the row lock
  (PostgreSQL ``SELECT ... FOR UPDATE``; SQLite ``BEGIN IMMEDIATE``): the second sees the
  stamp and is refused. The stamp is also a compare-and-set and the child's dedup key is
  unique, so even a broken lock could not make two children.
- **The launch** (`launch_retry`): after the commit, a Dagster *re-execution* of the
  parent's last run, through Dagster's GraphQL mutation ``launchRunReexecution`` — the same
  one the UI's "Re-execute" button sends. The run gets ``dagster/parent_run_id``/
  ``root_run_id`` from Dagster and the dueledger tags from us; it is queued, not waited for.
  When the parent has no Dagster run left to re-execute, a new run of the task's job is
  launched instead (``dagster job launch``, as ``dueledger launch`` does) with the lineage
  tags set by hand (see docs/operators.md for exactly what differs). Both go through the
  shared launch path, ``orchestration/services/launch.py``.

A re-execution started from the Dagster UI goes through ``record_retry`` too, at claim time,
as operator ``dagster-ui`` (``orchestration/services/reexecution.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from orchestration.retry import (
    ACTION_MANUAL_RETRY,
    ACTION_RETRY_LAUNCH,
    ACTION_RETRY_REDISPATCH,
    CHECK_CHILD_REDISPATCHABLE,
    CHECK_NOT_RETRIED,
    LAUNCH_NEW_RUN,
    LAUNCH_REEXECUTION,
    RETRYABLE_STATUSES,
    checks_json,
    evaluate_child_redispatch,
    evaluate_retry,
    first_failure,
    refusal_message,
)
from orchestration.services.launch import Launcher, LaunchFailed, retry_run_id
from orchestration.task_spec import TaskSpec, find_task, task_run_tags
from resources.core import tags as t
from resources.core.due import format_due
from resources.core.entry import Status, Trigger
from resources.core.errors import InvalidInput, Refused
from resources.core.operators import (
    Decision,
    Operators,
)
from resources.ledger import Entry, Ledger, dedup_key_for_retry

if TYPE_CHECKING:
    import dagster as dg

# --- the transaction ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryRecord:
    """A committed manual retry: the parent as it was, the new child, the audit record."""

    parent: Entry
    child: Entry
    checks: tuple[Decision, ...]
    audit_id: int
    operator: str
    reason: str


def record_retry(
    ledger: Ledger,
    parent_id: int,
    *,
    specs: Sequence[TaskSpec],
    operator: str,
    reason: str,
    operators: Operators,
    acknowledge_side_effects: bool = False,
    action: str = ACTION_MANUAL_RETRY,
    context: str = "",
    unregistered: str | None = None,
    now: datetime | None = None,
) -> RetryRecord:
    """Decide and record a manual retry of ``parent_id`` in one ledger transaction.

    Raises InvalidInput (no such entry) or Refused (a rule refused); both are audited, and
    nothing else is written. ``specs`` is the task registry as it is now. ``context`` is
    appended to the audit outcome (e.g. which Dagster run asked). ``unregistered`` says why
    the parent's task is not registered, when it is not (see :func:`retry_entry`).
    """
    suffix = f" ({context})" if context else ""
    refused: tuple[Decision, int] | None = None
    record: RetryRecord | None = None
    with ledger.transaction() as conn:
        parent = ledger.get(parent_id, connection=conn, for_update=True)
        if parent is None:
            audit_id = ledger.write_audit(
                operator=operator,
                action=action,
                entry_id=parent_id,
                reason=reason,
                checks=[{"check": "entry_exists", "passed": False, "detail": "no such entry"}],
                outcome=f"invalid: ledger entry {parent_id} does not exist{suffix}",
                now=now,
                connection=conn,
            )
        else:
            spec = find_task(specs, parent.task_key)
            checks = evaluate_retry(
                parent,
                spec,
                operator=operator,
                operators=operators,
                acknowledge_side_effects=acknowledge_side_effects,
                unregistered=unregistered,
            )
            failed = first_failure(checks)
            stamped = failed is None and ledger.mark_manual_retry(
                parent.id,
                operator=operator,
                statuses=RETRYABLE_STATUSES,
                now=now,
                connection=conn,
            )
            if failed is None and not stamped:
                # Unreachable under the row lock; the compare-and-set keeps it honest anyway.
                failed = Decision(CHECK_NOT_RETRIED, False, "another retry stamped it first")
                checks = (*checks, failed)
            if failed is not None:
                audit_id = ledger.write_audit(
                    operator=operator,
                    action=action,
                    entry_id=parent.id,
                    reason=reason,
                    checks=checks_json(checks),
                    outcome=f"refused: {failed.name}: {failed.detail}{suffix}",
                    now=now,
                    connection=conn,
                )
                refused = (failed, audit_id)
            else:
                assert spec is not None  # task_registered passed
                child = ledger.ensure_entry(
                    task_key=parent.task_key,
                    trigger=Trigger.MANUAL_RETRY,
                    dedup_key=dedup_key_for_retry(parent.id),
                    due=parent.due,
                    max_attempts=spec.max_attempts,
                    operator=operator,
                    reason=reason,
                    parent_id=parent.id,
                    now=now,
                    connection=conn,
                )
                audit_id = ledger.write_audit(
                    operator=operator,
                    action=action,
                    entry_id=parent.id,
                    child_entry_id=child.id,
                    reason=reason,
                    checks=checks_json(checks),
                    outcome=f"allowed: created child entry {child.id}{suffix}",
                    now=now,
                    connection=conn,
                )
                record = RetryRecord(parent, child, checks, audit_id, operator, reason)
    # Raised only after the commit: the refusal's audit record must survive it.
    if record is not None:
        return record
    if refused is not None:
        raise Refused(refusal_message(*refused))
    raise InvalidInput(
        f"ledger entry {parent_id} does not exist (list entries with `dueledger runs list`)"
    )


def audit_operator_refusal(
    ledger: Ledger,
    decision: Decision,
    *,
    operator: str,
    action: str,
    entry_id: int | None = None,
    reason: str | None = None,
) -> Refused:
    """Audit a role refusal (exit 3) and return the exception to raise."""
    audit_id = ledger.write_audit(
        operator=operator,
        action=action,
        entry_id=entry_id,
        reason=reason,
        checks=checks_json([decision]),
        outcome=f"refused: {decision.name}: {decision.detail}",
    )
    return Refused(refusal_message(decision, audit_id))


# --- the launch --------------------------------------------------------------------------------


def retry_run_tags(record: RetryRecord, spec: TaskSpec) -> dict[str, str]:
    """The tags of a retry's run: dueledger's, plus the job's run tags.

    Dagster copies the parent run's tags onto a re-execution but not the job's run tags
    (``define_asset_job(run_tags=...)``), so those are set here as the factory sets them.
    """
    tags = {
        **task_run_tags(spec),
        t.TAG_TRIGGER: Trigger.MANUAL_RETRY.value,
        t.TAG_PARENT_ENTRY: str(record.parent.id),
        t.TAG_OPERATOR: record.operator,
        t.TAG_REASON: record.reason,
        # The child's own attempt budget (equal to the task's unless it was changed since).
        t.DAGSTER_MAX_RETRIES: str(record.child.max_attempts - 1),
    }
    if record.parent.due is not None:
        # The retry computes "as of" the parent's due, like the parent did.
        tags[t.TAG_DUE] = format_due(record.parent.due)
    return tags


@dataclass(frozen=True)
class RetryResult:
    record: RetryRecord
    run_id: str
    method: str
    parent_run_id: str | None
    root_run_id: str | None
    run_status: str
    launch_audit_id: int
    #: The retry had been recorded before but its launch failed (the child was
    #: dispatch_failed): this request re-dispatched that child instead of a new retry.
    redispatched: bool = False

    def as_json(self) -> dict[str, object]:
        record = self.record
        return {
            "entry_id": record.child.id,
            "run_id": self.run_id,
            "parent_entry_id": record.parent.id,
            "parent_run_id": self.parent_run_id,
            "root_run_id": self.root_run_id,
            "launch": self.method,
            "run_status": self.run_status,
            "task_key": record.child.task_key,
            "operator": record.operator,
            "reason": record.reason,
            "audit_id": record.audit_id,
            "launch_audit_id": self.launch_audit_id,
            "checks": checks_json(record.checks),
            "redispatched": self.redispatched,
        }


def launch_retry(
    record: RetryRecord,
    spec: TaskSpec,
    *,
    ledger: Ledger,
    instance: dg.DagsterInstance,
    launcher: Launcher,
) -> RetryResult:
    """Start the Dagster run of a recorded retry and return at once (no waiting).

    A launch failure marks the child ``dispatch_failed`` (audited) and raises LaunchFailed;
    the parent stays retried, so the next step is a retry of the child.
    """
    parent_run = None
    for run_id in reversed(record.parent.run_ids):
        parent_run = instance.get_run_by_id(run_id)
        if parent_run is not None:
            break
    tags = retry_run_tags(record, spec)
    try:
        if parent_run is not None:
            method = LAUNCH_REEXECUTION
            parent_run_id: str | None = parent_run.run_id
            root_run_id: str | None = parent_run.root_run_id or parent_run.run_id
            run_id = launcher.reexecute(parent_run.run_id, tags)
        else:
            method = LAUNCH_NEW_RUN
            parent_run_id = record.parent.run_ids[-1] if record.parent.run_ids else None
            root_run_id = parent_run_id
            if parent_run_id is not None:
                # The parent's run is gone from Dagster: link it by tags only.
                tags[t.DAGSTER_PARENT_RUN_ID] = parent_run_id
                tags[t.DAGSTER_ROOT_RUN_ID] = parent_run_id
            run_id = launcher.launch_new(spec.job_name, retry_run_id(record.child.id), tags)
    except LaunchFailed as exc:
        ledger.record_dispatch_failure(record.child.id, error=str(exc))
        ledger.write_audit(
            operator=record.operator,
            action=ACTION_RETRY_LAUNCH,
            entry_id=record.parent.id,
            child_entry_id=record.child.id,
            reason=record.reason,
            outcome=f"dispatch_failed: {exc}",
        )
        raise LaunchFailed(
            f"retry recorded as entry {record.child.id}, but its run could not be launched "
            f"({exc}); the entry is now dispatch_failed. Fix the cause, then repeat "
            f"`dueledger runs retry {record.parent.id}`: it re-dispatches entry "
            f"{record.child.id}"
        ) from exc
    run = instance.get_run_by_id(run_id)
    status = run.status.value if run is not None else "UNKNOWN"
    if method == LAUNCH_REEXECUTION:
        described = f"re-execution of run {parent_run_id}"
    else:
        linked = f" linked to {parent_run_id}" if parent_run_id else ""
        described = f"new run of {spec.job_name}{linked}"
    launch_audit_id = ledger.write_audit(
        operator=record.operator,
        action=ACTION_RETRY_LAUNCH,
        entry_id=record.parent.id,
        child_entry_id=record.child.id,
        reason=record.reason,
        checks={"launch": method, "parent_run_id": parent_run_id, "run_id": run_id},
        outcome=f"launched: run {run_id} ({described}), {status}",
    )
    return RetryResult(record, run_id, method, parent_run_id, root_run_id, status, launch_audit_id)


def recorded_source(instance: dg.DagsterInstance, entry: Entry) -> str | None:
    """The ``dueledger/source`` (``plugin:<name>``) the entry's runs carried, newest run
    first; None when none did (a core task, or its runs are gone from Dagster)."""
    for run_id in reversed(entry.run_ids):
        run = instance.get_run_by_id(run_id)
        if run is not None and run.tags.get(t.TAG_SOURCE):
            return run.tags[t.TAG_SOURCE]
    return None


#: Why a task is not registered: (task key, the source its runs recorded) -> a sentence.
ExplainUnregistered = Callable[[str, str | None], str]


def retry_entry(
    ledger: Ledger,
    parent_id: int,
    *,
    specs: Sequence[TaskSpec],
    operator: str,
    reason: str,
    operators: Operators,
    acknowledge_side_effects: bool,
    instance: dg.DagsterInstance,
    launcher: Launcher,
    explain_unregistered: ExplainUnregistered | None = None,
    now: datetime | None = None,
) -> RetryResult:
    """`dueledger runs retry`: record the retry (one transaction), then launch its run.

    When the parent's task is no longer registered, ``explain_unregistered`` words the
    refusal (e.g. naming the plugin the task came from, read off its runs' tags).
    """
    unregistered = None
    parent = ledger.get(parent_id)
    child = _dispatch_failed_child(ledger, parent)
    if child is not None:
        assert parent is not None
        return redispatch_retry(
            ledger,
            parent,
            child,
            specs=specs,
            operator=operator,
            reason=reason,
            operators=operators,
            instance=instance,
            launcher=launcher,
            now=now,
        )
    if (
        explain_unregistered is not None
        and parent is not None
        and find_task(specs, parent.task_key) is None
    ):
        unregistered = explain_unregistered(parent.task_key, recorded_source(instance, parent))
    record = record_retry(
        ledger,
        parent_id,
        specs=specs,
        operator=operator,
        reason=reason,
        operators=operators,
        acknowledge_side_effects=acknowledge_side_effects,
        unregistered=unregistered,
        now=now,
    )
    spec = find_task(specs, record.child.task_key)
    assert spec is not None  # checked inside the transaction
    return launch_retry(record, spec, ledger=ledger, instance=instance, launcher=launcher)


def _dispatch_failed_child(ledger: Ledger, parent: Entry | None) -> Entry | None:
    """The retry child of ``parent`` when its launch failed (``dispatch_failed``), else None."""
    if parent is None or parent.manual_retry_at is None:
        return None
    child = ledger.find(parent.task_key, dedup_key_for_retry(parent.id))
    return child if child is not None and child.status == Status.DISPATCH_FAILED else None


def redispatch_retry(
    ledger: Ledger,
    parent: Entry,
    child: Entry,
    *,
    specs: Sequence[TaskSpec],
    operator: str,
    reason: str,
    operators: Operators,
    instance: dg.DagsterInstance,
    launcher: Launcher,
    now: datetime | None = None,
) -> RetryResult:
    """`dueledger runs retry PARENT` again, after the retry's launch failed: the same request,
    so the recorded child is re-dispatched (``dispatch_failed -> queued``, its earlier errors
    kept) and launched -- no second child, and nothing to acknowledge, since no run of the
    child ever claimed it (DESIGN rule 5). The retrier role, the task's registration and its
    manual trigger are checked as for a retry (``evaluate_child_redispatch``). Audited
    either way."""
    who = f"entry {child.id} (retry of entry {parent.id})"
    spec = find_task(specs, child.task_key)
    checks = evaluate_child_redispatch(parent, child, spec, operator=operator, operators=operators)
    failed = first_failure(checks)
    if failed is None and not ledger.redispatch(child.id, now=now):
        failed = Decision(
            CHECK_CHILD_REDISPATCHABLE, False, f"{who} changed meanwhile; nothing launched"
        )
        checks.append(failed)
    audit_id = ledger.write_audit(
        operator=operator,
        action=ACTION_RETRY_REDISPATCH,
        entry_id=parent.id,
        child_entry_id=child.id,
        reason=reason,
        checks=checks_json(checks),
        outcome=(
            f"refused: {failed.name}: {failed.detail}"
            if failed is not None
            else f"allowed: re-dispatched child entry {child.id} (dispatch_failed -> queued)"
        ),
        now=now,
    )
    if failed is not None:
        raise Refused(refusal_message(failed, audit_id))
    assert spec is not None  # task_registered passed
    # The run carries the retry as it was recorded: its operator and reason.
    record = RetryRecord(
        parent,
        child,
        tuple(checks),
        audit_id,
        child.operator or operator,
        child.reason or reason,
    )
    result = launch_retry(record, spec, ledger=ledger, instance=instance, launcher=launcher)
    return dataclasses.replace(result, redispatched=True)
