"""Ledger entry vocabulary and dedup keys (DESIGN.md "Ledger dedup keys"), Dagster-free.

An entry is unique on ``(task_key, origin, dedup_key)``; the origin is the key's prefix, so
manual, retry and backfill keys can never collide with a scheduled ``due:`` key.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from resources.core import tags
from resources.core.checks import require_text
from resources.core.due import ORIGIN_DUE, Due

ORIGIN_MANUAL: Final = "manual"
ORIGIN_RETRY: Final = "retry"
ORIGIN_BACKFILL: Final = "backfill"
ORIGINS: Final = (ORIGIN_DUE, ORIGIN_MANUAL, ORIGIN_RETRY, ORIGIN_BACKFILL)

#: Statuses a run may claim.
CLAIMABLE_STATUSES: Final = (tags.STATUS_QUEUED, tags.STATUS_RETRYING)
#: Statuses a launch failure may move to ``dispatch_failed`` (not started, not terminal).
DISPATCHABLE_STATUSES: Final = (
    tags.STATUS_QUEUED,
    tags.STATUS_RETRYING,
    tags.STATUS_DISPATCH_FAILED,
)
#: Failure kinds a run reports about itself through ``fail()``. The other two have their own
#: operations: ``lease_reclaimed`` (reclaim_expired) and ``dispatch`` (record_dispatch_failure).
RUN_FAILURE_KINDS: Final = (
    tags.FAILURE_ERROR,
    tags.FAILURE_TIMEOUT,
    tags.FAILURE_UNSUPPORTED_TASK,
)

MAX_ERROR_CHARS: Final = 4000
MAX_LATE_JOB_REJECTIONS: Final = 5
MAX_DISPATCH_FAILURES: Final = 5
MAX_HOOK_RESULTS: Final = 20
SUMMARY_REJECTIONS: Final = "late_job_rejections"
SUMMARY_DISPATCH_FAILURES: Final = "dispatch_failures"
SUMMARY_HOOKS: Final = "hooks"
SUMMARY_KEYS: Final = (SUMMARY_REJECTIONS, SUMMARY_DISPATCH_FAILURES, SUMMARY_HOOKS)

MAX_RUN_ID_CHARS: Final = 255
DEFAULT_MAX_ATTEMPTS: Final = 3
DEFAULT_LIST_LIMIT: Final = 50


def dedup_key_for_due(due: Due | datetime) -> str:
    """Dedup key of a scheduled/sensor run: ``due:<YYYY-MM-DDTHH:MM:SSZ>``.

    A datetime is checked as :class:`Due` checks it: a naive one is refused instead of being
    taken as UTC, and so is one with seconds or microseconds (a wrong due is a wrong key).
    """
    return Due.coerce(due).key


def dedup_key_for_request(request_id: str) -> str:
    """Dedup key of a manual launch: ``manual:<request_id>``."""
    return f"{ORIGIN_MANUAL}:{require_text(request_id, 'request_id')}"


def dedup_key_for_retry(parent_entry_id: int) -> str:
    """Dedup key of a manual retry: ``retry:<parent_entry_id>`` (so at most one per parent)."""
    if isinstance(parent_entry_id, bool) or not isinstance(parent_entry_id, int):
        raise ValueError(f"parent_entry_id must be an int, got {parent_entry_id!r}")
    if parent_entry_id <= 0:
        raise ValueError(f"parent_entry_id must be positive, got {parent_entry_id}")
    return f"{ORIGIN_RETRY}:{parent_entry_id}"


def dedup_key_for_backfill(backfill_id: str, partition: str) -> str:
    """Dedup key of a backfill partition run: ``backfill:<backfill_id>:<partition>``."""
    backfill = require_text(backfill_id, "backfill_id")
    if ":" in backfill:
        raise ValueError(f"backfill_id {backfill_id!r} must not contain ':'")
    return f"{ORIGIN_BACKFILL}:{backfill}:{require_text(partition, 'partition')}"


def origin_of(dedup_key: str) -> str:
    """The namespace of a dedup key (its prefix): ``due``, ``manual``, ``retry``, ``backfill``."""
    prefix, sep, rest = str(dedup_key).partition(":")
    if not sep or not rest or prefix not in ORIGINS:
        raise ValueError(
            f"dedup_key {dedup_key!r} must start with one of "
            f"{', '.join(o + ':' for o in ORIGINS)} (use the dedup_key_for_* helpers)"
        )
    return prefix


#: The audit action of a run the ledger did not let act (a duplicate or late run, a refused
#: UI re-execution, a manual launch of a task that is not manually triggerable): one record
#: per refused run, which `dueledger summary` counts as ``refused_24h``.
ACTION_RUN_REFUSED: Final = "run_refused"
#: The audit action of a run whose entry ended ``skipped`` (overlap, a pause): one per run.
ACTION_RUN_SKIPPED: Final = "run_skipped"
#: The audit action of a run a newer run of its task replaced (overlap ``replace``).
ACTION_RUN_REPLACED: Final = "run_replaced"
