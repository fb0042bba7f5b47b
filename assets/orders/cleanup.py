"""Order cleanup: cancel orders that stayed `pending` (unpaid) for too long.

Pure rule (`select_orders_to_cancel`) plus its write-back (`cancel_orders`). The Dagster
asset that runs them is a thin wrapper elsewhere; nothing here imports Dagster.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

import pandas as pd
import sqlalchemy as sa

from resources.core.fence import EffectGuard
from resources.effects import effect_transaction
from resources.source_schema import (
    ORDER_CANCELLED,
    ORDER_PENDING,
    naive_utc,
    naive_utc_series,
    orders,
)
from resources.source_store import update_and_log

ACTION_CANCEL: Final = "cancel"
OBJECT_ORDER: Final = "order"

_REQUIRED_COLUMNS: Final = ("id", "status", "created_at")


@dataclass(frozen=True)
class OrderCleanupPolicy:
    """How long an order may stay pending before the cleanup cancels it."""

    pending_max_age: timedelta = timedelta(hours=24)

    def __post_init__(self) -> None:
        if not isinstance(self.pending_max_age, timedelta) or self.pending_max_age <= timedelta(0):
            raise ValueError(
                f"OrderCleanupPolicy.pending_max_age must be a positive timedelta "
                f"(e.g. timedelta(hours=24)), got {self.pending_max_age!r}"
            )


def _require_columns(frame: pd.DataFrame, required: Iterable[str], what: str) -> None:
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise ValueError(f"{what} frame is missing column(s) {missing}; it needs {list(required)}")


def select_orders_to_cancel(
    orders_frame: pd.DataFrame, as_of: datetime, policy: OrderCleanupPolicy
) -> pd.DataFrame:
    """Return the pending orders that are old enough to cancel at `as_of`.

    Boundary rule: an order is cancelled when `created_at <= as_of - pending_max_age`,
    so an order exactly `pending_max_age` old is cancelled, one a second younger is not.
    As-of semantics: orders created after `as_of` are ignored, so a late or backfilled
    run decides only from what existed at its due time. `as_of` is naive UTC (an aware
    value is converted). Returns the matching rows (all columns), in input order.
    """
    _require_columns(orders_frame, _REQUIRED_COLUMNS, "orders")
    at = pd.Timestamp(naive_utc(as_of))
    created_at = naive_utc_series(orders_frame["created_at"])
    # The `<= at` term is implied by the cutoff (max age is positive) and kept to state
    # the as-of rule in code rather than rely on the arithmetic.
    mask = (
        (orders_frame["status"] == ORDER_PENDING)
        & (created_at <= at)
        & (created_at <= at - policy.pending_max_age)
    )
    return orders_frame.loc[mask].copy()


def candidate_orders_query(as_of: datetime, policy: OrderCleanupPolicy) -> sa.Select[Any]:
    """SQL that narrows `orders` to the rows `select_orders_to_cancel` can pick.

    Served by the (status, created_at) index, so a run reads the few candidates instead
    of the whole table. The pure rule stays the authority: pass the result through
    `select_orders_to_cancel`, which gives the same answer on the full table.
    """
    cutoff = naive_utc(as_of) - policy.pending_max_age
    return (
        sa.select(orders)
        .where(orders.c.status == ORDER_PENDING, orders.c.created_at <= cutoff)
        .order_by(orders.c.id)
    )


def cancel_orders(
    engine: sa.Engine,
    order_ids: Iterable[int],
    as_of: datetime,
    *,
    task_key: str,
    entry_key: str,
    guard: EffectGuard | None,
) -> int:
    """Cancel the given orders that are still pending; return how many were cancelled.

    One transaction: `UPDATE orders SET status='cancelled', cancelled_at=:as_of WHERE id
    IN (...) AND status='pending'` (chunks of at most 500 ids) and one `automation_log`
    row per order actually changed. The status condition is a compare-and-set: an order
    paid or cancelled since it was selected is left as it is, and re-running the same
    entry changes nothing.
    """
    at = naive_utc(as_of)
    with effect_transaction(engine, guard, "cancel orders") as conn:
        changed = update_and_log(
            conn,
            orders,
            order_ids,
            condition=orders.c.status == ORDER_PENDING,
            values={"status": ORDER_CANCELLED, "cancelled_at": at},
            at=at,
            task_key=task_key,
            entry_key=entry_key,
            action=ACTION_CANCEL,
            object_type=OBJECT_ORDER,
            detail={"from": ORDER_PENDING, "to": ORDER_CANCELLED},
        )
    return len(changed)
