"""A ledger entry: its vocabulary (statuses, triggers, failure kinds, origins, dedup keys) and
the entry itself as a value -- one stored row, read-only, times timezone-aware UTC.

An entry is unique on ``(task_key, origin, dedup_key)``; the origin is the key's prefix, so
manual, retry and backfill keys can never collide with a scheduled ``due:`` key. The store
(``resources/ledger/``) builds entries from rows and never hands out anything else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from resources.core.arguments import require_text
from resources.core.due import ORIGIN_DUE, Due, format_due
from resources.core.instants import iso


class Status(StrEnum):
    """Where an entry stands. ``retrying`` only while a retry will really come; ``skipped`` is
    terminal: the entry was not run, on purpose, and its ``error`` says why (``overlap: entry
    12 running``, ``paused by alice: ...``), never a silent gap."""

    QUEUED = "queued"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCESS = "success"
    FAILED = "failed"
    DISPATCH_FAILED = "dispatch_failed"
    SKIPPED = "skipped"


class Trigger(StrEnum):
    """What launched the entry's first run (tag ``dueledger/trigger``)."""

    SCHEDULE = "schedule"
    SENSOR = "sensor"
    MANUAL = "manual"
    MANUAL_RETRY = "manual_retry"
    BACKFILL = "backfill"


class FailureKind(StrEnum):
    """Why an entry failed. ``lease_reclaimed`` and ``dispatch`` have operations of their own;
    ``replaced`` is set by the claim of the run that replaced it (overlap ``replace``)."""

    ERROR = "error"
    TIMEOUT = "timeout"
    LEASE_RECLAIMED = "lease_reclaimed"
    UNSUPPORTED_TASK = "unsupported_task"
    DISPATCH = "dispatch"
    REPLACED = "replaced"


class Origin(StrEnum):
    """The namespace of a dedup key (its prefix)."""

    DUE = ORIGIN_DUE
    MANUAL = "manual"
    RETRY = "retry"
    BACKFILL = "backfill"


STATUSES: Final = tuple(Status)
TRIGGERS: Final = tuple(Trigger)
FAILURE_KINDS: Final = tuple(FailureKind)
ORIGINS: Final = tuple(Origin)
TERMINAL_STATUSES: Final = (Status.SUCCESS, Status.FAILED, Status.SKIPPED)
#: In progress: a run holds the entry, or a retry of it is coming.
IN_PROGRESS: Final = (Status.RUNNING, Status.RETRYING)
#: Statuses a run may claim.
CLAIMABLE_STATUSES: Final = (Status.QUEUED, Status.RETRYING)
#: Statuses a launch failure may move to ``dispatch_failed`` (not started, not terminal).
DISPATCHABLE_STATUSES: Final = (Status.QUEUED, Status.RETRYING, Status.DISPATCH_FAILED)
#: Failure kinds a run reports about itself through ``fail()``. The others have their own
#: operations: ``lease_reclaimed`` (reclaim), ``dispatch`` (a dispatch failure), ``replaced``.
RUN_FAILURE_KINDS: Final = (
    FailureKind.ERROR,
    FailureKind.TIMEOUT,
    FailureKind.UNSUPPORTED_TASK,
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

#: The audit action of a run the ledger did not let act (a duplicate or late run, a refused
#: UI re-execution, a manual launch of a task that is not manually triggerable): one record
#: per refused run, which `dueledger summary` counts as ``refused_24h``.
ACTION_RUN_REFUSED: Final = "run_refused"
#: The audit action of a run whose entry ended ``skipped`` (overlap, a pause): one per run.
ACTION_RUN_SKIPPED: Final = "run_skipped"
#: The audit action of a run a newer run of its task replaced (overlap ``replace``).
ACTION_RUN_REPLACED: Final = "run_replaced"


# --- dedup keys ------------------------------------------------------------------------------


def dedup_key_for_due(due: Due | datetime) -> str:
    """Dedup key of a scheduled/sensor run: ``due:<YYYY-MM-DDTHH:MM:SSZ>``.

    A datetime is checked as :class:`Due` checks it: a naive one is refused instead of being
    taken as UTC, and so is one with seconds or microseconds (a wrong due is a wrong key).
    """
    return Due.coerce(due).key


def dedup_key_for_request(request_id: str) -> str:
    """Dedup key of a manual launch: ``manual:<request_id>``."""
    return f"{Origin.MANUAL}:{require_text(request_id, 'request_id')}"


def dedup_key_for_retry(parent_entry_id: int) -> str:
    """Dedup key of a manual retry: ``retry:<parent_entry_id>`` (so at most one per parent)."""
    if isinstance(parent_entry_id, bool) or not isinstance(parent_entry_id, int):
        raise ValueError(f"parent_entry_id must be an int, got {parent_entry_id!r}")
    if parent_entry_id <= 0:
        raise ValueError(f"parent_entry_id must be positive, got {parent_entry_id}")
    return f"{Origin.RETRY}:{parent_entry_id}"


def dedup_key_for_backfill(backfill_id: str, partition: str) -> str:
    """Dedup key of a backfill partition run: ``backfill:<backfill_id>:<partition>``."""
    backfill = require_text(backfill_id, "backfill_id")
    if ":" in backfill:
        raise ValueError(f"backfill_id {backfill_id!r} must not contain ':'")
    return f"{Origin.BACKFILL}:{backfill}:{require_text(partition, 'partition')}"


def origin_of(dedup_key: str) -> Origin:
    """The namespace of a dedup key (its prefix): ``due``, ``manual``, ``retry``, ``backfill``."""
    prefix, sep, rest = str(dedup_key).partition(":")
    if not sep or not rest or prefix not in ORIGINS:
        raise ValueError(
            f"dedup_key {dedup_key!r} must start with one of "
            f"{', '.join(o + ':' for o in ORIGINS)} (use the dedup_key_for_* helpers)"
        )
    return Origin(prefix)


# --- the entry -------------------------------------------------------------------------------


def with_summary_lists(raw: object) -> dict[str, Any]:
    """A summary dict that always carries the three contract lists."""
    data: dict[str, Any] = dict(raw) if isinstance(raw, Mapping) else {}
    for key in SUMMARY_KEYS:
        if not isinstance(data.get(key), list):
            data[key] = []
    return data


@dataclass(frozen=True)
class Entry:
    """One ledger entry as stored (times timezone-aware UTC)."""

    id: int
    task_key: str
    trigger: str
    origin: str
    dedup_key: str
    due: datetime | None
    status: str
    attempt: int
    max_attempts: int
    parent_id: int | None
    run_ids: tuple[str, ...]
    lease_owner: str | None
    lease_expires_at: datetime | None
    heartbeat_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    operator: str | None
    reason: str | None
    failure_kind: str | None
    error: str | None
    summary: dict[str, Any] = field(hash=False)
    manual_retry_at: datetime | None
    manual_retry_by: str | None
    #: Incremented by every successful claim: the fencing token of the current claim.
    claim_generation: int = 0

    @property
    def label(self) -> str:
        """``task@due`` for scheduled entries, ``task[dedup_key]`` otherwise (for messages)."""
        if self.due is not None:
            return f"{self.task_key}@{format_due(self.due)}"
        return f"{self.task_key}[{self.dedup_key}]"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def dispatch_failure_run_ids(self) -> frozenset[str]:
        """The runs recorded in ``summary.dispatch_failures``: they ended before claiming."""
        return frozenset(
            str(item["run_id"])
            for item in self.summary.get(SUMMARY_DISPATCH_FAILURES, [])
            if isinstance(item, Mapping) and item.get("run_id")
        )

    def to_json(self) -> dict[str, Any]:
        """The contract's JSON shape of an entry (docs/contract.md), plus a few extra fields."""
        summary = with_summary_lists(self.summary)
        return {
            "id": self.id,
            "task_key": self.task_key,
            "trigger": self.trigger,
            "dedup_key": self.dedup_key,
            "due": format_due(self.due) if self.due is not None else None,
            "status": self.status,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "parent_id": self.parent_id,
            "run_ids": list(self.run_ids),
            "lease_expires_at": iso(self.lease_expires_at, micro=True),
            "failure_kind": self.failure_kind,
            "error": self.error,
            "operator": self.operator,
            "reason": self.reason,
            "manual_retry_by": self.manual_retry_by,
            "manual_retry_at": iso(self.manual_retry_at, micro=True),
            "created_at": iso(self.created_at, micro=True),
            "updated_at": iso(self.updated_at, micro=True),
            "summary": json.loads(json.dumps(summary)),
            "origin": self.origin,
            "lease_owner": self.lease_owner,
            "heartbeat_at": iso(self.heartbeat_at, micro=True),
            "started_at": iso(self.started_at, micro=True),
            "finished_at": iso(self.finished_at, micro=True),
            "claim_generation": self.claim_generation,
        }
