"""Instants as text and the production clock: the one ISO-8601-UTC formatter.

Every time dueledger writes for a person or a script -- an entry's JSON, alert fields, audit
lines, CLI output, hook payloads -- is ISO-8601 in UTC with a trailing ``Z``: seconds
precision by default, microseconds where ordering within a second matters (the ledger's
own stamps and its list cursor). The due's text (``resources/core/due.py``) is the seconds
form of a slot-aligned instant. Naive datetimes are taken to be UTC already.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final, overload

ISO_SECONDS: Final = "%Y-%m-%dT%H:%M:%SZ"
ISO_MICROSECONDS: Final = "%Y-%m-%dT%H:%M:%S.%fZ"


def utc_now() -> datetime:
    """The production clock (aware UTC). Code that decides takes ``now`` as an argument;
    only shells call this, and tests inject their own clock instead."""
    return datetime.now(UTC)


def as_utc(instant: datetime) -> datetime:
    """Return the same instant in UTC; naive datetimes are taken to be UTC already."""
    if instant.tzinfo is None:
        return instant.replace(tzinfo=UTC)
    return instant.astimezone(UTC)


@overload
def iso(instant: datetime, *, micro: bool = ...) -> str: ...
@overload
def iso(instant: None, *, micro: bool = ...) -> None: ...
@overload
def iso(instant: datetime | None, *, micro: bool = ...) -> str | None: ...
def iso(instant: datetime | None, *, micro: bool = False) -> str | None:
    """``2026-11-30T22:45:00Z`` (``micro``: ``2026-11-30T22:45:00.123456Z``); None stays None."""
    if instant is None:
        return None
    return as_utc(instant).strftime(ISO_MICROSECONDS if micro else ISO_SECONDS)


#: Where a shell reads "now" from: :func:`utc_now` in production, a frozen clock in tests.
Clock = Callable[[], datetime]
