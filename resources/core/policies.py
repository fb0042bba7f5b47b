"""A task's scheduling policies: their names and what a declaration may say (pure).

DESIGN names them: overlap ``queue`` | ``skip`` | ``buffer_one`` | ``replace`` | ``allow``
(``allow`` only with ``concurrent_safe=True``), ``pause_after_failures``, ``deadline`` and
``timezone``. :func:`policy_problem` says what is wrong with a declaration's values, so the
registry (``resources/core/registry.py``) can refuse it at load naming the task and the field.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

#: Later runs wait in the task's Dagster pool (one run of the task at a time).
OVERLAP_QUEUE: Final = "queue"
#: A run that finds the task running is not run: its entry ends ``skipped``.
OVERLAP_SKIP: Final = "skip"
#: At most one run waits for the running one; any further one is ``skipped``.
OVERLAP_BUFFER_ONE: Final = "buffer_one"
#: A new run ends the running one (``failed``, kind ``replaced``) and runs.
OVERLAP_REPLACE: Final = "replace"
#: Runs of the task run side by side (a task declared ``concurrent_safe=True`` only).
OVERLAP_ALLOW: Final = "allow"
OVERLAP_POLICIES: Final = (
    OVERLAP_QUEUE,
    OVERLAP_SKIP,
    OVERLAP_BUFFER_ONE,
    OVERLAP_REPLACE,
    OVERLAP_ALLOW,
)
#: Policies the ledger decides when a run claims (their task asset has no Dagster pool, so a
#: second run starts and asks the ledger); ``queue`` is Dagster's pool, ``allow`` is nothing.
LEDGER_OVERLAP_POLICIES: Final = (OVERLAP_SKIP, OVERLAP_BUFFER_ONE, OVERLAP_REPLACE)

#: Longest deadline: the deadline sweep and ``deadline_missed_24h`` look this far back.
MAX_DEADLINE: Final = timedelta(days=7)
#: Most consecutive failures a task may wait for before it pauses itself.
MAX_PAUSE_AFTER_FAILURES: Final = 1000


def uses_task_pool(overlap_policy: str) -> bool:
    """Does the task's asset sit in a Dagster pool of one slot (overlap ``queue``)?"""
    return overlap_policy == OVERLAP_QUEUE


def zone_problem(name: object) -> str | None:
    """Why ``name`` is not an IANA time zone ``zoneinfo`` knows (None: it is one)."""
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        return f"{name!r} is not an IANA time zone name (e.g. 'UTC', 'Europe/Berlin')"
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return (
            f"{name!r} is not a time zone zoneinfo knows; use an IANA name such as "
            f"'Europe/Berlin' or 'America/New_York'"
        )
    return None


def policy_problem(
    *,
    overlap_policy: object,
    concurrent_safe: object,
    pause_after_failures: object,
    deadline: object,
    timezone: object,
) -> tuple[str, str] | None:
    """The first problem of a declaration's policy values, as ``(field, problem)``."""
    if overlap_policy not in OVERLAP_POLICIES:
        return (
            "overlap_policy",
            f"unknown policy {overlap_policy!r}; use one of {', '.join(OVERLAP_POLICIES)}",
        )
    if not isinstance(concurrent_safe, bool):
        return "concurrent_safe", f"must be True or False, got {concurrent_safe!r}"
    if overlap_policy == OVERLAP_ALLOW and not concurrent_safe:
        return (
            "overlap_policy",
            "'allow' runs several runs of the task at once; declare concurrent_safe=True only "
            "when its side effects stay exactly-once under concurrency, else use 'queue'",
        )
    if pause_after_failures is not None and (
        isinstance(pause_after_failures, bool)
        or not isinstance(pause_after_failures, int)
        or not 1 <= pause_after_failures <= MAX_PAUSE_AFTER_FAILURES
    ):
        return (
            "pause_after_failures",
            f"must be None or a whole number from 1 to {MAX_PAUSE_AFTER_FAILURES}, "
            f"got {pause_after_failures!r}",
        )
    if deadline is not None and (
        not isinstance(deadline, timedelta) or not timedelta(0) < deadline <= MAX_DEADLINE
    ):
        return (
            "deadline",
            f"must be None or a duration after the due in (0, {MAX_DEADLINE}], got {deadline!r}",
        )
    if timezone is not None:
        problem = zone_problem(timezone)
        if problem is not None:
            return "timezone", problem
    return None
