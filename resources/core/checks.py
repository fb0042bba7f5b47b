"""Argument checks shared by the entry keys and the ledger; each names the bad value."""

from __future__ import annotations

from datetime import datetime


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
