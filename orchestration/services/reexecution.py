"""DESIGN rule 4 at claim time: a re-execution started from the Dagster UI is a manual retry.

The claim wrapper (``runtime.task_run``) asks :func:`apply_reexecution_rule` once, before
any side effect, which entry a run may claim:

- a UI re-execution ("Re-execute" on a run page: ``dagster/parent_run_id`` and no
  ``dagster/retry_number``) becomes a manual retry of its parent run's entry by operator
  ``dagster-ui``, under the same checks and the same one transaction as `runs retry`
  (``retry.record_retry``), or is refused and does nothing;
- a run tagged ``dueledger/trigger=manual_retry`` claims only a retry that was recorded: it
  never creates the child itself (a launchpad run with hand-typed tags bypasses nothing);
- every other run passes unchanged.

Allowed and refused outcomes are audited; a refusal is also written in the parent's
``late_job_rejections``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import dagster as dg

from orchestration.retry import (
    ACTION_RETRY_RUN,
    ACTION_UI_REEXECUTION,
    CHECK_RECORDED,
    refusal_message,
    ui_reexecution_parent,
)
from orchestration.services.dagster_runs import turn_off_dagster_retries
from orchestration.services.retry import record_retry
from orchestration.task_run import EntryRequest, task_tags
from orchestration.task_spec import TaskSpec
from resources.core import tags as t
from resources.core.entry import Trigger
from resources.core.errors import Refused
from resources.core.operators import (
    UI_OPERATOR,
    Decision,
    Operators,
    OperatorsFileError,
    operators_from_env,
)
from resources.ledger import Entry, Ledger, dedup_key_for_retry


@dataclass(frozen=True)
class UiRetryOutcome:
    """What the claim wrapper does with a UI re-execution.

    ``allowed``: claim ``entry`` (the child just created, or the parent's own entry when
    the parent never got one). Refused: do nothing; ``entry`` is the parent.
    """

    allowed: bool
    entry: Entry | None
    message: str


def apply_reexecution_rule(
    context: dg.AssetExecutionContext, ledger: Ledger, spec: TaskSpec, request: EntryRequest
) -> tuple[EntryRequest, UiRetryOutcome | None]:
    """Rule 4 at claim time, before any side effect: the request to claim, or the refusal.

    A UI re-execution becomes a manual retry by ``dagster-ui`` (or is refused); a run
    tagged ``manual_retry`` claims only a retry that was recorded. Others pass unchanged."""
    tags = task_tags(context.run.tags, spec)
    parent_run_id = tags.get(t.DAGSTER_PARENT_RUN_ID)
    if not parent_run_id or t.DAGSTER_RETRY_NUMBER in tags:
        return recorded_retry_only(context, ledger, request)
    parent_run = context.instance.get_run_by_id(parent_run_id)
    parent_request = ui_reexecution_parent(
        tags, task_tags(parent_run.tags, spec) if parent_run else None
    )
    if parent_request is None:
        return recorded_retry_only(context, ledger, request)
    outcome = retry_for_ui_reexecution(
        ledger,
        task_key=parent_request.task_key,
        dedup_key=parent_request.dedup_key,
        run_id=context.run.run_id,
        parent_run_id=parent_run_id,
        spec=spec,
    )
    if not outcome.allowed:
        return request, outcome
    context.log.info(outcome.message)
    child = outcome.entry
    if child is None:  # the parent run never reached the ledger: this is its first attempt
        return recorded_retry_only(context, ledger, parent_request)
    assert child.parent_id is not None
    retry_tags = {
        t.TAG_TRIGGER: Trigger.MANUAL_RETRY.value,
        t.TAG_PARENT_ENTRY: str(child.parent_id),
        t.TAG_OPERATOR: child.operator or UI_OPERATOR,
        t.TAG_REASON: child.reason or "",
    }
    try:
        # So the UI shows the retry, and Dagster's automatic retries of this run (which
        # copy its tags) land on the child entry.
        context.instance.add_run_tags(context.run.run_id, retry_tags)
    except Exception as exc:  # the ledger already holds the truth; tags are a convenience
        context.log.warning(f"could not tag run {context.run.run_id} as a manual retry: {exc}")
    return EntryRequest.of_entry(child), None


def recorded_retry_only(
    context: dg.AssetExecutionContext, ledger: Ledger, request: EntryRequest
) -> tuple[EntryRequest, UiRetryOutcome | None]:
    """A ``manual_retry`` run claims the child its retry recorded; it never creates one."""
    if request.trigger != Trigger.MANUAL_RETRY or request.parent_id is None:
        return request, None
    refusal = unrecorded_retry_refusal(
        ledger,
        task_key=request.task_key,
        parent_id=request.parent_id,
        run_id=context.run.run_id,
        operator=request.operator,
    )
    if refusal is not None and refusal.entry is None:  # not even the parent exists
        turn_off_dagster_retries(context.instance, context.run.run_id, context.log)
        raise dg.Failure(description=refusal.message, allow_retries=False)
    return request, refusal


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
