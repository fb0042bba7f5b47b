"""Argument checks shared by the entry keys and the ledger; each names the bad value."""

from __future__ import annotations

from datetime import datetime
from typing import Final

from resources.core.text import check_plain

#: The longest ``--reason``: it is stored on the entry and its audit and is a tag of the run
#: (shown on the Runs page); longer context belongs in a ticket or document it links to.
MAX_REASON_CHARS: Final = 2000
#: The longest ``--request-id``: its ledger key ``manual:<id>`` is a 400-character column.
MAX_REQUEST_ID_CHARS: Final = 200


def require_text(value: object, name: str) -> str:
    """``value`` when it is a non-empty string, else ValueError naming ``name``."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def require_aware(dt: datetime, name: str) -> datetime:
    """``dt`` when it is a timezone-aware datetime; a naive one is refused, never assumed UTC."""
    if not isinstance(dt, datetime):
        raise ValueError(f"{name} must be a datetime, got {dt!r}")
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ValueError(
            f"{name}={dt.isoformat()} is timezone-naive; pass a timezone-aware UTC datetime "
            f"(e.g. datetime.now(UTC))"
        )
    return dt


def check_reason(reason: str, what: str) -> str:
    """A usable ``--reason`` (``what``: "why the run is launched"), else ValueError."""
    text = (reason or "").strip()
    if not text:
        raise ValueError(f"--reason must say {what}")
    if len(text) > MAX_REASON_CHARS:
        raise ValueError(
            f"--reason is {len(text)} characters; at most {MAX_REASON_CHARS} are kept with the "
            f"entry and its run: shorten it and link to the details (a ticket, a document)"
        )
    # Stored, tagged and printed: bytes that are not UTF-8 cannot be, escapes must not be.
    return check_plain(text, "--reason", allow_layout=True)


def check_request_id(request_id: str) -> str:
    """A usable ``--request-id``, else ValueError naming the limit."""
    text = (request_id or "").strip()
    if not text:
        raise ValueError("--request-id must not be empty")
    if len(text) > MAX_REQUEST_ID_CHARS:
        raise ValueError(
            f"--request-id is {len(text)} characters; at most {MAX_REQUEST_ID_CHARS} are "
            f"allowed (use a short id, such as a ticket number or a UUID)"
        )
    return check_plain(text, "--request-id")
