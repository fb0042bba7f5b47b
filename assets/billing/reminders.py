"""Billing reminders: overdue-invoice reminders and service renewal notices.

Pure, vectorised rules (no Dagster, no I/O) plus the narrowing SQL for the asset that
runs them. The write side is `resources.notifier.dispatch_notifications`.

Reminder semantics (both kinds):
- A reminder stage `d` has a **time point**: `due_at + d days` for an overdue invoice,
  `expires_at - d days` for a renewal notice. It is due once `time_point <= as_of`.
- **Continuous, compensating scan**: every run looks at everything due at its `as_of`,
  not at a same-day window, so a missed run is made up by the next one.
- **Latest stage only**: of the stages already reached, only the latest is due; an
  earlier stage that was never sent is superseded (a customer who is 4 days overdue
  gets the 3-day reminder, not the 1-day and the 3-day one at once).
- An overdue reminder is due while the invoice is unpaid as of `as_of` (no `paid_at`,
  or paid after `as_of`) and existed then (`created_at <= as_of`); a renewal notice
  while the service is `active` and not yet expired at `as_of`.
- One reminder per channel the customer opted into (`customers.channels`) that the
  policy enables. The idempotency key is (rule, object, time point, channel).

The first renewal notice of an expiry (`first_notice_gate`): plugin listeners of the hook
event `before_renewal_first_notice` are asked before it goes out, and a blocking deny skips
it. "First" is the first notice the service actually gets for that expiry, whatever its
stage: normally the 7-day one, the 3-day one when the 7-day notice was never sent (the
service appeared 5 days before expiry, the runs were down) or was skipped. A notice is not
first once any renewal notice of the same expiry has an idempotency row (sent, failed on a
channel, or in doubt: it went out, or was tried). A skipped notice is recorded under its own
key (rule `service_renewal_notice_skipped`, channel `all`), so it stays skipped and its
listeners are not asked again for it; the next stage's notice is then the first, and asks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

import numpy as np
import pandas as pd
import sqlalchemy as sa

from assets.tunables import ReminderPolicy
from resources.idempotency import KEY_COLUMNS, normalize_keys
from resources.source_schema import (
    CHANNELS,
    SERVICE_ACTIVE,
    customers,
    invoices,
    naive_utc,
    naive_utc_series,
    services,
)

RULE_OVERDUE: Final = "invoice_overdue_reminder"
RULE_RENEWAL: Final = "service_renewal_notice"
#: The key a skipped renewal notice is recorded under (see the module docstring).
RULE_RENEWAL_SKIPPED: Final = "service_renewal_notice_skipped"
#: A skip covers the notice on every channel: its key has this channel.
SKIP_CHANNEL: Final = "all"
OBJECT_INVOICE: Final = "invoice"
OBJECT_SERVICE: Final = "service"

#: Columns of a due-reminder frame (before rendering): key, whom, and message facts.
REMINDER_COLUMNS: Final = (
    "rule",
    "object_type",
    "object_id",
    "time_point",
    "channel",
    "customer_id",
    "recipient",
    "stage_days",
    "amount_cents",
    "reference_at",
)

_DAY = np.timedelta64(1, "D")


def _require_columns(frame: pd.DataFrame, required: Iterable[str], what: str) -> None:
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise ValueError(f"{what} frame is missing column(s) {missing}; it needs {list(required)}")


def _empty_reminders() -> pd.DataFrame:
    frame = pd.DataFrame({column: pd.Series(dtype=object) for column in REMINDER_COLUMNS})
    frame["object_id"] = frame["object_id"].astype(np.int64)
    frame["customer_id"] = frame["customer_id"].astype(np.int64)
    frame["stage_days"] = frame["stage_days"].astype(np.int64)
    frame["amount_cents"] = frame["amount_cents"].astype(np.int64)
    frame["time_point"] = pd.Series(dtype="datetime64[us]")
    frame["reference_at"] = pd.Series(dtype="datetime64[us]")
    return frame


def opted_in(channel_sets: Sequence[str] | np.ndarray, channel: str) -> np.ndarray:
    """For each comma-separated channel set ("email,sms", "" = none), is `channel` in it?

    Exact item match ("sms" is not in "smsx"). Vectorised by factorizing: the test runs
    once per distinct set (a handful), not once per customer.
    """
    codes, uniques = pd.factorize(pd.Series(channel_sets, dtype=object).fillna(""))
    members = np.array(
        [channel in {item.strip() for item in str(u).split(",")} for u in uniques], dtype=bool
    )
    return members[codes] if len(members) else np.zeros(len(codes), dtype=bool)


def expand_channels(
    stages: pd.DataFrame, customers_frame: pd.DataFrame, channels: Sequence[str]
) -> pd.DataFrame:
    """One row per (stage row, enabled channel the customer opted into), with recipient,
    ordered by object id then channel name.

    Recipients: email -> `customers.email`, sms -> `customers.phone`, in_app ->
    `customer:<id>`. Customers missing from `customers_frame` get nothing.
    """
    _require_columns(customers_frame, ("id", "email", "phone", "channels"), "customers")
    if stages.empty:
        return _empty_reminders()
    customer_index = pd.Index(customers_frame["id"].to_numpy(dtype=np.int64))
    position = customer_index.get_indexer(pd.Index(stages["customer_id"].to_numpy(np.int64)))
    known = position >= 0
    sets = np.full(len(stages), "", dtype=object)
    sets[known] = customers_frame["channels"].to_numpy(dtype=object)[position[known]]
    contact_columns = {"email": "email", "sms": "phone"}
    parts = []
    for rank, channel in enumerate(sorted(channels)):
        selected = known & opted_in(sets, channel)
        if not selected.any():
            continue
        part = stages.loc[selected].copy()
        part["channel"] = channel
        if channel in contact_columns:
            values = customers_frame[contact_columns[channel]].to_numpy(dtype=object)
            part["recipient"] = values[position[selected]]
        else:
            part["recipient"] = "customer:" + part["customer_id"].astype(str)
        part["_rank"] = rank
        parts.append(part)
    if not parts:
        return _empty_reminders()
    out = pd.concat(parts, ignore_index=True)
    order = np.lexsort((out["_rank"].to_numpy(), out["object_id"].to_numpy()))
    return out.iloc[order].reset_index(drop=True)[list(REMINDER_COLUMNS)]


def overdue_stages(
    invoices_frame: pd.DataFrame, as_of: datetime, days: Sequence[int]
) -> pd.DataFrame:
    """The latest reached overdue stage of each invoice unpaid at `as_of` (one row each).

    Columns: rule, object_type, object_id, customer_id, stage_days, time_point,
    amount_cents, reference_at (the due date).
    """
    _require_columns(
        invoices_frame,
        ("id", "customer_id", "amount_cents", "created_at", "due_at", "paid_at"),
        "invoices",
    )
    at = np.datetime64(naive_utc(as_of), "ns")
    offsets_days = np.sort(np.asarray(days, dtype=np.int64))
    offsets = offsets_days * _DAY
    due_at = naive_utc_series(invoices_frame["due_at"]).to_numpy(dtype="datetime64[ns]")
    paid_at = naive_utc_series(invoices_frame["paid_at"]).to_numpy(dtype="datetime64[ns]")
    created_at = naive_utc_series(invoices_frame["created_at"]).to_numpy(dtype="datetime64[ns]")
    # NaT compares False: "unpaid" is "no paid_at, or paid after as_of".
    unpaid = np.isnat(paid_at) | (paid_at > at)
    elapsed = at - due_at
    # Index of the largest offset <= elapsed; -1 when no stage is reached yet.
    stage = np.searchsorted(offsets.astype("timedelta64[ns]"), elapsed, side="right") - 1
    mask = unpaid & (created_at <= at) & (stage >= 0)
    stage_days = offsets_days[stage[mask]]
    reference = due_at[mask]
    return pd.DataFrame(
        {
            "rule": RULE_OVERDUE,
            "object_type": OBJECT_INVOICE,
            "object_id": invoices_frame["id"].to_numpy(dtype=np.int64)[mask],
            "customer_id": invoices_frame["customer_id"].to_numpy(dtype=np.int64)[mask],
            "stage_days": stage_days,
            "time_point": (reference + stage_days * _DAY).astype("datetime64[us]"),
            "amount_cents": invoices_frame["amount_cents"].to_numpy(dtype=np.int64)[mask],
            "reference_at": reference.astype("datetime64[us]"),
        }
    )


def renewal_stages(
    services_frame: pd.DataFrame, as_of: datetime, days: Sequence[int]
) -> pd.DataFrame:
    """The latest reached renewal-notice stage of each active, unexpired service.

    Stage `d` is reached when `expires_at - d days <= as_of < expires_at`; the latest is
    the smallest such `d`. Columns as `overdue_stages` (reference_at = expiry).
    """
    _require_columns(
        services_frame, ("id", "customer_id", "status", "price_cents", "expires_at"), "services"
    )
    at = np.datetime64(naive_utc(as_of), "ns")
    offsets_days = np.sort(np.asarray(days, dtype=np.int64))
    offsets = (offsets_days * _DAY).astype("timedelta64[ns]")
    expires_at = naive_utc_series(services_frame["expires_at"]).to_numpy(dtype="datetime64[ns]")
    remaining = expires_at - at
    # Index of the smallest offset >= remaining; len(offsets) when none is reached yet.
    stage = np.searchsorted(offsets, remaining, side="left")
    active = services_frame["status"].to_numpy() == SERVICE_ACTIVE
    mask = active & (remaining > np.timedelta64(0, "ns")) & (stage < len(offsets))
    stage_days = offsets_days[stage[mask]]
    reference = expires_at[mask]
    return pd.DataFrame(
        {
            "rule": RULE_RENEWAL,
            "object_type": OBJECT_SERVICE,
            "object_id": services_frame["id"].to_numpy(dtype=np.int64)[mask],
            "customer_id": services_frame["customer_id"].to_numpy(dtype=np.int64)[mask],
            "stage_days": stage_days,
            "time_point": (reference - stage_days * _DAY).astype("datetime64[us]"),
            "amount_cents": services_frame["price_cents"].to_numpy(dtype=np.int64)[mask],
            "reference_at": reference.astype("datetime64[us]"),
        }
    )


def overdue_reminders_due(
    invoices_frame: pd.DataFrame,
    customers_frame: pd.DataFrame,
    as_of: datetime,
    policy: ReminderPolicy,
) -> pd.DataFrame:
    """Overdue-invoice reminders due at `as_of`: one row per invoice and channel."""
    stages = overdue_stages(invoices_frame, as_of, policy.overdue_days)
    return expand_channels(stages, customers_frame, policy.channels)


def renewal_notices_due(
    services_frame: pd.DataFrame,
    customers_frame: pd.DataFrame,
    as_of: datetime,
    policy: ReminderPolicy,
) -> pd.DataFrame:
    """Renewal notices due at `as_of`: one row per service and channel."""
    stages = renewal_stages(services_frame, as_of, policy.renewal_days)
    return expand_channels(stages, customers_frame, policy.channels)


# --- the first renewal notice of an expiry ---------------------------------------------

#: Where a due renewal notice stands (`first_notice_gate`).
NOTICE_FIRST: Final = "first"  # no notice of this expiry yet: ask the listeners first
NOTICE_LATER: Final = "later"  # a notice of this expiry went out (or was tried) already
NOTICE_SKIPPED: Final = "skipped"  # denied by a listener in an earlier run: stays skipped

#: Columns of a notices frame: one row per renewal notice (service and time point).
NOTICE_COLUMNS: Final = (
    "object_id",
    "customer_id",
    "time_point",
    "stage_days",
    "reference_at",
    "channels",
)


def renewal_notices(due: pd.DataFrame) -> pd.DataFrame:
    """The renewal notices of a due-reminder frame, one row per service and time point,
    with the channels it goes to (sorted, comma-separated), ordered by service id."""
    rows = due.loc[due["rule"] == RULE_RENEWAL]
    if rows.empty:
        frame = pd.DataFrame({column: pd.Series(dtype=object) for column in NOTICE_COLUMNS})
        for column in ("object_id", "customer_id", "stage_days"):
            frame[column] = frame[column].astype(np.int64)
        for column in ("time_point", "reference_at"):
            frame[column] = pd.Series(dtype="datetime64[us]")
        return frame
    grouped = rows.groupby(["object_id", "time_point"], sort=True).agg(
        customer_id=("customer_id", "first"),
        stage_days=("stage_days", "first"),
        reference_at=("reference_at", "first"),
        channels=("channel", lambda c: ",".join(sorted(c))),
    )
    return grouped.reset_index()[list(NOTICE_COLUMNS)]


def first_notice_keys(notices: pd.DataFrame, stages: Sequence[int]) -> pd.DataFrame:
    """The idempotency keys that tell where each notice stands: the notice of every stage of
    its expiry on every channel (rule `service_renewal_notice`), and its own skip key.

    KEY_COLUMNS plus `notice_time_point` (the notice the key is looked up for). Every known
    channel, not only the enabled ones: a notice sent before a channel was disabled counts.
    """
    n = len(notices)
    ids = notices["object_id"].to_numpy(dtype=np.int64)
    expiry = notices["reference_at"].to_numpy(dtype="datetime64[us]")
    own = notices["time_point"].to_numpy(dtype="datetime64[us]")
    days = np.asarray(sorted(stages), dtype=np.int64)
    per_notice = len(days) * len(CHANNELS)
    stage = np.tile(np.repeat(days, len(CHANNELS)), n)
    sent = pd.DataFrame(
        {
            "rule": RULE_RENEWAL,
            "object_type": OBJECT_SERVICE,
            "object_id": np.repeat(ids, per_notice),
            "time_point": np.repeat(expiry, per_notice) - (stage * _DAY).astype("timedelta64[us]"),
            "channel": np.tile(np.asarray(CHANNELS, dtype=object), n * len(days)),
            "notice_time_point": np.repeat(own, per_notice),
        }
    )
    skipped = pd.DataFrame(
        {
            "rule": RULE_RENEWAL_SKIPPED,
            "object_type": OBJECT_SERVICE,
            "object_id": ids,
            "time_point": own,
            "channel": SKIP_CHANNEL,
            "notice_time_point": own,
        }
    )
    return pd.concat([sent, skipped], ignore_index=True)


def first_notice_gate(
    notices: pd.DataFrame, keys: pd.DataFrame, existing: pd.DataFrame
) -> pd.Series:
    """For each notice (same index): `first`, `later` or `skipped` (NOTICE_*).

    `keys` are `first_notice_keys(notices, ...)`; `existing` the idempotency rows found for
    them (any columns including KEY_COLUMNS, e.g. `resources.idempotency.read_effects`).
    A notice is `later` when any renewal notice of its expiry has a row, else `skipped`
    when its own skip key has one, else `first`.
    """
    gate = pd.Series(NOTICE_FIRST, index=notices.index, dtype=object)
    if notices.empty or existing.empty:
        return gate
    found = normalize_keys(keys).merge(
        normalize_keys(existing[list(KEY_COLUMNS)]).drop_duplicates(), on=list(KEY_COLUMNS)
    )
    notice_index = pd.MultiIndex.from_arrays(
        [
            notices["object_id"].to_numpy(dtype=np.int64),
            notices["time_point"].to_numpy(dtype="datetime64[us]"),
        ]
    )

    def hit(rule: str) -> np.ndarray:
        rows = found.loc[found["rule"] == rule]
        keys_found = pd.MultiIndex.from_arrays(
            [
                rows["object_id"].to_numpy(dtype=np.int64),
                rows["notice_time_point"].to_numpy(dtype="datetime64[us]"),
            ]
        )
        return np.asarray(notice_index.isin(keys_found))

    gate[hit(RULE_RENEWAL_SKIPPED)] = NOTICE_SKIPPED
    gate[hit(RULE_RENEWAL)] = NOTICE_LATER
    return gate


def skip_keys(notices: pd.DataFrame) -> pd.DataFrame:
    """The skip keys (KEY_COLUMNS) of these renewal notices, in their order."""
    return pd.DataFrame(
        {
            "rule": RULE_RENEWAL_SKIPPED,
            "object_type": OBJECT_SERVICE,
            "object_id": notices["object_id"].to_numpy(dtype=np.int64),
            "time_point": notices["time_point"].to_numpy(dtype="datetime64[us]"),
            "channel": SKIP_CHANNEL,
        },
        index=notices.index,
    )


_TEXT = np.dtypes.StringDType()


def _text(values: np.ndarray) -> np.ndarray:
    return np.asarray(values).astype(_TEXT)


def _minutes_text(instants: np.ndarray) -> np.ndarray:
    """'YYYY-MM-DD HH:MM UTC' for naive-UTC datetimes, formatting each distinct minute once."""
    minutes = np.asarray(instants).astype("datetime64[m]")
    distinct, inverse = np.unique(minutes, return_inverse=True)
    labels = np.strings.replace(_text(np.datetime_as_string(distinct, unit="m")), "T", " ")
    return labels[inverse] + " UTC"


def render_reminders(due: pd.DataFrame) -> pd.DataFrame:
    """`due` plus `subject` and `body`, built with numpy string ufuncs (no row loop)."""
    out = due.copy()
    if out.empty:
        out["subject"] = pd.Series(dtype=object)
        out["body"] = pd.Series(dtype=object)
        return out
    ident = _text(out["object_id"].to_numpy(dtype=np.int64))
    days = out["stage_days"].to_numpy(dtype=np.int64)
    day_text = _text(days) + np.where(days == 1, " day", " days").astype(_TEXT)
    date = _minutes_text(out["reference_at"].to_numpy(dtype="datetime64[us]"))
    cents = out["amount_cents"].to_numpy(dtype=np.int64)
    money = _text(cents // 100) + "." + np.strings.zfill(_text(cents % 100), 2)
    overdue = (out["rule"] == RULE_OVERDUE).to_numpy()
    subject = np.where(
        overdue,
        "Reminder: invoice #" + ident + " is " + day_text + " overdue",
        "Your service #" + ident + " expires in " + day_text,
    )
    body = np.where(
        overdue,
        "Invoice #"
        + ident
        + " for "
        + money
        + " was due on "
        + date
        + ". Please pay it to keep your services running.",
        "Service #"
        + ident
        + " expires on "
        + date
        + ". Renewal costs "
        + money
        + "; renew it (or keep enough balance for auto-renew) to avoid suspension.",
    )
    out["subject"] = subject.astype(object)
    out["body"] = body.astype(object)
    return out


# --- narrowing SQL ----------------------------------------------------------------------


def overdue_candidates_query(as_of: datetime, policy: ReminderPolicy) -> sa.Select[Any]:
    """Invoices `overdue_stages` can pick at `as_of` (unpaid then, at least the first
    stage past due). The pure rule stays the authority."""
    at = naive_utc(as_of)
    first_stage = at - timedelta(days=min(policy.overdue_days))
    return (
        sa.select(
            invoices.c.id,
            invoices.c.customer_id,
            invoices.c.amount_cents,
            invoices.c.created_at,
            invoices.c.due_at,
            invoices.c.paid_at,
        )
        .where(
            sa.or_(invoices.c.paid_at.is_(None), invoices.c.paid_at > at),
            invoices.c.created_at <= at,
            invoices.c.due_at <= first_stage,
        )
        .order_by(invoices.c.id)
    )


def renewal_candidates_query(as_of: datetime, policy: ReminderPolicy) -> sa.Select[Any]:
    """Services `renewal_stages` can pick at `as_of` (active, expiring within the largest
    notice period). Served by the (status, expires_at) index."""
    at = naive_utc(as_of)
    horizon = at + timedelta(days=max(policy.renewal_days))
    return (
        sa.select(
            services.c.id,
            services.c.customer_id,
            services.c.status,
            services.c.price_cents,
            services.c.expires_at,
        )
        .where(
            services.c.status == SERVICE_ACTIVE,
            services.c.expires_at > at,
            services.c.expires_at <= horizon,
        )
        .order_by(services.c.id)
    )


def reminder_customers_query(*candidate_queries: sa.Select[Any]) -> sa.Select[Any]:
    """Contact columns of the customers the candidate queries refer to."""
    ids = sa.union(
        *(sa.select(query.subquery().c.customer_id) for query in candidate_queries)
    ).subquery()
    return (
        sa.select(customers.c.id, customers.c.email, customers.c.phone, customers.c.channels)
        .where(customers.c.id.in_(sa.select(ids.c.customer_id)))
        .order_by(customers.c.id)
    )
