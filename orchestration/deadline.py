"""Deadlines: was a due ``success`` within its deadline? The decision and its record.

A task's ``deadline`` is a duration after each due. Once ``due + deadline`` has passed, the due
**missed its deadline** unless its entry -- or a manual retry of it -- ended ``success`` by
then. A due not run on purpose (``skipped``, or inside a pause before the sweep wrote it) and
a due from before the task's schedule first ran here are not judged. Like Airflow 3's
Deadline Alerts (reference: the due; interval: the deadline), a miss is audited once and
raises one ``deadline_missed`` alert (:func:`record_deadline_misses`, each tick of
``ledger_sensor`` (policies)); it also fails the task's ``latest_due_accounted_for`` check naming
the entry, and `dueledger summary` counts ``deadline_missed_24h``. Dagster-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

from orchestration.missed_dues import DueVerdict, due_verdict, scheduling_of
from orchestration.task_spec import TaskView
from orchestration.timetable import plan_dues
from resources.core.alerting import KIND_DEADLINE_MISSED
from resources.core.due import format_due
from resources.core.entry import Entry, Status
from resources.ledger import Ledger

if TYPE_CHECKING:
    from orchestration.services.alerts import Alerts

#: How far back the deadline sweep looks each tick.
SWEEP_WINDOW: Final = timedelta(hours=24)
#: The audit action recording a missed deadline (one per due: the alert is raised once).
ACTION_DEADLINE_MISSED: Final = "deadline_missed"


@dataclass(frozen=True)
class DeadlineMiss:
    """A due of ``task_key`` not ``success`` by ``due + deadline``; ``entry`` is its entry
    (None: no run was created for it)."""

    task_key: str
    due: datetime
    deadline: timedelta
    entry: Entry | None
    why: str

    @property
    def subject(self) -> str:
        """The alert's subject: one per task and due."""
        return f"deadline:{self.task_key}@{format_due(self.due)}"

    def fields(self) -> dict[str, object]:
        entry = self.entry
        return {
            "task": self.task_key,
            "due": format_due(self.due),
            "deadline": format_due(self.due + self.deadline),
            "entry_id": entry.id if entry is not None else None,
            "status": entry.status if entry is not None else "missed",
            "error": self.why,
            "action": (
                f"`dueledger runs show {entry.id}`"
                if entry is not None
                else f"`dueledger catch-up {self.task_key} --from {format_due(self.due)} ...`"
            ),
        }


def deadline_miss(
    task_key: str,
    due: datetime,
    deadline: timedelta,
    entry: Entry | None,
    retried: Sequence[Entry] = (),
) -> DeadlineMiss | None:
    """The miss of ``due`` (whose deadline has passed), or None when it was met or is not
    judged. ``retried``: successful manual retries of its entry (any depth)."""
    by = due + deadline
    if entry is not None and entry.status == Status.SKIPPED:
        return None
    done = [
        e
        for e in ([entry] if entry is not None else []) + list(retried)
        if e.status == Status.SUCCESS and e.finished_at is not None
    ]
    if any(e.finished_at is not None and e.finished_at <= by for e in done):
        return None
    if entry is None:
        why = "no run was created for it"
    elif done:
        late = min(e.finished_at for e in done if e.finished_at is not None)
        why = f"entry {entry.id} succeeded only at {format_due(late)}"
    else:
        kind = f" ({entry.failure_kind})" if entry.failure_kind else ""
        why = f"entry {entry.id} is {entry.status}{kind}"
    return DeadlineMiss(task_key, due, deadline, entry, f"{why}; deadline {format_due(by)}")


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
