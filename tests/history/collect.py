"""Reading the end state of a fault test into history records: the ledger as `runs show`
and `summary` give it, the audit trail, the dues the summary reports missed, and the effect
sink. Shared by the in-process harness and the real-daemon topologies, so every history is
read the same way.

The sink (``history_effects``) and the claim log (``history_claims``) are tables a test's
task body writes: the claim log right after a claim (one row per process holding a token),
the sink inside the side effect's fenced transaction, with no unique constraint, so a
second delivery of one effect is visible.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from history.history_format import Record, stamp

from orchestration.services.summary import all_entries
from resources.core.entry import Entry
from resources.ledger import RunLedger

MISSED_REASON = (
    "reported by `dueledger summary` (missed_dues): no ledger entry and no Dagster run for "
    "this due, the scheduler did not fire it"
)

sink_metadata = sa.MetaData()
#: One row per side effect as the outside world saw it (no unique constraint on purpose).
history_effects = sa.Table(
    "history_effects",
    sink_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("task", sa.String(200), nullable=False),
    sa.Column("due", sa.String(32), nullable=False),
    sa.Column("effect", sa.String(200), nullable=False),
    sa.Column("entry_id", sa.BigInteger, nullable=False),
    sa.Column("run_id", sa.String(255), nullable=False),
    sa.Column("token", sa.BigInteger, nullable=False),
    sa.Column("worker", sa.String(200), nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=True),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
)
#: The idempotency key of an effect, as the domain keeps one (resources/idempotency.py).
history_effect_keys = sa.Table(
    "history_effect_keys",
    sink_metadata,
    sa.Column("task", sa.String(200), primary_key=True),
    sa.Column("due", sa.String(32), primary_key=True),
    sa.Column("effect", sa.String(200), primary_key=True),
)
#: One row per process that got a claim (entry, token): two processes of one run show here.
history_claims = sa.Table(
    "history_claims",
    sink_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("entry_id", sa.BigInteger, nullable=False),
    sa.Column("run_id", sa.String(255), nullable=False),
    sa.Column("token", sa.BigInteger, nullable=False),
    sa.Column("worker", sa.String(200), nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=True),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
)


def create_sink(engine: sa.Engine) -> None:
    """Create the sink tables (idempotent)."""
    sink_metadata.create_all(engine)


def insert_ignoring_conflict(conn: sa.Connection, table: sa.Table, **values: Any) -> bool:
    """Insert unless the key exists; True when this call inserted the row."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert  # the dialect's own upsert
    else:
        from sqlalchemy.dialects.sqlite import insert  # the dialect's own upsert
    return bool(conn.execute(insert(table).values(**values).on_conflict_do_nothing()).rowcount)


def _utc(value: datetime) -> datetime:
    # SQLite hands a timezone-aware column back naive (in UTC, as it was written).
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _seq(value: Any) -> dict[str, Any]:
    return {} if value is None else {"seq": int(value)}


def sink_records(engine: sa.Engine) -> Iterator[Record]:
    """``claim`` and ``effect`` records from the sink tables."""
    with engine.connect() as conn:
        for row in conn.execute(sa.select(history_claims).order_by(history_claims.c.id)):
            yield {
                "type": "claim",
                "entry_id": int(row.entry_id),
                "run_id": row.run_id,
                "token": int(row.token),
                "worker": row.worker,
                "at": stamp(_utc(row.at)),
                **_seq(row.seq),
            }
        for row in conn.execute(sa.select(history_effects).order_by(history_effects.c.id)):
            yield {
                "type": "effect",
                "task": row.task,
                "due": row.due,
                "effect": row.effect,
                "entry_id": int(row.entry_id),
                "run_id": row.run_id,
                "token": int(row.token),
                "worker": row.worker,
                "at": stamp(_utc(row.at)),
                **_seq(row.seq),
            }


def ledger_records(ledger: RunLedger) -> tuple[list[Entry], list[Record]]:
    """Every entry (``runs show``'s JSON) and every audit record the ledger holds."""
    entries = sorted(all_entries(ledger), key=lambda e: e.id)
    records: list[Record] = [{"type": "entry", **e.to_json()} for e in entries]
    seen: set[int] = set()
    for entry in entries:
        if entry.parent_id is None and entry.manual_retry_at is None:
            continue
        for item in ledger.audit_for(entry.id):
            if item["id"] not in seen:
                seen.add(item["id"])
                records.append({"type": "audit", **item})
    return entries, records


def summary_records(
    summary: Mapping[str, Any], tasks: Iterable[str], dues: Iterable[datetime]
) -> list[Record]:
    """The summary itself and one ``missed`` record per missed due of ``tasks`` among
    ``dues`` (the test's window: the audit also reports dues after it, never fired)."""
    wanted = set(tasks)
    window = {due.strftime("%Y-%m-%dT%H:%M:%SZ") for due in dues}
    records: list[Record] = [{"type": "summary", **summary}]
    for row in summary.get("tasks", []):
        if row["task_key"] in wanted:
            for due in row.get("missed_dues", []):
                if due not in window:
                    continue
                records.append(
                    {"type": "missed", "task": row["task_key"], "due": due, "reason": MISSED_REASON}
                )
    return records


def due_records(tasks: Sequence[str], dues: Sequence[datetime]) -> list[Record]:
    """One ``due`` record per task and due."""
    return [
        {"type": "due", "task": task, "due": due.strftime("%Y-%m-%dT%H:%M:%SZ")}
        for task in tasks
        for due in dues
    ]
