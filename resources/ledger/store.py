"""The base of every ledger: configuration, the per-process engine, connections.

:class:`LedgerStore` holds what every ledger operation needs: the configured URL and lock
timeout, the :class:`~resources.ledger.engine.Runtime` built on first use in a process (and
rebuilt after a fork), connections in the three modes, the hot path, row loading and the
shared summary writes. The read side (``queries.py``) and the compare-and-set write side
(``transitions.py``) build on it; ``resource.py`` joins them into ``RunLedger``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

import resources.ledger.memo as memo
import resources.ledger.migrate as migrations
from resources.core.arguments import require_aware
from resources.core.entry import MAX_LATE_JOB_REJECTIONS, SUMMARY_REJECTIONS, Entry
from resources.core.instants import iso
from resources.core.settings import load_settings
from resources.ledger.engine import Mode, Runtime, build_runtime, current_pid
from resources.ledger.model import (
    UnknownEntryError,
    appended,
    check_id,
    db_values,
    entry_from_row,
    to_db,
)
from resources.ledger.rules import Decision
from resources.ledger.schema import entries
from resources.ledger.statements import statements_for


class LedgerStore:
    """Configuration and database plumbing of the run ledger (see :class:`~resources.ledger.
    ledger.Ledger`). A mixin: the concrete ledger sets ``database_url`` and
    ``busy_timeout_ms`` (the plain :class:`Ledger` in its constructor, the ``RunLedger``
    resource as its Dagster config); neither Dagster nor pydantic is needed here, so a
    command that only reads the ledger loads neither."""

    database_url: str | None
    busy_timeout_ms: int

    @property
    def url(self) -> str:
        """The database URL in use (from config, else from the settings)."""
        return self.database_url or load_settings().ledger_url

    @property
    def dialect_name(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._rt().engine.dialect.name

    def _rt(self) -> Runtime:
        runtime = self._current_runtime()
        if runtime is None or runtime.pid != current_pid():
            inherited = None
            if runtime is not None:
                # Inherited through fork: never use the parent's pooled connections.
                runtime.engine.dispose(close=False)
                inherited = runtime
            runtime = build_runtime(self.url, self.busy_timeout_ms, inherited)
            self._keep_runtime(runtime)
        return runtime

    def _current_runtime(self) -> Runtime | None:
        """The runtime built in this object, if any (where a subclass keeps it may differ)."""
        runtime: Runtime | None = self.__dict__.get("_runtime")
        return runtime

    def _keep_runtime(self, runtime: Runtime | None) -> None:
        self.__dict__["_runtime"] = runtime

    def _get_engine(self) -> Engine:
        """The SQLAlchemy engine (created on first use, per process)."""
        return self._rt().engine

    def dispose(self) -> None:
        """Close pooled connections (the engine is recreated on next use)."""
        runtime = self._current_runtime()
        if runtime is not None and runtime.pid == current_pid():
            runtime.close_idle()
            runtime.engine.dispose()
        self._keep_runtime(None)

    def migrate(self) -> None:
        """Apply the Alembic migrations up to head. Idempotent; safe when processes race.

        Cheap when the schema is already at head (one read, no lock). Otherwise the upgrade
        runs in one transaction that first takes a cross-process lock (PostgreSQL:
        ``pg_advisory_xact_lock``; SQLite: ``BEGIN IMMEDIATE``), so a second process waits,
        then finds the schema at head and does nothing. Runs and sensor ticks do not call
        it: resource set-up migrates once per process (``RunLedger.ensure_migrated``).
        """
        migrations.upgrade(self._rt())
        memo.mark_migrated(self.url)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A connection in a write transaction, committed on success, rolled back on error.

        For multi-statement operations (a manual retry writes the parent stamp, the child
        entry and the audit record together): pass it as ``connection=`` to
        :meth:`ensure_entry`, :meth:`get` (``for_update=True``), :meth:`mark_manual_retry`
        and :meth:`write_audit`. On SQLite it holds the database write lock throughout;
        keep it short.
        """
        with self.connect("write") as conn:
            yield conn

    # --- plumbing for the operations ------------------------------------------------------

    def connect(self, mode: Mode) -> contextlib.AbstractContextManager[Connection]:
        """A connection in ``mode`` (see :meth:`Runtime.connect`)."""
        return self._rt().connect(mode)

    def _hot(self, name: str, params: dict[str, Any], *, returning: bool) -> Any:
        """Hot-path statement ``name`` as one autocommit statement (see :meth:`Runtime.hot`)."""
        return self._rt().hot(name, params, returning=returning)

    @contextlib.contextmanager
    def maybe(self, connection: Connection | None) -> Iterator[Connection]:
        if connection is not None:
            yield connection
        else:
            with self.connect("autocommit") as conn:
                yield conn

    def clock(self, now: datetime | None) -> datetime:
        return datetime.now(UTC) if now is None else require_aware(now, "now").astimezone(UTC)

    def load(self, conn: Connection, entry_id: int, *, lock: bool = False) -> Entry:
        sql = statements_for(conn.dialect.name)
        query = sql.select_for_update if lock else sql.select_by_id
        row = conn.execute(query, {"b_id": check_id(entry_id, "entry_id")}).mappings().first()
        if row is None:
            raise UnknownEntryError(
                f"ledger entry {entry_id} does not exist (list entries with `dueledger runs list`)"
            )
        return entry_from_row(row)

    def apply(self, conn: Connection, entry: Entry, decision: Decision) -> Entry:
        """Write an allowed ``decision`` of a rule to the locked ``entry``, by compare-and-set
        on its status, in the caller's transaction; the entry after the write."""
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

    def record_rejection(
        self, conn: Connection, entry: Entry, run_id: str, at: datetime, action: str, reason: str
    ) -> Entry:
        """Append a rejection to the (locked) entry's summary; state columns stay as they are."""
        item = {
            "run_id": run_id,
            "at": iso(at, micro=True),
            "status": entry.status,
            "action": action,
            "reason": reason,
        }
        summary = appended(entry.summary, SUMMARY_REJECTIONS, item, MAX_LATE_JOB_REJECTIONS)
        return self.set_summary(conn, entry.id, summary, at)

    def set_summary(
        self, conn: Connection, entry_id: int, summary: dict[str, Any], at: datetime
    ) -> Entry:
        row = (
            conn.execute(
                sa.update(entries)
                .where(entries.c.id == entry_id)
                .values(summary=summary, updated_at=to_db(at, "now"))
                .returning(*entries.c)
            )
            .mappings()
            .one()
        )
        return entry_from_row(row)
