"""Missed-due audit and catch-up: the dues each task's rule implies, against what happened.

A due is **missed** when its slot has ended, there is neither a ledger entry nor a Dagster
run for it (daemon down, a tick that never came), it is not before the task's schedule first
ran here, and no pause covers it: one rule, ``resources/core/dues.py: due_verdict``, which
the asset checks use too. Expected dues are computed with the schedule's own decision
(``plans.plan_dues``: ``decide_tick`` over the fires of the task's crons), so the audit and
the schedule cannot disagree.

The audit starts when the task's schedule first ran here (``services/scheduling.py``; its
first recorded activity when no schedule was observed yet), or at the window's start: dues
from before a deployment or a task existed are not "missed". A task that nothing ran yet is
not audited (``TaskAudit.start`` is None).

For ``catch_up`` tasks, ``<task>_catch_up_sensor`` launches each missed due inside the
task's ``catch_up_window`` with ``run_key`` = the due: Dagster's sensor run-key dedup
(kept forever) and the run it creates — which the next audit sees — make a due launched
once, however often the sensor is evaluated.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

from orchestration.services.scheduling import scheduling_of
from orchestration.task_spec import TaskView
from orchestration.timetable import plan_dues
from resources.core import tags as t
from resources.core.due import floor_to_slot, format_due, parse_due
from resources.core.dues import DueVerdict, Scheduling, due_verdict, skipped_for_pause
from resources.core.entry import Status
from resources.ledger import Ledger

if TYPE_CHECKING:
    import dagster as dg

DEFAULT_AUDIT_WINDOW: Final = timedelta(hours=24)
#: Runs one catch-up evaluation may request; the next evaluation continues (oldest first).
MAX_CATCH_UP_PER_TICK: Final = 20
_PAGE: Final = 500


def expected_dues(view: TaskView, start: datetime, end: datetime) -> list[datetime]:
    """The dues the task's schedule requests in ``[start, end)``, oldest first: its plan's
    own decision (``resources/core/plans.py: plan_dues``, what every tick decides)."""
    return plan_dues(view.plan, view.slot_minutes, start, end)


@dataclass(frozen=True)
class TaskAudit:
    """One task's audit over ``[start, end)`` (``start`` None: nothing ran the task here yet,
    so no due is expected): the dues its rule implies, those ``missed``, and those ``paused``
    (not run on purpose: inside a pause, or written ``skipped`` for one). Every other due is
    judged by ``resources/core/dues.py: due_verdict``."""

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


def _run_dues(instance: dg.DagsterInstance, task_key: str, since: datetime) -> set[datetime]:
    # Dagster is loaded only where an instance is: the CLI's read commands have none.
    import dagster as dg

    records = instance.get_run_records(
        filters=dg.RunsFilter(tags={t.TAG_TASK: task_key}, created_after=since)
    )
    dues = (_parse(r.dagster_run.tags.get(t.TAG_DUE)) for r in records)
    return {d for d in dues if d is not None}


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
    (``services/scheduling.py: scheduling_of``), read here when not given.
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
        seen |= _run_dues(instance, key, since)
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
    schedules, pauses = ledger.schedule_states(), ledger.pauses_by_task()
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
