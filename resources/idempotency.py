"""Exactly-once bookkeeping for the hosting domain's side effects.

Three tables, registered on the source store's ``metadata`` so they live beside the data
they talk about and commit in the same transactions:

- ``side_effects`` -- the idempotency log. One row per (rule, object, time point,
  channel), enforced by a unique constraint. A side effect (an outbox row, a balance
  change) is written in the same transaction as its row, so a re-run, a retry, an
  overlapping manual run or a backfill can never do it twice: the second insert hits the
  constraint and does nothing.
- ``notification_outbox`` -- the notification log: one row per notification handed to a
  channel (see ``resources/notifier.py``).
- ``log_archives`` -- the manifest of archive files written by ``log_archive``.

Effect states: ``succeeded`` (done, never repeated), ``failed`` (may be claimed again by
a later run -- that is how a failed channel is retried alone) and ``in_flight`` (claimed
for a delivery outside the database's transaction; a row that stays ``in_flight`` after
its run ended is *in doubt* -- the delivery may have happened -- and is never retried
automatically, like a reclaimed ledger entry).

Nothing here imports Dagster; all functions take a connection or an engine.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import sqlalchemy as sa

from resources.source_schema import (
    chunks,
    metadata,
    naive_utc,
    naive_utc_series,
    read_frame_from,
    unique_ids,
)

if TYPE_CHECKING:
    # Imported where frames are made: the code location loads without pandas.
    import numpy as np
    import pandas as pd

EFFECT_SUCCEEDED: Final = "succeeded"
EFFECT_FAILED: Final = "failed"
EFFECT_IN_FLIGHT: Final = "in_flight"
EFFECT_STATUSES: Final = (EFFECT_SUCCEEDED, EFFECT_FAILED, EFFECT_IN_FLIGHT)

#: The idempotency key: what a side effect is "the same" as.
KEY_COLUMNS: Final = ("rule", "object_type", "object_id", "time_point", "channel")

OUTBOX_PENDING: Final = "pending"  # written in the effect's transaction; a relay delivers it
OUTBOX_DELIVERED: Final = "delivered"  # delivered by the notifier itself (e.g. SMTP)
OUTBOX_STATUSES: Final = (OUTBOX_PENDING, OUTBOX_DELIVERED)

#: How a key row was found before a run acted on it (see `classify_effects`).
STATE_NEW: Final = "new"

side_effects = sa.Table(
    "side_effects",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("rule", sa.String(64), nullable=False),
    sa.Column("object_type", sa.String(32), nullable=False),
    sa.Column("object_id", sa.BigInteger, nullable=False),
    # The instant the rule made this effect due (e.g. invoice due_at + 3 days), not when a
    # run noticed it: two runs that see the same due point agree on the key.
    sa.Column("time_point", sa.DateTime, nullable=False),
    sa.Column("channel", sa.String(20), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, default=1),
    # Which claim (one transaction's batch) owns the row right now; see `claim_effects`.
    sa.Column("claim_token", sa.String(32), nullable=True),
    # The task and ledger entry of the latest attempt: every effect traces to one entry.
    sa.Column("task_key", sa.String(200), nullable=False),
    sa.Column("entry_key", sa.String(200), nullable=False),
    # As-of instants (run dues), like automation_log.at.
    sa.Column("first_at", sa.DateTime, nullable=False),
    sa.Column("last_at", sa.DateTime, nullable=False),
    sa.Column("succeeded_at", sa.DateTime, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.UniqueConstraint(*KEY_COLUMNS, name="uq_side_effects_key"),
    sa.CheckConstraint(
        "status IN ({})".format(", ".join(f"'{s}'" for s in EFFECT_STATUSES)),
        name="ck_side_effects_status",
    ),
    sa.Index("ix_side_effects_rule_time_point", "rule", "time_point"),
    sa.Index("ix_side_effects_claim_token", "claim_token"),
    sa.Index("ix_side_effects_status", "status"),
)

notification_outbox = sa.Table(
    "notification_outbox",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    # At most one notification per effect, whatever retries happen.
    sa.Column("effect_id", sa.Integer, sa.ForeignKey("side_effects.id"), nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),  # the run's as-of instant
    sa.Column("task_key", sa.String(200), nullable=False),
    sa.Column("entry_key", sa.String(200), nullable=False),
    sa.Column("rule", sa.String(64), nullable=False),
    sa.Column("channel", sa.String(20), nullable=False),
    sa.Column("customer_id", sa.Integer, nullable=False),
    sa.Column("recipient", sa.String(320), nullable=False),
    sa.Column("subject", sa.String(300), nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.UniqueConstraint("effect_id", name="uq_notification_outbox_effect"),
    sa.CheckConstraint(
        "status IN ({})".format(", ".join(f"'{s}'" for s in OUTBOX_STATUSES)),
        name="ck_notification_outbox_status",
    ),
    sa.Index("ix_notification_outbox_created_at", "created_at"),
    sa.Index("ix_notification_outbox_status", "status"),
)

log_archives = sa.Table(
    "log_archives",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("table_name", sa.String(64), nullable=False),
    sa.Column("path", sa.String(1000), nullable=False),
    sa.Column("format", sa.String(20), nullable=False),
    sa.Column("rows", sa.Integer, nullable=False),
    sa.Column("deleted", sa.Integer, nullable=False),
    sa.Column("min_id", sa.BigInteger, nullable=False),
    sa.Column("max_id", sa.BigInteger, nullable=False),
    sa.Column("cutoff", sa.DateTime, nullable=False),
    # sha256 of the uncompressed CSV text: compare it with `gzip -dc FILE | sha256sum`.
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("task_key", sa.String(200), nullable=False),
    sa.Column("entry_key", sa.String(200), nullable=False),
    sa.UniqueConstraint("path", name="uq_log_archives_path"),
)

DOMAIN_TABLES: Final = (side_effects, notification_outbox, log_archives)
#: Advisory lock key for schema creation on PostgreSQL (arbitrary, fixed).
SCHEMA_LOCK_KEY: Final = 0x64756564


def create_domain_schema(engine: sa.Engine) -> None:
    """Create the bookkeeping tables that do not exist yet (safe to repeat).

    `resources.source_store.create_schema` creates them too once this module is imported;
    the domain assets call this so a store made before they existed still works.
    On PostgreSQL an advisory lock serializes concurrent first runs (CREATE TABLE is not
    "if not exists" under create_all's check-then-create).
    """
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(SCHEMA_LOCK_KEY)))
        metadata.create_all(conn, tables=list(DOMAIN_TABLES))


# --- frames -------------------------------------------------------------------------------


def normalize_keys(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with key columns in one canonical dtype, so merges compare like with like.

    `time_point` becomes naive-UTC `datetime64[us]` (the databases keep microseconds),
    `object_id` int64, the text columns `object` strings.
    """
    import numpy as np
    import pandas as pd

    missing = [column for column in KEY_COLUMNS if column not in frame.columns]
    if missing:
        raise ValueError(f"effect key frame is missing column(s) {missing}")
    out = frame.copy()
    time_point = out["time_point"]
    if isinstance(time_point.dtype, pd.DatetimeTZDtype):
        time_point = time_point.dt.tz_convert("UTC").dt.tz_localize(None)
    out["time_point"] = pd.to_datetime(time_point).astype("datetime64[us]")
    out["object_id"] = out["object_id"].astype(np.int64)
    for column in ("rule", "object_type", "channel"):
        out[column] = out[column].astype(object)
    return out


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts of plain Python values for executemany (datetimes, ints, None).

    Converted column by column (drivers cannot bind numpy scalars or NaT).
    """
    import pandas as pd

    columns: dict[str, np.ndarray] = {}
    for name in frame.columns:
        series = frame[name]
        if pd.api.types.is_datetime64_any_dtype(series.dtype):
            columns[str(name)] = series.to_numpy(dtype="datetime64[us]").astype(object)
        else:
            values = series.astype(object).to_numpy()
            values[pd.isna(values)] = None
            columns[str(name)] = values
    names = list(columns)
    return [dict(zip(names, row, strict=True)) for row in zip(*columns.values(), strict=True)]


def read_effects(connectable: sa.Engine | sa.Connection, keys: pd.DataFrame) -> pd.DataFrame:
    """The `side_effects` rows for the keys in `keys` (columns: id, KEY_COLUMNS, status,
    attempts, error), in `keys` order where found.

    One range query per rule (served by the (rule, time_point) index), then an exact
    match on the full key in pandas.
    """
    import pandas as pd

    columns = ["id", *KEY_COLUMNS, "status", "attempts", "error"]
    if keys.empty:
        return pd.DataFrame(columns=columns)
    keys = normalize_keys(keys[list(KEY_COLUMNS)]).drop_duplicates()
    found: list[pd.DataFrame] = []
    for rule, group in keys.groupby("rule", sort=True):
        lo, hi = group["time_point"].min(), group["time_point"].max()
        statement = (
            sa.select(*(side_effects.c[name] for name in columns))
            .where(
                side_effects.c.rule == rule,
                side_effects.c.time_point >= lo.to_pydatetime(),
                side_effects.c.time_point <= hi.to_pydatetime(),
            )
            .order_by(side_effects.c.id)
        )
        if isinstance(connectable, sa.Engine):
            frame = read_frame_from(connectable, statement, parse_dates=["time_point"])
        else:
            result = connectable.execute(statement)
            frame = pd.DataFrame(result.fetchall(), columns=list(result.keys()))
            if not frame.empty:
                frame["time_point"] = naive_utc_series(frame["time_point"])
        if frame.empty:
            continue
        frame = normalize_keys(frame)
        found.append(frame.merge(group, on=list(KEY_COLUMNS), how="inner"))
    if not found:
        return pd.DataFrame(columns=columns)
    return pd.concat(found, ignore_index=True)[columns]


def classify_effects(keys: pd.DataFrame, existing: pd.DataFrame) -> pd.DataFrame:
    """`keys` plus `effect_id` (nullable) and `state`: `new`, or the stored status.

    Vectorised left merge on the key; `keys` index and order are kept.
    """
    import pandas as pd

    normalized = normalize_keys(keys)
    if existing.empty:
        out = keys.copy()
        out["effect_id"] = pd.array([pd.NA] * len(out), dtype="Int64")
        out["state"] = STATE_NEW
        return out
    lookup = normalize_keys(existing[["id", *KEY_COLUMNS, "status"]])
    merged = normalized[list(KEY_COLUMNS)].merge(
        lookup, on=list(KEY_COLUMNS), how="left", validate="many_to_one"
    )
    out = keys.copy()
    out["effect_id"] = pd.array(merged["id"].to_numpy(), dtype="Int64")
    out["state"] = merged["status"].fillna(STATE_NEW).to_numpy()
    return out


# --- claims -------------------------------------------------------------------------------


def _insert_ignoring_conflicts(
    conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]], index_elements: Sequence[str]
) -> None:
    """INSERT ... ON CONFLICT (index_elements) DO NOTHING, on SQLite and PostgreSQL."""
    if not rows:
        return
    dialect = conn.dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        conn.execute(pg_insert(table).on_conflict_do_nothing(index_elements=index_elements), rows)
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        conn.execute(
            sqlite_insert(table).on_conflict_do_nothing(index_elements=index_elements), rows
        )
    else:  # pragma: no cover - the store supports these two backends only
        raise ValueError(f"unsupported database dialect {dialect!r} (use SQLite or PostgreSQL)")


def claim_effects(
    conn: sa.Connection,
    candidates: pd.DataFrame,
    *,
    at: datetime,
    task_key: str,
    entry_key: str,
) -> pd.DataFrame:
    """Claim the effects in `candidates` for this transaction; return what was claimed.

    `candidates` has KEY_COLUMNS, `effect_id` and `state` (from `classify_effects`):
    - `new` rows are inserted `in_flight` with ON CONFLICT DO NOTHING, so a key another
      run recorded meanwhile is simply not claimed;
    - `failed` rows are taken over by compare-and-set (`WHERE status = 'failed'`),
      counting the attempt.
    Rows in any other state are ignored. Returns `effect_id`, KEY_COLUMNS and `attempts`
    of exactly the rows claimed (found again by this claim's token). The caller settles
    them with `settle_effects` -- in the same transaction for a transactional side
    effect, so nobody else ever sees them `in_flight`.
    """
    import pandas as pd

    token = uuid.uuid4().hex
    at = naive_utc(at)
    base = {
        "status": EFFECT_IN_FLIGHT,
        "claim_token": token,
        "task_key": task_key,
        "entry_key": entry_key,
        "first_at": at,
        "last_at": at,
        "attempts": 1,
    }
    new = normalize_keys(candidates.loc[candidates["state"] == STATE_NEW, list(KEY_COLUMNS)])
    rows = [{**base, **row} for row in records(new.drop_duplicates())]
    for start in range(0, len(rows), 1000):
        _insert_ignoring_conflicts(
            conn, side_effects, rows[start : start + 1000], list(KEY_COLUMNS)
        )
    retry_ids = unique_ids(
        candidates.loc[candidates["state"] == EFFECT_FAILED, "effect_id"].dropna()
    )
    for chunk in chunks(retry_ids):
        conn.execute(
            sa.update(side_effects)
            .where(side_effects.c.id.in_(chunk), side_effects.c.status == EFFECT_FAILED)
            .values(
                status=EFFECT_IN_FLIGHT,
                claim_token=token,
                attempts=side_effects.c.attempts + 1,
                task_key=task_key,
                entry_key=entry_key,
                last_at=at,
            )
        )
    result = conn.execute(
        sa.select(
            side_effects.c.id.label("effect_id"),
            *(side_effects.c[name] for name in KEY_COLUMNS),
            side_effects.c.attempts,
        )
        .where(side_effects.c.claim_token == token)
        .order_by(side_effects.c.id)
    )
    claimed = pd.DataFrame(result.fetchall(), columns=list(result.keys()))
    if claimed.empty:
        return pd.DataFrame(columns=["effect_id", *KEY_COLUMNS, "attempts"])
    claimed["time_point"] = naive_utc_series(claimed["time_point"])
    return normalize_keys(claimed)


def settle_effects(
    conn: sa.Connection,
    *,
    succeeded: Iterable[Any],
    failed: Mapping[int, str] | None = None,
    at: datetime,
) -> None:
    """Finish claimed effects: `succeeded` ids become `succeeded`, `failed` ids `failed`
    with their error text. Only `in_flight` rows change (compare-and-set)."""
    at = naive_utc(at)
    for chunk in chunks(unique_ids(succeeded)):
        conn.execute(
            sa.update(side_effects)
            .where(side_effects.c.id.in_(chunk), side_effects.c.status == EFFECT_IN_FLIGHT)
            .values(status=EFFECT_SUCCEEDED, succeeded_at=at, error=None)
        )
    if failed:
        conn.execute(
            sa.update(side_effects)
            .where(
                side_effects.c.id == sa.bindparam("b_id"),
                side_effects.c.status == EFFECT_IN_FLIGHT,
            )
            .values(status=EFFECT_FAILED, error=sa.bindparam("b_error")),
            [
                {"b_id": int(effect_id), "b_error": str(error)[:2000]}
                for effect_id, error in failed.items()
            ],
        )
