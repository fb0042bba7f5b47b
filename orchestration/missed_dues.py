"""Missed dues: was a due missed? One answer for every reader, and the audit that asks it.

`dueledger summary` (``missed_24h``), the ``ledger_health`` asset, the slot-health alert, the
catch-up sensor and every task's ``latest_due_accounted_for`` asset check ask
:func:`due_verdict`, so they cannot disagree about a due:

- **accounted**: a ledger entry or a Dagster run exists for it (whatever its outcome);
- **not expected**: it lies before the task's schedule first ran here (a fresh deployment,
  a new task): nothing was supposed to run it;
- **paused**: it lies inside a pause of the task (its schedule stopped in the Dagster UI,
  or ``dueledger pause``): not run, on purpose, and said by whom and why;
- **missed**: none of these -- the scheduler should have run it and did not.

Expected dues are computed with the schedule's own decision (``timetable.plan_dues``:
``decide_tick`` over the fires of the task's crons), so the audit and the schedule cannot
disagree. The audit starts when the task's schedule first ran here (mirrored from Dagster by
``pause.sync_schedules``; its first recorded activity when no schedule was observed yet), or
at the window's start: dues from before a deployment or a task existed are not "missed". A
task that nothing ran yet is not audited (``TaskAudit.start`` is None).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Final

from orchestration.pause import (
    Pause,
    ScheduleState,
    pause_at,
    pauses_by_task,
    schedule_states,
    skipped_for_pause,
)
from orchestration.task_spec import TaskView
from orchestration.timetable import plan_dues
from resources.core import tags as t
from resources.core.due import floor_to_slot, format_due, parse_due
from resources.core.entry import Status
from resources.core.instants import iso
from resources.ledger import Ledger

if TYPE_CHECKING:
    import dagster as dg

DEFAULT_AUDIT_WINDOW: Final = timedelta(hours=24)
#: Runs one catch-up evaluation may request; the next evaluation continues (oldest first).
MAX_CATCH_UP_PER_TICK: Final = 20
_PAGE: Final = 500


class DueVerdict(StrEnum):
    ACCOUNTED = "accounted"
    NOT_EXPECTED = "not_expected"
    PAUSED = "paused"
    MISSED = "missed"


@dataclass(frozen=True)
class Scheduling:
    """What is known of a task's scheduling here: since when its schedule has run (None:
    nothing ran it yet, so no due is expected) and its pauses."""

    since: datetime | None
    pauses: tuple[Pause, ...] = ()


def due_verdict(
    due: datetime, scheduling: Scheduling, *, accounted: bool
) -> tuple[DueVerdict, str]:
    """The verdict on ``due`` (a due whose slot is over) and why, in words."""
    if accounted:
        return DueVerdict.ACCOUNTED, "a ledger entry or a Dagster run exists for it"
    if scheduling.since is None or due < scheduling.since:
        since = iso(scheduling.since) if scheduling.since else "never"
        return (
            DueVerdict.NOT_EXPECTED,
            f"before the task's schedule first ran here (since {since}): not expected",
        )
    pause = pause_at(scheduling.pauses, due)
    if pause is not None:
        return DueVerdict.PAUSED, pause.skip_reason
    return DueVerdict.MISSED, "no run was created for it"


def missed(dues: Sequence[datetime], scheduling: Scheduling, seen: set[datetime]) -> list[datetime]:
    """The dues of ``dues`` whose verdict is missed."""
    return [
        d for d in dues if due_verdict(d, scheduling, accounted=d in seen)[0] is DueVerdict.MISSED
    ]


def scheduling_of(
    ledger: Ledger,
    view: TaskView,
    *,
    schedules: dict[str, ScheduleState] | None = None,
    pauses: dict[str, tuple[Pause, ...]] | None = None,
    instance: dg.DagsterInstance | None = None,
) -> Scheduling:
    """What the ledger knows of ``view``'s scheduling: its schedule's first start here, else
    (no schedule observed yet) the slot of its first recorded activity -- a ledger entry, or
    with ``instance`` a Dagster run of the task; None when nothing ran it yet. ``schedules``
    and ``pauses`` are the ledger's tables when the caller read them already (one read for
    many tasks)."""
    key = view.spec.key
    schedules = schedule_states(ledger) if schedules is None else schedules
    pauses = pauses_by_task(ledger) if pauses is None else pauses
    row = schedules.get(key)
    since = row.first_started_at if row is not None else None
    if since is None:
        first = first_activity(ledger, key, instance)
        since = floor_to_slot(first, view.slot_minutes) if first is not None else None
    return Scheduling(since, pauses.get(key, ()))


def first_activity(
    ledger: Ledger, task_key: str, instance: dg.DagsterInstance | None
) -> datetime | None:
    """The earliest recorded activity of a task: its oldest ledger entry and, with
    ``instance``, its oldest Dagster run (their creation times)."""
    found = [x for x in (ledger.first_activity(task_key),) if x is not None]
    if instance is not None:
        # Dagster is loaded only where an instance is: the CLI's read commands have none.
        import dagster as dg

        records = instance.get_run_records(
            filters=dg.RunsFilter(tags={t.TAG_TASK: task_key}), limit=1, ascending=True
        )
        if records:
            found.append(records[0].create_timestamp.astimezone(UTC))
    return min(found) if found else None


def expected_dues(view: TaskView, start: datetime, end: datetime) -> list[datetime]:
    """The dues the task's schedule requests in ``[start, end)``, oldest first: its plan's
    own decision (``timetable.plan_dues``, what every tick decides)."""
    return plan_dues(view.plan, view.slot_minutes, start, end)


@dataclass(frozen=True)
class TaskAudit:
    """One task's audit over ``[start, end)`` (``start`` None: nothing ran the task here yet,
    so no due is expected): the dues its rule implies, those ``missed``, and those ``paused``
    (not run on purpose: inside a pause, or written ``skipped`` for one). Every other due is
    judged by :func:`due_verdict`."""

    task_key: str
    policy: str
    start: datetime | None
    end: datetime
    expected: int
    missed: tuple[datetime, ...]
    paused: tuple[datetime, ...] = ()

    def as_json(self) -> dict[str, object]:
        return {
            "task_key": self.task_key,
            "missed_slot_policy": self.policy,
            "audited_since": format_due(self.start) if self.start else None,
            "until": format_due(self.end),
            "expected": self.expected,
            "missed": [format_due(d) for d in self.missed],
            "paused": [format_due(d) for d in self.paused],
        }


def _ledger_dues(
    ledger: Ledger, task_key: str, since: datetime
) -> tuple[set[datetime], set[datetime]]:
    """The dues of the task's entries created since ``since``, and those of them skipped for
    a pause (counted as paused: the pause is what the due says)."""
    dues: set[datetime] = set()
    paused: set[datetime] = set()
    cursor: str | None = None
    while True:
        page, cursor = ledger.list_entries(
            task_key=task_key, since=since, limit=_PAGE, cursor=cursor
        )
        for entry in page:
            if entry.due is None:
                continue
            dues.add(entry.due)
            if entry.status == Status.SKIPPED and skipped_for_pause(entry.error):
                paused.add(entry.due)
        if cursor is None:
            return dues, paused


def run_dues(instance: dg.DagsterInstance, task_key: str, since: datetime) -> set[datetime]:
    """The dues of the task's Dagster runs created since ``since`` (a queued run has no ledger
    entry yet)."""
    # Dagster is loaded only where an instance is: the CLI's read commands have none.
    import dagster as dg

    records = instance.get_run_records(
        filters=dg.RunsFilter(tags={t.TAG_TASK: task_key}, created_after=since)
    )
    dues = (_parse(r.dagster_run.tags.get(t.TAG_DUE)) for r in records)
    return {d for d in dues if d is not None}


def unqueued_runs(
    instance: dg.DagsterInstance, task_key: str, since: datetime, before: datetime
) -> dict[datetime, str]:
    """The task's runs created in ``[since, before)`` that Dagster never queued (status
    ``NOT_STARTED``), by due: what a launcher killed between creating a run and queueing it
    leaves behind."""
    import dagster as dg

    records = instance.get_run_records(
        filters=dg.RunsFilter(
            tags={t.TAG_TASK: task_key},
            statuses=[dg.DagsterRunStatus.NOT_STARTED],
            created_after=since,
            created_before=before,
        )
    )
    found: dict[datetime, str] = {}
    for record in records:
        due = _parse(record.dagster_run.tags.get(t.TAG_DUE))
        if due is not None:
            found[due] = record.dagster_run.run_id
    return found


def _parse(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return parse_due(text)
    except ValueError:
        return None


def audit_task(
    view: TaskView,
    ledger: Ledger,
    now: datetime,
    *,
    window: timedelta = DEFAULT_AUDIT_WINDOW,
    instance: dg.DagsterInstance | None = None,
    scheduling: Scheduling | None = None,
) -> TaskAudit:
    """The dues of one task over ``[now - window, start of now's slot)``, judged.

    A due is accounted for by a ledger entry with that due, or (with ``instance``) a Dagster
    run tagged with it -- a queued run has no entry yet, and a run that failed before starting
    is the outcome reconciler's business, not a gap. ``scheduling`` is the task's
    (:func:`scheduling_of`), read here when not given.
    """
    key = view.spec.key
    end = floor_to_slot(now, view.slot_minutes)
    since = now - window
    if scheduling is None:
        scheduling = scheduling_of(ledger, view, instance=instance)
    if scheduling.since is None:
        return TaskAudit(key, view.spec.missed_slot_policy, None, end, 0, ())
    start = max(since, scheduling.since)
    seen, paused = _ledger_dues(ledger, key, since)
    if instance is not None:
        seen |= run_dues(instance, key, since)
    dues = expected_dues(view, start, end)
    verdicts = [
        (
            d,
            DueVerdict.PAUSED
            if d in paused
            else due_verdict(d, scheduling, accounted=d in seen)[0],
        )
        for d in dues
    ]
    return TaskAudit(
        key,
        view.spec.missed_slot_policy,
        start,
        end,
        len(dues),
        tuple(d for d, v in verdicts if v is DueVerdict.MISSED),
        tuple(d for d, v in verdicts if v is DueVerdict.PAUSED),
    )


def audit_tasks(
    ledger: Ledger,
    views: Iterable[TaskView],
    now: datetime,
    *,
    window: timedelta = DEFAULT_AUDIT_WINDOW,
    instance: dg.DagsterInstance | None = None,
) -> list[TaskAudit]:
    """:func:`audit_task` for every task, in registry order (the ledger's schedules and
    pauses read once for all of them)."""
    schedules, pauses = schedule_states(ledger), pauses_by_task(ledger)
    return [
        audit_task(
            v,
            ledger,
            now,
            window=window,
            instance=instance,
            scheduling=scheduling_of(
                ledger, v, schedules=schedules, pauses=pauses, instance=instance
            ),
        )
        for v in views
    ]
