"""The claim generation: the fencing token a run's side effects are checked against.

Revision ID: 0003_claim_generation
Revises: 0002_list_and_summary_indexes
Create Date: 2026-12-02

Every successful claim increments ``claim_generation``; a claim hands the run (entry, run id,
generation) as its fence, and each domain side effect commits only while the entry is still
``running`` under that owner and generation. Existing rows start at 0; the first claim
after the upgrade makes an entry's generation 1.

Additive only: the downgrade refuses, because dropping the column would
discard the tokens that running runs hold.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_claim_generation"
down_revision: str | None = "0002_list_and_summary_indexes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "dueledger_entries",
        sa.Column("claim_generation", sa.BigInteger(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    raise RuntimeError(
        "refusing to downgrade 0003_claim_generation: dropping dueledger_entries.claim_generation "
        "would discard the fencing tokens of running runs (ledger migrations are add-only, "
        "nothing that holds ledger history is ever dropped)"
    )
