"""The ledger's value objects and the pure helpers around them (no database, no Dagster).

``Entry`` is one stored row, times timezone-aware UTC; the helpers convert times at the
database boundary (stored timezone-naive UTC), keep the JSON ``summary`` lists bounded,
word refusals, validate arguments and encode the keyset cursor of ``list_entries``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from resources.core.arguments import require_aware, require_text
from resources.core.entry import MAX_ERROR_CHARS, MAX_RUN_ID_CHARS, Entry, with_summary_lists
from resources.core.errors import InvalidInput
from resources.core.fence import Fence
from resources.core.instants import iso
from resources.core.text import clean_text


class LedgerError(RuntimeError):
    """The ledger database cannot be used (unreachable, locked, not migrated, bad URL).

    The message names the database (password masked) and what to do about it.
    """


class LedgerConflict(LedgerError):
    """A write lost to a concurrent one on a unique key (another process inserted the same row
    first): the caller's transaction was rolled back and nothing of it was written."""


class LedgerConfigError(LedgerError, InvalidInput):
    """The ledger's configuration is wrong (not an SQLAlchemy URL, an unsupported backend or
    driver, a SQLite path that cannot be a file): invalid input, exit 2 from the CLI. The
    message names the setting and the fix."""


class UnknownEntryError(ValueError):
    """An operation named a ledger entry id that does not exist."""


def truncate_error(error: str) -> str:
    """Bound an error text to MAX_ERROR_CHARS, saying how much was cut; made fit to store
    first (no ANSI escapes, NUL or other control characters: ``clean_text``)."""
    text = clean_text(str(error))
    if len(text) <= MAX_ERROR_CHARS:
        return text
    marker = f"\n... [truncated: {len(text)} characters in total]"
    return text[: MAX_ERROR_CHARS - len(marker)] + marker


# Both conversions run several times per ledger call (the claim hot path: 2 in, 8 out), so
# they attach or drop the tzinfo with datetime.combine: on CPython 3.11 it costs a fifth of
# dt.replace(tzinfo=...), whose keyword parsing dominated them (bench/ledger_claims.py).
# Same value, same fold; combine() takes only the date part of its first argument.


def to_db(dt: datetime | None, name: str) -> datetime | None:
    """Aware datetime -> naive UTC for storage."""
    if dt is None:
        return None
    if type(dt) is not datetime or dt.tzinfo is not UTC:  # else UTC already (internal stamps)
        dt = require_aware(dt, name).astimezone(UTC)
    return datetime.combine(dt, dt.time())


def db_values(changes: Mapping[str, Any]) -> dict[str, Any]:
    """A rule's changes (resources/core/rules.py) as column values: aware times become
    naive UTC, tuples (``run_ids``) lists."""
    values: dict[str, Any] = {}
    for name, value in changes.items():
        if isinstance(value, datetime):
            value = to_db(value, name)
        elif isinstance(value, tuple):
            value = list(value)
        values[name] = value
    return values


def from_db(dt: datetime | None) -> datetime | None:
    """Stored naive UTC -> aware UTC."""
    return None if dt is None else datetime.combine(dt, dt.time(), UTC)


def appended(summary: Mapping[str, Any], key: str, item: Any, keep: int) -> dict[str, Any]:
    """Copy of ``summary`` with ``item`` appended to list ``key``, keeping the newest ``keep``."""
    new = with_summary_lists(summary)
    new[key] = [*new[key], item][-keep:]
    return new


#: Entry's fields in order, each read from the column of the same name, and how each kind
#: of field is converted (by its annotation, so a new column converts like its kind).
_FIELDS: Final = tuple(f.name for f in fields(Entry))
_FIELD_SET: Final = frozenset(_FIELDS)
_TIMES: Final = tuple(f.name for f in fields(Entry) if f.type in ("datetime", "datetime | None"))
_INTS: Final = tuple(f.name for f in fields(Entry) if f.type == "int")
_OPTIONAL_INTS: Final = tuple(f.name for f in fields(Entry) if f.type == "int | None")
_combine = datetime.combine


def entry_from_row(row: Mapping[Any, Any]) -> Entry:
    """The Entry of a stored row (a mapping by column name; other columns are ignored).

    Every claim, failure, reclaim and listed entry goes through here, so it builds the
    frozen dataclass without its ``__init__``: the generated one sets each of the 25 fields
    through ``object.__setattr__``, which was most of this function's cost (about two
    thirds, bench/ledger_claims.py). Every field is read from the row (a missing column is
    a KeyError, as before), so no default applies, and Entry has no ``__post_init__`` to
    skip (tests/resources/test_ledger_hot_path.py checks that, and the result against
    ``Entry(...)``); times are converted as in :func:`from_db`.
    """
    values = dict(row)
    if values.keys() != _FIELD_SET:  # a row with other columns: take Entry's only
        values = {name: row[name] for name in _FIELDS}
    for name in _TIMES:
        value = values[name]
        if value is not None:
            values[name] = _combine(value, value.time(), UTC)
    assert values["created_at"] is not None and values["updated_at"] is not None  # NOT NULL
    for name in _INTS:
        values[name] = int(values[name])
    for name in _OPTIONAL_INTS:
        if values[name] is not None:
            values[name] = int(values[name])
    values["run_ids"] = tuple(values["run_ids"] or ())
    values["summary"] = with_summary_lists(values["summary"])
    entry = object.__new__(Entry)
    entry.__dict__.update(values)
    return entry


@dataclass(frozen=True)
class ClaimResult:
    """Outcome of :meth:`RunLedger.claim`: the entry's state after the call and, if refused, why."""

    claimed: bool
    entry: Entry
    reason: str | None
    #: The caller's run already held the entry: nothing changed, the fence is the one that
    #: run got before -- possibly in another process of the same Dagster run.
    reentrant: bool = False

    @property
    def fence(self) -> Fence | None:
        """The claiming run's fencing token (None when refused): its side effects commit
        only while the entry is still running under this owner and claim generation."""
        if not self.claimed or self.entry.lease_owner is None:
            return None
        return Fence(self.entry.id, self.entry.lease_owner, self.entry.claim_generation)


# --- validation and cursors --------------------------------------------------------------------


def check_id(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    return value


def check_run_id(run_id: object) -> str:
    text = require_text(run_id, "run_id")
    if len(text) > MAX_RUN_ID_CHARS:
        raise ValueError(f"run_id {text[:40]!r}... is longer than {MAX_RUN_ID_CHARS} characters")
    return text


_NO_TIME: Final = timedelta(0)


def check_ttl(lease_ttl: object) -> timedelta:
    if not isinstance(lease_ttl, timedelta) or lease_ttl <= _NO_TIME:
        raise ValueError(f"lease_ttl must be a positive timedelta, got {lease_ttl!r}")
    return lease_ttl


#: The largest entry id (the ``id`` column is a signed 64-bit BIGINT).
MAX_ENTRY_ID = 2**63 - 1


def encode_cursor(entry: Entry) -> str:
    raw = f"{iso(entry.created_at, micro=True)}|{entry.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, int]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created_text, id_text = base64.urlsafe_b64decode(padded).decode().split("|")
        created = datetime.strptime(created_text, "%Y-%m-%dT%H:%M:%S.%fZ")
        entry_id = int(id_text)
        # Entry ids are BIGINT: a larger one is not from a page (PostgreSQL would refuse it).
        if not 0 <= entry_id <= MAX_ENTRY_ID:
            raise ValueError(entry_id)
        return created, entry_id
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValueError(f"cursor {cursor!r} is not a cursor returned by a previous page") from None
