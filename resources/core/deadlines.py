"""Deadlines (DESIGN ``deadline``), pure: was a due ``success`` within its deadline?

A task's ``deadline`` is a duration after each due. Once ``due + deadline`` has passed, the due
**missed its deadline** unless its entry -- or a manual retry of it -- ended ``success`` by
then. A due not run on purpose (``skipped``, or inside a pause before the sweep wrote it) and
a due from before the task's schedule first ran here are not judged. Like Airflow 3's
Deadline Alerts (reference: the due; interval: the deadline), a miss raises one
``deadline_missed`` alert; it also fails the task's ``latest_due_accounted_for`` check naming
the entry, and `dueledger summary` counts ``deadline_missed_24h``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from resources.core.due import format_due
from resources.core.entry import Entry, Status

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
