"""Re-dispatch within the slot, planned as pure functions.

A scheduled due whose run never claimed its entry (``dispatch_failed``) is re-dispatched
within its own slot, at most ``max_redispatches`` times. Dagster's sensor run-key dedup holds
a key forever, even for a failed run, so the n-th re-dispatch of a due uses run key
``<due>#redispatch-<n>`` where n is the number of dispatch failures the entry has recorded:
a new failure gives a new key (never blocked), and re-evaluating the same state gives the
same key (Dagster finds its run; no second run). One sensor re-dispatches every task, and
Dagster looks a sensor's run keys up by sensor name only, so when it targets several task
jobs the key is qualified by the task: ``<task>@<due>#redispatch-<n>``. The ledger's
``dispatch_failed -> queued`` compare-and-set decides which evaluation re-dispatches; the
claim decides which run acts. The sensor that asks is ``sensors/redispatch.py``; it reads
only the current slot's entries that may need it (:data:`REDISPATCH_STATUSES`, by index).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

from resources.core.due import Due
from resources.core.entry import MAX_DISPATCH_FAILURES, SUMMARY_DISPATCH_FAILURES, Entry, Status

#: Re-dispatches of one due per slot (the ledger keeps the newest 5 dispatch failures, and
#: the failure count numbers the re-dispatches, so at most 4 are possible).
DEFAULT_MAX_REDISPATCHES: Final = 3
MAX_REDISPATCHES_LIMIT: Final = MAX_DISPATCH_FAILURES - 1
#: A re-dispatch sensor evaluates once per REDISPATCH_SLOT_FRACTION of its slot, between
#: these bounds (see :func:`redispatch_interval_seconds`).
REDISPATCH_INTERVAL_MIN: Final = 30
REDISPATCH_INTERVAL_MAX: Final = 120
REDISPATCH_SLOT_FRACTION: Final = 8
#: The statuses of a due's entry that a re-dispatch evaluation looks at: ``dispatch_failed``
#: (to re-dispatch) and ``queued`` (re-dispatched already, its run request perhaps lost).
REDISPATCH_STATUSES: Final = (Status.DISPATCH_FAILED, Status.QUEUED)


@dataclass(frozen=True)
class RedispatchPlan:
    """What a re-dispatch evaluation does for the current slot's entry."""

    number: int | None  # n of run_key <due>#redispatch-<n>; None: nothing to request
    compare_and_set: bool  # dispatch_failed -> queued first
    reason: str


def redispatch_run_key(due: Due | datetime, number: int, task_key: str | None = None) -> str:
    """``<due>#redispatch-<n>``, or ``<task>@<due>#redispatch-<n>`` with ``task_key`` (a
    sensor that targets several task jobs): unique per (task, due, n) within the sensor, so
    never blocked by an older key."""
    return Due.coerce(due).redispatch_run_key(number, task_key)


def plan_redispatch(
    entry: Entry | None, max_redispatches: int, *, last_failure_canceled: bool = False
) -> RedispatchPlan:
    """Pure: whether the current slot's entry gets (or keeps) a re-dispatch run request."""
    if entry is None:
        return RedispatchPlan(None, False, "no entry for this slot's due")
    failures = len(entry.summary.get(SUMMARY_DISPATCH_FAILURES, []))
    if entry.status == Status.DISPATCH_FAILED:
        if failures == 0:
            return RedispatchPlan(None, False, "dispatch_failed without a recorded failure")
        if entry.manual_retry_at is not None:
            return RedispatchPlan(None, False, "a manual retry was made of this entry")
        if last_failure_canceled:
            return RedispatchPlan(None, False, "its last run was canceled by an operator")
        if failures > max_redispatches:
            return RedispatchPlan(
                None,
                False,
                f"re-dispatch budget used: {failures} dispatch failures, at most "
                f"{max_redispatches} re-dispatches per slot",
            )
        return RedispatchPlan(failures, True, f"dispatch failure {failures}: re-dispatching")
    if entry.status == Status.QUEUED and 0 < failures <= max_redispatches:
        # Re-dispatched already (perhaps by a tick that crashed before its run request was
        # stored): ask again with the same key; Dagster finds the run if it exists.
        return RedispatchPlan(failures, False, f"re-dispatch {failures} pending")
    return RedispatchPlan(None, False, f"entry is {entry.status}: nothing to re-dispatch")


def redispatch_interval_seconds(slot_minutes: int) -> int:
    """How often the re-dispatch sensor evaluates: an eighth of the slot, 30 s to 2 minutes.

    The sensor has work only while an entry of the current slot is ``dispatch_failed``, and
    it must act within that slot; every other evaluation is a skipped tick the daemon still
    pays for (a gRPC call to the code server, a tick written to Dagster's storage). On
    15-minute slots it evaluates every 112 s: a dispatch failure waits at most that long for
    its re-dispatch, and one recorded in the last 112 s of its slot is left
    ``dispatch_failed`` (the slot-health warning and ``summary`` report it). Slots of 4
    minutes or less keep 30 s, so a re-dispatch still fits in the slot."""
    share = slot_minutes * 60 // REDISPATCH_SLOT_FRACTION
    return max(REDISPATCH_INTERVAL_MIN, min(REDISPATCH_INTERVAL_MAX, share))
