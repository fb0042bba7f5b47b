"""The source store: schema, SQLite engine settings, the resource, reading frames."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest
import sqlalchemy as sa

from resources.source_schema import customers, metadata, naive_utc, orders, services
from resources.source_store import SourceStore, create_schema, make_engine

AS_OF = datetime(2026, 3, 1, 12, 0)


def sqlite_file_url(path: Path) -> str:
    return f"sqlite:///{path}"


def add_customer(engine: sa.Engine, customer_id: int = 1) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.insert(customers),
            {
                "id": customer_id,
                "name": "Ada",
                "email": "ada@example.test",
                "phone": "+1",
                "balance_cents": -1500,
                "channels": "email,sms",
            },
        )


def add_service(engine: sa.Engine, *, customer_id: int = 1, status: str = "active") -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.insert(services),
            {
                "customer_id": customer_id,
                "product": "vps-small",
                "status": status,
                "price_cents": 2499,
                "auto_renew": True,
                "expires_at": AS_OF,
                "suspended_at": None,
                "updated_at": AS_OF - timedelta(days=1),
            },
        )


@pytest.fixture
def engine(tmp_path: Path) -> sa.Engine:
    engine = make_engine(sqlite_file_url(tmp_path / "source.sqlite"))
    create_schema(engine)
    return engine


# --- schema -----------------------------------------------------------------------------------


def test_create_schema_creates_every_table_and_the_scan_indexes_and_can_be_repeated(engine):
    create_schema(engine)  # second time: must not fail or duplicate anything

    inspector = sa.inspect(engine)
    assert set(inspector.get_table_names()) == {
        "customers",
        "services",
        "invoices",
        "payments",
        "orders",
        "tickets",
        "automation_log",
        # side-effect bookkeeping (resources/idempotency.py)
        "side_effects",
        "notification_outbox",
        "log_archives",
        # what `dueledger sample-data` generated (resources/sample_data.py)
        "sample_data_generated",
    }
    service_indexes = {i["name"]: i["column_names"] for i in inspector.get_indexes("services")}
    assert service_indexes["ix_services_status_expires_at"] == ["status", "expires_at"]
    assert service_indexes["ix_services_status_suspended_at"] == ["status", "suspended_at"]
    order_indexes = {i["name"]: i["column_names"] for i in inspector.get_indexes("orders")}
    assert order_indexes["ix_orders_status_created_at"] == ["status", "created_at"]


def test_an_unknown_service_status_is_rejected_by_the_database(engine):
    add_customer(engine)
    with pytest.raises(sa.exc.IntegrityError):
        add_service(engine, status="paused")


def test_a_service_for_a_missing_customer_is_rejected_on_sqlite_as_on_postgresql(engine):
    with pytest.raises(sa.exc.IntegrityError):
        add_service(engine, customer_id=99)


# --- engine -----------------------------------------------------------------------------------


def test_a_sqlite_engine_creates_the_parent_directory_and_uses_wal_and_a_30s_busy_timeout(
    tmp_path,
):
    path = tmp_path / "not" / "yet" / "there.sqlite"
    engine = make_engine(sqlite_file_url(path))
    with engine.connect() as conn:
        journal_mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
        busy_timeout = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
        foreign_keys = conn.exec_driver_sql("PRAGMA foreign_keys").scalar()
    assert path.parent.is_dir()
    assert (journal_mode, busy_timeout, foreign_keys) == ("wal", 30_000, 1)


def test_an_in_memory_sqlite_url_needs_no_directory():
    engine = make_engine("sqlite://")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1


# --- resource --------------------------------------------------------------------------------


def test_constructing_the_resource_touches_nothing_on_disk(tmp_path):
    path = tmp_path / "lazy" / "source.sqlite"
    store = SourceStore(url=sqlite_file_url(path))
    assert not path.parent.exists()
    store.engine()
    assert path.parent.is_dir()


def test_each_resource_keeps_its_own_engine(tmp_path):
    first = SourceStore(url=sqlite_file_url(tmp_path / "a.sqlite"))
    second = SourceStore(url=sqlite_file_url(tmp_path / "b.sqlite"))
    assert first.engine() is first.engine()
    assert first.engine() is not second.engine()
    assert str(second.engine().url).endswith("b.sqlite")


def test_has_data_is_false_without_schema_false_without_services_and_true_with_one(tmp_path):
    store = SourceStore(url=sqlite_file_url(tmp_path / "source.sqlite"))
    assert store.has_data() is False
    store.create_schema()
    add_customer(store.engine())
    assert store.has_data() is False
    add_service(store.engine())
    assert store.has_data() is True


def test_has_data_is_false_when_a_table_is_missing(engine):
    add_customer(engine)
    add_service(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE tickets")
    store = SourceStore(url=str(engine.url))
    assert store.has_data() is False


# --- read_frame ------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> SourceStore:
    store = SourceStore(url=sqlite_file_url(tmp_path / "source.sqlite"))
    store.create_schema()
    add_customer(store.engine())
    add_service(store.engine())
    return store


@pytest.mark.parametrize(
    "query",
    [
        pytest.param(services, id="table"),
        pytest.param("services", id="table_name"),
        pytest.param("SELECT * FROM services WHERE status = :status", id="sql_text"),
        pytest.param(sa.select(services).where(services.c.status == "active"), id="select"),
    ],
)
def test_read_frame_returns_times_as_naive_utc_datetime64_for_every_query_form(store, query):
    frame = store.read_frame(query, {"status": "active"})

    assert frame["id"].tolist() == [1]
    for column in ("expires_at", "suspended_at", "updated_at"):
        assert frame[column].dtype.kind == "M", column
        assert getattr(frame[column].dtype, "tz", None) is None, column
    assert frame.loc[0, "expires_at"] == pd.Timestamp(AS_OF)
    assert pd.isna(frame.loc[0, "suspended_at"])


def test_read_frame_of_an_empty_result_still_has_datetime_columns(store):
    frame = store.read_frame(orders)
    assert frame.empty
    assert frame["created_at"].dtype.kind == "M"


def test_read_frame_parses_extra_columns_on_request(store):
    frame = store.read_frame(
        "SELECT MAX(expires_at) AS latest FROM services", parse_dates=["latest"]
    )
    assert frame.loc[0, "latest"] == pd.Timestamp(AS_OF)


# --- naive_utc -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("naive_is_taken_as_utc", AS_OF, AS_OF),
        ("utc_aware", AS_OF.replace(tzinfo=UTC), AS_OF),
        (
            "utc_plus_two",
            datetime(2026, 3, 1, 14, 0, tzinfo=timezone(timedelta(hours=2))),
            AS_OF,
        ),
        (
            "crossing_midnight_backwards",
            datetime(2026, 3, 2, 1, 0, tzinfo=timezone(timedelta(hours=13))),
            AS_OF,
        ),
        ("pandas_timestamp", pd.Timestamp("2026-03-01T12:00:00Z"), AS_OF),
    ],
)
def test_naive_utc_converts_aware_instants_to_utc_and_drops_the_zone(name, value, expected):
    result = naive_utc(value)
    assert (result, result.tzinfo) == (expected, None), name


def test_every_table_has_an_integer_autoincrement_primary_key():
    for table in metadata.tables.values():
        (pk,) = table.primary_key.columns
        assert (pk.name, isinstance(pk.type, sa.Integer)) == ("id", True), table.name
