"""Retries: Dagster's automatic attempts of an entry, and the manual retry of a failed entry
(`dueledger runs retry`, or "Re-execute" in the Dagster UI) with its lineage (ledger rule 4).

- **Automatic attempts.** A failed attempt with attempts left goes ``retrying`` while a retry
  will really come (``Ledger.fail``); Dagster's run retry claims the same entry, taking over
  from a chain member that died after claiming (:func:`settle_parent_of_automatic_retry`) or
  re-dispatching an entry whose run never started (:func:`resume_dispatch_failed_entry`).
- **Manual retry.** Only a ``failed`` entry, at most once, by a named operator with a reason
  (:func:`evaluate_retry`: every check evaluated, so the audit shows them all); one
  transaction (:func:`record_retry`) locks the parent row, re-decides the checks, and either
  writes the refusal to the audit, or stamps the parent (``manual_retry_at/by``), creates the
  child entry (trigger ``manual_retry``, dedup key ``retry:<parent>``) and writes the audit
  record. Two concurrent retries of one parent serialise on the row lock (PostgreSQL
  ``SELECT ... FOR UPDATE``; SQLite ``BEGIN IMMEDIATE``): the second sees the stamp and is
  refused; the stamp is also a compare-and-set and the child's key is unique. ``dispatch_failed``
  and ``lease_reclaimed`` parents need the side effects acknowledged.
- **The launch** (:func:`launch_retry`): after the commit, a Dagster *re-execution* of the
  parent's last run through the mutation the UI's "Re-execute" sends; the run gets
  ``dagster/parent_run_id``/``root_run_id`` from Dagster and the dueledger tags from here. When
  the parent has no Dagster run left, a new run of the task's job is launched with the lineage
  tags set by hand (docs/operators.md says exactly what differs).
- **"Re-execute" in the UI** follows the same rules at claim time, as operator ``dagster-ui``
  (:func:`entry_of_run`).
- **Backoff** (:func:`retry_backoff_wait`): Dagster launches its retry run the moment an
  attempt fails, so a short outage would use every attempt in seconds; the retry run waits at
  its claim until the task's ``retry_backoff`` has passed since the failed attempt, doubling
  with each attempt (60 s, 120 s, ... by default). Manual retries and re-executions do not
  wait: a person asked for them now.
- **Lineage**: every run of an entry's lineage carries ``dueledger/lineage=<root entry>``
  (:func:`lineage_root`), so one Runs filter shows the retries.

Dagster-free: what Dagster knows of a run is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

from orchestration.manual_launch import EntryRequest, RunAttribution
from orchestration.services.launch import Launcher, LaunchFailed, retry_run_id
from orchestration.task_spec import TaskSpec, find_task, task_run_tags
from resources.core import tags as t
from resources.core.due import format_due
from resources.core.entry import Entry, FailureKind, Status, Trigger, dedup_key_for_retry
from resources.core.errors import InvalidInput, Refused
from resources.core.instants import iso
from resources.core.operators import (
    ROLE_ADMIN,
    ROLE_RETRIER,
    UI_OPERATOR,
    Decision,
    Operators,
    OperatorsFileError,
    operators_from_env,
)
from resources.ledger import Ledger

if TYPE_CHECKING:
    import dagster as dg

#: Audit actions.
ACTION_MANUAL_RETRY: Final = "manual_retry"
ACTION_UI_REEXECUTION: Final = "ui_reexecution"
ACTION_RETRY_LAUNCH: Final = "manual_retry_launch"
ACTION_RETRY_RUN: Final = "manual_retry_run"
ACTION_RETRY_REDISPATCH: Final = "manual_retry_redispatch"

#: Statuses a manual retry may start from. ``dispatch_failed`` only with acknowledgement.
RETRYABLE_STATUSES: Final = (Status.FAILED, Status.DISPATCH_FAILED)

#: Check names (the audit's "check" fields).
CHECK_ROLE_RETRIER: Final = f"operator_has_role_{ROLE_RETRIER}"
CHECK_STATUS: Final = "parent_is_failed"
CHECK_NOT_RETRIED: Final = "parent_not_yet_retried"
CHECK_ACKNOWLEDGED: Final = "side_effects_acknowledged"
CHECK_ROLE_ADMIN: Final = f"operator_has_role_{ROLE_ADMIN}"
CHECK_REGISTERED: Final = "task_registered"
CHECK_MANUAL_TRIGGER: Final = "task_manually_triggerable"
CHECK_RECORDED: Final = "retry_recorded"
CHECK_CHILD_REDISPATCHABLE: Final = "child_redispatchable"

#: How a retry's run was launched (its JSON field "launch").
LAUNCH_REEXECUTION: Final = "reexecution"
LAUNCH_NEW_RUN: Final = "new_run"


def needs_acknowledgement(entry: Entry) -> bool:
    """A parent whose earlier run may have had side effects that nobody recorded."""
    return (
        entry.status == Status.DISPATCH_FAILED or entry.failure_kind == FailureKind.LEASE_RECLAIMED
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
                + (
                    # What a person who wants the work done again does instead.
                    ": to run the task again, use Materialize on its asset in the Catalog or "
                    "the launchpad of its job (a manual launch, a new entry)"
                    if parent.status == Status.SUCCESS
                    else ""
                )
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
                f"{iso(parent.manual_retry_at)}; an entry is "
                f"retried at most once "
                f"(retry its child instead if that failed too)",
            )
        )
    if needs_acknowledgement(parent):
        why = (
            "its launch failed but a run may still have started"
            if parent.status == Status.DISPATCH_FAILED
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
                or f"task {parent.task_key!r} is no longer declared "
                f"(`dueledger tasks` lists what is)",
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
                    else "is not manually triggerable; set manual_trigger: true where the task "
                    "is declared (its defs.yaml) if manual runs are safe for it"
                ),
            )
        )
    return tuple(checks)


def first_failure(checks: Sequence[Decision]) -> Decision | None:
    """The first rule that refuses, or None when every check passed."""
    return next((c for c in checks if not c.passed), None)


def checks_json(checks: Sequence[Decision]) -> list[dict[str, object]]:
    return [c.as_json() for c in checks]


def refusal_message(rule: Decision, audit_id: int) -> str:
    return (
        f"refused by rule {rule.name}: {rule.detail}. Nothing was changed "
        f"(refusal recorded as audit record {audit_id})"
    )


def evaluate_child_redispatch(
    parent: Entry,
    child: Entry,
    spec: TaskSpec | None,
    *,
    operator: str,
    operators: Operators,
) -> list[Decision]:
    """The checks of `runs retry PARENT` repeated after the retry's launch failed: the
    recorded ``dispatch_failed`` child is re-dispatched, never a second child made. The
    retrier role, the task's registration and its manual trigger are checked as for a
    retry; a child that was itself retried by hand is refused (its own child runs instead)."""
    who = f"entry {child.id} (retry of entry {parent.id})"
    return [
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


def is_retry_of_a_dispatch_failure(run_tags: Mapping[str, str], entry: Entry) -> bool:
    """Pure: is this run Dagster's automatic retry of a run that made ``entry``
    dispatch_failed (its parent or root run is in the entry's ``dispatch_failures``)?"""
    if t.DAGSTER_RETRY_NUMBER not in run_tags or entry.status != Status.DISPATCH_FAILED:
        return False
    lineage = {run_tags.get(t.DAGSTER_PARENT_RUN_ID), run_tags.get(t.DAGSTER_ROOT_RUN_ID)}
    return bool(lineage & entry.dispatch_failure_run_ids)


# --- the manual retry: one transaction -----------------------------------------------------


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
    child ever claimed it. The retrier role, the task's registration and its
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
    return replace(result, redispatched=True)


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
    ledger: Ledger,
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
    ledger: Ledger,
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


# --- "Re-execute" in the Dagster UI: a manual retry, decided when the run claims --------------


@dataclass(frozen=True)
class Reexecution:
    """What a run's claim does about the manual-retry rule (:func:`_reexecution`): claim
    ``request``, or do nothing (``refusal``); ``retry_tags`` go on the run when it became a
    manual retry (so the UI shows it, and Dagster's automatic retries of it land on the child
    entry); ``fatal``: the run names a retry of an entry that does not exist -- it fails,
    unretried; ``unissued``: why a task that is not manually triggerable may not run this."""

    request: EntryRequest
    refusal: UiRetryOutcome | None = None
    retry_tags: Mapping[str, str] = field(default_factory=dict)
    fatal: bool = False
    unissued: str | None = None
    #: What was allowed, for the run's log (None: nothing to say).
    note: str | None = None


def _reexecution(
    ledger: Ledger, spec: TaskSpec, run: RunAttribution, run_id: str, now: datetime | None
) -> Reexecution:
    """The manual-retry rule at claim time, before any side effect: the request to claim, or
    the refusal.

    A re-execution started from the Dagster UI ("Re-execute" on a run page) becomes a manual
    retry of its parent run's entry by operator ``dagster-ui``, under the same checks and the
    same one transaction as `runs retry` (:func:`record_retry`), or is refused and does
    nothing. A run tagged ``dueledger/trigger=manual_retry`` claims only a retry that was
    recorded: it never creates the child itself (a launchpad run with hand-typed tags
    bypasses nothing). Every other run passes unchanged.
    """
    parent_request = run.parent
    if parent_request is None or run.parent_run_id is None:
        return _recorded_retry_only(ledger, run.request, run_id, now, run.unissued)
    outcome = retry_for_ui_reexecution(
        ledger,
        task_key=parent_request.task_key,
        dedup_key=parent_request.dedup_key,
        run_id=run_id,
        parent_run_id=run.parent_run_id,
        spec=spec,
        now=now,
    )
    if not outcome.allowed:
        return Reexecution(run.request, outcome)
    child = outcome.entry
    if child is None:  # the parent run never reached the ledger: this is its first attempt
        first = _recorded_retry_only(ledger, parent_request, run_id, now, run.parent_unissued)
        return replace(first, note=outcome.message)
    assert child.parent_id is not None
    retry_tags = {
        t.TAG_TRIGGER: Trigger.MANUAL_RETRY.value,
        t.TAG_PARENT_ENTRY: str(child.parent_id),
        t.TAG_OPERATOR: child.operator or UI_OPERATOR,
        t.TAG_REASON: child.reason or "",
    }
    return Reexecution(EntryRequest.of_entry(child), retry_tags=retry_tags, note=outcome.message)


def _recorded_retry_only(
    ledger: Ledger,
    request: EntryRequest,
    run_id: str,
    now: datetime | None,
    unissued: str | None,
) -> Reexecution:
    """A ``manual_retry`` run claims the child its retry recorded; it never creates one."""
    if request.trigger != Trigger.MANUAL_RETRY or request.parent_id is None:
        return Reexecution(request, unissued=unissued)
    refusal = unrecorded_retry_refusal(
        ledger,
        task_key=request.task_key,
        parent_id=request.parent_id,
        run_id=run_id,
        operator=request.operator,
        now=now,
    )
    return Reexecution(
        request,
        refusal,
        fatal=refusal is not None and refusal.entry is None,
        unissued=unissued,
    )


# --- the entry a run is an attempt of --------------------------------------------------------


@dataclass(frozen=True)
class RunEntry:
    """The entry a run is an attempt of (``entry``), or why the run may not act
    (``refusal``: already audited where a rule decided it; ``fatal``: the run fails,
    unretried). ``lineage``: the root of the entry's manual-retry lineage (its Runs filter)."""

    request: EntryRequest
    entry: Entry | None
    refusal: str | None = None
    fatal: bool = False
    lineage: int | None = None
    retry_tags: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def entry_of_run(
    ledger: Ledger,
    spec: TaskSpec,
    run: RunAttribution,
    *,
    run_id: str,
    ended_ancestor: Callable[[str], str | None],
    now: datetime | None = None,
) -> RunEntry:
    """The entry run ``run_id`` of ``spec``'s task runs as, every retry rule applied once.

    The manual-retry rule first (a UI re-execution becomes a manual retry or is refused; a
    ``manual_retry`` run claims only a recorded retry), then the manual trigger (a task that
    is not manually triggerable runs only what dueledger issued), then the entry itself,
    insert-or-ignore on its key, and Dagster's automatic attempts of it: a dead chain member's
    attempt settled (:func:`settle_parent_of_automatic_retry`), a dispatch failure resumed
    (:func:`resume_dispatch_failed_entry`).
    """
    rule = _reexecution(ledger, spec, run, run_id, now)
    notes = (rule.note,) if rule.note else ()
    if rule.refusal is not None:
        refused = rule.refusal.entry
        return RunEntry(
            rule.request,
            refused,
            refusal=rule.refusal.message,
            fatal=rule.fatal,
            lineage=lineage_root(ledger, refused) if refused is not None else None,
        )
    if rule.unissued is not None:
        return RunEntry(rule.request, None, refusal=rule.unissued)
    request = rule.request
    entry = ledger.ensure_entry(
        task_key=request.task_key,
        trigger=request.trigger,
        dedup_key=request.dedup_key,
        due=request.due,
        max_attempts=spec.max_attempts,
        operator=request.operator,
        reason=request.reason,
        parent_id=request.parent_id,
        now=now,
    )
    entry = settle_parent_of_automatic_retry(
        ledger, entry, run_id=run_id, tags=run.tags, ended_ancestor=ended_ancestor, now=now
    )
    entry, resumed = resume_dispatch_failed_entry(ledger, entry, run.tags, now)
    return RunEntry(
        request,
        entry,
        lineage=lineage_root(ledger, entry),
        retry_tags=rule.retry_tags,
        notes=notes + ((resumed,) if resumed else ()),
    )


# --- Dagster's automatic attempts of an entry ----------------------------------------------------


def settle_parent_of_automatic_retry(
    ledger: Ledger,
    entry: Entry,
    *,
    run_id: str,
    tags: Mapping[str, str],
    ended_ancestor: Callable[[str], str | None],
    now: datetime | None = None,
) -> Entry:
    """Ledger rule 2 for Dagster's automatic retries.

    Dagster retries only a run it has ended FAILURE. When a run of this retry's chain died
    after claiming without recording its outcome (killed worker, max runtime) and this retry
    starts before the outcome sensor has seen it, the entry is still leased to that run:
    record its failed attempt now (``running -> retrying``) so this run claims the next
    attempt instead of being refused as a duplicate. The lease owner is usually the parent;
    it is an earlier ancestor when the retries between died before claiming (a worker killed
    while loading). ``ended_ancestor(owner)``: the failure kind (``timeout``, ``error``) when
    ``owner`` is an ancestor of this run that Dagster ended FAILURE, else None. Every other
    run passes through unchanged.
    """
    if t.DAGSTER_RETRY_NUMBER not in tags or not tags.get(t.DAGSTER_PARENT_RUN_ID):
        return entry
    if entry.status != Status.RUNNING or not entry.lease_owner:
        return entry
    kind = ended_ancestor(entry.lease_owner)
    if kind is None:
        return entry
    return ledger.fail(
        entry.id,
        entry.lease_owner,
        error=(
            f"Dagster run {entry.lease_owner} failed after claiming the entry, without "
            f"recording its outcome; its automatic retry {run_id} takes over"
        ),
        kind=kind,
        now=now,
    )


def resume_dispatch_failed_entry(
    ledger: Ledger, entry: Entry, tags: Mapping[str, str], now: datetime | None = None
) -> tuple[Entry, str | None]:
    """Ledger rule 5 for Dagster's automatic retries: the entry, and what was done (for the
    run's log; None: nothing).

    A run that ended before claiming (its worker killed while loading, run monitoring's
    start timeout) makes its entry ``dispatch_failed``; nothing of the task ran. When Dagster
    retries that run, the retry is the re-dispatch: it moves the entry back to ``queued``
    (``redispatch``: attempt count reset, errors kept, refused once a manual retry was made)
    and claims it, in whatever slot. Only a retry descended from a run recorded in the
    entry's ``dispatch_failures``; every other run passes through unchanged.
    """
    if not is_retry_of_a_dispatch_failure(tags, entry):
        return entry, None
    said = None
    if ledger.redispatch(entry.id, now=now):
        said = (
            f"entry {entry.id} {entry.label}: dispatch_failed -> queued; Dagster's retry of "
            f"run {tags.get(t.DAGSTER_PARENT_RUN_ID)}, which ended before claiming, claims it"
        )
    return ledger.get(entry.id) or entry, said


# --- lineage -------------------------------------------------------------------------------------


def lineage_root(ledger: Ledger, entry: Entry) -> int:
    """The id of the entry at the top of ``entry``'s manual-retry lineage (itself if none)."""
    seen = {entry.id}
    root = entry
    while root.parent_id is not None and root.parent_id not in seen:
        parent = ledger.get(root.parent_id)
        if parent is None:
            return root.parent_id
        seen.add(parent.id)
        root = parent
    return root.id


def retry_backoff_wait(
    spec: TaskSpec, entry: Entry, run_tags: Mapping[str, str], now: datetime
) -> str | None:
    """Why Dagster's automatic retry of ``entry`` may not claim it yet (None: it may).

    The wait after attempt ``n`` (``entry.attempt``, the attempts made) is
    ``retry_backoff * 2**(n - 1)``, counted from the failure (the ``retrying`` entry's
    ``updated_at``, stamped by ``Ledger.fail``). Only a ``retrying`` entry claimed by a run
    Dagster's run retries made (``dagster/retry_number``) waits.
    """
    if (
        entry.status != Status.RETRYING
        or t.DAGSTER_RETRY_NUMBER not in run_tags
        or spec.retry_backoff <= timedelta(0)
    ):
        return None
    wait = spec.retry_backoff * 2 ** max(entry.attempt - 1, 0)
    ready = entry.updated_at + wait
    if now >= ready:
        return None
    return (
        f"retry backoff: attempt {entry.attempt + 1}/{entry.max_attempts} starts at "
        f"{iso(ready)}, {wait.total_seconds():.0f} s after attempt {entry.attempt} failed "
        f"(the task's retry_backoff {spec.retry_backoff.total_seconds():.0f} s, doubling "
        f"per attempt)"
    )
