"""The write side of the ledger: every state change, as a compare-and-set.

- State transitions are compare-and-set: a single ``UPDATE ... WHERE id = :id AND status IN
  (...) [AND lease_owner = :run]`` whose row count (or RETURNING row) says whether it won.
  They run on an autocommit connection: one statement, one round trip, atomic on its own.
- Changes to the JSON ``summary`` are read-modify-write, so they run in a transaction that
  holds the row: ``SELECT ... FOR UPDATE`` on PostgreSQL, ``BEGIN IMMEDIATE`` (the database
  write lock) on SQLite. A refused claim re-decides inside that transaction, so every
  interleaving ends either claimed or recorded as a rejection.
- Terminal states (``success``, ``failed``) are never overwritten; rows are never deleted.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

import resources.ledger.rules as rules
from resources.core.arguments import require_text
from resources.core.due import Due, format_due
from resources.core.entry import (
    DEFAULT_MAX_ATTEMPTS,
    MAX_DISPATCH_FAILURES,
    MAX_HOOK_RESULTS,
    RUN_FAILURE_KINDS,
    STATUSES,
    SUMMARY_DISPATCH_FAILURES,
    SUMMARY_HOOKS,
    TRIGGERS,
    Entry,
    FailureKind,
    Origin,
    Status,
    Trigger,
    origin_of,
    with_summary_lists,
)
from resources.core.fence import Fence
from resources.core.instants import iso
from resources.core.text import clean_json
from resources.ledger.model import (
    ClaimResult,
    appended,
    check_id,
    check_run_id,
    check_ttl,
    db_values,
    entry_from_row,
    to_db,
    truncate_error,
)
from resources.ledger.rules import claim_refusal, who
from resources.ledger.schema import audit, entries
from resources.ledger.statements import statements_for
from resources.ledger.store import LedgerStore


class LedgerTransitions(LedgerStore):
    """The state-changing operations of :class:`RunLedger`."""

    def ensure_entry(
        self,
        *,
        task_key: str,
        trigger: str,
        dedup_key: str,
        due: Due | datetime | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        operator: str | None = None,
        reason: str | None = None,
        parent_id: int | None = None,
        now: datetime | None = None,
        connection: Connection | None = None,
    ) -> Entry:
        """Insert the entry unless ``(task_key, origin, dedup_key)`` exists; return the row.

        Insert-or-ignore (``ON CONFLICT DO NOTHING``) on both dialects: concurrent callers
        with the same key all get the one row, whichever inserted it. The origin is the
        key's prefix. For ``due:`` keys, ``due`` defaults to the time in the key and must
        match it when given. ``connection`` runs it inside a caller's :meth:`transaction`.
        """
        require_text(task_key, "task_key")
        if trigger not in TRIGGERS:
            raise ValueError(f"trigger {trigger!r} is not one of {', '.join(TRIGGERS)}")
        origin = origin_of(dedup_key)
        if origin == Origin.DUE:
            # The key's due and the caller's are compared as Due values: one parser, and a
            # naive or unaligned due is refused by Due itself.
            keyed = Due.from_key(dedup_key)
            if due is not None and Due.coerce(due) != keyed:
                raise ValueError(
                    f"due {format_due(Due.coerce(due).at)} does not match dedup_key "
                    f"{dedup_key!r}; build the key with dedup_key_for_due(due)"
                )
            due = keyed
        if isinstance(due, Due):
            due = due.at
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        if parent_id is not None:
            check_id(parent_id, "parent_id")
        at = to_db(self.clock(now), "now")
        values: dict[str, Any] = {
            "task_key": task_key,
            "trigger": trigger,
            "origin": origin,
            "dedup_key": dedup_key,
            "due": to_db(due, "due"),
            "status": Status.QUEUED,
            "attempt": 0,
            "max_attempts": max_attempts,
            "parent_id": parent_id,
            "run_ids": [],
            "created_at": at,
            "updated_at": at,
            "operator": operator,
            "reason": reason,
            "summary": with_summary_lists(None),
        }
        existing = sa.select(entries).where(
            entries.c.task_key == task_key,
            entries.c.origin == origin,
            entries.c.dedup_key == dedup_key,
        )
        with self.maybe(connection) as conn:
            try:
                row = (
                    conn.execute(statements_for(conn.dialect.name).insert_entry, values)
                    .mappings()
                    .first()
                )
            except sa.exc.IntegrityError as exc:
                # The only other constraint an insert can break is the parent foreign key.
                raise ValueError(
                    f"parent_id {parent_id} is not an existing ledger entry ({exc.orig})"
                ) from None
            if row is None:
                row = conn.execute(existing).mappings().one()
        return entry_from_row(row)

    def claim(
        self, entry_id: int, run_id: str, *, lease_ttl: timedelta, now: datetime | None = None
    ) -> ClaimResult:
        """Claim the entry for ``run_id``: ``queued|retrying -> running`` with a lease.

        Compare-and-set: one conditional UPDATE, which also counts the attempt and appends
        the run id. Re-entrant for the lease owner. Anything else is a late or duplicate
        run: refused, recorded in ``summary.late_job_rejections``, state untouched. An
        entry whose attempts are used up is never claimed.
        """
        check_run_id(run_id)
        ttl = check_ttl(lease_ttl)
        at = self.clock(now)
        entry_id = check_id(entry_id, "entry_id")
        params = {
            "b_id": entry_id,
            "b_run_id": run_id,
            "b_now": to_db(at, "now"),
            "b_expires": to_db(at + ttl, "now"),
        }
        row = self._hot("claim", params, returning=True)
        if row is not None:
            return ClaimResult(claimed=True, entry=entry_from_row(row), reason=None)
        # Slow path: decide again while holding the row, so the answer and the record agree.
        with self.connect("write") as conn:
            entry = self.load(conn, entry_id, lock=True)
            decision = rules.claim(entry, run_id, now=at, lease_ttl=ttl)
            if decision.allowed and not decision.changes:  # re-entrant: the owner again
                return ClaimResult(claimed=True, entry=entry, reason=None, reentrant=True)
            if decision.allowed:
                # It became claimable since the first UPDATE (e.g. a failure -> retrying).
                row = conn.execute(self._rt().sql.claim, params).mappings().one()
                return ClaimResult(claimed=True, entry=entry_from_row(row), reason=None)
            reason = decision.refusal or claim_refusal(entry)
            entry = self.record_rejection(conn, entry, run_id, at, "claim", reason)
        return ClaimResult(claimed=False, entry=entry, reason=reason)

    def heartbeat(
        self, entry_id: int, run_id: str, *, lease_ttl: timedelta, now: datetime | None = None
    ) -> bool:
        """Extend the lease to ``now + lease_ttl``. Only the owner of a running entry may.

        False means the run no longer owns the entry (reclaimed, finished, or never claimed
        by it): it should stop doing side effects.
        """
        check_run_id(run_id)
        ttl = check_ttl(lease_ttl)
        at = self.clock(now)
        params = {
            "b_id": check_id(entry_id, "entry_id"),
            "b_run_id": run_id,
            "b_now": to_db(at, "now"),
            "b_expires": to_db(at + ttl, "now"),
        }
        return bool(self._hot("heartbeat", params, returning=False) == 1)

    def succeed(self, entry_id: int, run_id: str, *, now: datetime | None = None) -> bool:
        """``running -> success`` for the lease owner; clears the lease.

        Otherwise (late completion after a reclaim, a duplicate run, ...) the entry is left
        as it is, the attempt is recorded as a rejection and False is returned.
        """
        check_run_id(run_id)
        at = self.clock(now)
        entry_id = check_id(entry_id, "entry_id")
        params = {"b_id": entry_id, "b_run_id": run_id, "b_now": to_db(at, "now")}
        if self._hot("succeed", params, returning=False) == 1:
            return True
        with self.connect("write") as conn:
            entry = self.load(conn, entry_id, lock=True)
            reason = rules.succeed(entry, run_id, now=at).refusal or (
                f"late completion from run {run_id}: {who(entry)} changed meanwhile; "
                f"nothing changed"
            )
            self.record_rejection(conn, entry, run_id, at, "succeed", reason)
        return False

    def fail(
        self,
        entry_id: int,
        run_id: str,
        *,
        error: str,
        kind: str = FailureKind.ERROR,
        now: datetime | None = None,
        retry_coming: bool = True,
    ) -> Entry:
        """The owner's run failed: ``running -> retrying`` with attempts left, else ``failed``.

        ``kind`` is ``error``, ``timeout`` or ``unsupported_task`` (always ``failed``: a task
        the code location no longer declares cannot be retried). ``retry_coming`` False: no
        retry will be launched (Dagster will not retry the run), so the attempt is final.
        The error is kept (truncated to 4000 characters). From anyone but the running owner
        this is a late report: recorded as a rejection, state untouched (success is never
        overwritten).
        Returns the entry after the call.
        """
        check_run_id(run_id)
        if kind not in RUN_FAILURE_KINDS:
            if kind == FailureKind.LEASE_RECLAIMED:
                raise ValueError(
                    "kind 'lease_reclaimed' is set by reclaim_expired(), not reported by a run"
                )
            if kind == FailureKind.DISPATCH:
                raise ValueError(
                    "kind 'dispatch' is set by record_dispatch_failure(), not reported by a run"
                )
            raise ValueError(f"failure kind {kind!r} is not one of {', '.join(RUN_FAILURE_KINDS)}")
        text = truncate_error(error)
        at = self.clock(now)
        entry_id = check_id(entry_id, "entry_id")
        params = {
            "b_id": entry_id,
            "b_run_id": run_id,
            "b_now": to_db(at, "now"),
            "b_kind": kind,
            "b_error": text,
            "b_retry": bool(retry_coming),
        }
        row = self._hot("fail", params, returning=True)
        if row is not None:
            return entry_from_row(row)
        with self.connect("write") as conn:
            entry = self.load(conn, entry_id, lock=True)
            decision = rules.fail(
                entry, run_id, kind=kind, error=text, now=at, retry_coming=retry_coming
            )
            reason = decision.refusal or (
                f"late failure report from run {run_id} ({kind}): {who(entry)} changed "
                f"meanwhile; nothing changed"
            )
            return self.record_rejection(conn, entry, run_id, at, "fail", reason)

    def reject(
        self, entry_id: int, run_id: str, *, reason: str, now: datetime | None = None
    ) -> Entry:
        """Record that ``run_id`` was a late or duplicate run for this entry; state untouched."""
        check_run_id(run_id)
        require_text(reason, "reason")
        at = self.clock(now)
        with self.connect("write") as conn:
            entry = self.load(conn, entry_id, lock=True)
            return self.record_rejection(conn, entry, run_id, at, "reject", reason)

    # --- fencing ---------------------------------------------------------------------------

    def holds(self, fence: Fence, *, connection: Connection | None = None) -> bool:
        """Does the run behind ``fence`` still hold its entry (running, same owner, same
        claim generation)? ``connection``: check inside a caller's transaction on the
        ledger's database -- on PostgreSQL the row is then share-locked until it commits, so
        a reclaim cannot slip between the check and the caller's commit."""
        params = {
            "b_id": check_id(fence.entry_id, "entry_id"),
            "b_run_id": check_run_id(fence.run_id),
            "b_token": fence.token,
        }
        with self.maybe(connection) as conn:
            statement = statements_for(conn.dialect.name).holds
            return conn.execute(statement, params).first() is not None

    def record_fenced_effect(
        self, fence: Fence, *, effect: str, now: datetime | None = None
    ) -> Entry:
        """Trace a side effect refused by the fence: a rejection (action ``side_effect``)
        in the entry's ``summary.late_job_rejections``; the entry's state is untouched."""
        at = self.clock(now)
        with self.connect("write") as conn:
            entry = self.load(conn, fence.entry_id, lock=True)
            decision = rules.holds(entry, fence, effect=effect)
            reason = decision.refusal or (
                f"side effect {effect!r} of run {fence.run_id} (claim {fence.token}) refused: "
                f"{who(entry)} changed while the effect was being committed"
            )
            return self.record_rejection(conn, entry, fence.run_id, at, "side_effect", reason)

    # --- dispatch --------------------------------------------------------------------------

    def record_dispatch_failure(
        self,
        entry_id: int,
        *,
        error: str,
        run_id: str | None = None,
        now: datetime | None = None,
        connection: Connection | None = None,
    ) -> Entry:
        """The launch of a run for this entry failed: ``queued|retrying -> dispatch_failed``.

        Not a business failure: kind ``dispatch``; the error is appended to
        ``summary.dispatch_failures`` (newest 5 kept). A running or terminal entry is left
        untouched (the failed launch was a duplicate). Returns the entry after the call.
        """
        text = truncate_error(error)
        if run_id is not None:
            check_run_id(run_id)
        at = self.clock(now)
        with contextlib.nullcontext(connection) if connection else self.connect("write") as conn:
            entry = self.load(conn, entry_id, lock=True)
            decision = rules.dispatch_failure(entry, error=text, now=at)
            if not decision.allowed:
                return entry
            item = {"at": iso(at, micro=True), "error": text, "run_id": run_id}
            summary = appended(
                entry.summary, SUMMARY_DISPATCH_FAILURES, item, MAX_DISPATCH_FAILURES
            )
            row = (
                conn.execute(
                    sa.update(entries)
                    .where(entries.c.id == entry.id)
                    .values(**db_values(decision.changes), summary=summary)
                    .returning(*entries.c)
                )
                .mappings()
                .one()
            )
            return entry_from_row(row)

    def redispatch(self, entry_id: int, *, now: datetime | None = None) -> bool:
        """``dispatch_failed -> queued`` with the attempt count reset; earlier errors kept.

        Refused (False) unless the entry is dispatch_failed, and once a manual retry has
        been made of it (its child runs instead).
        """
        at = self.clock(now)
        stmt = (
            sa.update(entries)
            .where(
                entries.c.id == check_id(entry_id, "entry_id"),
                # rules.redispatch, as one blind compare-and-set (no read first):
                entries.c.status.in_(rules.REDISPATCH_FROM),
                entries.c.manual_retry_at.is_(None),
            )
            .values(status=Status.QUEUED, attempt=0, updated_at=to_db(at, "now"))
        )
        with self.connect("autocommit") as conn:
            return conn.execute(stmt).rowcount == 1

    def skip_entry(self, entry_id: int, *, reason: str, now: datetime | None = None) -> Entry:
        """``queued -> skipped`` with ``reason`` (compare-and-set); the entry after the call
        (unchanged when it was not queued)."""
        require_text(reason, "reason")
        at = self.clock(now)
        with self.connect("write") as conn:
            entry = self.load(conn, check_id(entry_id, "entry_id"), lock=True)
            decision = rules.skip(entry, reason=truncate_error(reason), now=at)
            return self.apply(conn, entry, decision) if decision.allowed else entry

    def record_skipped_due(
        self,
        task_key: str,
        due: Due | datetime,
        *,
        reason: str,
        trigger: str = Trigger.SCHEDULE,
        max_attempts: int = 1,
        now: datetime | None = None,
        connection: Connection | None = None,
    ) -> tuple[Entry, bool]:
        """The entry of ``task_key``'s ``due`` written ``skipped`` with ``reason`` unless the due
        has an entry already (insert-or-ignore); returns it and whether this call wrote it.
        ``connection`` runs it inside a caller's :meth:`transaction`."""
        require_text(task_key, "task_key")
        require_text(reason, "reason")
        due = Due.coerce(due)
        at = to_db(self.clock(now), "now")
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
        with self.maybe(connection) as conn:
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

    # --- hooks, audit, manual retry support -------------------------------------------------

    def record_hook_result(self, entry_id: int, result: dict[str, Any]) -> None:
        """Append a hook outcome to ``summary.hooks`` (newest 20 kept)."""
        if not isinstance(result, Mapping):
            raise ValueError(f"hook result must be a dict, got {result!r}")
        try:
            # Cleaned: a NUL in a listener's text could not be stored on PostgreSQL.
            item = clean_json(json.loads(json.dumps(dict(result))))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"hook result {result!r} is not JSON-serialisable: {exc}") from None
        at = self.clock(None)
        with self.connect("write") as conn:
            entry = self.load(conn, entry_id, lock=True)
            summary = appended(entry.summary, SUMMARY_HOOKS, item, MAX_HOOK_RESULTS)
            self.set_summary(conn, entry.id, summary, at)

    def mark_manual_retry(
        self,
        parent_id: int,
        *,
        operator: str,
        statuses: Sequence[str] = (Status.FAILED,),
        now: datetime | None = None,
        connection: Connection | None = None,
    ) -> bool:
        """Stamp ``manual_retry_at/by`` on the parent, once: compare-and-set.

        True only for the first caller while the parent is in ``statuses``; use it in the
        same :meth:`transaction` that creates the child entry and writes the audit record.
        """
        require_text(operator, "operator")
        unknown = [s for s in statuses if s not in STATUSES]
        if unknown:
            raise ValueError(f"unknown status {', '.join(map(repr, unknown))}")
        at = to_db(self.clock(now), "now")
        stmt = (
            sa.update(entries)
            .where(
                entries.c.id == check_id(parent_id, "parent_id"),
                entries.c.status.in_(list(statuses)),
                entries.c.manual_retry_at.is_(None),
            )
            .values(manual_retry_at=at, manual_retry_by=operator, updated_at=at)
        )
        with self.maybe(connection) as conn:
            return conn.execute(stmt).rowcount == 1

    def write_audit(
        self,
        *,
        operator: str | None,
        action: str,
        entry_id: int | None,
        child_entry_id: int | None = None,
        reason: str | None = None,
        checks: Mapping[str, Any] | Sequence[Any] | None = None,
        outcome: str,
        now: datetime | None = None,
        connection: Connection | None = None,
    ) -> int:
        """Append an audit record; returns its id. ``connection`` joins a caller's transaction."""
        require_text(action, "action")
        require_text(outcome, "outcome")
        try:
            checks_json = None if checks is None else json.loads(json.dumps(checks))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"audit checks {checks!r} are not JSON-serialisable: {exc}") from None
        stmt = (
            sa.insert(audit)
            .values(
                at=to_db(self.clock(now), "now"),
                operator=operator,
                action=action,
                entry_id=entry_id,
                child_entry_id=child_entry_id,
                reason=reason,
                checks=checks_json,
                outcome=outcome,
            )
            .returning(audit.c.id)
        )
        with self.maybe(connection) as conn:
            return int(conn.execute(stmt).scalar_one())

    def settle_unretried_run(
        self,
        entry_id: int,
        run_id: str,
        *,
        error: str,
        kind: str = FailureKind.ERROR,
        now: datetime | None = None,
    ) -> Entry | None:
        """Dagster ended ``run_id`` and will not retry it: its entry becomes ``failed``.

        Used by the outcome reconciler (orchestration/services/outcomes.py); the rule, decided
        under the row lock, is ``rules.settle_unretried``. Anything it refuses is left untouched and
        None is returned. Returns the entry after the change.
        """
        check_run_id(run_id)
        if kind not in RUN_FAILURE_KINDS:
            raise ValueError(f"failure kind {kind!r} is not one of {', '.join(RUN_FAILURE_KINDS)}")
        at = self.clock(now)
        with self.connect("write") as conn:
            entry = self.load(conn, check_id(entry_id, "entry_id"), lock=True)
            decision = rules.settle_unretried(
                entry, run_id, kind=kind, error=truncate_error(error), now=at
            )
            if not decision.allowed:
                return None
            values = db_values(decision.changes)
            row = (
                conn.execute(
                    sa.update(entries)
                    .where(entries.c.id == entry.id, entries.c.status == entry.status)
                    .values(**values)
                    .returning(*entries.c)
                )
                .mappings()
                .one()
            )
            return entry_from_row(row)
