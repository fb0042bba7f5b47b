"""Indexes for what the sensors read each tick: ``(status, due)`` and ``(updated_at)``.

Revision ID: 0008_sensor_read_indexes
Revises: 0007_scheduling_policies
Create Date: 2026-12-03

- ``(status, due)``: one sensor re-dispatches every task (``sensors/redispatch.py``); each
  evaluation reads the current slot's ``dispatch_failed`` and ``queued`` entries
  (``RunLedger.entries_of_due``): a range of exactly those rows.
- ``(updated_at)``: ``slot_health_sensor`` reads the entries that changed since its
  previous evaluation (``RunLedger.entries_updated_since``: reclaims, dispatch failures,
  entries whose check may have changed) instead of every entry of the last day.

With them a tick's reads follow what changed, not the size of the ledger nor the number of
tasks (bench/scale.py measures both sensors on 10,000 and 100,000 entries). Write cost:
``status`` and ``lease_expires_at`` are indexed already, so a claim, heartbeat, finish or
reclaim was never a HOT update on PostgreSQL; ``due`` never changes; only an update of the
summary alone (a hook's result) stops being HOT because of ``updated_at``.

Additive only; the downgrade drops these indexes and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008_sensor_read_indexes"
down_revision: str | None = "0007_scheduling_policies"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "dueledger_entries"
STATUS_DUE = "ix_dueledger_entries_status_due"
UPDATED = "ix_dueledger_entries_updated_at"


def upgrade() -> None:
    op.create_index(STATUS_DUE, TABLE, ["status", "due"])
    op.create_index(UPDATED, TABLE, ["updated_at"])


def downgrade() -> None:
    # Indexes only: no ledger data is touched.
    op.drop_index(UPDATED, TABLE)
    op.drop_index(STATUS_DUE, TABLE)
