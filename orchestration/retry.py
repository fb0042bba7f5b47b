"""Manual retry of a failed ledger entry (DESIGN rule 4), from the CLI or the Dagster UI.

Three parts:

- **Pure checks** (`evaluate_retry`): which rules a retry request passes. Every check is
  evaluated (not only up to the first failure) so the audit record shows them all.
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

A re-execution started from the Dagster UI goes through ``record_retry`` too, at claim time
(``orchestration/runtime.py``), as operator ``dagster-ui``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

import dagster as dg

from orchestration.operators import (
    ROLE_ADMIN,
    ROLE_RETRIER,
    UI_OPERATOR,
    Decision,
    Operators,
    OperatorsFileError,
    operators_from_env,
)
from orchestration.registry import TaskSpec, find_task, task_run_tags
from orchestration.services.launch import Launcher, LaunchFailed, retry_run_id
from resources.core import tags as t
from resources.core.due import format_due
from resources.core.errors import InvalidInput, Refused
from resources.ledger import Entry, RunLedger, dedup_key_for_retry

ACTION_MANUAL_RETRY: Final = "manual_retry"
ACTION_UI_REEXECUTION: Final = "ui_reexecution"
ACTION_RETRY_LAUNCH: Final = "manual_retry_launch"
ACTION_RETRY_RUN: Final = "manual_retry_run"
ACTION_RETRY_REDISPATCH: Final = "manual_retry_redispatch"

#: Statuses a manual retry may start from. ``dispatch_failed`` only with acknowledgement.
RETRYABLE_STATUSES: Final = (t.STATUS_FAILED, t.STATUS_DISPATCH_FAILED)

CHECK_ROLE_RETRIER: Final = f"operator_has_role_{ROLE_RETRIER}"
CHECK_STATUS: Final = "parent_is_failed"
CHECK_NOT_RETRIED: Final = "parent_not_yet_retried"
CHECK_ACKNOWLEDGED: Final = "side_effects_acknowledged"
CHECK_ROLE_ADMIN: Final = f"operator_has_role_{ROLE_ADMIN}"
CHECK_REGISTERED: Final = "task_registered"
CHECK_MANUAL_TRIGGER: Final = "task_manually_triggerable"
CHECK_RECORDED: Final = "retry_recorded"
CHECK_CHILD_REDISPATCHABLE: Final = "child_redispatchable"

LAUNCH_REEXECUTION: Final = "reexecution"
LAUNCH_NEW_RUN: Final = "new_run"

# --- pure checks -----------------------------------------------------------------------------


def needs_acknowledgement(entry: Entry) -> bool:
    """A parent whose earlier run may have had side effects that nobody recorded."""
    return (
        entry.status == t.STATUS_DISPATCH_FAILED or entry.failure_kind == t.FAILURE_LEASE_RECLAIMED
    )


def evaluate_retry(
    parent: Entry,
    spec: TaskSpec | None,
    *,
    operator: str,
    operators: Operators,
    acknowledge_side_effects: bool,
    unregistered: str | None = None,
) -> tuple[Decision, ...]:
    """Every rule of a manual retry of ``parent`` by ``operator``, each with its result.

    ``spec`` is the task as registered *now* (None: no longer registered; ``unregistered``
    then says why, naming the plugin the task came from when that is known).
    """
    who = f"entry {parent.id} ({parent.task_key}, {parent.dedup_key})"
    checks = [operators.check(operator, ROLE_RETRIER)]
    state = parent.status + (f" ({parent.failure_kind})" if parent.failure_kind else "")
    checks.append(
        Decision(
            CHECK_STATUS,
            parent.status in RETRYABLE_STATUSES,
            f"{who} is {state}"
            + (
                ""
                if parent.status in RETRYABLE_STATUSES
                else "; only a failed (or, acknowledged, dispatch_failed) entry can be retried"
            ),
        )
    )
    if parent.manual_retry_at is None:
        checks.append(Decision(CHECK_NOT_RETRIED, True, f"{who} has not been retried"))
    else:
        checks.append(
            Decision(
                CHECK_NOT_RETRIED,
                False,
                f"{who} was already retried by {parent.manual_retry_by} at "
                f"{parent.manual_retry_at.strftime('%Y-%m-%dT%H:%M:%SZ')}; an entry is "
                f"retried at most once "
                f"(retry its child instead if that failed too)",
            )
        )
    if needs_acknowledgement(parent):
        why = (
            "its launch failed but a run may still have started"
            if parent.status == t.STATUS_DISPATCH_FAILED
            else "its lease was reclaimed while its run may have been doing side effects"
        )
        checks.append(
            Decision(
                CHECK_ACKNOWLEDGED,
                acknowledge_side_effects,
                f"{who}: {why}; "
                + (
                    "acknowledged with --acknowledge-side-effects"
                    if acknowledge_side_effects
                    else "check what it did, then retry with --acknowledge-side-effects"
                ),
            )
        )
        checks.append(operators.check(operator, ROLE_ADMIN))
    else:
        checks.append(Decision(CHECK_ACKNOWLEDGED, True, "no acknowledgement needed"))
    if spec is None:
        checks.append(
            Decision(
                CHECK_REGISTERED,
                False,
                unregistered
                or f"task {parent.task_key!r} is no longer registered in orchestration/tasks.py",
            )
        )
        checks.append(
            Decision(CHECK_MANUAL_TRIGGER, False, f"task {parent.task_key!r} is not registered")
        )
    else:
        checks.append(Decision(CHECK_REGISTERED, True, f"task {spec.key!r} is registered"))
        checks.append(
            Decision(
                CHECK_MANUAL_TRIGGER,
                spec.manual_trigger,
                f"task {spec.key!r} "
                + (
                    "may be triggered manually"
                    if spec.manual_trigger
                    else "is not manually triggerable; set manual_trigger=True in "
                    "orchestration/tasks.py if manual runs are safe for it"
                ),
            )
        )
    return tuple(checks)


def first_failure(checks: Sequence[Decision]) -> Decision | None:
    """The first rule that refuses, or None when every check passed."""
    return next((c for c in checks if not c.passed), None)


def checks_json(checks: Sequence[Decision]) -> list[dict[str, object]]:
    return [c.as_json() for c in checks]


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


def refusal_message(rule: Decision, audit_id: int) -> str:
    return (
        f"refused by rule {rule.name}: {rule.detail}. Nothing was changed "
        f"(refusal recorded as audit record {audit_id})"
    )


def record_retry(
    ledger: RunLedger,
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
                    trigger=t.TRIGGER_MANUAL_RETRY,
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
    ledger: RunLedger,
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
        t.TAG_TRIGGER: t.TRIGGER_MANUAL_RETRY,
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
    ledger: RunLedger,
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
    ledger: RunLedger,
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


def _dispatch_failed_child(ledger: RunLedger, parent: Entry | None) -> Entry | None:
    """The retry child of ``parent`` when its launch failed (``dispatch_failed``), else None."""
    if parent is None or parent.manual_retry_at is None:
        return None
    child = ledger.find(parent.task_key, dedup_key_for_retry(parent.id))
    return child if child is not None and child.status == t.STATUS_DISPATCH_FAILED else None


def redispatch_retry(
    ledger: RunLedger,
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
    manual trigger are checked as for a retry; a child that was itself retried by hand is
    refused (its own child runs instead). Audited either way."""
    who = f"entry {child.id} (retry of entry {parent.id})"
    spec = find_task(specs, child.task_key)
    checks: list[Decision] = [
        operators.check(operator, ROLE_RETRIER),
        Decision(
            CHECK_REGISTERED,
            spec is not None,
            f"task {child.task_key!r} is " + ("registered" if spec else "no longer registered"),
        ),
        Decision(
            CHECK_MANUAL_TRIGGER,
            spec is not None and spec.manual_trigger,
            f"task {child.task_key!r} "
            + ("may be triggered manually" if spec and spec.manual_trigger else "may not be"),
        ),
        Decision(
            CHECK_CHILD_REDISPATCHABLE,
            child.manual_retry_at is None,
            f"{who} is dispatch_failed: its launch failed before any run claimed it"
            if child.manual_retry_at is None
            else f"{who} was itself retried by {child.manual_retry_by}; see its child",
        ),
    ]
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


# --- re-executions started from the Dagster UI -----------------------------------------------


@dataclass(frozen=True)
class UiRetryOutcome:
    """What the claim wrapper does with a UI re-execution.

    ``allowed``: claim ``entry`` (the child just created, or the parent's own entry when
    the parent never got one). Refused: do nothing; ``entry`` is the parent.
    """

    allowed: bool
    entry: Entry | None
    message: str


def ui_retry_reason(run_id: str, parent_run_id: str) -> str:
    return f"re-executed from the Dagster UI as run {run_id} (parent run {parent_run_id})"


def retry_for_ui_reexecution(
    ledger: RunLedger,
    *,
    task_key: str,
    dedup_key: str,
    run_id: str,
    parent_run_id: str,
    spec: TaskSpec,
    operators: Operators | None = None,
    now: datetime | None = None,
) -> UiRetryOutcome:
    """Apply rule 4 to run ``run_id``, a UI re-execution of ``parent_run_id``.

    The parent run's entry is ``(task_key, dedup_key)``. It is retried by operator
    ``dagster-ui`` under the same checks as the CLI (no acknowledgement is possible from
    the UI). Allowed and refused outcomes are both audited; a refusal is also recorded in
    the parent's ``late_job_rejections``. When the parent run never reached the ledger (it
    failed before its task started) there is nothing to retry: the run executes the
    parent's entry as its first attempt, audited as such.
    """
    reason = ui_retry_reason(run_id, parent_run_id)
    context = f"Dagster run {run_id}, re-execution of run {parent_run_id}"
    parent = ledger.find(task_key, dedup_key)
    if parent is None:
        ledger.write_audit(
            operator=UI_OPERATOR,
            action=ACTION_UI_REEXECUTION,
            entry_id=None,
            reason=reason,
            checks=[{"check": "parent_entry_exists", "passed": False, "detail": dedup_key}],
            outcome=(
                f"allowed: no ledger entry {task_key} {dedup_key} for parent run "
                f"{parent_run_id}; this run executes it as its first attempt ({context})"
            ),
            now=now,
        )
        return UiRetryOutcome(True, None, f"parent run {parent_run_id} has no ledger entry")
    if parent.manual_retry_at is not None:
        # The same run entering its task again (a step retry) keeps the child it created.
        child = ledger.find(task_key, dedup_key_for_retry(parent.id))
        if child is not None and (run_id in child.run_ids or child.reason == reason):
            return UiRetryOutcome(True, child, f"run {run_id} continues entry {child.id}")
    try:
        ops = operators if operators is not None else operators_from_env()
    except OperatorsFileError as exc:
        # Fail closed: without a readable allow-list nobody is authorised.
        ops = Operators(source=f"unreadable operators file: {exc}", local=False)
    try:
        record = record_retry(
            ledger,
            parent.id,
            specs=[spec],
            operator=UI_OPERATOR,
            reason=reason,
            operators=ops,
            action=ACTION_UI_REEXECUTION,
            context=context,
            now=now,
        )
    except Refused as exc:
        message = (
            f"UI re-execution {run_id} of run {parent_run_id} (a manual retry of entry "
            f"{parent.id} by {UI_OPERATOR}) {exc}; this run does nothing"
        )
        after = ledger.reject(parent.id, run_id, reason=message, now=now)
        return UiRetryOutcome(False, after, message)
    return UiRetryOutcome(
        True,
        record.child,
        f"UI re-execution {run_id} of run {parent_run_id}: manual retry of entry "
        f"{parent.id} by {UI_OPERATOR} allowed, child entry {record.child.id} "
        f"(audit record {record.audit_id})",
    )


def unrecorded_retry_refusal(
    ledger: RunLedger,
    *,
    task_key: str,
    parent_id: int,
    run_id: str,
    operator: str | None,
    now: datetime | None = None,
) -> UiRetryOutcome | None:
    """None when the retry a ``manual_retry`` run names was recorded; else its refusal.

    A retry exists only once `record_retry` made its child (from `runs retry` or the UI
    rule). A run that merely carries ``dueledger/trigger=manual_retry`` tags (typed into
    the launchpad, say) must not create the child itself: that would bypass every rule.
    The refusal is audited and, when the parent exists, recorded in its rejections; the
    outcome's entry is None when it does not.
    """
    if ledger.find(task_key, dedup_key_for_retry(parent_id)) is not None:
        return None
    detail = (
        f"run {run_id} is tagged as a manual retry of entry {parent_id}, but no retry of "
        f"that entry was recorded; retries are made with `dueledger runs retry "
        f"{parent_id}` or by re-executing its run in the Dagster UI, never by tagging a run"
    )
    audit_id = ledger.write_audit(
        operator=operator,
        action=ACTION_RETRY_RUN,
        entry_id=parent_id,
        reason=None,
        checks=[{"check": CHECK_RECORDED, "passed": False, "detail": detail}],
        outcome=f"refused: {CHECK_RECORDED}: {detail}",
        now=now,
    )
    message = refusal_message(Decision(CHECK_RECORDED, False, detail), audit_id)
    message += "; this run does nothing"
    parent = ledger.get(parent_id)
    if parent is None:
        return UiRetryOutcome(False, None, message)
    return UiRetryOutcome(False, ledger.reject(parent.id, run_id, reason=message, now=now), message)
