"""Pause on failure (a task's ``pause_after_failures``), pure: when a task pauses itself.

After ``N`` consecutive final failures the task is paused by ``dueledger`` with a reason that
names the entries; one ``task_paused`` alert goes out. "Consecutive" reads the task's finished
entries newest first: ``failed`` ones count, a ``success`` ends the streak, ``skipped`` ones
(not run, on purpose) neither count nor end it. Only failures after the task was last resumed
from such a pause count, so resuming it gives it ``N`` fresh attempts at a due.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Final

from resources.core.entry import Entry, Status

#: Who pauses a task after its failures (the pause's ``by``; audit operator).
PAUSED_BY_DUELEDGER: Final = "dueledger"
#: The audit actions of a pause and a resume.
ACTION_TASK_PAUSED: Final = "task_paused"
ACTION_TASK_RESUMED: Final = "task_resumed"


def failure_streak(
    threshold: int, finished_newest_first: Sequence[Entry], since: datetime | None
) -> tuple[Entry, ...] | None:
    """The ``threshold`` consecutive final failures that pause the task, newest first, or
    None. ``finished_newest_first``: the task's terminal entries; ``since``: when the task was
    last resumed from a pause on failure (None: never)."""
    streak: list[Entry] = []
    for entry in finished_newest_first:
        if since is not None and (entry.finished_at is None or entry.finished_at <= since):
            break
        if entry.status == Status.SKIPPED:
            continue
        if entry.status != Status.FAILED:
            break
        streak.append(entry)
        if len(streak) == threshold:
            return tuple(streak)
    return None


def failure_pause_reason(streak: Sequence[Entry]) -> str:
    """The pause's reason: how many failures, and which entries."""
    listed = ", ".join(f"{e.id} ({e.label}: {e.failure_kind or 'error'})" for e in streak)
    return (
        f"{len(streak)} consecutive final failures (pause_after_failures={len(streak)}): "
        f"entries {listed}"
    )
