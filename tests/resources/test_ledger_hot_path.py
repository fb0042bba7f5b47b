"""The ledger's hot path: claim, heartbeat, succeed and fail as one prepared statement each.

What it pins: on psycopg2 each of the four runs as one statement on a
kept DBAPI connection and cursor, with no SQLAlchemy execution per call; the statement
constants are rendered once into the SQL; the returned Entry is the stored row; and the
cheaper time conversions at the database boundary give the same values as before.
"""

from __future__ import annotations

import dataclasses
import os
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

from resources.core.entry import SUMMARY_KEYS, Entry, Status, Trigger, dedup_key_for_due
from resources.ledger import RunLedger
from resources.ledger.engine import HOT_PATH, prepare
from resources.ledger.model import entry_from_row, from_db, to_db
from resources.ledger.statements import statements_for

DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
JUST_AFTER_DUE = DUE + timedelta(seconds=2)
TTL = timedelta(minutes=5)
OWNER = "run-a"
OTHER = "run-b"
#: The per-call parameters the transitions pass (transitions.py); nothing else may remain.
CALL_PARAMS = {"b_id", "b_run_id", "b_now", "b_expires", "b_kind", "b_error", "b_retry"}


def _entry(ledger: RunLedger, due: datetime = DUE, max_attempts: int = 3) -> Entry:
    return ledger.ensure_entry(
        task_key="order_cleanup",
        trigger=Trigger.SCHEDULE,
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
            assert claimed.claimed and claimed.entry.status == Status.RUNNING
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
    assert late.status == Status.SUCCESS and late.error is None
    ledger.dispose()


def test_what_the_hot_path_returns_is_the_stored_entry(ledger: RunLedger) -> None:
    entry = _entry(ledger, max_attempts=2)
    claimed = ledger.claim(entry.id, OWNER, lease_ttl=TTL, now=JUST_AFTER_DUE)
    assert claimed.entry == ledger.get(entry.id)
    assert claimed.entry.lease_expires_at == JUST_AFTER_DUE + TTL
    assert claimed.entry.started_at is not None and claimed.entry.started_at.tzinfo is UTC
    failed = ledger.fail(entry.id, OWNER, error="boom", now=JUST_AFTER_DUE)
    assert failed == ledger.get(entry.id)
    assert failed.status == Status.RETRYING and failed.error == "boom"


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


# --- rows into entries ----------------------------------------------------------------------

STORED = datetime(2026, 11, 30, 22, 45, 1, 123456)  # naive UTC, as the database keeps it
ROW: dict[str, Any] = {
    "id": 7,
    "task_key": "order_cleanup",
    "trigger": Trigger.SCHEDULE,
    "origin": "due",
    "dedup_key": "due:2026-11-30T22:45:00Z",
    "due": datetime(2026, 11, 30, 22, 45),
    "status": Status.RUNNING,
    "attempt": 1,
    "max_attempts": 3,
    "parent_id": 3,
    "run_ids": ["run-a"],
    "lease_owner": "run-a",
    "lease_expires_at": STORED + TTL,
    "heartbeat_at": STORED,
    "created_at": STORED,
    "started_at": STORED,
    "finished_at": None,
    "updated_at": STORED,
    "operator": None,
    "reason": None,
    "failure_kind": None,
    "error": None,
    "summary": {"late_job_rejections": [{"run_id": "run-b"}]},
    "manual_retry_at": None,
    "manual_retry_by": None,
    # Columns added later with a default (as stored rows of that time have it).
    **{
        f.name: f.default for f in dataclasses.fields(Entry) if f.default is not dataclasses.MISSING
    },
}


def _entry_through_init(row: dict[str, Any]) -> Entry:
    """The entry as Entry's own __init__ builds it from the row (the reference)."""
    values = {f.name: row[f.name] for f in dataclasses.fields(Entry)}
    times = {name: from_db(v) for name, v in values.items() if isinstance(v, datetime)}
    summary = {**{key: [] for key in SUMMARY_KEYS}, **row["summary"]}
    return Entry(**{**values, **times, "run_ids": tuple(row["run_ids"]), "summary": summary})


def test_an_entry_from_a_row_is_the_entry_its_init_builds() -> None:
    # entry_from_row skips Entry.__init__ (its 25 frozen setattrs were most of the claim's
    # conversion cost): the result must be the same object state, fully converted.
    entry = entry_from_row(ROW)
    assert vars(entry) == vars(_entry_through_init(ROW))
    assert entry == _entry_through_init(ROW) and hash(entry) == hash(_entry_through_init(ROW))
    assert all(value.tzinfo is UTC for value in vars(entry).values() if isinstance(value, datetime))
    # What skipping __init__ relies on: nothing for it to run (every field comes from the row).
    assert not hasattr(Entry, "__post_init__")


def test_an_entry_from_a_row_ignores_other_columns_and_needs_its_own() -> None:
    assert entry_from_row({**ROW, "a_newer_column": 1}) == entry_from_row(ROW)
    with pytest.raises(KeyError, match="summary"):
        entry_from_row({k: v for k, v in ROW.items() if k != "summary"})


# --- fork ------------------------------------------------------------------------------------


def test_a_forked_child_builds_its_own_runtime(ledger: RunLedger) -> None:
    # The process id the ledger checks on every call is kept without a system call and must
    # follow a fork: a child using the parent's runtime would share its connections.
    entry = _entry(ledger)
    parent_runtime = ledger._rt()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            runtime = ledger._rt()
            ok = (
                runtime is not parent_runtime
                and runtime.pid == os.getpid()
                and runtime.inherited is parent_runtime
                and ledger.get(entry.id) == entry
            )
            os.write(write, b"ok" if ok else b"shared")
        finally:
            os._exit(0)
    os.close(write)
    try:
        answer = os.read(read, 16)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert answer == b"ok"
    assert ledger._rt() is parent_runtime  # the parent keeps its own
