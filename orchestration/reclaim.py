"""Reclaim: a run that stopped holding its entry without saying so -- the lease that expired
(ledger rule 3), and the launch whose run was never created (a stranded launch).

- **Leases.** A running entry whose lease expired becomes ``failed`` with kind
  ``lease_reclaimed`` (:func:`decide_reclaim`, applied by :func:`reclaim_expired`, each entry
  by its own compare-and-set: same owner, lease still expired, so a run that heartbeats in
  between keeps its entry). Never a new run: the dead run may have had side effects. One
  structured alert line per reclaim (task, entry, run id, how long overdue). A run that comes
  back after its lease was reclaimed finds its heartbeat, completion and every fenced side
  effect refused, and each refusal traced as a late-job rejection.
- **Stranded launches.** `dueledger launch` and `dueledger runs retry` write their entry
  first and then submit the run; a launching process that dies in between leaves a
  ``queued`` entry with no run that nothing would ever start. :func:`sweep_stranded` finds
  them -- ``manual`` and ``retry`` origins, ``queued``, no run id, older than
  :data:`STRANDED_AFTER`, and no Dagster run launched for them -- and records each as a launch
  failure (``dispatch_failed``, kind ``dispatch``) naming the command that re-dispatches it.
  It never launches a run itself: an operator asked for that run, and asks again.

Both run on every tick of ``ledger_sensor`` (reclaim) and in `dueledger reclaim` (deployments
without the daemon). Dagster-free.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import sqlalchemy as sa

from resources.core.alerting import KIND_LAUNCH_STRANDED, KIND_LEASE_RECLAIMED
from resources.core.due import format_due
from resources.core.entry import Entry, FailureKind, Origin, Status
from resources.core.instants import iso
from resources.ledger import Ledger
from resources.ledger.model import db_values, entry_from_row, to_db, truncate_error
from resources.ledger.rules import Decision, EntryState, format_duration, state_words, who
from resources.ledger.schema import entries

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

#: A reclaim takes a running entry only.
RECLAIM_FROM: Final = (Status.RUNNING,)


def decide_reclaim(entry: EntryState, *, now: datetime) -> Decision:
    """Rule 3: a running entry whose lease expired before ``now`` -> ``failed``
    (``lease_reclaimed``). Never re-run automatically: the run may have had side effects."""
    expired_at = entry.lease_expires_at
    if entry.status not in RECLAIM_FROM or expired_at is None or not expired_at < now:
        return Decision(
            refusal=f"{who(entry)} is {state_words(entry)}: no expired lease to reclaim"
        )
    heartbeat_at = iso(entry.heartbeat_at, micro=True) or "never"
    message = (
        f"lease of run {entry.lease_owner} expired at {iso(expired_at, micro=True)}, "
        f"{format_duration(now - expired_at)} overdue (last heartbeat {heartbeat_at}); "
        f"reclaimed at {iso(now, micro=True)}. Not re-run automatically: the run may have had "
        f"side effects. Check run {entry.lease_owner} in Dagster; to run it again "
        f"use `dueledger runs retry {entry.id} --acknowledge-side-effects`"
    )
    return Decision(
        {
            "status": Status.FAILED,
            "failure_kind": FailureKind.LEASE_RECLAIMED,
            "error": message,
            "lease_owner": None,
            "lease_expires_at": None,
            "finished_at": now,
            "updated_at": now,
        }
    )


#: Records a change in the transaction that makes it (an operator command's audit record).
AuditChange = Callable[[Entry, "Connection"], None]


def reclaim_expired(
    ledger: Ledger,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    limit: int = 1000,
    audit: AuditChange | None = None,
) -> list[Entry]:
    """Running entries whose lease expired before ``now`` -> ``failed`` (lease_reclaimed).

    Never re-run automatically: the run may have had side effects. Each entry is
    reclaimed by its own compare-and-set (same owner, lease still expired), so a run that
    heartbeats in between keeps its entry. Returns the reclaimed entries (after); with
    ``dry_run`` the candidates, unchanged. ``audit`` records each reclaim in the transaction
    that makes it.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive int, got {limit!r}")
    at = ledger.clock(now)
    stamp = to_db(at, "now")
    query = (
        sa.select(entries)
        .where(entries.c.status == Status.RUNNING, entries.c.lease_expires_at < stamp)
        .order_by(entries.c.lease_expires_at, entries.c.id)
        .limit(limit)
    )
    with ledger.connect("autocommit") as conn:
        candidates = [entry_from_row(r) for r in conn.execute(query).mappings()]
        if dry_run:
            return candidates
        reclaimed = []
        for entry in candidates:
            decision = decide_reclaim(entry, now=at)
            if not decision.allowed:  # selected by the same condition: cannot happen
                continue
            changes = dict(decision.changes, error=truncate_error(decision.changes["error"]))
            update = (
                sa.update(entries)
                .where(
                    entries.c.id == entry.id,
                    entries.c.status.in_(RECLAIM_FROM),
                    entries.c.lease_owner == entry.lease_owner,
                    entries.c.lease_expires_at < stamp,
                )
                .values(**db_values(changes))
                .returning(*entries.c)
            )
            if audit is None:
                row = conn.execute(update).mappings().first()
            else:
                with ledger.transaction() as tx:
                    row = tx.execute(update).mappings().first()
                    if row is not None:
                        audit(entry_from_row(row), tx)
            if row is not None:
                reclaimed.append(entry_from_row(row))
    return reclaimed


# --- leases: the sweep ---------------------------------------------------------------------

ALERT_KIND: Final = KIND_LEASE_RECLAIMED


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


def reclaim_leases(
    ledger: Ledger, now: datetime, *, dry_run: bool = False, audit: AuditChange | None = None
) -> list[Reclaim]:
    """Reclaim every expired lease as of ``now`` (or, with ``dry_run``, list them).

    The candidates are read first so that each reclaim can name its run and expiry (the
    reclaimed row no longer carries the lease); only entries the ledger's compare-and-set
    actually reclaimed are returned — a run that heartbeat in between keeps its entry.
    """
    candidates = reclaim_expired(ledger, now=now, dry_run=True)
    if dry_run:
        return [_reclaim(e, now, done=False) for e in candidates]
    reclaimed = {e.id for e in reclaim_expired(ledger, now=now, audit=audit)}
    return [_reclaim(e, now, done=True) for e in candidates if e.id in reclaimed]


# --- stranded launches -----------------------------------------------------------------------

#: How long an entry may wait for its run to be created: well past the launch timeout
#: (300 s), so a slow launch that is still going is never taken for a dead one.
STRANDED_AFTER: Final = timedelta(minutes=15)
#: Entries looked at per sweep (the oldest stranded ones wait for the next sweep).
SWEEP_LIMIT: Final = 200
STRANDED_ALERT_KIND: Final = KIND_LAUNCH_STRANDED


@dataclass(frozen=True)
class Stranded:
    """One entry the sweep recorded as a failed launch."""

    entry: Entry
    redo: str

    def as_json(self) -> dict[str, Any]:
        return {
            "task": self.entry.task_key,
            "entry_id": self.entry.id,
            "dedup_key": self.entry.dedup_key,
            "created_at": iso(self.entry.created_at),
            "action": self.redo,
        }


def redo_command(entry: Entry) -> str:
    """The command that re-dispatches a manual or retry entry whose launch failed
    (``dispatch_failed``): the same request again."""
    if entry.origin == Origin.MANUAL:
        request_id = entry.dedup_key.removeprefix(f"{Origin.MANUAL}:")
        return (
            f"`dueledger launch {entry.task_key} --request-id {shlex.quote(request_id)} "
            f"--operator <you> "
            f'--reason "..."` re-dispatches it'
        )
    if entry.parent_id is not None:
        # The retry's own request, repeated, re-dispatches this child (retry.py).
        return (
            f'`dueledger runs retry {entry.parent_id} --operator <you> --reason "..."` '
            f"re-dispatches it"
        )
    return f"`dueledger runs retry {entry.id} --acknowledge-side-effects` launches it"


def stranded_candidates(ledger: Ledger, now: datetime) -> list[Entry]:
    """``queued`` manual/retry entries with no run id, recorded before ``now - STRANDED_AFTER``."""
    page, _ = ledger.list_entries(
        statuses=[Status.QUEUED], until=now - STRANDED_AFTER, limit=SWEEP_LIMIT
    )
    return [e for e in page if e.origin in (Origin.MANUAL, Origin.RETRY) and not e.run_ids]


def sweep_stranded(
    ledger: Ledger,
    has_run: Callable[[Entry], bool],
    now: datetime,
    *,
    dry_run: bool = False,
    audit: AuditChange | None = None,
) -> list[Stranded]:
    """Record every stranded launch as ``dispatch_failed``; returns what was recorded (with
    ``dry_run``: what would be, unchanged). ``has_run``: whether Dagster has a run of the
    entry's current dispatch (``dagster_runs.has_dispatched_run``), read by the caller."""
    swept: list[Stranded] = []
    for entry in stranded_candidates(ledger, now):
        if has_run(entry):
            continue
        redo = redo_command(entry)
        if dry_run:
            swept.append(Stranded(entry, redo))
            continue
        waited = int((now - entry.created_at).total_seconds() // 60)
        error = (
            f"no Dagster run was created for this entry {waited} minutes after it was "
            f"recorded: the launching command stopped between recording and launching. "
            f"Nothing ran; {redo}"
        )
        with ledger.transaction() as conn:
            after = ledger.record_dispatch_failure(entry.id, error=error, now=now, connection=conn)
            changed = after.status == Status.DISPATCH_FAILED and entry.status != after.status
            if changed and audit is not None:
                audit(after, conn)
        if changed:
            swept.append(Stranded(after, redo))
    return swept
