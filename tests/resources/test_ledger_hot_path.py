"""The ledger's hot path: claim, heartbeat, succeed and fail as one prepared statement each.

What it pins (issue 16, item 6): on psycopg2 each of the four runs as one statement on a
kept DBAPI connection and cursor, with no SQLAlchemy execution per call; the statement
constants are rendered once into the SQL; the returned Entry is the stored row; and the
cheaper time conversions at the database boundary give the same values as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

from resources.core import tags
from resources.ledger import Entry, RunLedger, dedup_key_for_due
from resources.ledger.engine import HOT_PATH, prepare
from resources.ledger.model import from_db, to_db
from resources.ledger.statements import statements_for

DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
JUST_AFTER_DUE = DUE + timedelta(seconds=2)
TTL = timedelta(minutes=5)
OWNER = "run-a"
OTHER = "run-b"
#: The per-call parameters the transitions pass (transitions.py); nothing else may remain.
CALL_PARAMS = {"b_id", "b_run_id", "b_now", "b_expires", "b_kind", "b_error"}


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[RunLedger]:
    resource = RunLedger(database_url=ledger_url)
    resource.migrate()
    yield resource
    resource.dispose()


def _entry(ledger: RunLedger, due: datetime = DUE, max_attempts: int = 3) -> Entry:
    return ledger.ensure_entry(
        task_key="order_cleanup",
        trigger=tags.TRIGGER_SCHEDULE,
        dedup_key=dedup_key_for_due(due),
        max_attempts=max_attempts,
        now=DUE,
    )


# --- the prepared SQL ---------------------------------------------------------------------


def test_prepared_statements_keep_only_the_per_call_parameters() -> None:
    engine = sa.create_engine("postgresql+psycopg2://u@localhost/db")
    prepared = prepare(engine, statements_for("postgresql"))
    assert prepared is not None and set(prepared) == set(HOT_PATH)
    for name, statement in prepared.items():
        placeholders = set(re.findall(r"%\((\w+)\)s", statement.sql))
        assert placeholders <= CALL_PARAMS, name
        # The constants are literals in the text, as psycopg2 would have interpolated them.
        assert "%(status" not in statement.sql and "%(param_" not in statement.sql
    assert "status='running'" in prepared["claim"].sql
    assert "'queued'" in prepared["claim"].sql and "'retrying'" in prepared["claim"].sql
    assert "lease_owner=NULL" in prepared["succeed"].sql
    # RETURNING columns named once, in the order of the table (entry_from_row reads them).
    columns = tuple(c.key for c in statements_for("postgresql").claim.exported_columns)
    assert prepared["claim"].columns == prepared["fail"].columns == columns
    assert prepared["heartbeat"].columns == prepared["succeed"].columns == ()


def test_sqlite_has_no_prepared_route() -> None:
    assert prepare(sa.create_engine("sqlite://"), statements_for("sqlite")) is None


# --- one statement per call, on a kept connection -------------------------------------------


@pytest.mark.postgres
def test_a_cycle_runs_without_sqlalchemy_executions_on_one_kept_connection(
    postgres_url: str,
) -> None:
    ledger = RunLedger(database_url=postgres_url)
    ledger.migrate()
    first, second = _entry(ledger), _entry(ledger, DUE + timedelta(minutes=15))
    executed: list[str] = []

    def watch(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        executed.append(statement)

    engine = ledger._get_engine()
    sa.event.listen(engine, "before_cursor_execute", watch)
    try:
        for entry in (first, second):
            claimed = ledger.claim(entry.id, OWNER, lease_ttl=TTL, now=JUST_AFTER_DUE)
            assert claimed.claimed and claimed.entry.status == tags.STATUS_RUNNING
            assert ledger.heartbeat(entry.id, OWNER, lease_ttl=TTL, now=JUST_AFTER_DUE)
            assert ledger.succeed(entry.id, OWNER, now=JUST_AFTER_DUE)
        assert executed == [], "the hot path went through SQLAlchemy's execution"
        runtime = ledger._rt()
        assert len(runtime.idle) == 1, "one connection and cursor kept for the next call"
        pooled, cursor = runtime.idle[0]
        assert not cursor.closed and pooled.driver_connection.autocommit
    finally:
        sa.event.remove(engine, "before_cursor_execute", watch)
        ledger.dispose()
    assert ledger._runtime is None


@pytest.mark.postgres
def test_the_refused_claim_still_takes_the_slow_path_and_is_recorded(postgres_url: str) -> None:
    ledger = RunLedger(database_url=postgres_url)
    ledger.migrate()
    entry = _entry(ledger)
    assert ledger.claim(entry.id, OWNER, lease_ttl=TTL, now=JUST_AFTER_DUE).claimed
    refused = ledger.claim(entry.id, OTHER, lease_ttl=TTL, now=JUST_AFTER_DUE)
    assert not refused.claimed and refused.entry.lease_owner == OWNER
    assert [r["run_id"] for r in refused.entry.summary["late_job_rejections"]] == [OTHER]
    assert not ledger.heartbeat(entry.id, OTHER, lease_ttl=TTL, now=JUST_AFTER_DUE)
    assert ledger.succeed(entry.id, OWNER, now=JUST_AFTER_DUE)
    late = ledger.fail(entry.id, OWNER, error="late", now=JUST_AFTER_DUE)
    assert late.status == tags.STATUS_SUCCESS and late.error is None
    ledger.dispose()


def test_what_the_hot_path_returns_is_the_stored_entry(ledger: RunLedger) -> None:
    entry = _entry(ledger, max_attempts=2)
    claimed = ledger.claim(entry.id, OWNER, lease_ttl=TTL, now=JUST_AFTER_DUE)
    assert claimed.entry == ledger.get(entry.id)
    assert claimed.entry.lease_expires_at == JUST_AFTER_DUE + TTL
    assert claimed.entry.started_at is not None and claimed.entry.started_at.tzinfo is UTC
    failed = ledger.fail(entry.id, OWNER, error="boom", now=JUST_AFTER_DUE)
    assert failed == ledger.get(entry.id)
    assert failed.status == tags.STATUS_RETRYING and failed.error == "boom"


# --- time conversions at the database boundary --------------------------------------------

PLUS_TWO = timezone(timedelta(hours=2))
AWARE_INSTANTS = [
    pytest.param(datetime(2026, 11, 30, 22, 45, tzinfo=UTC), id="utc"),
    pytest.param(datetime(2026, 11, 30, 22, 45, 1, 123456, tzinfo=UTC), id="microseconds"),
    pytest.param(datetime(2026, 12, 1, 0, 30, tzinfo=PLUS_TWO), id="other-offset-crossing-day"),
    pytest.param(datetime(2026, 11, 30, 22, 45, tzinfo=UTC, fold=1), id="fold"),
]


@pytest.mark.parametrize("instant", AWARE_INSTANTS)
def test_to_db_and_from_db_give_what_replace_gave(instant: datetime) -> None:
    stored = to_db(instant, "now")
    assert stored == instant.astimezone(UTC).replace(tzinfo=None)
    assert stored is not None and stored.tzinfo is None and stored.fold == instant.fold
    back = from_db(stored)
    assert back == stored.replace(tzinfo=UTC) == instant
    assert back is not None and back.tzinfo is UTC


@pytest.mark.parametrize("bad", [datetime(2026, 11, 30, 22, 45), "2026-11-30", DUE.date()])
def test_to_db_still_refuses_what_is_not_an_aware_datetime(bad: Any) -> None:
    with pytest.raises(ValueError, match="now"):
        to_db(bad, "now")
