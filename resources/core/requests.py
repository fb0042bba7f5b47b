"""Which logical execution a Dagster run belongs to, read from its tags (pure, no Dagster).

A run's tags (``dueledger/*`` and the ``dagster/*`` lineage tags Dagster sets) name one
ledger entry: its task, its origin and dedup key, and for a manual retry its parent. The
claim wrapper, the outcome reconciliation and the ledger checks all ask this module, so a
run maps onto the same entry whoever looks at it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from resources.core import tags as t
from resources.core.due import Due
from resources.core.entry import (
    Entry,
    Status,
    Trigger,
    dedup_key_for_backfill,
    dedup_key_for_request,
    dedup_key_for_retry,
)
from resources.core.operators import UI_OPERATOR
from resources.core.registry import TaskSpec, find_task


@dataclass(frozen=True)
class EntryRequest:
    """The logical execution a run belongs to: the ledger's unique key and its context."""

    task_key: str
    trigger: str
    dedup_key: str
    due: Due | None = None
    operator: str | None = None
    reason: str | None = None
    parent_id: int | None = None

    @classmethod
    def of_entry(cls, entry: Entry) -> EntryRequest:
        """The request that created ``entry`` (its ledger key and context)."""
        return cls(
            entry.task_key,
            entry.trigger,
            entry.dedup_key,
            due=Due.coerce(entry.due) if entry.due is not None else None,
            operator=entry.operator,
            reason=entry.reason,
            parent_id=entry.parent_id,
        )


def entry_request_from_tags(tags: Mapping[str, str], run_id: str) -> EntryRequest:
    """Map a run's tags onto its ledger key (DESIGN: dedup keys).

    - manual_retry (``dueledger/parent_entry``)   -> ``retry:<parent entry id>``
    - schedule / sensor (``dueledger/due``)       -> ``due:<due>``
    - manual with ``dueledger/due`` (catch-up)    -> ``due:<due>``
    - backfill (``dagster/backfill`` + partition) -> ``backfill:<id>:<partition>``
    - manual (``dueledger/request_id``)           -> ``manual:<request id>``
    - no dueledger trigger (UI launchpad run)     -> ``manual:<root run id>``

    Dagster copies a run's tags onto its retries and re-executions, so an automatic
    retry lands on the same entry as its root run; for a launchpad run the root run id
    (``dagster/root_run_id``) plays the request id.
    """
    task_key = tags.get(t.TAG_TASK)
    if not task_key:
        raise ValueError(f"run {run_id} has no {t.TAG_TASK} tag; it was not launched as a task")
    trigger = tags.get(t.TAG_TRIGGER)
    operator, reason = tags.get(t.TAG_OPERATOR), tags.get(t.TAG_REASON)
    # First: a retry of a backfill or scheduled run still carries its parent's tags.
    if trigger == Trigger.MANUAL_RETRY and t.TAG_PARENT_ENTRY in tags:
        parent = int(tags[t.TAG_PARENT_ENTRY])
        return EntryRequest(
            task_key,
            Trigger.MANUAL_RETRY,
            dedup_key_for_retry(parent),
            # The parent's due, when it had one: the retry computes as of the same instant.
            due=Due.parse(tags[t.TAG_DUE]) if t.TAG_DUE in tags else None,
            operator=operator,
            reason=reason,
            parent_id=parent,
        )
    if t.DAGSTER_BACKFILL in tags and t.DAGSTER_PARTITION in tags:
        return EntryRequest(
            task_key,
            Trigger.BACKFILL,
            dedup_key_for_backfill(tags[t.DAGSTER_BACKFILL], tags[t.DAGSTER_PARTITION]),
            due=Due.parse(tags[t.TAG_DUE]) if t.TAG_DUE in tags else None,
        )
    if trigger in (Trigger.SCHEDULE, Trigger.SENSOR) and t.TAG_DUE in tags:
        due = Due.parse(tags[t.TAG_DUE])
        return EntryRequest(task_key, trigger, due.key, due=due)
    if trigger == Trigger.MANUAL and t.TAG_DUE in tags:
        # `dueledger catch-up`: an operator's run of a past due is that due's run.
        due = Due.parse(tags[t.TAG_DUE])
        return EntryRequest(
            task_key, Trigger.MANUAL, due.key, due=due, operator=operator, reason=reason
        )
    if trigger == Trigger.MANUAL and tags.get(t.TAG_REQUEST_ID):
        return EntryRequest(
            task_key,
            Trigger.MANUAL,
            dedup_key_for_request(tags[t.TAG_REQUEST_ID]),
            operator=operator,
            reason=reason,
        )
    root = tags.get(t.DAGSTER_ROOT_RUN_ID) or run_id
    return EntryRequest(
        task_key,
        Trigger.MANUAL,
        dedup_key_for_request(root),
        operator=operator or UI_OPERATOR,
        reason=reason or "launched from the Dagster UI without dueledger tags",
    )


def task_tags(tags: Mapping[str, str], spec: TaskSpec) -> Mapping[str, str]:
    """The run's tags, completed with ``dueledger/task`` from the asset being executed.

    Dagster 1.13's GraphQL ``launchRun`` -- what the launchpad, the Catalog's and the job
    page's "Materialize" call -- does not apply a job's run tags, and a backfill from the
    asset graph runs the implicit asset job: such runs carry no ``dueledger/task``. The
    asset being executed names the task (DESIGN: attribution by what Dagster records).
    """
    if t.TAG_TASK in tags:
        return tags
    return {**tags, t.TAG_TASK: spec.key}


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


def task_is_registered(task_key: str, spec: TaskSpec, tasks: Sequence[TaskSpec]) -> bool:
    """May a run tagged ``dueledger/task=task_key`` run the body of ``spec``'s asset?

    Yes for the asset's own task and for any other registered task; no for a key the code
    location no longer declares (its plugin was removed, or the key was renamed while the
    asset stayed): such a run is unsupported.
    """
    return task_key == spec.key or find_task(tasks, task_key) is not None


def unissued_launch(spec: TaskSpec, request: EntryRequest, tags: Mapping[str, str]) -> str | None:
    """Why a run of ``spec``'s task may not act: the task is not manually triggerable and the
    run was not launched by anything dueledger issued. None: it may act.

    Issued are: a run of the task's own schedule (Dagster tags it ``dagster/schedule_name``),
    a run of a sensor (``dagster/sensor_name``: re-dispatch, catch-up) and a backfill run
    (``dagster/backfill``); Dagster copies these tags onto its automatic retries. A manual
    retry is the retry rules' to decide (they check the manual trigger themselves). Anything
    else -- the launchpad, "Materialize", GraphQL ``launchRun``, ``dagster job launch``, a
    run with hand-typed dueledger tags -- is a manual launch, whatever it claims to be.
    """
    if spec.manual_trigger or request.trigger == Trigger.MANUAL_RETRY:
        return None
    if request.trigger == Trigger.BACKFILL and tags.get(t.DAGSTER_BACKFILL):
        return None
    if request.trigger == Trigger.SCHEDULE and tags.get(t.DAGSTER_SCHEDULE_NAME) == (
        spec.schedule_name
    ):
        return None
    if request.trigger == Trigger.SENSOR and tags.get(t.DAGSTER_SENSOR_NAME):
        return None
    who = request.operator or UI_OPERATOR
    return (
        f"task {spec.key!r} is not manually triggerable: only its schedule, dueledger's "
        f"sensors and backfills run it, and this run was launched by hand (operator {who}); "
        f"it does nothing. Set manual_trigger=True in orchestration/tasks.py if manual runs "
        f"are safe for it"
    )
