"""Table definitions of the run ledger (SQLAlchemy Core), shared by the code and its tests.

The tables themselves are created by the Alembic migrations in ``resources/ledger/migrations``
(``RunLedger.migrate()``); this module describes the *current* shape so that queries can
be built from it. A test compares it with what the migrations produce, so the two cannot
drift apart unnoticed.

Conventions:
- Times are stored timezone-naive in UTC (``DateTime`` without time zone on both
  dialects); the ledger API converts at its boundary.
- JSON columns are ``JSONB`` on PostgreSQL (appendable in SQL with ``||``) and SQLite's
  JSON text elsewhere.
- Ids are 64-bit on PostgreSQL; SQLite uses ``INTEGER PRIMARY KEY AUTOINCREMENT`` so ids are
  never reused (the ledger never deletes rows, but an id must never mean two entries).
"""

from __future__ import annotations

from typing import Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

ENTRIES_TABLE: Final = "dueledger_entries"
AUDIT_TABLE: Final = "dueledger_audit"
ALERT_DELIVERIES_TABLE: Final = "dueledger_alert_deliveries"
SCHEDULES_TABLE: Final = "dueledger_schedules"
PAUSES_TABLE: Final = "dueledger_pauses"
TASK_LOCKS_TABLE: Final = "dueledger_task_locks"
LAUNCH_CLAIMS_TABLE: Final = "dueledger_launch_claims"
#: Alembic's version table for the ledger. Not ``alembic_version``: the ledger may live in the
#: same PostgreSQL database as Dagster's own storage, which has its own Alembic history there.
VERSION_TABLE: Final = "dueledger_alembic_version"

ID_TYPE = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

# The predicates of migration 0006's partial indexes, word for word: a query finds the few
# entries with refused runs or failed hooks through them only when its WHERE is the same.
# They never raise (a summary that is not valid JSON is simply not indexed).
_SQLITE_SUMMARY = "CASE WHEN json_valid(summary) THEN summary END"
SQLITE_REJECTED: Final = f"json_array_length({_SQLITE_SUMMARY}, '$.late_job_rejections') > 0"
PG_REJECTED: Final = "(summary -> 'late_job_rejections') @> '[{}]'::jsonb"
_FAILED_OUTCOMES = ("error", "timeout", "invalid")  # resources/core/metric_model.py, a test checks
SQLITE_HOOK_FAILED: Final = " OR ".join(
    f"instr(json_extract({_SQLITE_SUMMARY}, '$.hooks'), '\"outcome\":\"{o}\"') > 0"
    for o in _FAILED_OUTCOMES
)
PG_HOOK_FAILED: Final = " OR ".join(
    f"(summary -> 'hooks') @> '[{{\"outcome\": \"{o}\"}}]'::jsonb" for o in _FAILED_OUTCOMES
)

metadata = sa.MetaData()

entries = sa.Table(
    ENTRIES_TABLE,
    metadata,
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
        # No ON DELETE CASCADE: deleting a parent must never take its lineage with it.
        sa.ForeignKey(f"{ENTRIES_TABLE}.id", name="fk_dueledger_entries_parent_id"),
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
    # Migration 0003: incremented by every successful claim; with the lease owner
    # it is the fencing token a run's side effects are checked against (resources/core/fence.py).
    sa.Column("claim_generation", sa.BigInteger(), nullable=False, server_default="0"),
    sa.UniqueConstraint(
        "task_key", "origin", "dedup_key", name="uq_dueledger_entries_task_origin_dedup"
    ),
    sa.Index("ix_dueledger_entries_task_status_created", "task_key", "status", "created_at"),
    sa.Index("ix_dueledger_entries_status_lease", "status", "lease_expires_at"),
    sa.Index("ix_dueledger_entries_parent", "parent_id"),
    sa.Index("ix_dueledger_entries_trigger_created", "trigger", "created_at"),
    sa.Index("ix_dueledger_entries_created_id", "created_at", "id"),
    # Migration 0002: `runs list` by status / task, `summary` counts.
    sa.Index("ix_dueledger_entries_status_created_id", "status", "created_at", "id"),
    sa.Index("ix_dueledger_entries_task_created_id", "task_key", "created_at", "id"),
    sa.Index(
        "ix_dueledger_entries_status_finished",
        "status",
        "finished_at",
        postgresql_where=sa.text("finished_at IS NOT NULL"),
        sqlite_where=sa.text("finished_at IS NOT NULL"),
    ),
    # Migration 0008: what the sensors read each tick -- one slot's entries of
    # a few statuses (re-dispatch), the entries changed since a time (slot health) -- are
    # index ranges of exactly those rows whatever the ledger's size.
    sa.Index("ix_dueledger_entries_status_due", "status", "due"),
    sa.Index("ix_dueledger_entries_updated_at", "updated_at"),
    # Migration 0006: the Prometheus scrape (resources/ledger/scrape_queries.py).
    sa.Index(
        "ix_dueledger_entries_task_status_trigger_kind",
        "task_key",
        "status",
        "trigger",
        "failure_kind",
    ),
    sa.Index(
        "ix_dueledger_entries_task_status_finished",
        "task_key",
        "status",
        "finished_at",
        postgresql_where=sa.text("finished_at IS NOT NULL"),
        sqlite_where=sa.text("finished_at IS NOT NULL"),
    ),
    sa.Index(
        "ix_dueledger_entries_rejected",
        "task_key",
        postgresql_where=sa.text(PG_REJECTED),
        sqlite_where=sa.text(SQLITE_REJECTED),
    ),
    sa.Index(
        "ix_dueledger_entries_hook_failed",
        "task_key",
        postgresql_where=sa.text(PG_HOOK_FAILED),
        sqlite_where=sa.text(SQLITE_HOOK_FAILED),
    ),
    sqlite_autoincrement=True,
)

audit = sa.Table(
    AUDIT_TABLE,
    metadata,
    sa.Column("id", ID_TYPE, primary_key=True, autoincrement=True),
    sa.Column("at", sa.DateTime(), nullable=False),
    sa.Column("operator", sa.String(200), nullable=True),
    sa.Column("action", sa.String(64), nullable=False),
    # No foreign keys: a refused request about an entry id that does not exist is audited too.
    sa.Column("entry_id", ID_TYPE, nullable=True),
    sa.Column("child_entry_id", ID_TYPE, nullable=True),
    sa.Column("reason", sa.Text(), nullable=True),
    sa.Column("checks", JSON_TYPE, nullable=True),
    sa.Column("outcome", sa.Text(), nullable=False),
    sa.Index("ix_dueledger_audit_entry", "entry_id"),
    sa.Index("ix_dueledger_audit_child", "child_entry_id"),
    sa.Index("ix_dueledger_audit_at", "at"),
    sqlite_autoincrement=True,
)

# Migration 0003: one row per (channel, alert kind, subject) -- an alert is delivered to a
# channel once (resources/ledger/deliveries.py). ``next_attempt_at`` is when it may be tried
# next: set while it is pending or failed with attempts left, NULL once delivered or given up.
alert_deliveries = sa.Table(
    ALERT_DELIVERIES_TABLE,
    metadata,
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
    # The retry sweep: due deliveries, oldest first. Partial: delivered rows never touch it.
    sa.Index(
        "ix_dueledger_alert_deliveries_next_attempt",
        "next_attempt_at",
        postgresql_where=sa.text("next_attempt_at IS NOT NULL"),
        sqlite_where=sa.text("next_attempt_at IS NOT NULL"),
    ),
    sqlite_autoincrement=True,
)

# Migration 0005: each task's schedule as the scheduler ran it (mirrored from Dagster's
# schedule state by the outcome sensor), and every pause of a task (closed, never deleted).
schedules = sa.Table(
    SCHEDULES_TABLE,
    metadata,
    sa.Column("task_key", sa.String(200), primary_key=True),
    sa.Column("schedule_name", sa.String(300), nullable=False),
    # running | stopped, as Dagster last reported it
    sa.Column("status", sa.String(16), nullable=False),
    # The earliest start of the schedule seen here: no due before it was expected.
    sa.Column("first_started_at", sa.DateTime(), nullable=True),
    sa.Column("started_at", sa.DateTime(), nullable=True),
    sa.Column("observed_at", sa.DateTime(), nullable=False),
)

pauses = sa.Table(
    PAUSES_TABLE,
    metadata,
    sa.Column("id", ID_TYPE, primary_key=True, autoincrement=True),
    sa.Column("task_key", sa.String(200), nullable=False),
    # schedule_stopped (the Dagster UI's toggle) | cli | pause_after_failures
    # (resources/ledger/scheduling.py: PAUSE_SOURCES)
    sa.Column("source", sa.String(32), nullable=False),
    sa.Column("paused_at", sa.DateTime(), nullable=False),
    sa.Column("paused_by", sa.String(200), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("resumed_at", sa.DateTime(), nullable=True),
    sa.Column("resumed_by", sa.String(200), nullable=True),
    sa.Column("resume_reason", sa.Text(), nullable=True),
    sa.Index("ix_dueledger_pauses_task", "task_key", "paused_at"),
    # Migration 0007: one open pause per task and source, whoever races to open it.
    sa.Index(
        "ux_dueledger_pauses_open",
        "task_key",
        "source",
        unique=True,
        postgresql_where=sa.text("resumed_at IS NULL"),
        sqlite_where=sa.text("resumed_at IS NULL"),
    ),
    sqlite_autoincrement=True,
)

# Migration 0007: the lock row of a task whose overlap the ledger decides (skip, buffer_one,
# replace): claims lock it first, so two runs starting at once decide one after the other. It
# names the run waiting for its turn under buffer_one, alive until ``waiting_until``.
task_locks = sa.Table(
    TASK_LOCKS_TABLE,
    metadata,
    sa.Column("task_key", sa.String(200), primary_key=True),
    sa.Column("waiting_entry_id", ID_TYPE, nullable=True),
    sa.Column("waiting_run_id", sa.String(255), nullable=True),
    sa.Column("waiting_until", sa.DateTime(), nullable=True),
    sa.Column("updated_at", sa.DateTime(), nullable=False),
)

# Migration 0009: the catch-up that may submit a catch-up entry's run, claimed in the
# transaction that creates the entry; run_id and submitted_at once Dagster accepted the run
# (orchestration/catch_up.py).
launch_claims = sa.Table(
    LAUNCH_CLAIMS_TABLE,
    metadata,
    sa.Column("entry_id", ID_TYPE, primary_key=True),
    sa.Column("claimed_by", sa.String(300), nullable=False),
    sa.Column("claimed_at", sa.DateTime(), nullable=False),
    sa.Column("run_id", sa.String(255), nullable=True),
    sa.Column("submitted_at", sa.DateTime(), nullable=True),
)
