"""Was a due missed? One answer for every reader (pure, no Dagster, no database).

`dueledger summary` (``missed_24h``), the ``ledger_health`` asset, the slot-health alert,
the catch-up sensor and every task's ``latest_due_accounted_for`` asset check ask
:func:`due_verdict`, so they cannot disagree about a due:

- **accounted**: a ledger entry or a Dagster run exists for it (whatever its outcome);
- **not expected**: it lies before the task's schedule first ran here (a fresh deployment,
  a new task): nothing was supposed to run it;
- **paused**: it lies inside a pause of the task (its schedule stopped in the Dagster UI,
  or ``dueledger pause``): not run, on purpose, and said by whom and why;
- **missed**: none of these -- the scheduler should have run it and did not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from resources.core.instants import iso

#: How a due skipped for a pause says so (``Pause.skip_reason``): ``paused by NAME: REASON``.
PAUSED_PREFIX = "paused by "


def skipped_for_pause(error: str | None) -> bool:
    """Does a skipped entry's reason say a pause skipped it?"""
    return (error or "").startswith(PAUSED_PREFIX)


class DueVerdict(StrEnum):
    ACCOUNTED = "accounted"
    NOT_EXPECTED = "not_expected"
    PAUSED = "paused"
    MISSED = "missed"


@dataclass(frozen=True)
class Pause:
    """One pause of a task: from ``start`` until ``end`` (None: still paused)."""

    start: datetime
    end: datetime | None
    by: str
    reason: str
    source: str = ""
    #: Its row in ``dueledger_pauses`` (None for a pause not read from the ledger).
    id: int | None = None
    task_key: str = ""

    def covers(self, due: datetime) -> bool:
        return self.start <= due and (self.end is None or due < self.end)

    @property
    def skip_reason(self) -> str:
        """What a due skipped for this pause says: ``paused by NAME: REASON``."""
        return f"{PAUSED_PREFIX}{self.by}: {self.reason}"

    def as_json(self) -> dict[str, str | None]:
        return {
            "by": self.by,
            "reason": self.reason,
            "since": iso(self.start),
            "until": iso(self.end),
            "source": self.source,
            "skip_reason": self.skip_reason,
        }


@dataclass(frozen=True)
class Scheduling:
    """What is known of a task's scheduling here: since when its schedule has run (None:
    nothing ran it yet, so no due is expected) and its pauses."""

    since: datetime | None
    pauses: tuple[Pause, ...] = ()

    def pause_at(self, due: datetime) -> Pause | None:
        return next((p for p in self.pauses if p.covers(due)), None)


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
    pause = scheduling.pause_at(due)
    if pause is not None:
        return DueVerdict.PAUSED, pause.skip_reason
    return DueVerdict.MISSED, "no run was created for it"


def missed(dues: Sequence[datetime], scheduling: Scheduling, seen: set[datetime]) -> list[datetime]:
    """The dues of ``dues`` whose verdict is missed."""
    return [
        d for d in dues if due_verdict(d, scheduling, accounted=d in seen)[0] is DueVerdict.MISSED
    ]
