"""Retries: Dagster's automatic attempts of an entry, and the manual retry of a failed entry
(`dueledger runs retry`, or "Re-execute" in the Dagster UI) with its lineage."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from orchestration.task_run import EntryRequest, entry_request_from_tags
from orchestration.task_spec import TaskSpec
from resources.core import tags as t
from resources.core.entry import Entry, FailureKind, Status, Trigger
from resources.core.instants import iso
from resources.core.operators import ROLE_ADMIN, ROLE_RETRIER, Decision, Operators

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


def ui_reexecution_parent(
    tags: Mapping[str, str], parent_tags: Mapping[str, str] | None
) -> EntryRequest | None:
    """For a re-execution started from the Dagster UI, the ledger key of its parent run's
    entry; None for every other run (DESIGN rule 4: the UI follows the manual-retry rules).

    A UI re-execution has ``dagster/parent_run_id`` and no ``dagster/retry_number`` (that
    one marks Dagster's automatic retries). A run launched by `dueledger runs retry`
    carries ``dueledger/trigger=manual_retry`` tags that its parent run did not have;
    Dagster copies a parent's tags onto a re-execution, so the same tags also present on
    the parent mean a UI re-execution of a manual-retry run. ``parent_tags`` are the
    parent run's current tags (None when Dagster no longer has that run).
    """
    parent_run_id = tags.get(t.DAGSTER_PARENT_RUN_ID)
    if not parent_run_id or t.DAGSTER_RETRY_NUMBER in tags:
        return None
    if tags.get(t.TAG_TRIGGER) == Trigger.MANUAL_RETRY and t.TAG_PARENT_ENTRY in tags:
        inherited = (
            parent_tags is not None
            and parent_tags.get(t.TAG_TRIGGER) == Trigger.MANUAL_RETRY
            and parent_tags.get(t.TAG_PARENT_ENTRY) == tags[t.TAG_PARENT_ENTRY]
        )
        if not inherited:
            return None
    # The parent's own key; its copied tags give the same key when the run is gone.
    source = parent_tags if parent_tags is not None and t.TAG_TASK in parent_tags else tags
    return entry_request_from_tags(source, parent_run_id)


def is_retry_of_a_dispatch_failure(run_tags: Mapping[str, str], entry: Entry) -> bool:
    """Pure: is this run Dagster's automatic retry of a run that made ``entry``
    dispatch_failed (its parent or root run is in the entry's ``dispatch_failures``)?"""
    if t.DAGSTER_RETRY_NUMBER not in run_tags or entry.status != Status.DISPATCH_FAILED:
        return False
    lineage = {run_tags.get(t.DAGSTER_PARENT_RUN_ID), run_tags.get(t.DAGSTER_ROOT_RUN_ID)}
    return bool(lineage & entry.dispatch_failure_run_ids)
