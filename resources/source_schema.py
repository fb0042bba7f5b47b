"""The source store's schema and frame helpers: tables, statuses, naive-UTC times, IN-list
chunks and :func:`read_frame_from`. No engine set-up and no Dagster here: the store
(``resources/source_store.py``) and the idempotency log (``resources/idempotency.py``) both
build on it, so neither imports the other's module to share a table.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import sqlalchemy as sa

if TYPE_CHECKING:
    # Imported where a frame is made: the code location loads without pandas.
    import pandas as pd

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


def log_automation(
    conn: sa.Connection,
    *,
    at: datetime,
    task_key: str,
    entry_key: str,
    action: str,
    items: Iterable[tuple[str, int, str]],
) -> None:
    """One ``automation_log`` row per ``(object_type, object_id, detail)`` of ``items``, written
    on the caller's connection so the rows commit (or roll back) with the change they explain.
    ``at`` is the run's as-of instant, stored naive UTC like every source time."""
    rows = [
        {
            "at": naive_utc(at),
            "task_key": task_key,
            "entry_key": entry_key,
            "action": action,
            "object_type": str(object_type),
            "object_id": int(object_id),
            "detail": str(detail),
        }
        for object_type, object_id, detail in items
    ]
    if rows:
        conn.execute(sa.insert(automation_log), rows)


#: The business tables sample data fills (automation_log is history, never regenerated).
#: Ordered parents first; delete in reverse.
SOURCE_TABLES: Final = (customers, services, invoices, payments, orders, tickets)

#: What `dueledger sample-data` generated into this store: one row per business table it
#: filled, written in the same transaction as the rows. `sample-data --replace` compares
#: the tables against it, so it deletes demo data without asking and anything else only
#: when told to (see ``resources/sample_data.py``).
sample_data_generated = sa.Table(
    "sample_data_generated",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("table_name", sa.String(64), nullable=False, unique=True),
    # The generated rows of table_name have ids 1..generated_rows.
    sa.Column("generated_rows", sa.Integer, nullable=False),
    # How they were generated; text, because any integer is a valid seed.
    sa.Column("seed", sa.String(100), nullable=False),
    sa.Column("services", sa.Integer, nullable=False),
    sa.Column("sample_as_of", sa.DateTime, nullable=False),
    # automation_log's highest id at generation: the log rows above it were written by the
    # tasks since, and trace the rows a task added (a renewal's invoice).
    sa.Column("automation_log_id", sa.Integer, nullable=False),
)

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
    # Only a loaded pandas can have made a Timestamp: the check imports nothing, so the
    # code location loads without pandas.
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(value, pandas.Timestamp):
        value = value.to_pydatetime()
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value


def naive_utc_series(values: pd.Series) -> pd.Series:
    """Parse a column of instants into naive-UTC `datetime64` (None/NaN become NaT)."""
    import pandas as pd

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
    import pandas as pd

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
