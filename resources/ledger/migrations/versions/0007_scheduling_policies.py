"""Scheduling policies: a lock row per task for the overlap decision, and at most
one open pause per task and source.

Revision ID: 0007_scheduling_policies
Revises: 0006_metrics_indexes
Create Date: 2026-12-05

``dueledger_task_locks``: one row per task whose overlap policy the ledger decides (``skip``,
``buffer_one``, ``replace``). A claim of such a task locks its row first (PostgreSQL ``SELECT
... FOR UPDATE``; SQLite holds the database write lock anyway), so two runs starting at once
decide one after the other; the row also names the run waiting for its turn under
``buffer_one`` (``waiting_entry_id``, alive until ``waiting_until``).

``ux_dueledger_pauses_open``: a unique index over ``(task_key, source)`` of the pauses not yet
resumed, so two processes pausing a task at once (two daemons pausing on failure, a CLI pause
racing another) leave one open pause, never two.

Self-contained (no import of schema.py). Additive only: a new table and a new
index; the downgrade refuses, as the lock rows name waiting runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_scheduling_policies"
down_revision: str | None = "0006_metrics_indexes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TASK_LOCKS = "dueledger_task_locks"
PAUSES = "dueledger_pauses"
ID_TYPE = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
OPEN = "resumed_at IS NULL"


def upgrade() -> None:
    op.create_table(
        TASK_LOCKS,
        sa.Column("task_key", sa.String(200), primary_key=True),
        sa.Column("waiting_entry_id", ID_TYPE, nullable=True),
        sa.Column("waiting_run_id", sa.String(255), nullable=True),
        sa.Column("waiting_until", sa.DateTime(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
    )
    op.create_index(
        "ux_dueledger_pauses_open",
        PAUSES,
        ["task_key", "source"],
        unique=True,
        postgresql_where=sa.text(OPEN),
        sqlite_where=sa.text(OPEN),
    )


def downgrade() -> None:
    raise RuntimeError(
        f"refusing to downgrade {revision}: {TASK_LOCKS} names runs waiting for their turn "
        f"(ledger migrations are add-only: nothing that holds ledger history is ever dropped)"
    )
