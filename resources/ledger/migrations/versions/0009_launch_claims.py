"""Launch claims: the catch-up that may submit a due entry's run, taken before it submits.

Revision ID: 0009_launch_claims
Revises: 0008_sensor_read_indexes
Create Date: 2026-12-05

``dueledger_launch_claims``: one row per catch-up entry whose run a `dueledger catch-up` is
submitting or has submitted. The row is inserted in the transaction that creates the entry
(with its audit record), so a second catch-up of an overlapping range finds it taken and
launches nothing for that due. ``claimed_by`` names the process (host, pid, start time) and
``claimed_at`` when; ``run_id``/``submitted_at`` are set once Dagster accepted the run. A
claim never submitted is taken over by a later catch-up only when its holder can no longer
submit (orchestration/catch_up.py says when), with a compare-and-set on ``claimed_by``.

Self-contained (no import of schema.py). Additive only: a new table; the downgrade refuses,
as the rows say which catch-up launched which due.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_launch_claims"
down_revision: str | None = "0008_sensor_read_indexes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LAUNCH_CLAIMS = "dueledger_launch_claims"
ID_TYPE = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        LAUNCH_CLAIMS,
        sa.Column("entry_id", ID_TYPE, primary_key=True),
        sa.Column("claimed_by", sa.String(300), nullable=False),
        sa.Column("claimed_at", sa.DateTime(), nullable=False),
        sa.Column("run_id", sa.String(255), nullable=True),
        sa.Column("submitted_at", sa.DateTime(), nullable=True),
    )


def downgrade() -> None:
    raise RuntimeError(
        f"refusing to downgrade {revision}: {LAUNCH_CLAIMS} says which catch-up launched "
        f"which due (ledger migrations are add-only: nothing that holds ledger history is "
        f"ever dropped)"
    )
