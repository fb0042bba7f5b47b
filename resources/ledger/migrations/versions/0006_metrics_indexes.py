"""Indexes that keep a Prometheus scrape cheap on a large ledger.

Revision ID: 0006_metrics_indexes
Revises: 0005_schedules_and_pauses
Create Date: 2026-12-04

`dueledger metrics serve|write` (orchestration/services/metrics.py) reads the ledger at every
scrape. Measured with bench/metrics_scrape.py on 1,000,000 entries: without these, counting
entries by task/status/trigger/failure kind reads every row (SQLite 3.2 s), and finding
refused runs and hook failures parses every entry's JSON summary.

- ``(task_key, status, trigger, failure_kind)``: ``dueledger_entries_total`` and
  ``dueledger_open_entries`` are one GROUP BY answered from this index alone.
- ``(task_key, status, finished_at) WHERE finished_at IS NOT NULL``: a task's last success
  is one index seek. Partial: running entries (heartbeats) never touch it.
- ``(task_key) WHERE`` the entry's ``late_job_rejections`` is not empty, and ``(task_key)
  WHERE`` its ``hooks`` outcomes hold a failure: the few entries that have them are found
  without reading the others. The predicates never raise (a summary that is not valid JSON
  is simply not indexed), so no write can fail because of them; the query side repeats them
  word for word (resources/ledger/schema.py), or the planner would not use the index. On
  PostgreSQL both are containment tests (``@>``): the planner estimates those as rare and
  uses the index, where a ``<> '[]'`` test was estimated at half the table and scanned it.

Self-contained (no import of schema.py). Additive only; the downgrade drops
nothing but these indexes. On PostgreSQL the upgrade builds them inside the migration's
transaction, which holds writes to the entries table back while it runs (about 4 s per
million entries here; docs/deployment.md, "Migrating the ledger").
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_metrics_indexes"
down_revision: str | None = "0005_schedules_and_pauses"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "dueledger_entries"
FINISHED = "finished_at IS NOT NULL"

_SQLITE_SUMMARY = "CASE WHEN json_valid(summary) THEN summary END"
SQLITE_REJECTED = f"json_array_length({_SQLITE_SUMMARY}, '$.late_job_rejections') > 0"
PG_REJECTED = "(summary -> 'late_job_rejections') @> '[{}]'::jsonb"
_FAILED_OUTCOMES = ("error", "timeout", "invalid")
SQLITE_HOOK_FAILED = " OR ".join(
    f"instr(json_extract({_SQLITE_SUMMARY}, '$.hooks'), '\"outcome\":\"{o}\"') > 0"
    for o in _FAILED_OUTCOMES
)
PG_HOOK_FAILED = " OR ".join(
    f"(summary -> 'hooks') @> '[{{\"outcome\": \"{o}\"}}]'::jsonb" for o in _FAILED_OUTCOMES
)


def upgrade() -> None:
    op.create_index(
        "ix_dueledger_entries_task_status_trigger_kind",
        TABLE,
        ["task_key", "status", "trigger", "failure_kind"],
    )
    op.create_index(
        "ix_dueledger_entries_task_status_finished",
        TABLE,
        ["task_key", "status", "finished_at"],
        postgresql_where=sa.text(FINISHED),
        sqlite_where=sa.text(FINISHED),
    )
    op.create_index(
        "ix_dueledger_entries_rejected",
        TABLE,
        ["task_key"],
        postgresql_where=sa.text(PG_REJECTED),
        sqlite_where=sa.text(SQLITE_REJECTED),
    )
    op.create_index(
        "ix_dueledger_entries_hook_failed",
        TABLE,
        ["task_key"],
        postgresql_where=sa.text(PG_HOOK_FAILED),
        sqlite_where=sa.text(SQLITE_HOOK_FAILED),
    )


def downgrade() -> None:
    # Indexes only: no ledger data is touched.
    for name in (
        "ix_dueledger_entries_hook_failed",
        "ix_dueledger_entries_rejected",
        "ix_dueledger_entries_task_status_finished",
        "ix_dueledger_entries_task_status_trigger_kind",
    ):
        op.drop_index(name, TABLE)
