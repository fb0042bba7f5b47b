"""The alert line every sensor and the CLI write, and the clock they read.

:func:`alert_line` renders one alert as one JSON line (``{"alert": kind, ...}``) so log
pipelines can parse it; :func:`emit_alert` writes it to the Dagster context log and to the
``dueledger.alerts`` Python logger.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

ALERT_LOGGER: Final = logging.getLogger("dueledger.alerts")

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The production clock of every sensor (tests inject Dagster's frozen clock)."""
    return datetime.now(UTC)


def iso(instant: datetime | None) -> str | None:
    """ISO-8601 UTC with ``Z`` (seconds precision), the alerts' time format."""
    if instant is None:
        return None
    return instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def alert_line(kind: str, **fields: Any) -> str:
    """One alert as one JSON line: ``{"alert": kind, ...fields}`` (keys in the given order)."""
    return json.dumps({"alert": kind, **fields}, default=str, separators=(",", ":"))


def emit_alert(log: Any | None, kind: str, **fields: Any) -> str:
    """Write one alert line as a warning to ``log`` (a Dagster context log) and to the
    ``dueledger.alerts`` logger (the daemon's own log). Returns the line."""
    line = alert_line(kind, **fields)
    if log is not None:
        log.warning(line)
    ALERT_LOGGER.warning(line)
    return line
