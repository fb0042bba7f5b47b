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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import dagster as dg
import pandas as pd
import sqlalchemy as sa
from pydantic import PrivateAttr

# --- status values (the CHECK constraints below and the business rules use these) ----
SERVICE_ACTIVE: Final = "active"
SERVICE_SUSPENDED: Final = "suspended"
SERVICE_TERMINATED: Final = "terminated"
SERVICE_STATUSES: Final = (SERVICE_ACTIVE, SERVICE_SUSPENDED, SERVICE_TERMINATED)

ORDER_PENDING: Final = "pending"
ORDER_PAID: Final = "paid"
ORDER_CANCELLED: Final = "cancelled"
ORDER_STATUSES: Final = (ORDER_PENDING, ORDER_PAID, ORDER_CANCELLED)

TICKET_OPEN: Final = "open"
TICKET_WAITING_CUSTOMER: Final = "waiting_customer"
TICKET_CLOSED: Final = "closed"
TICKET_STATUSES: Final = (TICKET_OPEN, TICKET_WAITING_CUSTOMER, TICKET_CLOSED)

CHANNELS: Final = ("email", "sms", "in_app")

#: SQLite waits this long for a competing writer before failing with "database is locked".
SQLITE_BUSY_TIMEOUT_MS: Final = 30_000

#: Largest IN-list a write-back puts in one statement (keeps SQLite's bound-parameter
#: limit and PostgreSQL's plan size in check).
MAX_IN_LIST: Final = 500


def _status_check(column: str, values: Sequence[str], name: str) -> sa.CheckConstraint:
    allowed = ", ".join(f"'{value}'" for value in values)
    return sa.CheckConstraint(f"{column} IN ({allowed})", name=name)


metadata = sa.MetaData()

customers = sa.Table(
    "customers",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("email", sa.String(320), nullable=False),
    sa.Column("phone", sa.String(40), nullable=False),
    sa.Column("balance_cents", sa.BigInteger, nullable=False, default=0),
    # Comma-separated subset of CHANNELS; empty means the customer opted out of all.
    sa.Column("channels", sa.String(40), nullable=False, default=""),
)

services = sa.Table(
    "services",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("customer_id", sa.Integer, sa.ForeignKey("customers.id"), nullable=False),
    sa.Column("product", sa.String(100), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("price_cents", sa.BigInteger, nullable=False),
    sa.Column("auto_renew", sa.Boolean, nullable=False, default=False),
    sa.Column("expires_at", sa.DateTime, nullable=False),
    sa.Column("suspended_at", sa.DateTime, nullable=True),
    sa.Column("terminated_at", sa.DateTime, nullable=True),
    sa.Column("updated_at", sa.DateTime, nullable=False),
    _status_check("status", SERVICE_STATUSES, "ck_services_status"),
    # The lifecycle scans: "active and expired", "suspended since before the cutoff".
    sa.Index("ix_services_status_expires_at", "status", "expires_at"),
    sa.Index("ix_services_status_suspended_at", "status", "suspended_at"),
)

invoices = sa.Table(
    "invoices",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("customer_id", sa.Integer, nullable=False),
    sa.Column("service_id", sa.Integer, nullable=True),
    sa.Column("amount_cents", sa.BigInteger, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("due_at", sa.DateTime, nullable=False),
    sa.Column("paid_at", sa.DateTime, nullable=True),
)

payments = sa.Table(
    "payments",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("customer_id", sa.Integer, nullable=False),
    sa.Column("amount_cents", sa.BigInteger, nullable=False),
    sa.Column("paid_at", sa.DateTime, nullable=False),
)

orders = sa.Table(
    "orders",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("customer_id", sa.Integer, nullable=False),
    sa.Column("product", sa.String(100), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("cancelled_at", sa.DateTime, nullable=True),
    _status_check("status", ORDER_STATUSES, "ck_orders_status"),
    # The cleanup scan: "pending and created before the cutoff".
    sa.Index("ix_orders_status_created_at", "status", "created_at"),
)

tickets = sa.Table(
    "tickets",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("customer_id", sa.Integer, nullable=False),
    sa.Column("subject", sa.String(300), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
    sa.Column("closed_at", sa.DateTime, nullable=True),
    _status_check("status", TICKET_STATUSES, "ck_tickets_status"),
)

automation_log = sa.Table(
    "automation_log",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    # The as-of instant of the run that made the change (its due time), not wall clock,
    # so the log row agrees with the cancelled_at/suspended_at it explains.
    sa.Column("at", sa.DateTime, nullable=False),
    sa.Column("task_key", sa.String(200), nullable=False),
    # The ledger entry that made the change: who/what, joined to the run ledger.
    sa.Column("entry_key", sa.String(200), nullable=False),
    sa.Column("action", sa.String(50), nullable=False),
    sa.Column("object_type", sa.String(50), nullable=False),
    sa.Column("object_id", sa.Integer, nullable=False),
    sa.Column("detail", sa.Text, nullable=False, default=""),
    sa.Index("ix_automation_log_task_entry", "task_key", "entry_key"),
    sa.Index("ix_automation_log_object", "object_type", "object_id"),
)

#: The business tables sample data fills (automation_log is history, never regenerated).
#: Ordered parents first; delete in reverse.
SOURCE_TABLES: Final = (customers, services, invoices, payments, orders, tickets)

#: Every DateTime column name in the schema; `read_frame` parses these wherever they appear.
DATETIME_COLUMNS: Final = frozenset(
    column.name
    for table in metadata.tables.values()
    for column in table.columns
    if isinstance(column.type, sa.DateTime)
)


def naive_utc(value: datetime) -> datetime:
    """Return `value` as a naive UTC datetime (aware values are converted to UTC first).

    The store keeps naive UTC; accepting aware datetimes here means a caller holding
    `context.scheduled_execution_time` (aware) cannot silently compare in local time.
    """
    if isinstance(value, pd.Timestamp):
        value = value.to_pydatetime()
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value


def naive_utc_series(values: pd.Series) -> pd.Series:
    """Parse a column of instants into naive-UTC `datetime64` (None/NaN become NaT)."""
    if isinstance(values.dtype, pd.DatetimeTZDtype):
        return values.dt.tz_convert("UTC").dt.tz_localize(None)
    if pd.api.types.is_datetime64_dtype(values.dtype):
        return values
    parsed = pd.to_datetime(values, format="ISO8601", utc=True)
    return parsed.dt.tz_localize(None)


def unique_ids(ids: Iterable[Any]) -> list[int]:
    """Distinct ids as plain ints in ascending order.

    Plain ints because sqlite3 cannot bind numpy integers; ascending so concurrent
    writers lock rows in the same order (no deadlock on PostgreSQL).
    """
    return sorted({int(value) for value in ids})


def chunks(ids: Sequence[int], size: int = MAX_IN_LIST) -> Iterator[list[int]]:
    """Split `ids` into lists of at most `size` for IN-lists."""
    for start in range(0, len(ids), size):
        yield list(ids[start : start + size])


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
        conn.execute(
            sa.insert(automation_log),
            [
                {
                    "at": at,
                    "task_key": task_key,
                    "entry_key": entry_key,
                    "action": action,
                    "object_type": object_type,
                    "object_id": object_id,
                    "detail": detail_text,
                }
                for object_id in changed
            ],
        )
    return changed


def create_schema(engine: sa.Engine) -> None:
    """Create the source tables and indexes that do not exist yet (safe to repeat).

    Includes the side-effect bookkeeping tables of ``resources.idempotency`` (defined on
    the same ``metadata``), so the schema never depends on which modules were imported.
    """
    from resources import idempotency

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


def read_frame_from(
    engine: sa.Engine,
    sql_or_table: str | sa.Table | sa.Executable,
    params: Mapping[str, Any] | None = None,
    *,
    parse_dates: Sequence[str] = (),
) -> pd.DataFrame:
    """Run a query and return its rows as a DataFrame with times as naive-UTC datetime64.

    `sql_or_table` is a table, a table name, a SQLAlchemy selectable or SQL text with
    `:name` parameters. Columns named like the schema's DateTime columns (`created_at`,
    `expires_at`, ...) and any listed in `parse_dates` are parsed, so SQLite's strings
    and PostgreSQL's datetimes come back the same.
    """
    statement: sa.Executable
    if isinstance(sql_or_table, sa.Table):
        statement = sa.select(sql_or_table).order_by(*sql_or_table.primary_key.columns)
    elif isinstance(sql_or_table, str) and sql_or_table in metadata.tables:
        table = metadata.tables[sql_or_table]
        statement = sa.select(table).order_by(*table.primary_key.columns)
    elif isinstance(sql_or_table, str):
        statement = sa.text(sql_or_table)
    else:
        statement = sql_or_table
    with engine.connect() as conn:
        result = conn.execute(statement, dict(params or {}))
        columns = list(result.keys())
        frame = pd.DataFrame(result.fetchall(), columns=columns)
    wanted = DATETIME_COLUMNS.union(parse_dates)
    for column in columns:
        if column in wanted:
            frame[column] = naive_utc_series(frame[column])
    return frame


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
