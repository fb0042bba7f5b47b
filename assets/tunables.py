"""The domain rules' tunables as plain validated values: no pandas, no Dagster, no I/O.

``assets.domain_config.DomainRules`` builds these at definition load to validate its
fields, so they live apart from the pandas rules that use them (``assets.billing``,
``renewals``, ``tickets``, ``log_archive``, which re-export them): the code location then
loads without pandas, and a rule module is imported by the run that executes it.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Final

from resources.source_schema import CHANNELS

MAX_REMINDER_DAYS: Final = 365

ARCHIVE_FORMAT: Final = "csv.gz"
ARCHIVE_FORMATS: Final = (ARCHIVE_FORMAT,)
MAX_BATCH_ROWS: Final = 2_000_000


def _validate_days(name: str, days: object) -> tuple[int, ...]:
    if not isinstance(days, tuple | list) or not days:
        raise ValueError(f"{name} must be a non-empty list of whole days, got {days!r}")
    for day in days:
        # numbers.Integral covers int and numpy's integers (numpy registers them).
        if isinstance(day, bool) or not isinstance(day, numbers.Integral):
            raise ValueError(f"{name}: {day!r} is not a whole number of days")
        if not 1 <= int(day) <= MAX_REMINDER_DAYS:
            raise ValueError(
                f"{name}: {day} is out of range; reminder days must be between 1 and "
                f"{MAX_REMINDER_DAYS} (e.g. [1, 3, 5])"
            )
    if len(set(days)) != len(days):
        raise ValueError(f"{name}: {list(days)} repeats a day; list each day once")
    return tuple(int(d) for d in days)


def validate_channels(name: str, channels: object) -> tuple[str, ...]:
    """A non-empty, duplicate-free tuple of known channels, or a ValueError naming `name`."""
    if not isinstance(channels, tuple | list) or not channels:
        raise ValueError(f"{name} must be a non-empty list of channels from {list(CHANNELS)}")
    unknown = [c for c in channels if c not in CHANNELS]
    if unknown:
        raise ValueError(f"{name}: unknown channel(s) {unknown}; use a subset of {list(CHANNELS)}")
    if len(set(channels)) != len(channels):
        raise ValueError(f"{name}: {list(channels)} repeats a channel; list each channel once")
    return tuple(channels)


@dataclass(frozen=True)
class ReminderPolicy:
    """When reminders are due and on which channels (the seed's defaults)."""

    overdue_days: tuple[int, ...] = (1, 3, 5)
    renewal_days: tuple[int, ...] = (7, 3, 1)
    channels: tuple[str, ...] = CHANNELS

    def __post_init__(self) -> None:
        object.__setattr__(self, "overdue_days", _validate_days("overdue_days", self.overdue_days))
        object.__setattr__(self, "renewal_days", _validate_days("renewal_days", self.renewal_days))
        object.__setattr__(self, "channels", validate_channels("channels", self.channels))


@dataclass(frozen=True)
class AutoRenewPolicy:
    """How far ahead of expiry services are renewed, and for how long."""

    window: timedelta = timedelta(days=3)
    period: timedelta = timedelta(days=30)

    def __post_init__(self) -> None:
        for name in ("window", "period"):
            value = getattr(self, name)
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise ValueError(
                    f"AutoRenewPolicy.{name} must be a positive timedelta "
                    f"(e.g. timedelta(days=3)), got {value!r}"
                )


@dataclass(frozen=True)
class TicketAutoClosePolicy:
    """How long a ticket may wait on the customer before it is closed."""

    waiting: timedelta = timedelta(days=7)

    def __post_init__(self) -> None:
        if not isinstance(self.waiting, timedelta) or self.waiting <= timedelta(0):
            raise ValueError(
                f"TicketAutoClosePolicy.waiting must be a positive timedelta "
                f"(e.g. timedelta(days=7)), got {self.waiting!r}"
            )


@dataclass(frozen=True)
class ArchivePolicy:
    """How old a log row must be to be archived, where archives go, and batch size."""

    directory: Path
    retention: timedelta = timedelta(days=90)
    batch_rows: int = 100_000
    format: str = ARCHIVE_FORMAT

    def __post_init__(self) -> None:
        if not str(self.directory).strip():
            raise ValueError("ArchivePolicy.directory must name a directory for archive files")
        object.__setattr__(self, "directory", Path(self.directory))
        if not isinstance(self.retention, timedelta) or self.retention < timedelta(days=1):
            raise ValueError(
                f"ArchivePolicy.retention must be at least one day (e.g. timedelta(days=90)), "
                f"got {self.retention!r}"
            )
        if (
            isinstance(self.batch_rows, bool)
            or not isinstance(self.batch_rows, int)
            or not 1 <= self.batch_rows <= MAX_BATCH_ROWS
        ):
            raise ValueError(
                f"ArchivePolicy.batch_rows must be a whole number in 1..{MAX_BATCH_ROWS}, "
                f"got {self.batch_rows!r}"
            )
        if self.format not in ARCHIVE_FORMATS:
            raise ValueError(
                f"ArchivePolicy.format {self.format!r} is not supported; use one of "
                f"{list(ARCHIVE_FORMATS)} (Parquet would need pyarrow)"
            )
