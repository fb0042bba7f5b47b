"""Order cleanup: the pure selection rule as named instants, and the compare-and-set write-back."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pandas as pd
import pytest
import sqlalchemy as sa
from fence_support import lost_guard, refusals

from assets.orders.cleanup import (
    OrderCleanupPolicy,
    cancel_orders,
    candidate_orders_query,
    select_orders_to_cancel,
)
from resources.core.fence import FenceLost
from resources.source_schema import automation_log, orders, read_frame_from

AS_OF = datetime(2026, 3, 1, 12, 0)
DAY_OLD = AS_OF - timedelta(hours=24)
SECOND = timedelta(seconds=1)
POLICY = OrderCleanupPolicy()


def orders_frame(*rows: tuple[int, str, datetime]) -> pd.DataFrame:
    """A hand-built orders frame with the columns the store returns."""
    frame = pd.DataFrame(rows, columns=["id", "status", "created_at"])
    frame["created_at"] = pd.to_datetime(frame["created_at"])
    frame["customer_id"] = 1
    frame["product"] = "vps-small"
    return frame


def selected_ids(frame: pd.DataFrame, as_of: datetime = AS_OF, policy=POLICY) -> list[int]:
    return select_orders_to_cancel(frame, as_of, policy)["id"].tolist()


# --- policy -----------------------------------------------------------------------------


def test_the_default_policy_cancels_orders_pending_for_24_hours():
    assert OrderCleanupPolicy().pending_max_age == timedelta(hours=24)


@pytest.mark.parametrize("bad", [timedelta(0), timedelta(hours=-1), 24])
def test_a_policy_with_a_non_positive_or_non_timedelta_max_age_is_rejected_naming_the_field(bad):
    with pytest.raises(ValueError, match="pending_max_age"):
        OrderCleanupPolicy(pending_max_age=bad)


# --- selection: named instants ----------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "created_at", "cancelled"),
    [
        ("one_second_younger_than_max_age", DAY_OLD + SECOND, False),
        ("exactly_max_age_old", DAY_OLD, True),
        ("one_second_older_than_max_age", DAY_OLD - SECOND, True),
        ("a_week_old", AS_OF - timedelta(days=7), True),
        ("created_at_as_of", AS_OF, False),
        ("created_after_as_of", AS_OF + timedelta(hours=1), False),
    ],
)
def test_a_pending_order_is_cancelled_once_it_is_at_least_max_age_old(name, created_at, cancelled):
    frame = orders_frame((1, "pending", created_at))
    assert selected_ids(frame) == ([1] if cancelled else []), name


@pytest.mark.parametrize("status", ["paid", "cancelled"])
def test_an_old_order_that_is_not_pending_is_left_alone(status):
    frame = orders_frame((1, status, AS_OF - timedelta(days=30)))
    assert selected_ids(frame) == []


def test_a_custom_max_age_moves_the_boundary():
    frame = orders_frame(
        (1, "pending", AS_OF - timedelta(hours=2)),
        (2, "pending", AS_OF - timedelta(hours=2) + SECOND),
    )
    assert selected_ids(frame, policy=OrderCleanupPolicy(timedelta(hours=2))) == [1]


def test_a_backfilled_run_does_not_see_orders_created_after_its_as_of():
    # As-of semantics: judged from a 2020 due time, an order created after it does not
    # exist yet, however old it is by the wall clock today.
    as_of = datetime(2020, 1, 1)
    frame = orders_frame(
        (1, "pending", as_of - timedelta(days=2)),
        (2, "pending", as_of + timedelta(days=2)),
    )
    assert selected_ids(frame, as_of=as_of) == [1]


def test_an_aware_as_of_is_compared_in_utc():
    # 14:00 at UTC+2 is 12:00 UTC, so the 24 h boundary is DAY_OLD exactly.
    as_of = datetime(2026, 3, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    frame = orders_frame((1, "pending", DAY_OLD), (2, "pending", DAY_OLD + SECOND))
    assert selected_ids(frame, as_of=as_of) == [1]


def test_selection_keeps_every_column_and_the_input_order():
    frame = orders_frame(
        (9, "pending", AS_OF - timedelta(days=3)),
        (4, "paid", AS_OF - timedelta(days=3)),
        (2, "pending", AS_OF - timedelta(days=5)),
    )
    selected = select_orders_to_cancel(frame, AS_OF, POLICY)
    assert selected["id"].tolist() == [9, 2]
    assert list(selected.columns) == list(frame.columns)


def test_an_empty_orders_frame_selects_nothing():
    assert select_orders_to_cancel(orders_frame(), AS_OF, POLICY).empty


def test_a_frame_without_created_at_is_rejected_with_the_missing_column_named():
    with pytest.raises(ValueError, match="created_at"):
        select_orders_to_cancel(pd.DataFrame({"id": [1], "status": ["pending"]}), AS_OF, POLICY)


# --- write-back ---------------------------------------------------------------------------


def insert_orders(engine: sa.Engine, *rows: tuple[int, str, datetime]) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.insert(orders),
            [
                {"id": i, "customer_id": 1, "product": "vps-small", "status": s, "created_at": c}
                for i, s, c in rows
            ],
        )


def stored(engine: sa.Engine) -> dict[int, tuple[Any, Any]]:
    """id -> (status, cancelled_at or None), as stored."""
    rows: list[dict[Any, Any]] = read_frame_from(engine, orders).to_dict("records")
    return {
        row["id"]: (row["status"], None if pd.isna(row["cancelled_at"]) else row["cancelled_at"])
        for row in rows
    }


def log_rows(engine: sa.Engine) -> pd.DataFrame:
    return read_frame_from(engine, automation_log)


def test_cancelling_sets_status_and_cancelled_at_and_logs_each_change(engine):
    old = AS_OF - timedelta(days=2)
    insert_orders(engine, (1, "pending", old), (2, "pending", old), (3, "pending", AS_OF))

    changed = cancel_orders(
        engine, [1, 2], AS_OF, task_key="order_cleanup", entry_key="e-17", guard=None
    )

    assert changed == 2
    assert stored(engine) == {
        1: ("cancelled", pd.Timestamp(AS_OF)),
        2: ("cancelled", pd.Timestamp(AS_OF)),
        3: ("pending", None),
    }
    log = log_rows(engine)
    assert log[["task_key", "entry_key", "action", "object_type", "object_id"]].to_dict(
        "records"
    ) == [
        {
            "task_key": "order_cleanup",
            "entry_key": "e-17",
            "action": "cancel",
            "object_type": "order",
            "object_id": order_id,
        }
        for order_id in (1, 2)
    ]
    assert (log["at"] == pd.Timestamp(AS_OF)).all()
    assert log["detail"].str.contains("pending").all()


def test_an_order_paid_between_selection_and_cancel_is_not_cancelled(engine):
    old = AS_OF - timedelta(days=2)
    insert_orders(engine, (1, "pending", old), (2, "pending", old))
    plan = select_orders_to_cancel(read_frame_from(engine, orders), AS_OF, POLICY)
    assert plan["id"].tolist() == [1, 2]
    with engine.begin() as conn:  # the customer pays order 1 while the task is running
        conn.execute(sa.update(orders).where(orders.c.id == 1).values(status="paid"))

    changed = cancel_orders(
        engine, plan["id"], AS_OF, task_key="order_cleanup", entry_key="e-1", guard=None
    )

    assert changed == 1
    assert stored(engine) == {1: ("paid", None), 2: ("cancelled", pd.Timestamp(AS_OF))}
    assert log_rows(engine)["object_id"].tolist() == [2]


def test_cancelling_the_same_orders_again_changes_and_logs_nothing(engine):
    insert_orders(engine, (1, "pending", AS_OF - timedelta(days=2)))
    assert cancel_orders(engine, [1], AS_OF, task_key="t", entry_key="e-1", guard=None) == 1

    later = AS_OF + timedelta(hours=1)
    assert cancel_orders(engine, [1], later, task_key="t", entry_key="e-2", guard=None) == 0

    assert stored(engine) == {1: ("cancelled", pd.Timestamp(AS_OF))}
    assert log_rows(engine)["entry_key"].tolist() == ["e-1"]


def test_repeated_and_numpy_ids_are_cancelled_and_logged_once(engine):
    insert_orders(engine, (1, "pending", AS_OF - timedelta(days=2)))
    ids = pd.Series([1, 1], dtype="int64")  # as they come out of a DataFrame
    assert cancel_orders(engine, ids, AS_OF, task_key="t", entry_key="e", guard=None) == 1
    assert len(log_rows(engine)) == 1


def test_cancelling_no_orders_is_a_no_op(engine):
    assert cancel_orders(engine, [], AS_OF, task_key="t", entry_key="e", guard=None) == 0
    assert log_rows(engine).empty


def test_a_large_cancel_is_split_into_in_lists_of_at_most_500_ids(engine):
    n = 1201
    insert_orders(engine, *((i, "pending", AS_OF - timedelta(days=2)) for i in range(1, n + 1)))
    update_batches: list[int] = []

    def count_in_list(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("UPDATE ORDERS"):
            # parameters: the ids plus the two SET values and the status condition
            update_batches.append(len(parameters) - 3)

    sa.event.listen(engine, "before_cursor_execute", count_in_list)
    try:
        changed = cancel_orders(
            engine, range(1, n + 1), AS_OF, task_key="t", entry_key="e", guard=None
        )
    finally:
        sa.event.remove(engine, "before_cursor_execute", count_in_list)

    assert changed == n
    assert update_batches == [500, 500, 201]
    assert len(log_rows(engine)) == n
    assert {status for status, _ in stored(engine).values()} == {"cancelled"}


def test_the_candidate_query_finds_exactly_the_orders_the_rule_selects_at_the_boundary(engine):
    insert_orders(
        engine,
        (1, "pending", DAY_OLD + SECOND),
        (2, "pending", DAY_OLD),
        (3, "pending", DAY_OLD - SECOND),
        (4, "paid", DAY_OLD - SECOND),
        (5, "pending", AS_OF + SECOND),
    )
    everything = select_orders_to_cancel(read_frame_from(engine, orders), AS_OF, POLICY)
    candidates = read_frame_from(engine, candidate_orders_query(AS_OF, POLICY))
    narrowed = select_orders_to_cancel(candidates, AS_OF, POLICY)
    assert candidates["id"].tolist() == everything["id"].tolist() == [2, 3]
    assert narrowed["id"].tolist() == [2, 3]


def test_a_run_that_lost_its_lease_cancels_nothing_and_the_refusal_is_traced(engine, tmp_path):
    # A worker paused past its lease used to commit after the reclaim.
    old = AS_OF - timedelta(days=2)
    insert_orders(engine, (1, "pending", old))
    guard, ledger = lost_guard(tmp_path)
    with pytest.raises(FenceLost):
        cancel_orders(engine, [1], AS_OF, task_key="order_cleanup", entry_key="e", guard=guard)
    assert stored(engine) == {1: ("pending", None)}
    assert log_rows(engine).empty
    assert ["cancel orders" in reason for reason in refusals(ledger, guard)] == [True]
