"""The ledger's prebuilt SQL statements, one set per dialect.

The hot path (claim / heartbeat / succeed / fail) runs thousands of times a second in a busy
deployment: its statements are built once per dialect with bind parameters, so a call costs
one cached execution, not a fresh statement construction.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from resources.core.entry import CLAIMABLE_STATUSES, FailureKind, Status
from resources.ledger.schema import entries, task_locks

_B_ID = sa.bindparam("b_id", type_=sa.BigInteger())
_B_RUN = sa.bindparam("b_run_id", type_=sa.String())
_B_NOW = sa.bindparam("b_now", type_=sa.DateTime())
_B_EXPIRES = sa.bindparam("b_expires", type_=sa.DateTime())
_B_KIND = sa.bindparam("b_kind", type_=sa.String())
_B_ERROR = sa.bindparam("b_error", type_=sa.Text())
_B_RETRY = sa.bindparam("b_retry", type_=sa.Boolean())
_HAS_ATTEMPTS_LEFT = entries.c.attempt < entries.c.max_attempts
# An unsupported task can never run again, whatever attempts are left: fail it for good; and
# an attempt no retry will follow (b_retry false: Dagster will not launch one) is final.
_WILL_RETRY = sa.and_(
    _HAS_ATTEMPTS_LEFT, _B_KIND != FailureKind.UNSUPPORTED_TASK, sa.true() == _B_RETRY
)
_B_TOKEN = sa.bindparam("b_token", type_=sa.BigInteger())
_OWNED_AND_RUNNING = (
    entries.c.id == _B_ID,
    entries.c.status == Status.RUNNING,
    entries.c.lease_owner == _B_RUN,
)


@dataclass(frozen=True)
class Statements:
    """The ledger's statements for one dialect."""

    insert_entry: Any
    claim: Any
    heartbeat: Any
    succeed: Any
    fail: Any
    select_by_id: Any
    select_for_update: Any
    holds: Any
    insert_task_lock: Any


@functools.cache
def statements_for(dialect: str) -> Statements:
    """The statements for ``dialect`` (``sqlite`` or ``postgresql``), built on first use."""
    if dialect == "postgresql":
        insert: Any = postgresql.insert
        # JSONB: append in place with ||.
        concat = entries.c.run_ids.op("||", return_type=postgresql.JSONB())
        appended_run_id: sa.ColumnElement[Any] = concat(
            sa.func.jsonb_build_array(sa.cast(_B_RUN, sa.Text()))
        )
    else:
        insert = sqlite.insert
        appended_run_id = sa.func.json_insert(entries.c.run_ids, "$[#]", _B_RUN)
    select_by_id = sa.select(entries).where(entries.c.id == _B_ID)
    return Statements(
        insert_entry=insert(entries)
        .on_conflict_do_nothing(index_elements=["task_key", "origin", "dedup_key"])
        .returning(*entries.c),
        claim=sa.update(entries)
        .where(
            entries.c.id == _B_ID,
            # OR of equalities, not IN: an IN list is re-rendered on every execution.
            sa.or_(*(entries.c.status == s for s in CLAIMABLE_STATUSES)),
            _HAS_ATTEMPTS_LEFT,
        )
        .values(
            status=Status.RUNNING,
            attempt=entries.c.attempt + 1,
            # The fencing token: every successful claim gets a new one (resources/core/fence.py).
            claim_generation=entries.c.claim_generation + 1,
            lease_owner=_B_RUN,
            lease_expires_at=_B_EXPIRES,
            heartbeat_at=_B_NOW,
            started_at=_B_NOW,
            updated_at=_B_NOW,
            run_ids=appended_run_id,
        )
        .returning(*entries.c),
        heartbeat=sa.update(entries)
        .where(*_OWNED_AND_RUNNING)
        .values(lease_expires_at=_B_EXPIRES, heartbeat_at=_B_NOW, updated_at=_B_NOW),
        succeed=sa.update(entries)
        .where(*_OWNED_AND_RUNNING)
        .values(
            status=Status.SUCCESS,
            lease_owner=None,
            lease_expires_at=None,
            finished_at=_B_NOW,
            updated_at=_B_NOW,
        ),
        fail=sa.update(entries)
        .where(*_OWNED_AND_RUNNING)
        .values(
            status=sa.case((_WILL_RETRY, Status.RETRYING.value), else_=Status.FAILED.value),
            failure_kind=_B_KIND,
            error=_B_ERROR,
            lease_owner=None,
            lease_expires_at=None,
            # A retrying entry is not finished; only the last attempt stamps finished_at.
            finished_at=sa.case((_WILL_RETRY, entries.c.finished_at), else_=_B_NOW),
            updated_at=_B_NOW,
        )
        .returning(*entries.c),
        select_by_id=select_by_id,
        # FOR UPDATE renders nothing on SQLite, where BEGIN IMMEDIATE holds the database lock.
        select_for_update=select_by_id.with_for_update(),
        # The fence check (resources/ledger/guard.py): FOR SHARE on PostgreSQL, so a reclaim's
        # UPDATE of the row waits until the side effect's transaction has committed; nothing
        # on SQLite, where the effect's transaction already holds the database write lock.
        holds=sa.select(entries.c.id)
        .where(*_OWNED_AND_RUNNING, entries.c.claim_generation == _B_TOKEN)
        .with_for_update(read=True),
        # A task's lock row (resources/ledger/overlap.py), created on first use.
        insert_task_lock=insert(task_locks).on_conflict_do_nothing(index_elements=["task_key"]),
    )
