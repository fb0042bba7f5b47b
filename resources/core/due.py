"""The due time: one type, one formatter, one parser.

A due is the start of a slot: an aware UTC instant on a whole minute. It is what makes a
scheduled run unique, so it travels in exactly two forms: a :class:`Due` in code (the
schedule's decision, the sensors, the run's entry request, the ledger's key check) and its
text ``YYYY-MM-DDTHH:MM:SSZ`` where only a string fits (the run key, the ``dueledger/due``
run tag, the dedup key ``due:<text>``). Both conversions live here and nowhere else.

Dagster-free, no wall clock: the instant is always passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from resources.core.arguments import require_aware
from resources.core.instants import ISO_SECONDS, as_utc, iso

#: The text form of a due: run key, ``dueledger/due`` tag and the body of a ``due:`` key.
DUE_FORMAT: Final = ISO_SECONDS
#: The ledger origin (and dedup-key prefix) of scheduled and sensor runs.
ORIGIN_DUE: Final = "due"
_KEY_PREFIX: Final = f"{ORIGIN_DUE}:"
_REDISPATCH: Final = "#redispatch-"
_TASK_SEPARATOR: Final = "@"
_WAITER: Final = "#waiter"


def floor_to_slot(instant: datetime, slot_minutes: int) -> datetime:
    """The start of the slot that contains ``instant`` (UTC, slots counted from the epoch).

    Because the slot length divides a day, slots also start at every UTC midnight.
    """
    utc = as_utc(instant)
    slot_seconds = slot_minutes * 60
    epoch_seconds = int(utc.timestamp())
    return datetime.fromtimestamp(epoch_seconds - epoch_seconds % slot_seconds, tz=UTC)


def format_due(instant: datetime) -> str:
    """Any instant in the due's text form (also used for "now", slot starts and log lines)."""
    return iso(instant)


def parse_due(text: str) -> datetime:
    """Inverse of :func:`format_due`; raises ValueError naming the text when malformed."""
    try:
        return datetime.strptime(text, DUE_FORMAT).replace(tzinfo=UTC)
    except (TypeError, ValueError):
        raise ValueError(f"due {text!r} is not of the form YYYY-MM-DDTHH:MM:SSZ") from None


@dataclass(frozen=True, order=True)
class Due:
    """A slot-aligned due time. ``Due(at)`` checks ``at``; use :meth:`parse` for text.

    Refused: a naive datetime (never assumed UTC) and one with seconds or microseconds (a
    due is a slot's start, never "now": such a value almost certainly came from a clock).
    """

    at: datetime

    def __post_init__(self) -> None:
        at = require_aware(self.at, "due")
        if at.second or at.microsecond:
            raise ValueError(
                f"due {at.isoformat()} is not slot-aligned (it has seconds); a due is the "
                f"slot's start time, never the current time"
            )
        object.__setattr__(self, "at", at.astimezone(UTC))

    @classmethod
    def parse(cls, text: str) -> Due:
        """The due of a run tag or run key text (``2026-11-30T22:45:00Z``)."""
        return cls(parse_due(text))

    @classmethod
    def of_slot(cls, instant: datetime, slot_minutes: int) -> Due:
        """The due of the slot that contains ``instant`` (a schedule tick, a sensor's now)."""
        return cls(floor_to_slot(instant, slot_minutes))

    @classmethod
    def from_key(cls, dedup_key: str) -> Due:
        """The due of a ledger dedup key ``due:<text>``; ValueError for any other key."""
        if not isinstance(dedup_key, str) or not dedup_key.startswith(_KEY_PREFIX):
            raise ValueError(f"dedup_key {dedup_key!r} is not a due key ({_KEY_PREFIX}<due>)")
        return cls.parse(dedup_key.removeprefix(_KEY_PREFIX))

    @classmethod
    def coerce(cls, value: Due | datetime) -> Due:
        """``value`` as a Due (a datetime is checked like ``Due(value)``)."""
        return value if isinstance(value, Due) else cls(value)

    @property
    def text(self) -> str:
        """``YYYY-MM-DDTHH:MM:SSZ``: the run key of the due's first request and its run tag."""
        return format_due(self.at)

    @property
    def key(self) -> str:
        """The ledger dedup key ``due:<text>``."""
        return f"{_KEY_PREFIX}{self.text}"

    def redispatch_run_key(self, number: int, task_key: str | None = None) -> str:
        """The run key of the ``number``-th re-dispatch: ``<text>#redispatch-<n>``, or
        ``<task>@<text>#redispatch-<n>`` with ``task_key`` (a sensor that re-dispatches
        several tasks: Dagster dedups its run keys per sensor, not per job)."""
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise ValueError(f"re-dispatch number must be an int >= 1, got {number!r}")
        if task_key is not None and (not task_key or _TASK_SEPARATOR in task_key):
            raise ValueError(f"task key {task_key!r} cannot qualify a run key")
        prefix = f"{task_key}{_TASK_SEPARATOR}" if task_key is not None else ""
        return f"{prefix}{self.text}{_REDISPATCH}{number}"

    def waiter_run_key(self, task_key: str) -> str:
        """``<task>@<text>#waiter``: the run key of the run launched for the due once its
        task is free, after the due waited for its turn without a run (overlap
        ``buffer_one``); one per (task, due), so a launch asked twice is one run."""
        if not task_key or _TASK_SEPARATOR in task_key:
            raise ValueError(f"task key {task_key!r} cannot qualify a run key")
        return f"{task_key}{_TASK_SEPARATOR}{self.text}{_WAITER}"

    def __str__(self) -> str:
        return self.text
