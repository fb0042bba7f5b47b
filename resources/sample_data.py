"""Deterministic sample data for the source store, laid out around an `as_of` instant.

Local development (`dagster dev`) and the tests fill the store with this, so the
business tasks have visible work at `as_of`: stale and fresh pending orders, services
expiring around `as_of`, suspended services at every age of their grace period,
overdue invoices and tickets waiting for the customer.

The same `(services, seed, as_of)` always yields the same rows: one
`numpy.random.default_rng(seed)` drawn in a fixed order, whole columns at a time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pandas as pd
import sqlalchemy as sa

from resources.core.settings import mask_url
from resources.source_schema import (
    CHANNELS,
    ORDER_CANCELLED,
    ORDER_PAID,
    ORDER_PENDING,
    SERVICE_ACTIVE,
    SERVICE_SUSPENDED,
    SERVICE_TERMINATED,
    SOURCE_TABLES,
    TICKET_CLOSED,
    TICKET_OPEN,
    TICKET_WAITING_CUSTOMER,
    automation_log,
    invoices,
    naive_utc,
    sample_data_generated,
)
from resources.source_store import create_schema

HOUR: Final = 3600
DAY: Final = 24 * HOUR

PRODUCTS: Final = (
    "shared-hosting-basic",
    "shared-hosting-pro",
    "managed-wordpress",
    "vps-small",
    "vps-large",
    "domain",
    "ssl-certificate",
)
#: Monthly price per product, in cents, aligned with PRODUCTS.
PRODUCT_PRICES_CENTS: Final = (499, 1299, 1999, 2499, 7999, 1499, 999)

TICKET_SUBJECTS: Final = (
    "Website is down",
    "Cannot receive email",
    "Question about my invoice",
    "Please renew my domain",
    "SSL certificate warning",
    "Upgrade to a larger plan",
    "DNS change not visible",
)

#: Channel sets a customer may have opted into ("" = opted out of everything).
CHANNEL_CHOICES: Final = (
    "email",
    "email,sms",
    "email,in_app",
    ",".join(CHANNELS),
    "sms",
    "in_app",
    "sms,in_app",
    "",
)
CHANNEL_WEIGHTS: Final = (0.30, 0.20, 0.15, 0.15, 0.06, 0.06, 0.04, 0.04)

IntArray = npt.NDArray[np.int64]
TimeArray = npt.NDArray[np.datetime64]


class _Clock:
    """Turns second offsets drawn by the generator into instants relative to as_of."""

    def __init__(self, as_of: datetime) -> None:
        self.base = np.datetime64(as_of, "us")

    def at(self, offset_seconds: IntArray) -> TimeArray:
        return self.base + offset_seconds.astype("timedelta64[s]")


def _uniform_seconds(rng: np.random.Generator, low: float, high: float, size: int) -> IntArray:
    """Whole seconds drawn uniformly from [low, high] (so both ends can occur)."""
    return rng.integers(int(low), int(high), size=size, endpoint=True)


def _pick(choices: Sequence[str], index: IntArray) -> npt.NDArray[np.object_]:
    return np.asarray(choices, dtype=object)[index]


def build_sample_frames(*, services: int, seed: int, as_of: datetime) -> dict[str, pd.DataFrame]:
    """Build the sample rows for every source table as DataFrames, without touching a database.

    Pure and deterministic in `(services, seed, as_of)`. Ids are 1..n per table. Times
    are naive UTC; every "happened" time (created_at, paid_at, suspended_at, ...) is at
    or before `as_of`, while due and expiry times may lie ahead of it.
    """
    if services < 1:
        raise ValueError(f"services must be at least 1, got {services}")
    at = naive_utc(as_of)
    rng = np.random.default_rng(seed)
    clock = _Clock(at)

    n_services = services
    n_customers = max(1, (services + 1) // 2)
    n_orders = max(1, services // 2)
    n_tickets = max(1, services // 4)

    # --- customers -----------------------------------------------------------------
    customer_ids = np.arange(1, n_customers + 1, dtype=np.int64)
    balance_kind = rng.choice(3, size=n_customers, p=[0.40, 0.35, 0.25])
    owed = -rng.integers(100, 50_000, size=n_customers, endpoint=True)
    credit = rng.integers(100, 20_000, size=n_customers, endpoint=True)
    balance = np.select([balance_kind == 1, balance_kind == 2], [owed, credit], default=0)
    channel_index = rng.choice(len(CHANNEL_CHOICES), size=n_customers, p=CHANNEL_WEIGHTS)
    phone_digits = rng.integers(0, 10_000_000, size=n_customers)
    customers_frame = pd.DataFrame(
        {
            "id": customer_ids,
            "name": [f"Customer {i:05d}" for i in customer_ids],
            "email": [f"customer{i:05d}@example.test" for i in customer_ids],
            "phone": [f"+1-555-{d:07d}" for d in phone_digits],
            "balance_cents": balance.astype(np.int64),
            "channels": _pick(CHANNEL_CHOICES, channel_index),
        }
    )

    # --- services ------------------------------------------------------------------
    # Every column is drawn for every row and then selected by status, so the number
    # of draws (and hence every later table) does not depend on the status mix.
    service_ids = np.arange(1, n_services + 1, dtype=np.int64)
    service_customer = rng.integers(1, n_customers, size=n_services, endpoint=True)
    product_index = rng.integers(0, len(PRODUCTS), size=n_services)
    price = np.asarray(PRODUCT_PRICES_CENTS, dtype=np.int64)[product_index]
    status_index = rng.choice(3, size=n_services, p=[0.75, 0.15, 0.10])
    is_active, is_suspended = status_index == 0, status_index == 1
    auto_renew = rng.random(n_services) < 0.5

    # Active: about a third expire within ±10 days of as_of (work for the lifecycle
    # task now or soon); the rest are paid up for months.
    expiring_soon = rng.random(n_services) < 0.35
    near_expiry = _uniform_seconds(rng, -10 * DAY, 10 * DAY, n_services)
    far_expiry = _uniform_seconds(rng, 10 * DAY, 365 * DAY, n_services)
    active_expires = np.where(expiring_soon, near_expiry, far_expiry)
    active_updated = -_uniform_seconds(rng, 0, 90 * DAY, n_services)
    # Suspended 0-60 days ago: on both sides of the default 30-day retention.
    suspended_ago = -_uniform_seconds(rng, 0, 60 * DAY, n_services)
    # Terminated: suspended 30-45 days before termination, terminated 0-180 days ago.
    terminated_ago = -_uniform_seconds(rng, 0, 180 * DAY, n_services)
    retention_used = _uniform_seconds(rng, 30 * DAY, 45 * DAY, n_services)
    grace_before_suspension = _uniform_seconds(rng, 0, 2 * DAY, n_services)

    suspended_offset = np.where(is_suspended, suspended_ago, terminated_ago - retention_used)
    expires_offset = np.where(is_active, active_expires, suspended_offset - grace_before_suspension)
    updated_offset = np.select(
        [is_active, is_suspended], [active_updated, suspended_ago], default=terminated_ago
    )
    services_frame = pd.DataFrame(
        {
            "id": service_ids,
            "customer_id": service_customer,
            "product": _pick(PRODUCTS, product_index),
            "status": _pick((SERVICE_ACTIVE, SERVICE_SUSPENDED, SERVICE_TERMINATED), status_index),
            "price_cents": price,
            "auto_renew": auto_renew,
            "expires_at": clock.at(expires_offset),
            "suspended_at": np.where(
                is_active, np.datetime64("NaT", "us"), clock.at(suspended_offset)
            ),
            "terminated_at": np.where(
                status_index == 2, clock.at(terminated_ago), np.datetime64("NaT", "us")
            ),
            "updated_at": clock.at(updated_offset),
        }
    )

    # --- invoices: one per service (a tenth are one-off charges without a service) ---
    one_off = rng.random(n_services) < 0.10
    one_off_amount = rng.integers(500, 5_000, size=n_services, endpoint=True)
    invoice_kind = rng.choice(3, size=n_services, p=[0.60, 0.20, 0.20])
    is_paid = invoice_kind == 0
    paid_due = -_uniform_seconds(rng, 0, 90 * DAY, n_services)
    overdue_due = -_uniform_seconds(rng, 0, 10 * DAY, n_services)  # overdue by 0-10 days
    upcoming_due = _uniform_seconds(rng, 0, 14 * DAY, n_services)
    due_offset = np.select([is_paid, invoice_kind == 1], [paid_due, overdue_due], upcoming_due)
    created_offset = due_offset - 14 * DAY
    # Paid up to six days after the due date, but never after as_of.
    paid_offset = np.minimum(created_offset + _uniform_seconds(rng, 0, 20 * DAY, n_services), 0)
    invoices_frame = pd.DataFrame(
        {
            "id": service_ids.copy(),
            "customer_id": service_customer,
            "service_id": pd.array(np.where(one_off, 0, service_ids), dtype="Int64"),
            "amount_cents": np.where(one_off, one_off_amount, price).astype(np.int64),
            "created_at": clock.at(created_offset),
            "due_at": clock.at(due_offset),
            "paid_at": np.where(is_paid, clock.at(paid_offset), np.datetime64("NaT", "us")),
        }
    )
    invoices_frame.loc[one_off, "service_id"] = pd.NA

    # --- payments: one per paid invoice -------------------------------------------
    paid_invoices = invoices_frame.loc[is_paid]
    payments_frame = pd.DataFrame(
        {
            "id": np.arange(1, len(paid_invoices) + 1, dtype=np.int64),
            "customer_id": paid_invoices["customer_id"].to_numpy(),
            "amount_cents": paid_invoices["amount_cents"].to_numpy(),
            "paid_at": paid_invoices["paid_at"].to_numpy(),
        }
    )

    # --- orders ----------------------------------------------------------------------
    order_customer = rng.integers(1, n_customers, size=n_orders, endpoint=True)
    order_product = rng.integers(0, len(PRODUCTS), size=n_orders)
    order_kind = rng.choice(3, size=n_orders, p=[0.40, 0.45, 0.15])
    # Pending for 0-72 h: about a third are fresh, the rest past the 24 h cleanup age.
    pending_created = -_uniform_seconds(rng, 0, 72 * HOUR, n_orders)
    paid_created = -_uniform_seconds(rng, 0, 90 * DAY, n_orders)
    cancelled_created = -_uniform_seconds(rng, 2 * DAY, 90 * DAY, n_orders)
    cancel_delay = _uniform_seconds(rng, DAY, DAY + HOUR, n_orders)
    order_created = np.select(
        [order_kind == 0, order_kind == 1], [pending_created, paid_created], cancelled_created
    )
    orders_frame = pd.DataFrame(
        {
            "id": np.arange(1, n_orders + 1, dtype=np.int64),
            "customer_id": order_customer,
            "product": _pick(PRODUCTS, order_product),
            "status": _pick((ORDER_PENDING, ORDER_PAID, ORDER_CANCELLED), order_kind),
            "created_at": clock.at(order_created),
            "cancelled_at": np.where(
                order_kind == 2,
                clock.at(cancelled_created + cancel_delay),
                np.datetime64("NaT", "us"),
            ),
        }
    )

    # --- tickets -------------------------------------------------------------------
    ticket_customer = rng.integers(1, n_customers, size=n_tickets, endpoint=True)
    subject_index = rng.integers(0, len(TICKET_SUBJECTS), size=n_tickets)
    ticket_kind = rng.choice(3, size=n_tickets, p=[0.40, 0.35, 0.25])
    open_updated = -_uniform_seconds(rng, 0, 7 * DAY, n_tickets)
    waiting_updated = -_uniform_seconds(rng, 0, 14 * DAY, n_tickets)  # waiting 0-14 days
    closed_ago = -_uniform_seconds(rng, 0, 60 * DAY, n_tickets)
    ticket_updated = np.select(
        [ticket_kind == 0, ticket_kind == 1], [open_updated, waiting_updated], closed_ago
    )
    tickets_frame = pd.DataFrame(
        {
            "id": np.arange(1, n_tickets + 1, dtype=np.int64),
            "customer_id": ticket_customer,
            "subject": _pick(TICKET_SUBJECTS, subject_index),
            "status": _pick((TICKET_OPEN, TICKET_WAITING_CUSTOMER, TICKET_CLOSED), ticket_kind),
            "updated_at": clock.at(ticket_updated),
            "closed_at": np.where(
                ticket_kind == 2, clock.at(closed_ago), np.datetime64("NaT", "us")
            ),
        }
    )

    return {
        "customers": customers_frame,
        "services": services_frame,
        "invoices": invoices_frame,
        "payments": payments_frame,
        "orders": orders_frame,
        "tickets": tickets_frame,
    }


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts of plain Python values (int, bool, str, datetime, None) for executemany.

    Column-wise conversion keeps this fast; drivers cannot bind numpy scalars or NaT.
    """
    columns: dict[str, npt.NDArray[np.object_]] = {}
    for name in frame.columns:
        series = frame[name]
        if pd.api.types.is_datetime64_dtype(series.dtype):
            # datetime64 -> datetime.datetime, NaT -> None.
            columns[name] = series.to_numpy(dtype="datetime64[us]").astype(object)
        else:
            values = series.astype(object).to_numpy()
            values[pd.isna(values)] = None  # pd.NA / NaN -> NULL
            columns[name] = values
    names = list(columns)
    return [dict(zip(names, row, strict=True)) for row in zip(*columns.values(), strict=True)]


@dataclass(frozen=True)
class StoreContents:
    """What the business tables of a source store hold, against what sample-data recorded
    generating into it (the ``sample_data_generated`` table)."""

    #: Rows per business table (SOURCE_TABLES order).
    rows: dict[str, int]
    #: Of those, rows sample-data did not generate and no dueledger task added: a table
    #: with no record of generated rows counts whole.
    not_generated: dict[str, int]
    #: How the recorded sample was made (seed, services, as_of), None without a record.
    generation: tuple[str, int, datetime] | None

    @property
    def empty(self) -> bool:
        """True when no business table holds a row."""
        return not any(self.rows.values())


def _describe(counts: Mapping[str, int]) -> str:
    """``counts`` as text: "3 customers, 1 invoices"."""
    return ", ".join(f"{n} {name}" for name, n in counts.items() if n)


def _generated_before(conn: sa.Connection) -> dict[str, Any]:
    """The ``sample_data_generated`` rows by table name."""
    return {row.table_name: row for row in conn.execute(sa.select(sample_data_generated))}


def _added_by_a_task(table: sa.Table, log_id: int) -> sa.ColumnElement[bool] | None:
    """Rows of ``table`` a dueledger task added while working on the sample: a renewal's
    invoice, traced by the automation_log row its task wrote at the same instant about its
    service since the sample was generated. None where no task adds rows."""
    if table is not invoices:
        return None
    return sa.exists().where(
        automation_log.c.id > log_id,
        automation_log.c.object_type == "service",
        automation_log.c.object_id == invoices.c.service_id,
        automation_log.c.at == invoices.c.created_at,
    )


def store_contents(conn: sa.Connection) -> StoreContents:
    """Count the business tables' rows and those sample-data did not generate.

    A row is generated when its table has a ``sample_data_generated`` record and its id is
    within the ids generated (1..generated_rows); a row above them that a dueledger task added while
    working on the sample (see `_added_by_a_task`) counts as generated too, so demo data a
    local platform has worked on is still demo data. Everything else — rows inserted by
    anyone else, every row of a table without a record — is not generated.
    """
    recorded = _generated_before(conn)
    rows: dict[str, int] = {}
    not_generated: dict[str, int] = {}
    for table in SOURCE_TABLES:
        count = sa.select(sa.func.count()).select_from(table)
        rows[table.name] = int(conn.execute(count).scalar_one())
        record = recorded.get(table.name)
        if record is None:
            not_generated[table.name] = rows[table.name]
            continue
        foreign = count.where(table.c.id > record.generated_rows)
        added = _added_by_a_task(table, record.automation_log_id)
        if added is not None:
            foreign = foreign.where(~added)
        not_generated[table.name] = int(conn.execute(foreign).scalar_one())
    generation = None
    if recorded:
        first = next(iter(recorded.values()))
        generation = (first.seed, first.services, first.sample_as_of)
    return StoreContents(rows, not_generated, generation)


class StoreNotEmpty(ValueError):
    """The store already has data and ``replace`` was not given; nothing was changed."""

    def __init__(self, occupied: Sequence[str]) -> None:
        self.occupied = list(occupied)
        super().__init__(
            f"the source store already has data in {', '.join(occupied)}; refusing to "
            f"overwrite it. Pass replace=True to delete and regenerate the source tables "
            f"(automation_log is kept), or point at an empty database."
        )


class ReplaceRefused(ValueError):
    """``replace`` would delete what may not be demo data; nothing was changed.

    Refused on a server database (PostgreSQL: it may be shared or production) and on a
    store holding rows sample-data did not generate, unless ``delete_everything``.
    """

    def __init__(self, where: str, server: bool, contents: StoreContents) -> None:
        self.where, self.server, self.contents = where, server, contents
        super().__init__(self.message("delete_everything=True"))

    def message(self, flag: str) -> str:
        """Why it was refused, naming ``flag`` (the option that allows it) as the fix."""
        contents = self.contents
        if contents.generation is None:
            origin = "sample-data has no record of generating any of them"
        else:
            seed, services, as_of = contents.generation
            made = f"seed {seed}, {services} services, as of {as_of:%Y-%m-%dT%H:%M:%S}Z"
            foreign = _describe(contents.not_generated)
            origin = (
                f"sample-data generated them ({made})"
                if not any(contents.not_generated.values())
                else f"sample-data did not generate {foreign} of them ({made}), nor did a "
                f"dueledger task add them"
            )
        why = (
            f"{self.where} is a server database, which may be shared or production"
            if self.server
            else f"{self.where} holds rows sample-data did not generate"
        )
        if contents.empty:
            holds = "It holds no rows yet, so there is nothing to replace"
        else:
            holds = f"It holds {_describe(contents.rows)}; {origin}"
        return (
            f"refusing to replace the sample data: {why}. {holds}. If everything in its "
            f"customers, services, invoices, payments, orders and tickets may be deleted, "
            f"repeat with {flag}. Nothing was changed."
        )


def generate_sample_data(
    engine: sa.Engine,
    *,
    services: int = 200,
    seed: int = 7,
    as_of: datetime,
    replace: bool = False,
    delete_everything: bool = False,
) -> dict[str, int]:
    """Fill the source store with deterministic sample data around `as_of`; return row counts.

    Creates the schema if needed and records what it generated (``sample_data_generated``).
    Refuses (StoreNotEmpty) when any source table already holds rows, unless `replace=True`, which
    deletes and regenerates the source tables (customers, services, invoices, payments,
    orders, tickets) in one transaction; `automation_log` and the side-effect log are
    history and are kept. Replacing is refused (ReplaceRefused) on PostgreSQL and on a store
    holding rows sample-data did not generate (`store_contents`), unless
    `delete_everything=True`. `services` sets the scale: about half as many customers and
    orders, one invoice per service, a quarter as many tickets.
    """
    frames = build_sample_frames(services=services, seed=seed, as_of=as_of)
    create_schema(engine)
    with engine.begin() as conn:
        occupied = [
            table.name
            for table in SOURCE_TABLES
            if conn.execute(sa.select(sa.literal(1)).select_from(table).limit(1)).first()
        ]
        if occupied and not replace:
            raise StoreNotEmpty(occupied)
        server = conn.dialect.name != "sqlite"
        if replace and not delete_everything:
            # Counted in the transaction that deletes, so what was judged is what goes.
            contents = store_contents(conn)
            if server or any(contents.not_generated.values()):
                where = mask_url(engine.url.render_as_string(hide_password=False))
                raise ReplaceRefused(where, server, contents)
        for table in reversed(SOURCE_TABLES):  # children first, for the foreign keys
            conn.execute(sa.delete(table))
        for table in SOURCE_TABLES:
            records = _records(frames[table.name])
            if records:
                conn.execute(sa.insert(table), records)
        last_log = sa.select(sa.func.coalesce(sa.func.max(automation_log.c.id), 0))
        log_id = int(conn.execute(last_log).scalar_one())
        conn.execute(sa.delete(sample_data_generated))
        conn.execute(
            sa.insert(sample_data_generated),
            [
                {
                    "table_name": name,
                    "generated_rows": len(frame),
                    "seed": str(seed),
                    "services": services,
                    "sample_as_of": naive_utc(as_of),
                    "automation_log_id": log_id,
                }
                for name, frame in frames.items()
            ],
        )
        if conn.dialect.name == "postgresql":
            # Explicit ids do not advance PostgreSQL's sequences; move them past the
            # inserted ids so later inserts without an id do not collide.
            for table in SOURCE_TABLES:
                conn.execute(
                    sa.text(
                        f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), "
                        f"COALESCE((SELECT MAX(id) FROM {table.name}), 0) + 1, false)"
                    )
                )
    return {name: len(frame) for name, frame in frames.items()}
