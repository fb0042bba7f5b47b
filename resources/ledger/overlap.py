"""The ledger's side of the overlap policies and of skipped dues (issue 24).

:meth:`LedgerOverlap.claim_with_overlap` is the claim of a task whose overlap the ledger
decides (``skip``, ``buffer_one``, ``replace``): one write transaction that locks the task's
row in ``dueledger_task_locks`` (PostgreSQL ``SELECT ... FOR UPDATE``; SQLite's write lock),
then the entry, reads the task's entries in progress and its waiter, asks the pure decision
(``resources/core/overlap.py``) and applies it -- claim, skip, wait, or replace and claim --
before it commits. Two runs starting at once therefore decide one after the other.

:meth:`LedgerOverlap.skip_entry` ends a queued entry ``skipped`` (a due inside a pause), and
:meth:`LedgerOverlap.record_skipped_due` writes a paused due's entry ``skipped`` outright,
insert-or-ignore on its ``due:`` key: whichever comes first, a due is written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from orchestration.task_spec import LEDGER_OVERLAP_POLICIES
from resources.core import rules
from resources.core.arguments import require_text
from resources.core.due import Due
from resources.core.entry import (
    CLAIMABLE_STATUSES,
    TERMINAL_STATUSES,
    Entry,
    Status,
    Trigger,
    with_summary_lists,
)
from resources.core.overlap import (
    OVERLAP_WAIT_TURN,
    SUMMARY_OVERLAP,
    OverlapAction,
    OverlapDecision,
    decide_overlap,
)
from resources.ledger.model import (
    ClaimResult,
    check_id,
    check_run_id,
    check_ttl,
    db_values,
    entry_from_row,
    from_db,
    to_db,
    truncate_error,
)
from resources.ledger.schema import entries, task_locks
from resources.ledger.statements import statements_for
from resources.ledger.store import LedgerStore

#: In-progress statuses: a run holds the entry, or a retry of it is coming.
IN_PROGRESS: Final = (Status.RUNNING, Status.RETRYING)


@dataclass(frozen=True)
class OverlapClaim:
    """What :meth:`LedgerOverlap.claim_with_overlap` did: the decision, the claim when the run
    claimed (None when it was skipped or must wait), and the entries it replaced."""

    decision: OverlapDecision
    entry: Entry
    claim: ClaimResult | None = None
    replaced: tuple[Entry, ...] = ()


class LedgerOverlap(LedgerStore):
    """Overlap-policy claims and skipped entries of :class:`RunLedger`."""

    def in_progress(self, task_key: str) -> list[Entry]:
        """The task's entries running, or waiting for a retry that is coming, oldest first."""
        query = (
            sa.select(entries)
            .where(entries.c.task_key == require_text(task_key, "task_key"))
            .where(entries.c.status.in_(IN_PROGRESS))
            .order_by(entries.c.id)
        )
        with self._connect("autocommit") as conn:
            return [entry_from_row(r) for r in conn.execute(query).mappings()]

    def claim_with_overlap(
        self,
        entry_id: int,
        run_id: str,
        *,
        policy: str,
        lease_ttl: timedelta,
        wait_turn: bool = False,
        wait_lease: timedelta = timedelta(seconds=30),
        now: datetime | None = None,
    ) -> OverlapClaim:
        """Claim the entry for ``run_id`` under overlap ``policy`` (one transaction; see the
        module docstring). ``wait_turn``: the entry waits instead of being skipped. A run told
        to wait calls again (its waiter mark lives ``wait_lease``, renewed by each call). An
        entry that is not a fresh claim -- another attempt, a duplicate run -- is claimed or
        refused exactly as :meth:`claim` would."""
        if policy not in LEDGER_OVERLAP_POLICIES:
            raise ValueError(f"overlap policy {policy!r} is not decided by the ledger")
        check_run_id(run_id)
        ttl = check_ttl(lease_ttl)
        at = self._now(now)
        entry_id = check_id(entry_id, "entry_id")
        with self._connect("autocommit") as conn:
            task_key = self._load(conn, entry_id).task_key
        with self._connect("write") as conn:
            lock = self._lock_task(conn, task_key, at)
            entry = self._load(conn, entry_id, lock=True)
            if entry.status not in CLAIMABLE_STATUSES or entry.attempt > 0:
                return self._plain_claim(conn, entry, run_id, at, ttl)
            in_progress = conn.execute(
                sa.select(entries.c.id)
                .where(entries.c.task_key == task_key, entries.c.status.in_(IN_PROGRESS))
                .order_by(entries.c.id)
            ).scalars()
            waiter = lock["waiting_entry_id"]
            until = from_db(lock["waiting_until"])
            live = waiter if waiter is not None and until is not None and until > at else None
            decision = decide_overlap(
                policy, entry.id, [int(i) for i in in_progress], live, wait_turn=wait_turn
            )
            if decision.action is OverlapAction.WAIT:
                if not wait_turn and (live is None or live == entry.id):
                    self._set_waiter(conn, task_key, entry.id, run_id, at + wait_lease, at)
                return OverlapClaim(decision, entry)
            if live == entry.id:
                self._set_waiter(conn, task_key, None, None, None, at)
            if decision.action is OverlapAction.SKIP:
                skipped = self._apply(
                    conn, entry, rules.skip(entry, reason=decision.reason, now=at)
                )
                return OverlapClaim(decision, skipped)
            replaced: list[Entry] = []
            if decision.action is OverlapAction.REPLACE:
                for other in self._others_in_progress(conn, task_key, entry.id):
                    change = rules.replace(other, by_entry=entry.id, by_run=run_id, now=at)
                    if change.allowed:
                        replaced.append(self._apply(conn, other, change))
            result = self._plain_claim(conn, entry, run_id, at, ttl)
            return OverlapClaim(decision, result.entry, result.claim, tuple(replaced))

    def wait_turn(self, entry_id: int, *, now: datetime | None = None) -> Entry:
        """Mark the entry to wait for its turn under any overlap policy (``summary.overlap``
        is ``queue``: `dueledger launch --queue`); returns it."""
        at = self._now(now)
        with self._connect("write") as conn:
            entry = self._load(conn, check_id(entry_id, "entry_id"), lock=True)
            summary = {**with_summary_lists(entry.summary), SUMMARY_OVERLAP: OVERLAP_WAIT_TURN}
            return self._set_summary(conn, entry.id, summary, at)

    def release_waiter(self, task_key: str, entry_id: int, *, now: datetime | None = None) -> None:
        """Drop ``entry_id``'s waiter mark (its run stopped waiting without claiming)."""
        with self._connect("write") as conn:
            conn.execute(
                sa.update(task_locks)
                .where(task_locks.c.task_key == task_key)
                .where(task_locks.c.waiting_entry_id == entry_id)
                .values(
                    waiting_entry_id=None,
                    waiting_run_id=None,
                    waiting_until=None,
                    updated_at=to_db(self._now(now), "now"),
                )
            )

    def skip_entry(self, entry_id: int, *, reason: str, now: datetime | None = None) -> Entry:
        """``queued -> skipped`` with ``reason`` (compare-and-set); the entry after the call
        (unchanged when it was not queued)."""
        require_text(reason, "reason")
        at = self._now(now)
        with self._connect("write") as conn:
            entry = self._load(conn, check_id(entry_id, "entry_id"), lock=True)
            decision = rules.skip(entry, reason=truncate_error(reason), now=at)
            return self._apply(conn, entry, decision) if decision.allowed else entry

    def record_skipped_due(
        self,
        task_key: str,
        due: Due | datetime,
        *,
        reason: str,
        trigger: str = Trigger.SCHEDULE,
        max_attempts: int = 1,
        now: datetime | None = None,
    ) -> tuple[Entry, bool]:
        """The entry of ``task_key``'s ``due`` written ``skipped`` with ``reason`` unless the due
        has an entry already (insert-or-ignore); returns it and whether this call wrote it."""
        require_text(task_key, "task_key")
        require_text(reason, "reason")
        due = Due.coerce(due)
        at = to_db(self._now(now), "now")
        values: dict[str, Any] = {
            "task_key": task_key,
            "trigger": trigger,
            "origin": "due",
            "dedup_key": due.key,
            "due": to_db(due.at, "due"),
            "status": Status.SKIPPED,
            "attempt": 0,
            "max_attempts": max_attempts,
            "parent_id": None,
            "run_ids": [],
            "created_at": at,
            "updated_at": at,
            "finished_at": at,
            "error": truncate_error(reason),
            "summary": with_summary_lists(None),
        }
        with self._connect("autocommit") as conn:
            sql = statements_for(conn.dialect.name)
            row = conn.execute(sql.insert_entry, values).mappings().first()
            if row is not None:
                return entry_from_row(row), True
            existing = sa.select(entries).where(
                entries.c.task_key == task_key,
                entries.c.origin == "due",
                entries.c.dedup_key == due.key,
            )
            return entry_from_row(conn.execute(existing).mappings().one()), False

    def due_entries(self, task_key: str, start: datetime, end: datetime) -> dict[datetime, Entry]:
        """The task's ``due:`` entries whose due lies in ``[start, end)``, by due (one range
        read of the unique index over ``(task_key, origin, dedup_key)``)."""
        low = Due.of_slot(start, 1).key
        high = Due.of_slot(end + timedelta(seconds=59), 1).key
        query = sa.select(entries).where(
            entries.c.task_key == require_text(task_key, "task_key"),
            entries.c.origin == "due",
            entries.c.dedup_key >= low,
            entries.c.dedup_key < high,
        )
        found: dict[datetime, Entry] = {}
        with self._connect("autocommit") as conn:
            for row in conn.execute(query).mappings():
                entry = entry_from_row(row)
                if entry.due is not None and start <= entry.due < end:
                    found[entry.due] = entry
        return found

    def latest_finished(
        self, task_key: str, *, limit: int, statuses: tuple[str, ...] = TERMINAL_STATUSES
    ) -> list[Entry]:
        """The task's newest entries in ``statuses`` by ``finished_at``, newest first."""
        query = (
            sa.select(entries)
            .where(entries.c.task_key == require_text(task_key, "task_key"))
            .where(entries.c.status.in_(list(statuses)), entries.c.finished_at.is_not(None))
            .order_by(entries.c.finished_at.desc(), entries.c.id.desc())
            .limit(limit)
        )
        with self._connect("autocommit") as conn:
            return [entry_from_row(r) for r in conn.execute(query).mappings()]

    # --- helpers on the caller's transaction -----------------------------------------------

    def _lock_task(self, conn: Connection, task_key: str, at: datetime) -> sa.RowMapping:
        insert = statements_for(conn.dialect.name).insert_task_lock
        conn.execute(insert, {"task_key": task_key, "updated_at": to_db(at, "now")})
        query = sa.select(task_locks).where(task_locks.c.task_key == task_key).with_for_update()
        return conn.execute(query).mappings().one()

    def _set_waiter(
        self,
        conn: Connection,
        task_key: str,
        entry_id: int | None,
        run_id: str | None,
        until: datetime | None,
        at: datetime,
    ) -> None:
        conn.execute(
            sa.update(task_locks)
            .where(task_locks.c.task_key == task_key)
            .values(
                waiting_entry_id=entry_id,
                waiting_run_id=run_id,
                waiting_until=to_db(until, "waiting_until") if until else None,
                updated_at=to_db(at, "now"),
            )
        )

    def _others_in_progress(self, conn: Connection, task_key: str, entry_id: int) -> list[Entry]:
        query = (
            sa.select(entries)
            .where(entries.c.task_key == task_key, entries.c.status.in_(IN_PROGRESS))
            .where(entries.c.id != entry_id)
            .order_by(entries.c.id)
            .with_for_update()
        )
        return [entry_from_row(r) for r in conn.execute(query).mappings()]

    def _apply(self, conn: Connection, entry: Entry, decision: rules.Decision) -> Entry:
        """Write ``decision`` (allowed) to the locked ``entry`` by compare-and-set on its status."""
        row = (
            conn.execute(
                sa.update(entries)
                .where(entries.c.id == entry.id, entries.c.status == entry.status)
                .values(**db_values(decision.changes))
                .returning(*entries.c)
            )
            .mappings()
            .one()
        )
        return entry_from_row(row)

    def _plain_claim(
        self, conn: Connection, entry: Entry, run_id: str, at: datetime, ttl: timedelta
    ) -> OverlapClaim:
        """:meth:`claim`'s decision on the locked entry, in the caller's transaction."""
        decision = rules.claim(entry, run_id, now=at, lease_ttl=ttl)
        claim = OverlapDecision(OverlapAction.CLAIM)
        if decision.allowed and not decision.changes:  # re-entrant: the owner again
            return OverlapClaim(claim, entry, ClaimResult(True, entry, None, reentrant=True))
        if decision.allowed:
            after = self._apply(conn, entry, decision)
            return OverlapClaim(claim, after, ClaimResult(True, after, None))
        reason = decision.refusal or rules.claim_refusal(entry)
        after = self._record_rejection(conn, entry, run_id, at, "claim", reason)
        return OverlapClaim(claim, after, ClaimResult(False, after, reason))
