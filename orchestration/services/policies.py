"""The scheduling policies kept by ``ledger_policy_sensor`` (sensors/policies.py) each tick.

- **Paused dues** (:func:`record_paused_dues`): every due of a task inside one of its pauses
  -- `dueledger pause`, a pause after failures, its schedule stopped in the Dagster UI -- is
  written as an entry ``skipped`` with ``paused by NAME: REASON``, insert-or-ignore on its
  ``due:`` key, once its slot has started. A run that reaches a paused due anyway (created
  before the pause, a re-dispatch) ends it ``skipped`` at its claim (``overlap.py``); the
  unique key makes whichever comes second a no-op, so no due is lost or written twice.
- **Pause on failure** (:func:`pause_after_failures`): a task with ``pause_after_failures=N``
  whose last ``N`` finished entries failed is paused by ``dueledger`` naming them, audited,
  with one ``task_paused`` alert (``resources/core/pausing.py``).
- **Deadlines** (:func:`record_deadline_misses`): each due of a task with a ``deadline`` that
  was not ``success`` by then is audited once and raises one ``deadline_missed`` alert
  (``resources/core/deadlines.py``); `dueledger summary` and the task's asset check ask
  :func:`deadline_misses` too.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Final

from orchestration.services.alerts import Alerts
from orchestration.services.scheduling import scheduling_of
from orchestration.task_spec import TaskView
from orchestration.timetable import plan_dues
from resources.core.alerting import KIND_DEADLINE_MISSED, KIND_TASK_PAUSED
from resources.core.deadlines import ACTION_DEADLINE_MISSED, DeadlineMiss, deadline_miss
from resources.core.due import floor_to_slot, format_due
from resources.core.dues import DueVerdict, Pause, due_verdict
from resources.core.entry import Status
from resources.core.instants import iso
from resources.core.pausing import (
    ACTION_TASK_PAUSED,
    PAUSED_BY_DUELEDGER,
    failure_pause_reason,
    failure_streak,
)
from resources.ledger import Entry, Ledger
from resources.ledger.scheduling import PAUSE_AFTER_FAILURES

#: How far back the paused-dues sweep and the deadline sweep look each tick.
SWEEP_WINDOW: Final = timedelta(hours=24)


def record_paused_dues(
    ledger: Ledger, views: Sequence[TaskView], now: datetime, *, window: timedelta = SWEEP_WINDOW
) -> list[Entry]:
    """Write the entry of every due inside a pause (slot started, within ``window``) as
    ``skipped`` with the pause's reason; returns the entries this call wrote."""
    written: list[Entry] = []
    by_task = ledger.pauses_by_task()
    for view in views:
        pauses = by_task.get(view.spec.key, ())
        slot = timedelta(minutes=view.slot_minutes)
        horizon = floor_to_slot(now, view.slot_minutes) + slot  # dues whose slot has started
        for pause in pauses:
            start = max(pause.start, now - window)
            end = min(pause.end or horizon, horizon)
            if start >= end:
                continue
            known = ledger.due_entries(view.spec.key, start, end)
            for due in plan_dues(view.plan, view.slot_minutes, start, end):
                if due in known or not pause.covers(due):
                    continue
                entry, wrote = ledger.record_skipped_due(
                    view.spec.key,
                    due,
                    reason=pause.skip_reason,
                    max_attempts=view.spec.max_attempts,
                )
                if wrote:
                    written.append(entry)
    return written


def pause_after_failures(
    ledger: Ledger, views: Sequence[TaskView], now: datetime, alerts: Alerts | None = None
) -> list[Pause]:
    """Pause every task whose last ``pause_after_failures`` finished entries failed (since
    it was last resumed from such a pause); returns the pauses opened."""
    opened: list[Pause] = []
    for view in views:
        threshold = view.spec.pause_after_failures
        if not threshold:
            continue
        key = view.spec.key
        pauses = ledger.pauses(key)
        own = [p for p in pauses if p.source == PAUSE_AFTER_FAILURES]
        if any(p.end is None for p in own):
            continue  # paused for its failures already
        since = max((p.end for p in own if p.end is not None), default=None)
        finished = ledger.latest_finished(
            key, limit=threshold, statuses=(Status.SUCCESS, Status.FAILED)
        )
        streak = failure_streak(threshold, finished, since)
        if streak is None:
            continue
        reason = failure_pause_reason(streak)
        pause = ledger.pause_task(
            key, by=PAUSED_BY_DUELEDGER, reason=reason, source=PAUSE_AFTER_FAILURES, now=now
        )
        if pause is None:
            continue  # another process paused it first
        opened.append(pause)
        ledger.write_audit(
            operator=PAUSED_BY_DUELEDGER,
            action=ACTION_TASK_PAUSED,
            entry_id=streak[0].id,
            reason=reason,
            checks={"task_key": key, "pause_id": pause.id, "entries": [e.id for e in streak]},
            outcome=f"paused: {key} paused by {PAUSED_BY_DUELEDGER}",
            now=now,
        )
        if alerts is not None:
            alerts.emit(
                KIND_TASK_PAUSED,
                f"pause:{pause.id}",
                task=key,
                pause_id=pause.id,
                paused_by=PAUSED_BY_DUELEDGER,
                since=iso(pause.start),
                reason=reason,
                entries=[e.id for e in streak],
                action=f"fix the cause, then `dueledger resume {key} --reason TEXT`",
            )
    return opened


def deadline_misses(
    ledger: Ledger, view: TaskView, now: datetime, *, window: timedelta = SWEEP_WINDOW
) -> list[DeadlineMiss]:
    """The dues of ``view`` whose deadline passed within ``window`` before ``now`` and was
    missed, oldest first (none without a ``deadline``)."""
    deadline = view.spec.deadline
    if deadline is None:
        return []
    end = now - deadline + timedelta(seconds=1)  # dues whose deadline has passed
    start = end - window
    dues = plan_dues(view.plan, view.slot_minutes, start, end)
    if not dues:
        return []
    entries = ledger.due_entries(view.spec.key, start, end)
    scheduling = None
    misses: list[DeadlineMiss] = []
    for due in dues:
        entry = entries.get(due)
        if entry is None:
            scheduling = scheduling or scheduling_of(ledger, view)
            if due_verdict(due, scheduling, accounted=False)[0] is not DueVerdict.MISSED:
                continue  # not expected here yet, or paused: not judged
        retried = _successful_retries(ledger, entry) if entry is not None else []
        miss = deadline_miss(view.spec.key, due, deadline, entry, retried)
        if miss is not None:
            misses.append(miss)
    return misses


def _successful_retries(ledger: Ledger, entry: Entry) -> list[Entry]:
    if entry.status == Status.SUCCESS or entry.manual_retry_at is None:
        return []
    found, pending = [], [entry]
    while pending:
        for child in ledger.children(pending.pop().id):
            if child.status == Status.SUCCESS:
                found.append(child)
            pending.append(child)
    return found


def record_deadline_misses(
    ledger: Ledger, views: Sequence[TaskView], now: datetime, alerts: Alerts | None = None
) -> list[DeadlineMiss]:
    """Audit each missed deadline once (action ``deadline_missed``) and raise its alert;
    returns the misses recorded by this call."""
    watched = [v for v in views if v.spec.deadline is not None]
    if not watched:
        return []
    longest = max(v.spec.deadline for v in watched if v.spec.deadline is not None)
    since = now - SWEEP_WINDOW - longest - timedelta(hours=1)
    seen = {
        str((record.get("checks") or {}).get("subject"))
        for record in ledger.recent_audit(action=ACTION_DEADLINE_MISSED, since=since, limit=5000)
    }
    recorded: list[DeadlineMiss] = []
    for view in watched:
        for miss in deadline_misses(ledger, view, now):
            if miss.subject in seen:
                continue
            fields = miss.fields()
            ledger.write_audit(
                operator=None,
                action=ACTION_DEADLINE_MISSED,
                entry_id=miss.entry.id if miss.entry is not None else None,
                reason=None,
                checks={"subject": miss.subject, "task_key": miss.task_key, **fields},
                outcome=f"deadline missed: {miss.task_key} due {format_due(miss.due)}: {miss.why}",
                now=now,
            )
            if alerts is not None:
                alerts.emit(KIND_DEADLINE_MISSED, miss.subject, **fields)
            recorded.append(miss)
    return recorded
