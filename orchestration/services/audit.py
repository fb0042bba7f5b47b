"""Missed-due audit and catch-up: the dues each task's rule implies, against what happened.

A due is **missed** when its slot has ended and there is neither a ledger entry nor a
Dagster run for it (daemon down, schedule stopped, a tick that never came). Expected dues
are computed with the schedule's own decision (``registry.decide_tick`` over the fires of
the task's cron), so the audit and the schedule cannot disagree.

The audit starts at the task's first recorded activity (ledger entry or Dagster run) when
that is inside the window: dues from before a task existed are not "missed". A task with
no recorded activity at all is not audited (``TaskAudit.start`` is None).

For ``catch_up`` tasks, ``<task>_catch_up_sensor`` launches each missed due inside the
task's ``catch_up_window`` with ``run_key`` = the due: Dagster's sensor run-key dedup
(kept forever) and the run it creates — which the next audit sees — make a due launched
once, however often the sensor is evaluated.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

import dagster as dg

from resources.core import tags as t
from resources.core.due import floor_to_slot, format_due, parse_due
from resources.core.registry import TaskView, decide_tick
from resources.core.slots import cron_fire_times
from resources.ledger import RunLedger

DEFAULT_AUDIT_WINDOW: Final = timedelta(hours=24)
#: Runs one catch-up evaluation may request; the next evaluation continues (oldest first).
MAX_CATCH_UP_PER_TICK: Final = 20
_PAGE: Final = 500


def expected_dues(view: TaskView, start: datetime, end: datetime) -> list[datetime]:
    """The dues the task's schedule requests in ``[start, end)``, oldest first.

    The fires of the schedule's cron from ``start`` to one slot past ``end`` (a due's first
    fire may lie inside its slot), kept where ``decide_tick`` would launch a run.
    """
    slot = timedelta(minutes=view.slot_minutes)
    dues: list[datetime] = []
    for fire in cron_fire_times(view.plan.cron, view.plan.timezone, start, end + slot):
        decision = decide_tick(view.plan, fire, view.slot_minutes)
        due = decision.due.at
        kept = decision.skip_reason is None and start <= due < end
        if kept and (not dues or dues[-1] != due):
            dues.append(due)
    return dues


@dataclass(frozen=True)
class TaskAudit:
    """One task's audit: ``missed`` dues in ``[start, end)`` (``start`` None: not audited)."""

    task_key: str
    policy: str
    start: datetime | None
    end: datetime
    expected: int
    missed: tuple[datetime, ...]

    def as_json(self) -> dict[str, object]:
        return {
            "task_key": self.task_key,
            "missed_slot_policy": self.policy,
            "audited_since": format_due(self.start) if self.start else None,
            "until": format_due(self.end),
            "expected": self.expected,
            "missed": [format_due(d) for d in self.missed],
        }


@dataclass(frozen=True)
class _Evidence:
    dues: set[datetime]
    earliest: datetime | None
    older_exists: bool


def _ledger_evidence(ledger: RunLedger, task_key: str, since: datetime) -> _Evidence:
    dues: set[datetime] = set()
    earliest: datetime | None = None
    cursor: str | None = None
    while True:
        page, cursor = ledger.list_entries(
            task_key=task_key, since=since, limit=_PAGE, cursor=cursor
        )
        for entry in page:
            if entry.due is not None:
                dues.add(entry.due)
            first = entry.due or entry.created_at
            earliest = first if earliest is None else min(earliest, first)
        if cursor is None:
            break
    older, _ = ledger.list_entries(task_key=task_key, until=since, limit=1)
    return _Evidence(dues, earliest, bool(older))


def _run_evidence(instance: dg.DagsterInstance, task_key: str, since: datetime) -> _Evidence:
    dues: set[datetime] = set()
    earliest: datetime | None = None
    records = instance.get_run_records(
        filters=dg.RunsFilter(tags={t.TAG_TASK: task_key}, created_after=since)
    )
    for record in records:
        due_text = record.dagster_run.tags.get(t.TAG_DUE)
        due = _parse(due_text)
        if due is not None:
            dues.add(due)
        first = due or record.create_timestamp.astimezone(UTC)
        earliest = first if earliest is None else min(earliest, first)
    older = instance.get_run_records(
        filters=dg.RunsFilter(tags={t.TAG_TASK: task_key}, created_before=since), limit=1
    )
    return _Evidence(dues, earliest, bool(older))


def _parse(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return parse_due(text)
    except ValueError:
        return None


def audit_task(
    view: TaskView,
    ledger: RunLedger,
    now: datetime,
    *,
    window: timedelta = DEFAULT_AUDIT_WINDOW,
    instance: dg.DagsterInstance | None = None,
) -> TaskAudit:
    """Missed dues of one task over ``[now - window, start of now's slot)``.

    Evidence that a due happened: a ledger entry with that due, or (with ``instance``) a
    Dagster run tagged with it — a queued run has no entry yet, and a run that failed
    before starting is the outcome reconciler's business, not a gap.
    """
    key = view.spec.key
    end = floor_to_slot(now, view.slot_minutes)
    since = now - window
    evidence = [_ledger_evidence(ledger, key, since)]
    if instance is not None:
        evidence.append(_run_evidence(instance, key, since))
    seen = set().union(*(e.dues for e in evidence))
    earliest = [e.earliest for e in evidence if e.earliest is not None]
    if any(e.older_exists for e in evidence):
        start: datetime | None = since
    elif earliest:
        start = max(since, floor_to_slot(min(earliest), view.slot_minutes))
    else:
        start = None
    if start is None:
        return TaskAudit(key, view.spec.missed_slot_policy, None, end, 0, ())
    dues = expected_dues(view, start, end)
    missed = tuple(d for d in dues if d not in seen)
    return TaskAudit(key, view.spec.missed_slot_policy, start, end, len(dues), missed)


def audit_tasks(
    ledger: RunLedger,
    views: Iterable[TaskView],
    now: datetime,
    *,
    window: timedelta = DEFAULT_AUDIT_WINDOW,
    instance: dg.DagsterInstance | None = None,
) -> list[TaskAudit]:
    """:func:`audit_task` for every task, in registry order."""
    return [audit_task(v, ledger, now, window=window, instance=instance) for v in views]
