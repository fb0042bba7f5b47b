"""Balance reconciliation: recompute every customer's balance from payments and invoices
and report where the recorded balance disagrees. Never fixes anything.

Model: `customers.balance_cents` = sum of the customer's payments - sum of the
customer's invoices (every issued invoice is a charge; a payment, or a renewal paid from
the balance, settles it). A positive balance is credit, a negative one is owed.

The three inputs are read by ONE statement (`movements_query`, a UNION ALL), so they are
one consistent snapshot on both SQLite and PostgreSQL even while auto-renew writes; the
arithmetic is pandas (`reconcile_balances`). Nothing here imports Dagster.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import pandas as pd
import sqlalchemy as sa

from resources.source_schema import customers, invoices, payments

KIND_BALANCE: Final = 0
KIND_PAYMENT: Final = 1
KIND_INVOICE: Final = 2

MISMATCH_COLUMNS: Final = (
    "customer_id",
    "recorded_cents",
    "payments_cents",
    "invoices_cents",
    "expected_cents",
    "difference_cents",
)


def movements_query() -> sa.CompoundSelect[Any]:
    """`(kind, customer_id, amount_cents)` for every balance, payment and invoice."""
    return sa.union_all(
        sa.select(
            sa.literal(KIND_BALANCE).label("kind"),
            customers.c.id.label("customer_id"),
            customers.c.balance_cents.label("amount_cents"),
        ),
        sa.select(
            sa.literal(KIND_PAYMENT).label("kind"),
            payments.c.customer_id,
            payments.c.amount_cents,
        ),
        sa.select(
            sa.literal(KIND_INVOICE).label("kind"),
            invoices.c.customer_id,
            invoices.c.amount_cents,
        ),
    )


def _positions(ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Position of each value in `ids`, -1 where absent; ValueError if `ids` repeats.

    Customer ids are dense small integers in practice: a lookup table is one vectorised
    gather. Sparse or negative ids fall back to a hash lookup.
    """
    duplicated = "movements list a customer's balance more than once"
    if len(ids) == 0:
        return np.full(len(values), -1, dtype=np.int64)
    low, high = int(ids.min()), int(ids.max())
    if low >= 0 and high <= 4 * len(ids) + 1024:
        if np.bincount(ids).max() > 1:
            raise ValueError(duplicated)
        table = np.full(high + 1, -1, dtype=np.int64)
        table[ids] = np.arange(len(ids), dtype=np.int64)
        inside = (values >= 0) & (values <= high)
        out = np.full(len(values), -1, dtype=np.int64)
        out[inside] = table[values[inside]]
        return out
    index = pd.Index(ids)
    if not index.is_unique:
        raise ValueError(duplicated)
    return np.asarray(index.get_indexer(pd.Index(values)), dtype=np.int64)


def reconcile_balances(movements: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, int]]:
    """Compare recorded balances with payments - invoices, per customer (vectorised).

    Returns the mismatches (MISMATCH_COLUMNS, largest absolute difference first, then
    customer id) and summary counts: customers, mismatched, absolute difference in
    cents, and `orphan_rows` (payments/invoices of customers that do not exist, which are
    reported, not attributed).
    """
    for column in ("kind", "customer_id", "amount_cents"):
        if column not in movements.columns:
            raise ValueError(f"movements frame is missing column {column!r}")
    kind = movements["kind"].to_numpy(dtype=np.int64)
    cid = movements["customer_id"].to_numpy(dtype=np.int64)
    amount = movements["amount_cents"].to_numpy(dtype=np.int64)
    is_balance = kind == KIND_BALANCE
    ids = cid[is_balance]
    pos = _positions(ids, cid)  # index of each movement's customer in `ids`, -1 if unknown
    known = pos >= 0
    totals = np.zeros((3, len(ids)), dtype=np.int64)
    for k in (KIND_BALANCE, KIND_PAYMENT, KIND_INVOICE):
        selected = known & (kind == k)
        np.add.at(totals[k], pos[selected], amount[selected])
    expected = totals[KIND_PAYMENT] - totals[KIND_INVOICE]
    difference = totals[KIND_BALANCE] - expected
    bad = difference != 0
    mismatches = pd.DataFrame(
        {
            "customer_id": ids[bad],
            "recorded_cents": totals[KIND_BALANCE][bad],
            "payments_cents": totals[KIND_PAYMENT][bad],
            "invoices_cents": totals[KIND_INVOICE][bad],
            "expected_cents": expected[bad],
            "difference_cents": difference[bad],
        }
    )
    order = np.lexsort((mismatches["customer_id"], -np.abs(mismatches["difference_cents"])))
    mismatches = mismatches.iloc[order].reset_index(drop=True)
    summary = {
        "customers": len(ids),
        "mismatched": int(bad.sum()),
        "absolute_difference_cents": int(np.abs(difference).sum()),
        "orphan_rows": int((~known & ~is_balance).sum()),
    }
    return mismatches, summary
