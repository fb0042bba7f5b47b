"""Task schedules as the scheduler ran them, and pauses: what tells a missed due from one that
was never expected or was paused.

Revision ID: 0005_schedules_and_pauses
Revises: 0004_alert_deliveries
Create Date: 2026-12-04

``dueledger_schedules``: one row per task, mirrored from Dagster's schedule state by the
outcome sensor: since when the task's schedule has run here (``first_started_at``: its
earliest start, so dues before a fresh deployment are not "missed"), whether it runs now.
``dueledger_pauses``: one row per pause of a task (a schedule stopped in the Dagster UI, or
paused through the CLI): dues inside a pause are paused, not missed. Rows are closed
(``resumed_at``), never deleted.

Self-contained (its own types, no import of schema.py) so it can be renumbered on its own.
Additive only: two new tables, nothing else is touched.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_schedules_and_pauses"
down_revision: str | None = "0004_alert_deliveries"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEDULES = "dueledger_schedules"
PAUSES = "dueledger_pauses"
ID_TYPE = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        SCHEDULES,
        sa.Column("task_key", sa.String(200), primary_key=True),
        sa.Column("schedule_name", sa.String(300), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("first_started_at", sa.DateTime(), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("observed_at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        PAUSES,
        sa.Column("id", ID_TYPE, primary_key=True, autoincrement=True),
        sa.Column("task_key", sa.String(200), nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("paused_at", sa.DateTime(), nullable=False),
        sa.Column("paused_by", sa.String(200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("resumed_at", sa.DateTime(), nullable=True),
        sa.Column("resumed_by", sa.String(200), nullable=True),
        sa.Column("resume_reason", sa.Text(), nullable=True),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_dueledger_pauses_task", PAUSES, ["task_key", "paused_at"])


def downgrade() -> None:
    # Dropping the tables would lose when tasks ran and why they were paused.
    raise RuntimeError(
        f"refusing to downgrade {revision}: it would drop {SCHEDULES} and {PAUSES} "
        f"(ledger migrations are add-only: nothing that holds ledger history is ever dropped)"
    )
