"""A ledger entry as a value: one stored row, read-only, times timezone-aware UTC.

The pure decisions of the core (the ledger rules, retry checks, outcome reconciliation,
re-dispatch planning) read entries of this type; the store (``resources/ledger/``) builds
them from rows and never hands out anything else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from resources.core import tags
from resources.core.due import format_due
from resources.core.entries import SUMMARY_DISPATCH_FAILURES, SUMMARY_KEYS
from resources.core.instants import iso


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
        return self.status in tags.TERMINAL_STATUSES

    @property
    def dispatch_failure_run_ids(self) -> frozenset[str]:
        """The runs recorded in ``summary.dispatch_failures``: they ended before claiming."""
        return frozenset(
            str(item["run_id"])
            for item in self.summary.get(SUMMARY_DISPATCH_FAILURES, [])
            if isinstance(item, Mapping) and item.get("run_id")
        )

    def to_json(self) -> dict[str, Any]:
        """The contract's JSON shape of an entry (DESIGN.md), plus a few extra fields."""
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
