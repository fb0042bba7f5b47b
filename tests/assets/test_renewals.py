"""Service auto-renew: the pure plan on fixed dates, the exactly-once write-back on real
SQLite and PostgreSQL, and the task end to end (balances stay reconcilable)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa
from fence_support import lost_guard, refusals
from hook_support import build

from assets.domain_config import DomainRules
from assets.services.renewals import apply_auto_renew, plan_auto_renew
from assets.tunables import AutoRenewPolicy
from resources.core import tags as t
from resources.core.due import format_due
from resources.core.entry import Trigger
from resources.core.fence import FenceLost
from resources.idempotency import create_domain_schema
from resources.ledger import RunLedger
from resources.source_store import SourceStore, create_schema, make_engine

# The code location's assets, built with this environment's plugin hooks.
reconcile_account_balance = build("reconcile_account_balance")
service_auto_renew = build("service_auto_renew")

AS_OF = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
NAIVE = AS_OF.replace(tzinfo=None)
POLICY = AutoRenewPolicy()  # 3-day window, 30-day period
DAY = timedelta(days=1)


def service(id_, customer, expires_in, price=1000, auto=True, status="active"):
    return {
        "id": id_,
        "customer_id": customer,
        "product": "vps-small",
        "status": status,
        "price_cents": price,
        "auto_renew": auto,
        "expires_at": NAIVE + expires_in,
        "suspended_at": None,
        "terminated_at": None,
        "updated_at": datetime(2026, 1, 1),
    }


def customers_frame(balances: dict[int, int]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": list(balances),
            "name": [f"c{i}" for i in balances],
            "email": [f"c{i}@example.org" for i in balances],
            "phone": "+1",
            "balance_cents": list(balances.values()),
            "channels": "email",
        }
    )


# --- the plan ----------------------------------------------------------------------------


def test_services_inside_the_window_with_auto_renew_are_planned():
    services = pd.DataFrame(
        [
            service(1, 1, 3 * DAY),  # exactly at the window's edge: in
            service(2, 1, 3 * DAY + timedelta(seconds=1)),  # just outside
            service(3, 1, DAY, auto=False),  # auto-renew off
            service(4, 1, DAY, status="suspended"),
            service(5, 1, -DAY),  # already expired but still active: renewed too
        ]
    )
    plan = plan_auto_renew(services, customers_frame({1: 10_000}), AS_OF, POLICY)
    assert sorted(plan.to_renew["service_id"]) == [1, 5]
    assert plan.insufficient.empty
    renewed = plan.to_renew.set_index("service_id")
    assert renewed.loc[1, "new_expires_at"] == pd.Timestamp(NAIVE + 33 * DAY)


def test_the_balance_pays_services_in_order_of_expiry_until_it_runs_out():
    services = pd.DataFrame(
        [
            service(1, 1, 2 * DAY, price=600),
            service(2, 1, DAY, price=500),  # expires first: paid first
            service(3, 1, 2 * DAY + 1 * timedelta(hours=1), price=100),
            service(4, 2, DAY, price=700),  # customer 2 has no balance
        ]
    )
    plan = plan_auto_renew(services, customers_frame({1: 1100, 2: 0}), AS_OF, POLICY)
    assert plan.to_renew["service_id"].tolist() == [2, 1]
    assert plan.insufficient["service_id"].tolist() == [3, 4]
    short = plan.insufficient.set_index("service_id")
    assert (short.loc[3, "needed_cents"], short.loc[3, "balance_cents"]) == (1200, 1100)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"auto_renew_window_days": -1}, "auto_renew_window_days"),
        ({"auto_renew_period_days": 0}, "auto_renew_period_days"),
    ],
)
def test_bad_renewal_configuration_fails_at_load(fields, message):
    with pytest.raises(ValueError, match=message):
        DomainRules(**fields)


# --- the write-back, on both backends ------------------------------------------------------


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def engine(request, tmp_path) -> Iterator[sa.Engine]:
    url = (
        f"sqlite:///{tmp_path / 'source.sqlite'}"
        if request.param == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    engine = make_engine(url)
    create_schema(engine)
    create_domain_schema(engine)
    yield engine
    engine.dispose()


def seed(engine, services: list[dict], balances: dict[int, int]) -> None:
    customers_frame(balances).to_sql("customers", engine, if_exists="append", index=False)
    pd.DataFrame(services).to_sql("services", engine, if_exists="append", index=False)


def read(engine, sql: str) -> pd.DataFrame:
    return pd.read_sql(sql, engine)


def plan_and_apply(engine, as_of=AS_OF, entry_key="e1"):
    services = read(engine, "SELECT * FROM services")
    services["expires_at"] = pd.to_datetime(services["expires_at"])
    customers = read(engine, "SELECT id, balance_cents FROM customers")
    plan = plan_auto_renew(services, customers, as_of, POLICY)
    return apply_auto_renew(
        engine, plan, as_of, task_key="service_auto_renew", entry_key=entry_key, guard=None
    )


def test_a_renewal_is_an_invoice_paid_from_balance_and_a_longer_expiry(engine):
    seed(engine, [service(1, 1, DAY, price=1000)], {1: 2500})
    result = plan_and_apply(engine)
    assert result["outcome"].tolist() == ["renewed"]
    assert read(engine, "SELECT balance_cents FROM customers")["balance_cents"].tolist() == [1500]
    expires = pd.to_datetime(read(engine, "SELECT expires_at FROM services")["expires_at"])
    assert expires.tolist() == [pd.Timestamp(NAIVE + 31 * DAY)]
    invoice = read(engine, "SELECT service_id, amount_cents, paid_at, due_at FROM invoices")
    assert invoice[["service_id", "amount_cents"]].values.tolist() == [[1, 1000]]
    assert pd.Timestamp(invoice["paid_at"][0]) == pd.Timestamp(NAIVE)
    log = read(engine, "SELECT action, object_id, entry_key FROM automation_log")
    assert log.values.tolist() == [["auto_renew", 1, "e1"]]


def test_applying_the_same_plan_again_charges_nothing(engine):
    seed(engine, [service(1, 1, DAY, price=1000)], {1: 2500})
    services = read(engine, "SELECT * FROM services")
    plan = plan_auto_renew(
        services, read(engine, "SELECT id, balance_cents FROM customers"), AS_OF, POLICY
    )
    first = apply_auto_renew(
        engine, plan, AS_OF, task_key="service_auto_renew", entry_key="e1", guard=None
    )
    # A retry of the same entry, or an overlapping run that planned before the renewal.
    again = apply_auto_renew(
        engine, plan, AS_OF, task_key="service_auto_renew", entry_key="e2", guard=None
    )
    assert first["outcome"].tolist() == ["renewed"]
    assert again["outcome"].tolist() == ["skipped_already_done"]
    assert read(engine, "SELECT balance_cents FROM customers")["balance_cents"].tolist() == [1500]
    assert len(read(engine, "SELECT id FROM invoices")) == 1


def test_without_balance_a_clear_insufficient_record_and_a_renewal_once_topped_up(engine):
    seed(engine, [service(1, 1, DAY, price=1000)], {1: 400})
    first = plan_and_apply(engine)
    assert first["outcome"].tolist() == ["insufficient_balance"]
    assert "needs 1000 cents" in first["error"][0] and "balance is 400 cents" in first["error"][0]
    effect = read(engine, "SELECT status, attempts, error FROM side_effects")
    assert effect[["status", "attempts"]].values.tolist() == [["failed", 1]]
    assert "insufficient balance" in effect["error"][0]
    assert read(engine, "SELECT COUNT(*) AS n FROM invoices")["n"][0] == 0
    # An hour later, still short: no second log row, one more attempt.
    plan_and_apply(engine, AS_OF + timedelta(hours=1))
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE customers SET balance_cents = 1200"))
    later = plan_and_apply(engine, AS_OF + timedelta(hours=2))
    assert later["outcome"].tolist() == ["renewed"]
    effect = read(engine, "SELECT status, attempts FROM side_effects")
    assert effect.values.tolist() == [["succeeded", 3]]
    assert read(engine, "SELECT balance_cents FROM customers")["balance_cents"].tolist() == [200]
    actions = read(engine, "SELECT action FROM automation_log ORDER BY id")["action"].tolist()
    assert actions == ["auto_renew_insufficient_balance", "auto_renew"]


def test_a_service_changed_after_planning_is_not_charged(engine):
    seed(engine, [service(1, 1, DAY, price=1000)], {1: 5000})
    services = read(engine, "SELECT * FROM services")
    plan = plan_auto_renew(
        services, read(engine, "SELECT id, balance_cents FROM customers"), AS_OF, POLICY
    )
    with engine.begin() as conn:  # renewed by hand in the meantime
        conn.execute(sa.text("UPDATE services SET auto_renew = false"))
    result = apply_auto_renew(
        engine, plan, AS_OF, task_key="service_auto_renew", entry_key="e1", guard=None
    )
    assert result["outcome"].tolist() == ["changed_meanwhile"]
    assert read(engine, "SELECT balance_cents FROM customers")["balance_cents"].tolist() == [5000]


# --- end to end: the asset under the ledger, and reconciliation agrees ---------------------


def test_auto_renew_task_keeps_balances_reconcilable(tmp_path):
    source = SourceStore(url=f"sqlite:///{tmp_path / 'source.sqlite'}")
    ledger = RunLedger(database_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    engine = source.engine()
    create_schema(engine)
    # Customer 1 paid 3000 in, was invoiced nothing yet: balance 3000 is consistent.
    seed(engine, [service(1, 1, DAY, price=1000), service(2, 2, DAY, price=1000)], {1: 3000, 2: 0})
    pd.DataFrame(
        [{"id": 1, "customer_id": 1, "amount_cents": 3000, "paid_at": NAIVE - DAY}]
    ).to_sql("payments", engine, if_exists="append", index=False)
    resources = {"source": source, "ledger": ledger, "rules": DomainRules()}

    def tags(task: str) -> dict[str, str]:
        return {
            t.TAG_TASK: task,
            t.TAG_TRIGGER: Trigger.SCHEDULE.value,
            t.TAG_DUE: format_due(AS_OF),
        }

    with dg.instance_for_test() as instance:
        renew = dg.materialize(
            [service_auto_renew],
            resources=resources,
            instance=instance,
            tags=tags("service_auto_renew"),
        )
        check = dg.materialize(
            [reconcile_account_balance],
            resources=resources,
            instance=instance,
            tags=tags("reconcile_account_balance"),
        )
    (mat,) = renew.asset_materializations_for_node("service_auto_renew")
    assert (mat.metadata["renewed"].value, mat.metadata["insufficient_balance"].value) == (1, 1)
    assert mat.metadata["charged_cents"].value == 1000
    (rec,) = check.asset_materializations_for_node("reconcile_account_balance")
    assert rec.metadata["mismatched"].value == 0
    engine.dispose()


def test_a_run_that_lost_its_lease_charges_and_claims_nothing(engine, tmp_path):
    # A worker paused past its lease used to commit after the reclaim.
    seed(engine, [service(1, 1, DAY, price=1000)], {1: 2500})
    services = read(engine, "SELECT * FROM services")
    services["expires_at"] = pd.to_datetime(services["expires_at"])
    customers = read(engine, "SELECT id, balance_cents FROM customers")
    plan = plan_auto_renew(services, customers, AS_OF, POLICY)
    guard, ledger = lost_guard(tmp_path, "service_auto_renew")
    with pytest.raises(FenceLost):
        apply_auto_renew(engine, plan, AS_OF, task_key="t", entry_key="e", guard=guard)
    assert read(engine, "SELECT balance_cents FROM customers")["balance_cents"].tolist() == [2500]
    assert read(engine, "SELECT * FROM invoices").empty
    # Not even the idempotency claim: a later run that holds its entry renews the service.
    assert read(engine, "SELECT * FROM side_effects").empty
    assert ["auto-renew services" in reason for reason in refusals(ledger, guard)] == [True]
    assert plan_and_apply(engine)["outcome"].tolist() == ["renewed"]
