"""Lease reclaim (ledger rule 3): running entries whose lease expired become ``failed`` with
kind ``lease_reclaimed``. Never a new run: the dead run may have had side effects.

One structured alert line per reclaim (task, entry, run id, how long overdue). The same
operation runs from ``lease_reclaim_sensor`` and from `dueledger reclaim` (deployments
without the daemon). A run that comes back after its lease was reclaimed finds its
heartbeat and completion refused by the ledger, which records them as late-job rejections.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from resources.core.alerting import KIND_LEASE_RECLAIMED
from resources.core.due import format_due
from resources.core.instants import iso
from resources.ledger import Entry, Ledger, format_duration

ALERT_KIND = KIND_LEASE_RECLAIMED


@dataclass(frozen=True)
class Reclaim:
    """One (possible) reclaim: what the entry looked like while its lease was running."""

    entry_id: int
    task_key: str
    due: datetime | None
    dedup_key: str
    run_id: str | None
    attempt: int
    lease_expired_at: datetime
    last_heartbeat_at: datetime | None
    now: datetime
    done: bool

    @property
    def overdue_seconds(self) -> int:
        return max(0, int((self.now - self.lease_expired_at).total_seconds()))

    def as_json(self) -> dict[str, Any]:
        return {
            "task": self.task_key,
            "entry_id": self.entry_id,
            "run_id": self.run_id,
            "overdue_seconds": self.overdue_seconds,
            "overdue": format_duration(self.now - self.lease_expired_at),
            "lease_expired_at": iso(self.lease_expired_at),
            "last_heartbeat_at": iso(self.last_heartbeat_at),
            "due": format_due(self.due) if self.due else None,
            "dedup_key": self.dedup_key,
            "attempt": self.attempt,
            "reclaimed": self.done,
            "action": (
                f"not re-run automatically; inspect run {self.run_id} and, if it must run again, "
                f"`dueledger runs retry {self.entry_id} --acknowledge-side-effects`"
            ),
        }


def _reclaim(entry: Entry, now: datetime, done: bool) -> Reclaim:
    assert entry.lease_expires_at is not None  # a reclaim candidate has an expired lease
    return Reclaim(
        entry_id=entry.id,
        task_key=entry.task_key,
        due=entry.due,
        dedup_key=entry.dedup_key,
        run_id=entry.lease_owner,
        attempt=entry.attempt,
        lease_expired_at=entry.lease_expires_at,
        last_heartbeat_at=entry.heartbeat_at,
        now=now,
        done=done,
    )


def reclaim_leases(ledger: Ledger, now: datetime, *, dry_run: bool = False) -> list[Reclaim]:
    """Reclaim every expired lease as of ``now`` (or, with ``dry_run``, list them).

    The candidates are read first so that each reclaim can name its run and expiry (the
    reclaimed row no longer carries the lease); only entries the ledger's compare-and-set
    actually reclaimed are returned — a run that heartbeat in between keeps its entry.
    """
    candidates = ledger.reclaim_expired(now=now, dry_run=True)
    if dry_run:
        return [_reclaim(e, now, done=False) for e in candidates]
    reclaimed = {e.id for e in ledger.reclaim_expired(now=now)}
    return [_reclaim(e, now, done=True) for e in candidates if e.id in reclaimed]
