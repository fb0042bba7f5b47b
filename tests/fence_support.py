"""A run that lost its lease, for the domain write functions' fencing tests.

``lost_guard`` claims an entry in a real SQLite ledger and lets its lease be reclaimed, as
the reclaim sensor does for a worker paused past its TTL: the guard it returns is the one
that paused run holds, so every effect written with it must be refused and traced.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from orchestration.reclaim import reclaim_expired
from resources.core.entry import Entry, FailureKind, Trigger, dedup_key_for_due
from resources.ledger import RunLedger
from resources.ledger.guard import LedgerGuard

_DUE = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
_TTL = timedelta(minutes=5)
ZOMBIE = "zombie-run"


def lost_guard(tmp_path: Path, task_key: str = "order_cleanup") -> tuple[LedgerGuard, RunLedger]:
    """A guard whose run was reclaimed (the entry is failed, lease_reclaimed)."""
    ledger = RunLedger(database_url=f"sqlite:///{tmp_path / 'fence-ledger.sqlite'}")
    ledger.migrate()
    entry = ledger.ensure_entry(
        task_key=task_key, trigger=Trigger.SCHEDULE, dedup_key=dedup_key_for_due(_DUE)
    )
    claim = ledger.claim(entry.id, ZOMBIE, lease_ttl=_TTL, now=_DUE)
    assert claim.fence is not None
    assert reclaim_expired(ledger, now=_DUE + 2 * _TTL)
    return LedgerGuard(ledger, claim.fence), ledger


def refusals(ledger: RunLedger, guard: LedgerGuard) -> list[str]:
    """The effects refused for the guard's run, as traced on its entry."""
    entry: Entry | None = ledger.get(guard.fence.entry_id)
    assert entry is not None and entry.failure_kind == FailureKind.LEASE_RECLAIMED
    return [
        r["reason"]
        for r in entry.summary["late_job_rejections"]
        if r["action"] == "side_effect" and r["run_id"] == ZOMBIE
    ]
