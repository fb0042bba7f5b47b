"""The two hosting tasks end to end: real assets, real ledger, real SQLite source store.

Each run is materialized with the tags a scheduled run carries, so the ledger claim,
the "as of due" semantics and the write-back are exercised exactly as in production.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa
from hook_support import build
from run_support import refused, scheduled

from resources.core import tags as t
from resources.core.due import format_due
from resources.core.entry import Trigger
from resources.ledger import RunLedger
from resources.source_store import SourceStore, create_schema, make_engine

# The code location's assets, built with this environment's plugin hooks.
order_cleanup = build("order_cleanup")
service_lifecycle_maintenance = build("service_lifecycle_maintenance")

DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)


def naive(dt: datetime) -> datetime:
    return dt.astimezone(UTC).replace(tzinfo=None)


@pytest.fixture
def stores(tmp_path):
    source = SourceStore(url=f"sqlite:///{tmp_path / 'source.sqlite'}")
    ledger = RunLedger(database_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    ledger.migrate()
    engine = make_engine(source.url)
    create_schema(engine)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO customers (id, name, email, phone, balance_cents, channels) "
                "VALUES (1, 'Ada', 'ada@example.org', '+100', 0, 'email')"
            )
        )
    yield source, ledger, engine
    engine.dispose()


def scheduled_tags(task: str, due: datetime) -> dict[str, str]:
    return scheduled(
        {t.TAG_TASK: task, t.TAG_TRIGGER: Trigger.SCHEDULE.value, t.TAG_DUE: format_due(due)}
    )


def materialize(asset, source, ledger, instance, tags, run_config=None):
    return dg.materialize(
        [asset],
        resources={"source": source, "ledger": ledger},
        instance=instance,
        tags=tags,
        run_config=run_config,
        # A run the ledger refuses ends CANCELED; the tests read how each run ended.
        raise_on_error=False,
    )


def insert(engine, table: str, rows: list[dict]) -> None:
    pd.DataFrame(rows).to_sql(table, engine, if_exists="append", index=False)


def statuses(engine, table: str) -> dict[int, str]:
    frame = pd.read_sql(f"SELECT id, status FROM {table}", engine)
    return dict(zip(frame["id"], frame["status"], strict=True))


def test_order_cleanup_cancels_only_orders_older_than_a_day_as_of_the_due(stores):
    source, ledger, engine = stores
    insert(
        engine,
        "orders",
        [
            # id 1: 25 h old at the due -> cancelled
            {
                "id": 1,
                "customer_id": 1,
                "product": "vps",
                "status": "pending",
                "created_at": naive(DUE - timedelta(hours=25)),
            },
            # id 2: exactly 24 h old -> cancelled (boundary is inclusive)
            {
                "id": 2,
                "customer_id": 1,
                "product": "vps",
                "status": "pending",
                "created_at": naive(DUE - timedelta(hours=24)),
            },
            # id 3: 23 h old -> stays pending
            {
                "id": 3,
                "customer_id": 1,
                "product": "vps",
                "status": "pending",
                "created_at": naive(DUE - timedelta(hours=23)),
            },
            # id 4: old but paid -> untouched
            {
                "id": 4,
                "customer_id": 1,
                "product": "vps",
                "status": "paid",
                "created_at": naive(DUE - timedelta(days=3)),
            },
        ],
    )
    with dg.instance_for_test() as instance:
        result = materialize(
            order_cleanup, source, ledger, instance, scheduled_tags("order_cleanup", DUE)
        )
    assert result.success
    assert statuses(engine, "orders") == {1: "cancelled", 2: "cancelled", 3: "pending", 4: "paid"}
    (mat,) = result.asset_materializations_for_node("order_cleanup")
    assert mat.metadata["cancelled"].value == 2
    assert mat.metadata["as_of"].value == "2026-11-30T22:45:00Z"
    log = pd.read_sql("SELECT object_id, action FROM automation_log ORDER BY object_id", engine)
    assert log["object_id"].tolist() == [1, 2]


def test_the_same_due_run_twice_does_its_work_once(stores):
    source, ledger, engine = stores
    insert(
        engine,
        "orders",
        [
            {
                "id": 1,
                "customer_id": 1,
                "product": "vps",
                "status": "pending",
                "created_at": naive(DUE - timedelta(days=2)),
            }
        ],
    )
    with dg.instance_for_test() as instance:
        first = materialize(
            order_cleanup, source, ledger, instance, scheduled_tags("order_cleanup", DUE)
        )
        # An order that becomes old enough later must not be touched by a duplicate run.
        insert(
            engine,
            "orders",
            [
                {
                    "id": 2,
                    "customer_id": 1,
                    "product": "vps",
                    "status": "pending",
                    "created_at": naive(DUE - timedelta(days=2)),
                }
            ],
        )
        second = materialize(
            order_cleanup, source, ledger, instance, scheduled_tags("order_cleanup", DUE)
        )
        second_refused = refused(instance, second.run_id)
    assert first.success and second_refused
    assert len(first.asset_materializations_for_node("order_cleanup")) == 1
    assert second.asset_materializations_for_node("order_cleanup") == []
    assert statuses(engine, "orders") == {1: "cancelled", 2: "pending"}
    entry = ledger.find("order_cleanup", f"due:{format_due(DUE)}")
    assert entry is not None and entry.status == "success"
    rejections = entry.summary["late_job_rejections"]
    assert [r["run_id"] for r in rejections] == [second.run_id]


def _service(id_: int, status: str, expires_at: datetime, suspended_at: datetime | None = None):
    return {
        "id": id_,
        "customer_id": 1,
        "product": "vps",
        "status": status,
        "price_cents": 1000,
        "auto_renew": False,
        "expires_at": naive(expires_at),
        "suspended_at": naive(suspended_at) if suspended_at else None,
        "terminated_at": None,
        "updated_at": naive(DUE - timedelta(days=90)),
    }


def test_lifecycle_suspends_at_expiry_and_a_missed_slot_is_compensated_next_run(stores):
    source, ledger, engine = stores
    insert(
        engine,
        "services",
        [
            _service(1, "active", DUE - timedelta(hours=1)),  # expired before the due
            _service(2, "active", DUE + timedelta(minutes=10)),  # expires in the missed slot
            _service(3, "active", DUE + timedelta(days=3)),  # not yet
        ],
    )
    task = "service_lifecycle_maintenance"
    with dg.instance_for_test() as instance:
        materialize(
            service_lifecycle_maintenance, source, ledger, instance, scheduled_tags(task, DUE)
        )
        assert statuses(engine, "services") == {1: "suspended", 2: "active", 3: "active"}
        # The slot at DUE+15m never ran (daemon down); the run at DUE+30m picks it up.
        later = DUE + timedelta(minutes=30)
        materialize(
            service_lifecycle_maintenance, source, ledger, instance, scheduled_tags(task, later)
        )
    assert statuses(engine, "services") == {1: "suspended", 2: "suspended", 3: "active"}
    suspended_at = pd.read_sql("SELECT id, suspended_at FROM services WHERE id = 2", engine)
    assert pd.Timestamp(suspended_at["suspended_at"][0]) == pd.Timestamp(naive(later))


def test_termination_counts_from_suspension_not_expiry_and_is_off_by_default(stores):
    source, ledger, engine = stores
    insert(
        engine,
        "services",
        [
            # expired 60 days ago, suspended 31 days ago -> terminated with 30 days retention
            _service(1, "suspended", DUE - timedelta(days=60), DUE - timedelta(days=31)),
            # expired 45 days ago but suspended only 29 days ago -> kept
            _service(2, "suspended", DUE - timedelta(days=45), DUE - timedelta(days=29)),
        ],
    )
    task = "service_lifecycle_maintenance"
    enable = {
        "ops": {task: {"config": {"termination_enabled": True, "termination_retention_days": 30}}}
    }
    with dg.instance_for_test() as instance:
        materialize(
            service_lifecycle_maintenance, source, ledger, instance, scheduled_tags(task, DUE)
        )
        assert statuses(engine, "services") == {1: "suspended", 2: "suspended"}
        materialize(
            service_lifecycle_maintenance,
            source,
            ledger,
            instance,
            scheduled_tags(task, DUE + timedelta(minutes=15)),
            run_config=enable,
        )
    assert statuses(engine, "services") == {1: "terminated", 2: "suspended"}


def test_a_manual_run_is_as_of_its_launch_not_a_due(stores):
    source, ledger, engine = stores
    insert(
        engine,
        "orders",
        [
            {
                "id": 1,
                "customer_id": 1,
                "product": "vps",
                "status": "pending",
                "created_at": datetime(2000, 1, 1),
            }
        ],
    )
    tags = {
        t.TAG_TASK: "order_cleanup",
        t.TAG_TRIGGER: Trigger.MANUAL.value,
        t.TAG_REQUEST_ID: "r-1",
        t.TAG_OPERATOR: "ops",
        t.TAG_REASON: "test",
    }
    with dg.instance_for_test() as instance:
        result = materialize(order_cleanup, source, ledger, instance, tags)
    assert result.success
    assert statuses(engine, "orders") == {1: "cancelled"}
    entry = ledger.find("order_cleanup", "manual:r-1")
    assert entry is not None and entry.trigger == "manual" and entry.operator == "ops"
    assert entry.status == "success"
