"""Service auto-renew: renew auto-renew services about to expire, paid from the balance.

Pure planning (`plan_auto_renew`, `decide_renewals`) plus the write-back
(`apply_auto_renew`). Nothing here imports Dagster.

Rule: an `active` service with `auto_renew` whose `expires_at <= as_of + window` is
renewed for `period` when the customer's balance covers its price. A customer's services
are paid in order of expiry (then id) while the balance lasts, so two services never
spend the same money. Renewing = one invoice (created, due and paid at `as_of`), the
balance debited by the price, `expires_at` extended by `period` from the old expiry.
When the balance does not cover it, the service gets an "insufficient balance" record
(a `failed` idempotency row with the amounts) and is tried again by the next run.

Exactly once: the idempotency key is (service_auto_renew, service, old expires_at,
balance). The key's row, the invoice, the balance debit, the new expiry and the
automation_log row commit in one transaction, and the write-back re-checks the service
and the balance under lock, so neither a rerun nor a concurrent run charges twice.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import numpy as np
import pandas as pd
import sqlalchemy as sa

from assets.tunables import AutoRenewPolicy
from resources.core.fence import EffectGuard
from resources.effects import effect_transaction
from resources.idempotency import (
    KEY_COLUMNS,
    claim_effects,
    classify_effects,
    normalize_keys,
    read_effects,
    records,
    settle_effects,
)
from resources.source_schema import (
    SERVICE_ACTIVE,
    chunks,
    customers,
    invoices,
    log_automation,
    naive_utc,
    naive_utc_series,
    services,
    unique_ids,
)

RULE_AUTO_RENEW: Final = "service_auto_renew"
OBJECT_SERVICE: Final = "service"
CHANNEL_BALANCE: Final = "balance"
ACTION_AUTO_RENEW: Final = "auto_renew"
ACTION_INSUFFICIENT: Final = "auto_renew_insufficient_balance"

#: Outcome of each planned service in `apply_auto_renew`.
OUTCOME_RENEWED: Final = "renewed"
OUTCOME_INSUFFICIENT: Final = "insufficient_balance"
OUTCOME_CHANGED: Final = "changed_meanwhile"
OUTCOME_ALREADY_DONE: Final = "skipped_already_done"
RENEW_OUTCOMES: Final = (
    OUTCOME_RENEWED,
    OUTCOME_INSUFFICIENT,
    OUTCOME_CHANGED,
    OUTCOME_ALREADY_DONE,
)

#: Services per write-back transaction (whole customers are kept together).
APPLY_CHUNK_ROWS: Final = 500

PLAN_COLUMNS: Final = (
    "service_id",
    "customer_id",
    "price_cents",
    "expires_at",
    "new_expires_at",
    "balance_cents",
    "needed_cents",
)


@dataclass(frozen=True, eq=False)
class AutoRenewPlan:
    """What one run intends: `to_renew` and `insufficient` (both PLAN_COLUMNS)."""

    to_renew: pd.DataFrame
    insufficient: pd.DataFrame
    as_of: datetime


def _affordability(candidates: pd.DataFrame) -> pd.DataFrame:
    """Sort by (customer, expiry, id) and add `needed_cents` (running total per customer)."""
    ordered = candidates.sort_values(
        ["customer_id", "expires_at", "service_id"], kind="stable", ignore_index=True
    )
    ordered["needed_cents"] = ordered.groupby("customer_id", sort=False)["price_cents"].cumsum()
    return ordered


def plan_auto_renew(
    services_frame: pd.DataFrame,
    customers_frame: pd.DataFrame,
    as_of: datetime,
    policy: AutoRenewPolicy,
) -> AutoRenewPlan:
    """Decide which services to renew at `as_of` and which lack the balance (vectorised).

    `services_frame` needs id, customer_id, status, auto_renew, price_cents, expires_at;
    `customers_frame` id and balance_cents (a customer missing from it has no balance).
    """
    for column in ("id", "customer_id", "status", "auto_renew", "price_cents", "expires_at"):
        if column not in services_frame.columns:
            raise ValueError(f"services frame is missing column {column!r}")
    at = pd.Timestamp(naive_utc(as_of))
    expires_at = naive_utc_series(services_frame["expires_at"])
    auto = services_frame["auto_renew"].fillna(False).astype(bool)
    mask = (services_frame["status"] == SERVICE_ACTIVE) & auto & (expires_at <= at + policy.window)
    picked = services_frame.loc[mask]
    candidates = pd.DataFrame(
        {
            "service_id": picked["id"].astype(np.int64).to_numpy(),
            "customer_id": picked["customer_id"].astype(np.int64).to_numpy(),
            "price_cents": picked["price_cents"].astype(np.int64).to_numpy(),
            "expires_at": expires_at[mask].astype("datetime64[us]").to_numpy(),
        }
    )
    balances = pd.Series(
        customers_frame["balance_cents"].astype(np.int64).to_numpy(),
        index=customers_frame["id"].astype(np.int64).to_numpy(),
    )
    candidates["balance_cents"] = (
        balances.reindex(candidates["customer_id"].to_numpy()).fillna(0).astype(np.int64).to_numpy()
    )
    candidates["new_expires_at"] = candidates["expires_at"] + policy.period
    ordered = _affordability(candidates)
    affordable = (ordered["needed_cents"] <= ordered["balance_cents"]).to_numpy()
    columns = list(PLAN_COLUMNS)
    return AutoRenewPlan(
        to_renew=ordered.loc[affordable, columns].reset_index(drop=True),
        insufficient=ordered.loc[~affordable, columns].reset_index(drop=True),
        as_of=at.to_pydatetime(),
    )


def auto_renew_candidates_query(as_of: datetime, policy: AutoRenewPolicy) -> sa.Select[Any]:
    """Services `plan_auto_renew` can pick (served by the (status, expires_at) index)."""
    horizon = naive_utc(as_of) + policy.window
    return (
        sa.select(
            services.c.id,
            services.c.customer_id,
            services.c.status,
            services.c.auto_renew,
            services.c.price_cents,
            services.c.expires_at,
        )
        .where(
            services.c.status == SERVICE_ACTIVE,
            services.c.auto_renew.is_(True),
            services.c.expires_at <= horizon,
        )
        .order_by(services.c.id)
    )


def balances_query(candidate_query: sa.Select[Any]) -> sa.Select[Any]:
    """Balances of the customers `candidate_query` refers to."""
    ids = sa.select(candidate_query.subquery().c.customer_id)
    return (
        sa.select(customers.c.id, customers.c.balance_cents)
        .where(customers.c.id.in_(ids))
        .order_by(customers.c.id)
    )


def decide_renewals(
    claimed: pd.DataFrame, current: pd.DataFrame, balances: pd.Series
) -> pd.DataFrame:
    """Re-decide claimed renewals against the rows as they are now (under lock).

    `claimed`: PLAN_COLUMNS + effect_id. `current`: the services' current id, status,
    auto_renew, expires_at. `balances`: current balance by customer id. Returns `claimed`
    (in affordability order) with `decision` in {renew, insufficient, changed} and the
    recomputed `balance_cents`/`needed_cents`. A service whose state moved on since
    planning (renewed, suspended, auto-renew turned off) is `changed` and left alone.
    """
    now = current.set_index(current["id"].astype(np.int64))
    ids = claimed["service_id"].astype(np.int64).to_numpy()
    still = (
        (now["status"].reindex(ids).to_numpy() == SERVICE_ACTIVE)
        & now["auto_renew"].reindex(ids).fillna(False).astype(bool).to_numpy()
        & (
            naive_utc_series(now["expires_at"]).reindex(ids).to_numpy(dtype="datetime64[us]")
            == claimed["expires_at"].to_numpy(dtype="datetime64[us]")
        )
    )
    out = claimed.copy()
    out["valid"] = still
    out["balance_cents"] = (
        balances.reindex(out["customer_id"].astype(np.int64).to_numpy())
        .fillna(0)
        .astype(np.int64)
        .to_numpy()
    )
    # Only still-valid services spend money; changed ones count as price 0.
    out["price_if_valid"] = np.where(still, out["price_cents"], 0)
    out = out.sort_values(
        ["customer_id", "expires_at", "service_id"], kind="stable", ignore_index=True
    )
    out["needed_cents"] = out.groupby("customer_id", sort=False)["price_if_valid"].cumsum()
    out["decision"] = np.select(
        [~out["valid"], out["needed_cents"] <= out["balance_cents"]],
        ["changed", "renew"],
        default="insufficient",
    )
    return out.drop(columns=["valid", "price_if_valid"])


def _keys(plan_rows: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "rule": RULE_AUTO_RENEW,
            "object_type": OBJECT_SERVICE,
            "object_id": plan_rows["service_id"].to_numpy(dtype=np.int64),
            "time_point": plan_rows["expires_at"].to_numpy(dtype="datetime64[us]"),
            "channel": CHANNEL_BALANCE,
        },
        index=plan_rows.index,
    )


def _customer_chunks(rows: pd.DataFrame, size: int) -> list[pd.DataFrame]:
    """Split rows (sorted by customer) into chunks of about `size`, never splitting a customer."""
    if rows.empty:
        return []
    customer = rows["customer_id"].to_numpy()
    starts = np.flatnonzero(np.r_[True, customer[1:] != customer[:-1]])
    bounds: list[int] = [0]
    for start in starts[1:]:
        if start - bounds[-1] >= size:
            bounds.append(int(start))
    bounds.append(len(rows))
    return [rows.iloc[a:b] for a, b in itertools.pairwise(bounds)]


def _lock_current(
    conn: sa.Connection, service_ids: list[int], customer_ids: list[int]
) -> tuple[pd.DataFrame, pd.Series]:
    """Current service rows and balances, row-locked on PostgreSQL (SQLite holds the
    database write lock already: the claim insert came first)."""
    lock = conn.dialect.name == "postgresql"
    service_frames: list[pd.DataFrame] = []
    balance_parts: list[tuple[int, int]] = []
    for chunk in chunks(customer_ids):
        statement = (
            sa.select(customers.c.id, customers.c.balance_cents)
            .where(customers.c.id.in_(chunk))
            .order_by(customers.c.id)
        )
        result = conn.execute(statement.with_for_update() if lock else statement)
        balance_parts.extend((int(row[0]), int(row[1])) for row in result)
    for chunk in chunks(service_ids):
        statement = (
            sa.select(
                services.c.id, services.c.status, services.c.auto_renew, services.c.expires_at
            )
            .where(services.c.id.in_(chunk))
            .order_by(services.c.id)
        )
        result = conn.execute(statement.with_for_update() if lock else statement)
        service_frames.append(pd.DataFrame(result.fetchall(), columns=list(result.keys())))
    current = (
        pd.concat(service_frames, ignore_index=True)
        if service_frames
        else pd.DataFrame(columns=["id", "status", "auto_renew", "expires_at"])
    )
    balances = pd.Series(
        [balance for _, balance in balance_parts],
        index=pd.Index([customer for customer, _ in balance_parts], dtype=np.int64),
        dtype=np.int64,
    )
    return current, balances


def _renew(
    conn: sa.Connection,
    rows: pd.DataFrame,
    at: datetime,
    *,
    task_key: str,
    entry_key: str,
) -> None:
    """Extend expiry, debit balances, insert paid invoices and automation_log rows."""
    conn.execute(
        sa.update(services)
        .where(
            services.c.id == sa.bindparam("b_id"),
            services.c.expires_at == sa.bindparam("b_old"),
            services.c.status == SERVICE_ACTIVE,
        )
        .values(expires_at=sa.bindparam("b_new"), updated_at=at),
        records(
            pd.DataFrame(
                {
                    "b_id": rows["service_id"].astype(np.int64),
                    "b_old": rows["expires_at"].astype("datetime64[us]"),
                    "b_new": rows["new_expires_at"].astype("datetime64[us]"),
                }
            )
        ),
    )
    debits = rows.groupby("customer_id", sort=True)["price_cents"].sum()
    conn.execute(
        sa.update(customers)
        .where(customers.c.id == sa.bindparam("b_id"))
        .values(balance_cents=customers.c.balance_cents - sa.bindparam("b_amount")),
        [
            {"b_id": customer, "b_amount": amount}
            for customer, amount in zip(
                debits.index.to_numpy(dtype=np.int64).tolist(),
                debits.to_numpy(dtype=np.int64).tolist(),
                strict=True,
            )
        ],
    )
    conn.execute(
        sa.insert(invoices),
        records(
            pd.DataFrame(
                {
                    "customer_id": rows["customer_id"].astype(np.int64),
                    "service_id": rows["service_id"].astype(np.int64),
                    "amount_cents": rows["price_cents"].astype(np.int64),
                    "created_at": at,
                    "due_at": at,
                    "paid_at": at,
                }
            )
        ),
    )
    _log(conn, rows, at, ACTION_AUTO_RENEW, task_key=task_key, entry_key=entry_key)


def _log(
    conn: sa.Connection,
    rows: pd.DataFrame,
    at: datetime,
    action: str,
    *,
    task_key: str,
    entry_key: str,
) -> None:
    if rows.empty:
        return
    details = [
        json.dumps(
            {
                "price_cents": int(price),
                "balance_cents": int(balance),
                "needed_cents": int(needed),
                "expires_at": old.isoformat(),
                "new_expires_at": new.isoformat(),
            },
            sort_keys=True,
        )
        for price, balance, needed, old, new in zip(
            rows["price_cents"],
            rows["balance_cents"],
            rows["needed_cents"],
            pd.to_datetime(rows["expires_at"]),
            pd.to_datetime(rows["new_expires_at"]),
            strict=True,
        )
    ]
    log_automation(
        conn,
        at=at,
        task_key=task_key,
        entry_key=entry_key,
        action=action,
        items=(
            (OBJECT_SERVICE, service_id, detail)
            for service_id, detail in zip(rows["service_id"], details, strict=True)
        ),
    )


def insufficient_messages(rows: pd.DataFrame) -> list[str]:
    """The "insufficient balance" record text of each row (PLAN_COLUMNS)."""
    return [
        f"insufficient balance: renewing service {service} needs {needed} cents "
        f"(price {price}) but the customer's balance is {balance} cents"
        for service, needed, price, balance in zip(
            rows["service_id"].astype(np.int64).tolist(),
            rows["needed_cents"].astype(np.int64).tolist(),
            rows["price_cents"].astype(np.int64).tolist(),
            rows["balance_cents"].astype(np.int64).tolist(),
            strict=True,
        )
    ]


def changed_messages(rows: pd.DataFrame) -> list[str]:
    """Why a claimed renewal was not applied: the service moved on since planning."""
    return [
        f"service {service} changed since planning (no longer active with auto-renew and "
        f"expiry {expiry}); not renewed"
        for service, expiry in zip(
            rows["service_id"].astype(np.int64).tolist(),
            pd.to_datetime(rows["expires_at"]).dt.strftime("%Y-%m-%dT%H:%M:%S").tolist(),
            strict=True,
        )
    ]


def apply_auto_renew(
    engine: sa.Engine,
    plan: AutoRenewPlan,
    as_of: datetime,
    *,
    task_key: str,
    entry_key: str,
    guard: EffectGuard | None,
    chunk_rows: int = APPLY_CHUNK_ROWS,
) -> pd.DataFrame:
    """Apply `plan` exactly once per (service, old expiry); return one row per planned
    service with `outcome` (RENEW_OUTCOMES): renewed, insufficient_balance,
    changed_meanwhile or skipped_already_done (key already succeeded, or claimed by a
    concurrent run)."""
    at = naive_utc(as_of)
    if naive_utc(plan.as_of) != at:
        raise ValueError(
            f"apply_auto_renew got as_of={at.isoformat()} for a plan made at "
            f"{naive_utc(plan.as_of).isoformat()}; apply a plan with the as_of it was made for"
        )
    planned = pd.concat([plan.to_renew, plan.insufficient], ignore_index=True)
    planned = planned.sort_values(
        ["customer_id", "expires_at", "service_id"], kind="stable", ignore_index=True
    )
    outcomes: dict[int, str] = {}
    errors: dict[int, str] = {}
    for chunk in _customer_chunks(planned, chunk_rows):
        keys = _keys(chunk)
        with effect_transaction(engine, guard, "auto-renew services") as conn:
            # The claim insert comes first: on SQLite it takes the write lock, so the reads
            # below see the state this transaction will change.
            classified = classify_effects(keys, read_effects(conn, keys))
            claimed = claim_effects(conn, classified, at=at, task_key=task_key, entry_key=entry_key)
            if claimed.empty:
                continue
            mine = normalize_keys(keys.join(chunk)).merge(
                claimed[["effect_id", *KEY_COLUMNS, "attempts"]],
                on=list(KEY_COLUMNS),
                how="inner",
            )
            current, balances = _lock_current(
                conn,
                unique_ids(mine["service_id"]),
                unique_ids(mine["customer_id"]),
            )
            decided = decide_renewals(
                mine[[*PLAN_COLUMNS, "effect_id", "attempts"]], current, balances
            )
            renew = decided.loc[decided["decision"] == "renew"]
            short = decided.loc[decided["decision"] == "insufficient"]
            changed = decided.loc[decided["decision"] == "changed"]
            if not renew.empty:
                _renew(conn, renew, at, task_key=task_key, entry_key=entry_key)
            # One log row when a service first runs short, not one per hourly retry.
            _log(
                conn,
                short.loc[short["attempts"] == 1],
                at,
                ACTION_INSUFFICIENT,
                task_key=task_key,
                entry_key=entry_key,
            )
            short_errors = insufficient_messages(short)
            changed_errors = changed_messages(changed)
            failed = dict(
                zip(
                    [
                        *short["effect_id"].astype(np.int64).tolist(),
                        *changed["effect_id"].astype(np.int64).tolist(),
                    ],
                    [*short_errors, *changed_errors],
                    strict=True,
                )
            )
            settle_effects(conn, succeeded=renew["effect_id"], failed=failed, at=at)
        for frame, outcome, texts in (
            (renew, OUTCOME_RENEWED, [None] * len(renew)),
            (short, OUTCOME_INSUFFICIENT, short_errors),
            (changed, OUTCOME_CHANGED, changed_errors),
        ):
            for service_id, text in zip(
                frame["service_id"].astype(np.int64).tolist(), texts, strict=True
            ):
                outcomes[service_id] = outcome
                if text is not None:
                    errors[service_id] = text
    result = planned.copy()
    ids = result["service_id"].astype(np.int64).tolist()
    result["outcome"] = [outcomes.get(i, OUTCOME_ALREADY_DONE) for i in ids]
    result["error"] = [errors.get(i) for i in ids]
    return result
