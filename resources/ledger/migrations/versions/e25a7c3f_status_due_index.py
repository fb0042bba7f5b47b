"""Index ``(status, due)`` for the re-dispatch sensor (issue 25).

Revision ID: e25a7c3f_status_due_index
Revises: 0004_alert_deliveries
Create Date: 2026-12-03

One sensor re-dispatches every task (``sensors/redispatch.py``); each evaluation reads the
current slot's ``dispatch_failed`` and ``queued`` entries (``RunLedger.entries_of_due``).
With this index that read is a range of exactly those rows, so its cost follows the entries
that may need a re-dispatch, not the size of the ledger nor the number of tasks. ``status``
is indexed already, so a status change was never a HOT update on PostgreSQL; ``due`` never
changes after insert: the index adds no write cost to the hot path's updates.

Additive only (DESIGN rule 6); the downgrade drops this index and nothing else. Named by a
unique revision id rather than a number: other revisions may be written beside it and are
chained at merge.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "e25a7c3f_status_due_index"
down_revision: str | None = "0004_alert_deliveries"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_dueledger_entries_status_due"
TABLE = "dueledger_entries"


def upgrade() -> None:
    op.create_index(INDEX, TABLE, ["status", "due"])


def downgrade() -> None:
    # An index only: no ledger data is touched.
    op.drop_index(INDEX, TABLE)
