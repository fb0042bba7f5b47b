"""Initial ledger schema: entries and audit.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-30

Frozen: this file describes the schema as first released. Later changes are new,
additive revisions; ``resources/ledger/schema.py`` describes the current shape.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID_TYPE = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "dueledger_entries",
        sa.Column("id", ID_TYPE, primary_key=True, autoincrement=True),
        sa.Column("task_key", sa.String(200), nullable=False),
        sa.Column("trigger", sa.String(32), nullable=False),
        sa.Column("origin", sa.String(16), nullable=False),
        sa.Column("dedup_key", sa.String(400), nullable=False),
        sa.Column("due", sa.DateTime(), nullable=True),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column(
            "parent_id",
            ID_TYPE,
            sa.ForeignKey("dueledger_entries.id", name="fk_dueledger_entries_parent_id"),
            nullable=True,
        ),
        sa.Column("run_ids", JSON_TYPE, nullable=False),
        sa.Column("lease_owner", sa.String(255), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("operator", sa.String(200), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("failure_kind", sa.String(32), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("summary", JSON_TYPE, nullable=False),
        sa.Column("manual_retry_at", sa.DateTime(), nullable=True),
        sa.Column("manual_retry_by", sa.String(200), nullable=True),
        sa.UniqueConstraint(
            "task_key", "origin", "dedup_key", name="uq_dueledger_entries_task_origin_dedup"
        ),
        sqlite_autoincrement=True,
    )
    op.create_index(
        "ix_dueledger_entries_task_status_created",
        "dueledger_entries",
        ["task_key", "status", "created_at"],
    )
    op.create_index(
        "ix_dueledger_entries_status_lease", "dueledger_entries", ["status", "lease_expires_at"]
    )
    op.create_index("ix_dueledger_entries_parent", "dueledger_entries", ["parent_id"])
    op.create_index(
        "ix_dueledger_entries_trigger_created", "dueledger_entries", ["trigger", "created_at"]
    )
    op.create_index("ix_dueledger_entries_created_id", "dueledger_entries", ["created_at", "id"])

    op.create_table(
        "dueledger_audit",
        sa.Column("id", ID_TYPE, primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("operator", sa.String(200), nullable=True),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("entry_id", ID_TYPE, nullable=True),
        sa.Column("child_entry_id", ID_TYPE, nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("checks", JSON_TYPE, nullable=True),
        sa.Column("outcome", sa.Text(), nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_dueledger_audit_entry", "dueledger_audit", ["entry_id"])
    op.create_index("ix_dueledger_audit_child", "dueledger_audit", ["child_entry_id"])
    op.create_index("ix_dueledger_audit_at", "dueledger_audit", ["at"])


def downgrade() -> None:
    # Dropping these tables would delete the ledger: who ran what, why, and every error.
    raise RuntimeError(
        "refusing to downgrade the initial ledger revision: it would drop dueledger_entries "
        "and dueledger_audit with their data (ledger migrations are add-only: nothing that "
        "holds ledger history is ever dropped); "
        "to start over, point DUELEDGER_DATABASE_URL at a new, empty database instead"
    )
