"""What every task run does around its work, whoever launched it: find the ledger entry its
tags name, claim it under the rules, keep the lease, record the outcome. Dagster-free: the task
asset (``orchestration/task_defs.py``) gives it what Dagster knows of the run, and the history
harness (``tests/history``) drives the very same path on a simulated Dagster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestration.task_spec import TaskSpec, find_task
from resources.core import tags as t
from resources.core.due import Due
from resources.core.entry import (
    Entry,
    Trigger,
    dedup_key_for_backfill,
    dedup_key_for_request,
    dedup_key_for_retry,
)
from resources.core.operators import UI_OPERATOR


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


def task_is_registered(task_key: str, spec: TaskSpec, tasks: Sequence[TaskSpec]) -> bool:
    """May a run tagged ``dueledger/task=task_key`` run the body of ``spec``'s asset?

    Yes for the asset's own task and for any other registered task; no for a key the code
    location no longer declares (its plugin was removed, or the key was renamed while the
    asset stayed): such a run is unsupported.
    """
    return task_key == spec.key or find_task(tasks, task_key) is not None
