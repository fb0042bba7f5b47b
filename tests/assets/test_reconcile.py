"""Balance reconciliation: pure comparison, and the task end to end on SQLite and
PostgreSQL -- a planted mismatch is reported and nothing is changed."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg
import pandas as pd
import pytest
from hook_support import build

from assets.billing.reconcile import (
    KIND_BALANCE,
    KIND_INVOICE,
    KIND_PAYMENT,
    movements_query,
    reconcile_balances,
)
from resources.core import tags as t
from resources.core.due import format_due
from resources.core.entry import Trigger
from resources.ledger import RunLedger
from resources.source_schema import read_frame_from
from resources.source_store import SourceStore, create_schema

# The code location's assets, built with this environment's plugin hooks.
reconcile_account_balance = build("reconcile_account_balance")

AS_OF = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def movements(rows: list[tuple[int, int, int]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["kind", "customer_id", "amount_cents"])


def test_balances_equal_to_payments_minus_invoices_are_not_reported():
    frame = movements(
        [
            (KIND_BALANCE, 1, -500),  # owes an unpaid 500 invoice
            (KIND_INVOICE, 1, 500),
            (KIND_BALANCE, 2, 300),  # paid 1300, invoiced 1000: 300 credit
            (KIND_PAYMENT, 2, 1300),
            (KIND_INVOICE, 2, 1000),
            (KIND_BALANCE, 3, 0),  # no movements at all
        ]
    )
    mismatches, summary = reconcile_balances(frame)
    assert mismatches.empty
    assert summary == {
        "customers": 3,
        "mismatched": 0,
        "absolute_difference_cents": 0,
        "orphan_rows": 0,
    }


def test_a_planted_mismatch_is_found_with_its_difference_and_orphans_are_counted():
    frame = movements(
        [
            (KIND_BALANCE, 1, 0),
            (KIND_PAYMENT, 1, 1000),
            (KIND_INVOICE, 1, 1000),
            (KIND_BALANCE, 2, 900),  # planted: should be 700
            (KIND_PAYMENT, 2, 700),
            (KIND_BALANCE, 3, -50),  # planted: no invoice explains it
            (KIND_PAYMENT, 99, 10),  # a payment of a customer that does not exist
        ]
    )
    mismatches, summary = reconcile_balances(frame)
    assert mismatches.to_dict("records") == [
        {
            "customer_id": 2,
            "recorded_cents": 900,
            "payments_cents": 700,
            "invoices_cents": 0,
            "expected_cents": 700,
            "difference_cents": 200,
        },
        {
            "customer_id": 3,
            "recorded_cents": -50,
            "payments_cents": 0,
            "invoices_cents": 0,
            "expected_cents": 0,
            "difference_cents": -50,
        },
    ]
    assert summary["mismatched"] == 2
    assert summary["absolute_difference_cents"] == 250
    assert summary["orphan_rows"] == 1


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def source(request, tmp_path):
    url = (
        f"sqlite:///{tmp_path / 'source.sqlite'}"
        if request.param == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    store = SourceStore(url=url)
    create_schema(store.engine())
    yield store
    store.engine().dispose()


def test_the_task_reports_a_planted_mismatch_and_changes_nothing(source, tmp_path):
    engine = source.engine()
    pd.DataFrame(
        {
            "id": [1, 2],
            "name": ["Ada", "Bob"],
            "email": ["a@x.test", "b@x.test"],
            "phone": ["+1", "+2"],
            "balance_cents": [-1299, 5000],  # Bob's 5000 is planted (should be 0)
            "channels": ["email", "sms"],
        }
    ).to_sql("customers", engine, if_exists="append", index=False)
    pd.DataFrame(
        {
            "id": [1, 2],
            "customer_id": [1, 2],
            "service_id": [None, None],
            "amount_cents": [1299, 2000],
            "created_at": [datetime(2026, 11, 1)] * 2,
            "due_at": [datetime(2026, 11, 15)] * 2,
            "paid_at": [None, datetime(2026, 11, 10)],
        }
    ).to_sql("invoices", engine, if_exists="append", index=False)
    pd.DataFrame(
        {"id": [1], "customer_id": [2], "amount_cents": [2000], "paid_at": [datetime(2026, 11, 10)]}
    ).to_sql("payments", engine, if_exists="append", index=False)
    before = read_frame_from(engine, "customers")
    ledger = RunLedger(database_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    tags = {
        t.TAG_TASK: "reconcile_account_balance",
        t.TAG_TRIGGER: Trigger.SCHEDULE.value,
        t.TAG_DUE: format_due(AS_OF),
    }
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [reconcile_account_balance],
            resources={"source": source, "ledger": ledger},
            instance=instance,
            tags=tags,
        )
    (mat,) = result.asset_materializations_for_node("reconcile_account_balance")
    assert mat.metadata["mismatched"].value == 1
    assert mat.metadata["absolute_difference_cents"].value == 5000
    (row,) = mat.metadata["mismatches"].value.records
    assert row.data["customer_id"] == 2
    assert row.data["recorded_cents"] == 5000
    assert row.data["expected_cents"] == 0
    pd.testing.assert_frame_equal(read_frame_from(engine, "customers"), before)  # never fixed


def test_the_movements_query_is_one_statement_over_the_three_tables():
    # One statement = one snapshot on both backends, even while auto-renew writes.
    sql = str(movements_query())
    assert sql.count("UNION ALL") == 2
    assert all(name in sql for name in ("customers", "payments", "invoices"))


@pytest.mark.parametrize("offset", [0, 10**9], ids=["dense_ids", "sparse_ids"])
def test_dense_and_sparse_customer_ids_reconcile_alike(offset):
    frame = movements(
        [
            (KIND_BALANCE, offset + 5, 100),
            (KIND_PAYMENT, offset + 5, 100),
            (KIND_BALANCE, offset + 7, 0),
            (KIND_INVOICE, offset + 7, 30),
            (KIND_PAYMENT, offset + 8, 1),  # unknown customer
        ]
    )
    mismatches, summary = reconcile_balances(frame)
    assert mismatches["customer_id"].tolist() == [offset + 7]
    assert mismatches["difference_cents"].tolist() == [30]
    assert summary["orphan_rows"] == 1
    with pytest.raises(ValueError, match="more than once"):
        reconcile_balances(movements([(KIND_BALANCE, offset + 5, 0)] * 2))
