"""The hosting provider's source data: customers, services, invoices, orders, tickets.

This is the store the business tasks read from and write back to (cancel an order,
suspend a service). Every write-back also adds one `automation_log` row per changed
object, so each change can be traced to the task and ledger entry that made it.

Conventions: integer autoincrement primary keys, money as integer cents, all times
naive UTC (`sa.DateTime` without a timezone). Nothing here does I/O at import or when
the resource is constructed; the engine is created on first use.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
import sqlalchemy as sa
from pydantic import PrivateAttr

from resources import idempotency
from resources.core.errors import InvalidInput
from resources.core.settings import ENV_SOURCE_URL, mask_url
from resources.source_schema import (
    SQLITE_BUSY_TIMEOUT_MS,
    chunks,
    log_automation,
    metadata,
    read_frame_from,
    services,
    unique_ids,
)

if TYPE_CHECKING:
    # Frames are made in read_frame_from: the code location loads without pandas.
    import pandas as pd


def update_and_log(
    conn: sa.Connection,
    table: sa.Table,
    ids: Iterable[Any],
    *,
    condition: sa.ColumnElement[bool],
    values: Mapping[str, Any],
    at: datetime,
    task_key: str,
    entry_key: str,
    action: str,
    object_type: str,
    detail: Mapping[str, Any],
) -> list[int]:
    """Compare-and-set `values` on the rows `ids` that still satisfy `condition`; log them.

    Runs on the caller's connection so the update and its `automation_log` rows commit
    (or roll back) together. Rows whose state changed since they were planned no longer
    match `condition` and are left alone, so a concurrent change is never overwritten.
    Returns the ids actually changed, ascending.
    """
    changed: list[int] = []
    for chunk in chunks(unique_ids(ids)):
        statement = (
            sa.update(table)
            .where(table.c.id.in_(chunk), condition)
            .values(**values)
            # RETURNING (SQLite >= 3.35, PostgreSQL) names exactly the rows this statement
            # changed, without a read-then-write that could race another writer.
            .returning(table.c.id)
        )
        changed.extend(int(row[0]) for row in conn.execute(statement))
    changed.sort()
    if changed:
        detail_text = json.dumps(dict(detail), sort_keys=True, default=str)
        log_automation(
            conn,
            at=at,
            task_key=task_key,
            entry_key=entry_key,
            action=action,
            items=((object_type, object_id, detail_text) for object_id in changed),
        )
    return changed


def create_schema(engine: sa.Engine) -> None:
    """Create the source tables and indexes that do not exist yet (safe to repeat).

    Includes the side-effect bookkeeping tables of ``resources.idempotency`` (defined on
    the same ``metadata``), so the schema never depends on which modules were imported.
    """
    metadata.create_all(engine)
    idempotency.create_domain_schema(engine)


def _sqlite_on_connect(dbapi_connection: Any, _connection_record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        # WAL lets readers (sensors, the UI) proceed while a task writes back.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        # SQLite ignores foreign keys unless asked; PostgreSQL always enforces them, and
        # the two backends must accept and reject the same writes.
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def make_engine(url: str) -> sa.Engine:
    """Create an engine for the source store.

    SQLite (local): creates the database file's parent directory and turns on WAL,
    a 30 s busy timeout and foreign keys on every connection. PostgreSQL
    (`postgresql+psycopg2://...`) and other URLs are used as given.
    """
    parsed = sa.make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return sa.create_engine(url)
    database = parsed.database
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url)
    sa.event.listen(engine, "connect", _sqlite_on_connect)
    return engine


class SourceConfigError(InvalidInput):
    """The source store's URL cannot be used (exit 2): the message names the variable, the
    URL with its password masked, and the fix."""


def open_source_engine(url: str) -> sa.Engine:
    """:func:`make_engine` for ``DUELEDGER_SOURCE_URL``, connected once: a URL that cannot
    work -- not a URL, a driver that is not installed, a SQLite path under a file, a server
    that refuses -- is a :class:`SourceConfigError`, like the ledger's URL, never a raw
    exception."""
    where = f"{ENV_SOURCE_URL}={mask_url(url)}"
    fix = (
        f"set {ENV_SOURCE_URL} to e.g. sqlite:////var/lib/dueledger/source.sqlite or "
        f"postgresql+psycopg2://user:password@host:5432/dbname"
    )
    try:
        engine = make_engine(url)
    except sa.exc.ArgumentError:
        raise SourceConfigError(f"{where} is not an SQLAlchemy URL; {fix}") from None
    except (sa.exc.NoSuchModuleError, ImportError) as exc:
        raise SourceConfigError(
            f"{where} needs a database driver that is not installed ({type(exc).__name__}: "
            f"{exc}); {fix}"
        ) from None
    except OSError as exc:
        raise SourceConfigError(
            f"{where}: cannot create the SQLite file's folder ({exc.strerror or exc}); {fix}"
        ) from None
    try:
        with engine.connect():
            pass
    except sa.exc.DBAPIError as exc:
        engine.dispose()
        detail = (str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[0]
        raise SourceConfigError(
            f"cannot use the source database {where}: {detail}; check the URL, that the "
            f"server runs (or the file's folder is writable) and the credentials"
        ) from None
    return engine


def has_data_in(engine: sa.Engine) -> bool:
    """True when every source-store table exists and `services` has at least one row."""
    inspector = sa.inspect(engine)
    if not all(inspector.has_table(name) for name in metadata.tables):
        return False
    with engine.connect() as conn:
        return conn.execute(sa.select(services.c.id).limit(1)).first() is not None


class SourceStore(dg.ConfigurableResource):
    """The hosting provider's source database (SQLite locally, PostgreSQL in production).

    Register with `SourceStore(url=dg.EnvVar("DUELEDGER_SOURCE_URL"))` or the URL that
    `orchestration.settings.load_settings()` decides. Constructing it does no I/O; the
    engine is created on first use and kept on this instance only.
    """

    url: str

    # Per-instance, never class-level: two resources with different URLs must not share.
    _engine: sa.Engine | None = PrivateAttr(default=None)

    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine for `url`, created on first call."""
        if self._engine is None:
            self._engine = make_engine(self.url)
        return self._engine

    def read_frame(
        self,
        sql_or_table: str | sa.Table | sa.Executable,
        params: Mapping[str, Any] | None = None,
        *,
        parse_dates: Sequence[str] = (),
    ) -> pd.DataFrame:
        """Query the store into a DataFrame (see `read_frame_from`)."""
        return read_frame_from(self.engine(), sql_or_table, params, parse_dates=parse_dates)

    def has_data(self) -> bool:
        """True when the schema exists and there is at least one service."""
        return has_data_in(self.engine())

    def create_schema(self) -> None:
        """Create missing tables and indexes (idempotent)."""
        create_schema(self.engine())

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        """Release pooled connections when Dagster is done with this resource."""
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
