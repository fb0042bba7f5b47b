"""Indexes for `runs list` filters and `summary` counts.

Revision ID: 0002_list_and_summary_indexes
Revises: 0001_initial
Create Date: 2026-12-01

Measured with bench/ledger_queries.py on 1,000,000 entries: without them SQLite sorts
every matching row for ``--status success`` (1.4 s p95) and ``--task`` (80 ms), and both
backends scan the newest-first index filtering out rows for rare statuses.

- ``(status, created_at, id)`` and ``(task_key, created_at, id)``: newest-first pages of one
  status / one task are index range scans in the list order, no sort.
- Partial ``(status, finished_at) WHERE finished_at IS NOT NULL``: the 24-hour terminal
  counts of `summary`. Partial, so running entries (heartbeats) never touch it.
  (`summary`'s dispatch count needs no index of its own: ``dispatch_failed`` rows are few
  and found by status; an index on ``updated_at`` would make every summary or hook update
  of a row a non-HOT update on PostgreSQL.)

Additive only; the downgrade drops nothing but these indexes.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_list_and_summary_indexes"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FINISHED = "finished_at IS NOT NULL"


def upgrade() -> None:
    op.create_index(
        "ix_dueledger_entries_status_created_id",
        "dueledger_entries",
        ["status", "created_at", "id"],
    )
    op.create_index(
        "ix_dueledger_entries_task_created_id",
        "dueledger_entries",
        ["task_key", "created_at", "id"],
    )
    op.create_index(
        "ix_dueledger_entries_status_finished",
        "dueledger_entries",
        ["status", "finished_at"],
        postgresql_where=sa.text(FINISHED),
        sqlite_where=sa.text(FINISHED),
    )


def downgrade() -> None:
    # Indexes only: no ledger data is touched.
    op.drop_index("ix_dueledger_entries_status_finished", "dueledger_entries")
    op.drop_index("ix_dueledger_entries_task_created_id", "dueledger_entries")
    op.drop_index("ix_dueledger_entries_status_created_id", "dueledger_entries")
