"""The read side of the ledger: entries by id or key, lineage, pages, audit, summary counts.

Each query is one autocommit statement (or a few, for the counts); nothing here changes a
row. ``list_entries`` pages by a keyset cursor on ``(created_at, id)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from resources.core.arguments import require_text
from resources.core.due import Due
from resources.core.entry import (
    ACTION_RUN_REFUSED,
    DEFAULT_LIST_LIMIT,
    IN_PROGRESS,
    STATUSES,
    TERMINAL_STATUSES,
    TRIGGERS,
    Entry,
    FailureKind,
    Origin,
    Status,
    Trigger,
    origin_of,
)
from resources.core.instants import iso
from resources.ledger.model import (
    UnknownEntryError,
    check_id,
    decode_cursor,
    encode_cursor,
    entry_from_row,
    from_db,
    to_db,
)
from resources.ledger.schema import audit, entries
from resources.ledger.store import LedgerStore


class LedgerQueries(LedgerStore):
    """Read-only operations of :class:`RunLedger`."""

    def get(
        self, entry_id: int, *, connection: Connection | None = None, for_update: bool = False
    ) -> Entry | None:
        """The entry with this id, or None. ``for_update`` locks the row in ``connection``."""
        with self.maybe(connection) as conn:
            try:
                return self.load(conn, entry_id, lock=for_update)
            except UnknownEntryError:
                return None

    def find(self, task_key: str, dedup_key: str) -> Entry | None:
        """The entry for ``(task_key, dedup_key)`` (origin taken from the key), or None."""
        origin = origin_of(dedup_key)
        query = sa.select(entries).where(
            entries.c.task_key == task_key,
            entries.c.origin == origin,
            entries.c.dedup_key == dedup_key,
        )
        with self.connect("autocommit") as conn:
            row = conn.execute(query).mappings().first()
        return None if row is None else entry_from_row(row)

    def entries_of_due(self, due: Due | datetime, statuses: Sequence[str]) -> list[Entry]:
        """The scheduled entries (dedup key ``due:<due>``) of ``due`` in one of ``statuses``,
        every task's, by id: one range of index ``(status, due)``, so the cost follows the
        rows returned, not the ledger's size (the re-dispatch sensor's read)."""
        due = Due.coerce(due)
        unknown = [s for s in statuses if s not in STATUSES]
        if unknown or not statuses:
            raise ValueError(
                f"statuses must name at least one of {', '.join(STATUSES)}, got {list(statuses)!r}"
            )
        query = (
            sa.select(entries)
            .where(
                entries.c.status.in_(list(statuses)),
                entries.c.due == to_db(due.at, "due"),
                entries.c.origin == Origin.DUE,
                entries.c.dedup_key == due.key,
            )
            .order_by(entries.c.id)
        )
        with self.connect("autocommit") as conn:
            return [entry_from_row(r) for r in conn.execute(query).mappings()]

    def entries_updated_since(self, since: datetime) -> list[Entry]:
        """Entries whose row changed at or after ``since`` (``updated_at``), oldest change
        first: one range of index ``(updated_at)``, so the cost follows what changed, not
        the ledger's size (ledger_sensor (slot health)'s read)."""
        query = (
            sa.select(entries)
            .where(entries.c.updated_at >= to_db(since, "since"))
            .order_by(entries.c.updated_at, entries.c.id)
        )
        with self.connect("autocommit") as conn:
            return [entry_from_row(r) for r in conn.execute(query).mappings()]

    def children(self, entry_id: int) -> list[Entry]:
        """Entries whose parent is ``entry_id`` (manual retries), oldest first."""
        query = (
            sa.select(entries)
            .where(entries.c.parent_id == check_id(entry_id, "entry_id"))
            .order_by(entries.c.id)
        )
        with self.connect("autocommit") as conn:
            return [entry_from_row(r) for r in conn.execute(query).mappings()]

    def list_entries(
        self,
        *,
        task_key: str | None = None,
        statuses: Sequence[str] | None = None,
        trigger: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = DEFAULT_LIST_LIMIT,
        cursor: str | None = None,
    ) -> tuple[list[Entry], str | None]:
        """Entries newest first (by created_at, id), keyset-paginated.

        Returns the page and the cursor of the next page (None on the last page). ``since``
        is inclusive and ``until`` exclusive, both on created_at.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        query = sa.select(entries)
        if task_key is not None:
            query = query.where(entries.c.task_key == task_key)
        if statuses:
            unknown = [s for s in statuses if s not in STATUSES]
            if unknown:
                raise ValueError(
                    f"unknown status {', '.join(map(repr, unknown))}; use {', '.join(STATUSES)}"
                )
            query = query.where(entries.c.status.in_(list(statuses)))
        if trigger is not None:
            if trigger not in TRIGGERS:
                raise ValueError(f"trigger {trigger!r} is not one of {', '.join(TRIGGERS)}")
            query = query.where(entries.c.trigger == trigger)
        if since is not None:
            query = query.where(entries.c.created_at >= to_db(since, "since"))
        if until is not None:
            query = query.where(entries.c.created_at < to_db(until, "until"))
        if cursor is not None:
            c_created, c_id = decode_cursor(cursor)
            # A row-value comparison, not an OR: both databases use it as an index bound,
            # so a page deep in the ledger costs the same as the first one.
            query = query.where(
                sa.tuple_(entries.c.created_at, entries.c.id) < sa.tuple_(c_created, c_id)
            )
        query = query.order_by(entries.c.created_at.desc(), entries.c.id.desc()).limit(limit + 1)
        with self.connect("autocommit") as conn:
            page = [entry_from_row(r) for r in conn.execute(query).mappings()]
        if len(page) <= limit:
            return page, None
        page = page[:limit]
        return page, encode_cursor(page[-1])

    # --- run lifecycle -------------------------------------------------------------------

    def audit_for(self, entry_id: int) -> list[dict[str, Any]]:
        """Audit records that name the entry as subject or child, oldest first."""
        entry_id = check_id(entry_id, "entry_id")
        query = (
            sa.select(audit)
            .where(sa.or_(audit.c.entry_id == entry_id, audit.c.child_entry_id == entry_id))
            .order_by(audit.c.id)
        )
        with self.connect("autocommit") as conn:
            return [_audit_json(r) for r in conn.execute(query).mappings()]

    def first_activity(self, task_key: str) -> datetime | None:
        """When the task first did anything here: the earlier of its oldest entry's creation and
        its oldest scheduled due. Two index probes however long the ledger: the head of the
        ``(task, created_at)`` index, and of the unique ``(task, origin, dedup_key)`` index
        among ``due:`` keys, whose text sorts as the instants do."""
        created = sa.select(sa.func.min(entries.c.created_at)).where(entries.c.task_key == task_key)
        due_key = sa.select(sa.func.min(entries.c.dedup_key)).where(
            entries.c.task_key == task_key, entries.c.origin == Origin.DUE
        )
        with self.connect("autocommit") as conn:
            first = from_db(conn.execute(created).scalar())
            key = conn.execute(due_key).scalar()
        due = Due.from_key(key).at if key else None
        found = [x for x in (first, due) if x is not None]
        return min(found) if found else None

    def recent_audit(
        self, *, action: str | None = None, since: datetime | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """The newest ``limit`` audit records (of ``action``, at or after ``since``), oldest
        first: also those that name no entry (a refused manual launch has none)."""
        query = sa.select(audit).order_by(audit.c.id.desc()).limit(limit)
        if action is not None:
            query = query.where(audit.c.action == action)
        if since is not None:
            query = query.where(audit.c.at >= to_db(since, "since"))
        with self.connect("autocommit") as conn:
            return [_audit_json(r) for r in conn.execute(query).mappings()][::-1]

    def summary_counts(
        self, *, now: datetime | None = None, window: timedelta = timedelta(hours=24)
    ) -> dict[str, int]:
        """Counts for `dueledger summary`, each one indexed COUNT.

        ``active``: running with a live lease; ``stale``: running with an expired lease (what
        the reclaim sensor will fail); ``queued`` / ``retrying``: waiting now. Over the last
        ``window``: ``failed`` / ``success`` / ``lease_reclaimed`` by ``finished_at``,
        ``dispatch_failed`` by ``updated_at`` (the last launch failure), ``manual_retry``
        entries by ``created_at``, ``skipped`` (overlap, pauses) by ``finished_at``;
        ``refused``: runs the ledger did not let act (audited as ``run_refused``) by the
        audit's time. Keys of the windowed counts end in ``_window``.
        """
        if not isinstance(window, timedelta) or window <= timedelta(0):
            raise ValueError(f"window must be a positive timedelta, got {window!r}")
        at = self.clock(now)
        stamp = to_db(at, "now")
        since = to_db(at - window, "now")
        c = entries.c
        where: dict[str, Any] = {
            "active": sa.and_(c.status == Status.RUNNING, c.lease_expires_at >= stamp),
            "stale": sa.and_(c.status == Status.RUNNING, c.lease_expires_at < stamp),
            "queued": c.status == Status.QUEUED,
            "retrying": c.status == Status.RETRYING,
            "failed_window": sa.and_(c.status == Status.FAILED, c.finished_at >= since),
            "success_window": sa.and_(c.status == Status.SUCCESS, c.finished_at >= since),
            "lease_reclaimed_window": sa.and_(
                c.status == Status.FAILED,
                c.finished_at >= since,
                c.failure_kind == FailureKind.LEASE_RECLAIMED,
            ),
            "dispatch_failed_window": sa.and_(
                c.status == Status.DISPATCH_FAILED, c.updated_at >= since
            ),
            "manual_retry_window": sa.and_(
                c.trigger == Trigger.MANUAL_RETRY, c.created_at >= since
            ),
            "skipped_window": sa.and_(c.status == Status.SKIPPED, c.finished_at >= since),
        }
        count = sa.select(sa.func.count()).select_from(entries)
        # Runs the ledger refused (each audited once, by the claim wrapper): by the audit's
        # time index, apart from every failure count above.
        refused = (
            sa.select(sa.func.count())
            .select_from(audit)
            .where(audit.c.at >= since, audit.c.action == ACTION_RUN_REFUSED)
        )
        with self.connect("autocommit") as conn:
            counts = {
                name: int(conn.execute(count.where(cond)).scalar_one())
                for name, cond in where.items()
            }
            counts["refused_window"] = int(conn.execute(refused).scalar_one())
            return counts

    def in_progress(self, task_key: str) -> list[Entry]:
        """The task's entries running, or waiting for a retry that is coming, oldest first."""
        query = (
            sa.select(entries)
            .where(entries.c.task_key == require_text(task_key, "task_key"))
            .where(entries.c.status.in_(IN_PROGRESS))
            .order_by(entries.c.id)
        )
        with self.connect("autocommit") as conn:
            return [entry_from_row(r) for r in conn.execute(query).mappings()]

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
        with self.connect("autocommit") as conn:
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
        with self.connect("autocommit") as conn:
            return [entry_from_row(r) for r in conn.execute(query).mappings()]


def _audit_json(row: Any) -> dict[str, Any]:
    return {
        "id": int(row["id"]),
        "at": iso(from_db(row["at"]), micro=True),
        "operator": row["operator"],
        "action": row["action"],
        "entry_id": row["entry_id"],
        "child_entry_id": row["child_entry_id"],
        "reason": row["reason"],
        "checks": row["checks"],
        "outcome": row["outcome"],
    }
