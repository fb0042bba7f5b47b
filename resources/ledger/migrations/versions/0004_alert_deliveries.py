"""Alert delivery records: one row per (channel, alert kind, subject).

Revision ID: 0004_alert_deliveries
Revises: 0003_claim_generation
Create Date: 2026-12-02

An alert (a lease reclaim, a dispatch failure, a slot's health report...) is delivered to each
configured channel (webhook, email) once: the row is inserted insert-or-ignore on
``(channel, kind, subject)`` when the alert is emitted, then attempted, retried with backoff
while the channel is down, and settled ``delivered`` or ``failed`` with the error
(resources/ledger/deliveries.py).

Self-contained (its own types, no import of schema.py) so it can be renumbered on its own.
Additive only: a new table, nothing else is touched.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004_alert_deliveries"
down_revision: str | None = "0003_claim_generation"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "dueledger_alert_deliveries"
ID_TYPE = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
DUE = "next_attempt_at IS NOT NULL"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", ID_TYPE, primary_key=True, autoincrement=True),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(400), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("payload", JSON_TYPE, nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("last_attempt_at", sa.DateTime(), nullable=True),
        sa.Column("next_attempt_at", sa.DateTime(), nullable=True),
        sa.Column("delivered_at", sa.DateTime(), nullable=True),
        sa.UniqueConstraint(
            "channel", "kind", "subject", name="uq_dueledger_alert_deliveries_channel_kind_subject"
        ),
        sqlite_autoincrement=True,
    )
    op.create_index(
        "ix_dueledger_alert_deliveries_next_attempt",
        TABLE,
        ["next_attempt_at"],
        postgresql_where=sa.text(DUE),
        sqlite_where=sa.text(DUE),
    )


def downgrade() -> None:
    # Dropping the table would delete the record of which alerts reached whom.
    raise RuntimeError(
        f"refusing to downgrade {revision}: it would drop {TABLE} with its delivery records "
        f"(ledger migrations are add-only: nothing that holds ledger history is ever dropped)"
    )
