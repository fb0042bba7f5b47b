"""Sample data: deterministic, refuses to overwrite, and gives the tasks work around as_of."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
import sqlalchemy as sa

from assets.orders.cleanup import (
    OrderCleanupPolicy,
    candidate_orders_query,
    select_orders_to_cancel,
)
from assets.services.lifecycle import LifecyclePolicy, candidate_services_query, plan_lifecycle
from resources.sample_data import build_sample_frames, generate_sample_data
from resources.source_schema import CHANNELS, SOURCE_TABLES, automation_log, orders, read_frame_from
from resources.source_store import SourceStore, make_engine

AS_OF = datetime(2026, 3, 1, 12, 0)
DAY = timedelta(days=1)
TABLE_NAMES = [table.name for table in SOURCE_TABLES]


def new_engine(tmp_path: Path, name: str = "source.sqlite") -> sa.Engine:
    return make_engine(f"sqlite:///{tmp_path / name}")


def read_all(engine: sa.Engine) -> dict[str, pd.DataFrame]:
    return {name: read_frame_from(engine, name) for name in TABLE_NAMES}


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pd.DataFrame]:
    """The default sample (200 services, seed 7) as stored and read back."""
    engine = new_engine(tmp_path_factory.mktemp("sample"))
    generate_sample_data(engine, as_of=AS_OF)
    return read_all(engine)


# --- determinism ------------------------------------------------------------------------------


def test_the_same_seed_and_as_of_give_identical_tables(tmp_path):
    first, second = new_engine(tmp_path, "a.sqlite"), new_engine(tmp_path, "b.sqlite")
    generate_sample_data(first, services=300, seed=11, as_of=AS_OF)
    generate_sample_data(second, services=300, seed=11, as_of=AS_OF)
    a, b = read_all(first), read_all(second)
    for name in TABLE_NAMES:
        pd.testing.assert_frame_equal(a[name], b[name], obj=name)


def test_a_different_seed_gives_different_data():
    a = build_sample_frames(services=300, seed=11, as_of=AS_OF)
    b = build_sample_frames(services=300, seed=12, as_of=AS_OF)
    assert not a["services"].equals(b["services"])
    assert not a["orders"].equals(b["orders"])


def test_the_stored_rows_are_exactly_the_built_frames(tmp_path):
    engine = new_engine(tmp_path)
    generate_sample_data(engine, services=50, seed=3, as_of=AS_OF)
    built = build_sample_frames(services=50, seed=3, as_of=AS_OF)
    stored = read_all(engine)
    pd.testing.assert_series_equal(
        stored["services"]["expires_at"],
        built["services"]["expires_at"].astype("datetime64[ns]"),
    )
    assert stored["orders"]["status"].tolist() == built["orders"]["status"].tolist()


def test_the_returned_counts_are_the_rows_written(tmp_path):
    engine = new_engine(tmp_path)
    counts = generate_sample_data(engine, services=120, as_of=AS_OF)
    assert counts == {name: len(frame) for name, frame in read_all(engine).items()}
    assert counts["services"] == 120


# --- refusing and replacing ------------------------------------------------------------------


def test_generating_into_a_store_with_data_is_refused_and_changes_nothing(tmp_path):
    engine = new_engine(tmp_path)
    generate_sample_data(engine, services=40, seed=1, as_of=AS_OF)
    before = read_all(engine)

    with pytest.raises(ValueError, match=r"already has data.*replace=True"):
        generate_sample_data(engine, services=40, seed=2, as_of=AS_OF)

    after = read_all(engine)
    for name in TABLE_NAMES:
        pd.testing.assert_frame_equal(before[name], after[name], obj=name)


def test_replace_regenerates_the_source_tables_and_keeps_the_automation_log(tmp_path):
    engine = new_engine(tmp_path)
    generate_sample_data(engine, services=40, seed=1, as_of=AS_OF)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(automation_log),
            {
                "at": AS_OF,
                "task_key": "order_cleanup",
                "entry_key": "e-1",
                "action": "cancel",
                "object_type": "order",
                "object_id": 1,
                "detail": "{}",
            },
        )

    counts = generate_sample_data(engine, services=60, seed=2, as_of=AS_OF, replace=True)

    fresh = new_engine(tmp_path, "fresh.sqlite")
    generate_sample_data(fresh, services=60, seed=2, as_of=AS_OF)
    replaced, expected = read_all(engine), read_all(fresh)
    for name in TABLE_NAMES:
        pd.testing.assert_frame_equal(replaced[name], expected[name], obj=name)
    assert counts["services"] == 60
    assert len(read_frame_from(engine, automation_log)) == 1


def test_fewer_than_one_service_is_rejected():
    with pytest.raises(ValueError, match="services"):
        build_sample_frames(services=0, seed=7, as_of=AS_OF)


def test_has_data_becomes_true_after_generating(tmp_path):
    store = SourceStore(url=f"sqlite:///{tmp_path / 'source.sqlite'}")
    assert store.has_data() is False
    generate_sample_data(store.engine(), services=10, as_of=AS_OF)
    assert store.has_data() is True


# --- shape of the data around as_of ----------------------------------------------------------


def test_pending_orders_include_stale_ones_past_24_hours_and_fresh_ones(sample):
    pending = sample["orders"].query("status == 'pending'")
    age = AS_OF - pending["created_at"]
    assert (age > timedelta(hours=24)).any()
    assert (age < timedelta(hours=24)).any()
    assert set(sample["orders"]["status"]) == {"pending", "paid", "cancelled"}


def test_some_active_services_expire_within_ten_days_either_side_of_as_of(sample):
    active = sample["services"].query("status == 'active'")
    delta = active["expires_at"] - AS_OF
    assert ((delta <= timedelta(0)) & (delta >= -10 * DAY)).any()
    assert ((delta > timedelta(0)) & (delta <= 10 * DAY)).any()
    assert (delta > 10 * DAY).any()


def test_suspended_services_were_suspended_0_to_60_days_ago_on_both_sides_of_retention(sample):
    suspended = sample["services"].query("status == 'suspended'")
    age = AS_OF - suspended["suspended_at"]
    assert age.between(timedelta(0), 60 * DAY).all()
    assert (age < 30 * DAY).any()
    assert (age > 30 * DAY).any()
    assert (suspended["expires_at"] <= suspended["suspended_at"]).all()


def test_customers_have_owing_zero_and_credit_balances_and_valid_channel_sets(sample):
    balances = sample["customers"]["balance_cents"]
    assert (balances < 0).any()
    assert (balances == 0).any()
    assert (balances > 0).any()
    channel_sets = sample["customers"]["channels"].map(
        lambda c: frozenset(filter(None, c.split(",")))
    )
    assert all(s <= set(CHANNELS) for s in channel_sets)
    assert channel_sets.nunique() >= 4


def test_some_invoices_are_unpaid_and_overdue_by_up_to_ten_days(sample):
    invoices = sample["invoices"]
    unpaid = invoices[invoices["paid_at"].isna()]
    overdue = unpaid[unpaid["due_at"] <= AS_OF]
    assert not overdue.empty
    assert (AS_OF - overdue["due_at"]).between(timedelta(0), 10 * DAY).all()
    assert (unpaid["due_at"] > AS_OF).any()


def test_every_paid_invoice_has_a_matching_payment(sample):
    paid = sample["invoices"].dropna(subset=["paid_at"])
    payments = sample["payments"]
    assert len(payments) == len(paid)
    assert payments["amount_cents"].sum() == paid["amount_cents"].sum()


def test_some_tickets_wait_for_the_customer_for_up_to_fourteen_days(sample):
    waiting = sample["tickets"].query("status == 'waiting_customer'")
    assert not waiting.empty
    assert (AS_OF - waiting["updated_at"]).between(timedelta(0), 14 * DAY).all()
    closed = sample["tickets"].query("status == 'closed'")
    assert closed["closed_at"].notna().all()


def test_nothing_in_the_sample_happened_after_as_of(sample):
    happened = {
        "services": ["suspended_at", "terminated_at", "updated_at"],
        "invoices": ["created_at", "paid_at"],
        "payments": ["paid_at"],
        "orders": ["created_at", "cancelled_at"],
        "tickets": ["updated_at", "closed_at"],
    }
    for table, columns in happened.items():
        for column in columns:
            assert (sample[table][column].dropna() <= AS_OF).all(), f"{table}.{column}"


def test_the_business_tasks_find_work_in_the_default_sample(sample):
    assert not select_orders_to_cancel(sample["orders"], AS_OF, OrderCleanupPolicy()).empty
    plan = plan_lifecycle(sample["services"], AS_OF, LifecyclePolicy(termination_enabled=True))
    assert not plan.to_suspend.empty
    assert not plan.to_terminate.empty


# --- scale and PostgreSQL ----------------------------------------------------------------------


def test_twenty_thousand_services_are_generated_in_bulk(tmp_path):
    # Speed is measured in bench/, never asserted here; this pins the bulk path's counts.
    engine = new_engine(tmp_path)
    counts = generate_sample_data(engine, services=20_000, as_of=AS_OF)
    assert counts["services"] == 20_000
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM services")).scalar_one() == 20_000


def test_on_postgresql_new_rows_get_ids_after_the_generated_ones(postgres_url):
    engine = make_engine(postgres_url)
    try:
        counts = generate_sample_data(engine, services=30, as_of=AS_OF)
        with engine.begin() as conn:
            new_id = conn.execute(
                sa.insert(orders)
                .values(customer_id=1, product="domain", status="pending", created_at=AS_OF)
                .returning(orders.c.id)
            ).scalar_one()
        assert new_id == counts["orders"] + 1
        pd.testing.assert_frame_equal(
            read_frame_from(engine, "services"),
            build_sample_frames(services=30, seed=7, as_of=AS_OF)["services"].astype(
                {
                    c: "datetime64[ns]"
                    for c in ("expires_at", "suspended_at", "terminated_at", "updated_at")
                }
            ),
            check_dtype=False,
        )
    finally:
        engine.dispose()


def test_the_candidate_queries_agree_with_the_rules_on_the_sample(tmp_path):
    engine = new_engine(tmp_path)
    generate_sample_data(engine, services=2_000, as_of=AS_OF)
    order_policy = OrderCleanupPolicy()
    lifecycle_policy = LifecyclePolicy(termination_enabled=True)

    all_orders = read_frame_from(engine, orders)
    candidate_orders = read_frame_from(engine, candidate_orders_query(AS_OF, order_policy))
    assert (
        select_orders_to_cancel(candidate_orders, AS_OF, order_policy)["id"].tolist()
        == select_orders_to_cancel(all_orders, AS_OF, order_policy)["id"].tolist()
    )

    full = plan_lifecycle(read_frame_from(engine, "services"), AS_OF, lifecycle_policy)
    narrowed = plan_lifecycle(
        read_frame_from(engine, candidate_services_query(AS_OF, lifecycle_policy)),
        AS_OF,
        lifecycle_policy,
    )
    assert narrowed.to_suspend["id"].tolist() == full.to_suspend["id"].tolist()
    assert narrowed.to_terminate["id"].tolist() == full.to_terminate["id"].tolist()
    assert len(full.to_suspend) > 0 and len(full.to_terminate) > 0
