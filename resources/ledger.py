"""The run ledger: one row per logical execution request, with leases, retries and lineage.

``RunLedger`` is a Dagster resource over SQLAlchemy Core that behaves the same on SQLite
(local default) and PostgreSQL (production). It enforces the ledger rules of DESIGN.md:

- an entry is created insert-or-ignore on ``(task_key, origin, dedup_key)``, so a due, a
  manual request or a retry can exist once only;
- a run *claims* its entry (``queued|retrying -> running``) by one conditional UPDATE, with a
  lease it renews by heartbeat; everything else is a late or duplicate run, recorded in the
  entry's ``summary.late_job_rejections`` and otherwise ignored;
- terminal states (``success``, ``failed``) are never overwritten; rows are never deleted.

Concurrency model (why the code looks the way it does):

- State transitions are compare-and-set: a single ``UPDATE ... WHERE id = :id AND status IN
  (...) [AND lease_owner = :run]`` whose row count (or RETURNING row) says whether it won.
  They run on an autocommit connection: one statement, one round trip, atomic on its own.
- Changes to the JSON ``summary`` are read-modify-write, so they run in a transaction that
  holds the row: ``SELECT ... FOR UPDATE`` on PostgreSQL, ``BEGIN IMMEDIATE`` (the database
  write lock) on SQLite. A refused claim re-decides inside that transaction, so every
  interleaving ends either claimed or recorded as a rejection.
- SQLite runs in WAL mode with a busy timeout; SQLAlchemy's pysqlite driver is told to let us
  emit BEGIN ourselves (the documented event-hook recipe), because its own legacy
  transaction handling cannot take the write lock up front.
- On psycopg2 the four hot-path statements (claim, heartbeat, succeed, fail) run on the
  pooled DBAPI cursor exactly as SQLAlchemy compiled them (see ``_Prepared``): same SQL,
  less client CPU per call.

Times: the API takes and returns timezone-aware UTC datetimes; the database stores them
timezone-naive in UTC. Every operation takes ``now=`` so tests and callers inject the clock.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import json
import os
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal

import dagster as dg
import sqlalchemy as sa
from pydantic import Field, PrivateAttr
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine, make_url

from resources.core import tags
from resources.core.settings import ENV_DATABASE_URL, load_settings
from resources.core.slots import DUE_FORMAT, parse_due
from resources.ledger_schema import VERSION_TABLE, audit, entries

# --- vocabulary ---------------------------------------------------------------------------

ORIGIN_DUE: Final = "due"
ORIGIN_MANUAL: Final = "manual"
ORIGIN_RETRY: Final = "retry"
ORIGIN_BACKFILL: Final = "backfill"
ORIGINS: Final = (ORIGIN_DUE, ORIGIN_MANUAL, ORIGIN_RETRY, ORIGIN_BACKFILL)

#: Statuses a run may claim.
CLAIMABLE_STATUSES: Final = (tags.STATUS_QUEUED, tags.STATUS_RETRYING)
#: Statuses a launch failure may move to ``dispatch_failed`` (not started, not terminal).
DISPATCHABLE_STATUSES: Final = (
    tags.STATUS_QUEUED,
    tags.STATUS_RETRYING,
    tags.STATUS_DISPATCH_FAILED,
)
#: Failure kinds a run reports about itself through ``fail()``. The other two have their own
#: operations: ``lease_reclaimed`` (reclaim_expired) and ``dispatch`` (record_dispatch_failure).
RUN_FAILURE_KINDS: Final = (
    tags.FAILURE_ERROR,
    tags.FAILURE_TIMEOUT,
    tags.FAILURE_UNSUPPORTED_TASK,
)

MAX_ERROR_CHARS: Final = 4000
MAX_LATE_JOB_REJECTIONS: Final = 5
MAX_DISPATCH_FAILURES: Final = 5
MAX_HOOK_RESULTS: Final = 20
SUMMARY_REJECTIONS: Final = "late_job_rejections"
SUMMARY_DISPATCH_FAILURES: Final = "dispatch_failures"
SUMMARY_HOOKS: Final = "hooks"
SUMMARY_KEYS: Final = (SUMMARY_REJECTIONS, SUMMARY_DISPATCH_FAILURES, SUMMARY_HOOKS)

MAX_RUN_ID_CHARS: Final = 255
DEFAULT_MAX_ATTEMPTS: Final = 3
DEFAULT_LIST_LIMIT: Final = 50

#: Key of the PostgreSQL advisory lock that serialises concurrent ``migrate()`` calls.
MIGRATION_LOCK_KEY: Final = int.from_bytes(b"dueledgr", "big") & 0x7FFF_FFFF_FFFF_FFFF
MIGRATIONS_DIR: Final = Path(__file__).resolve().parent / "migrations"

# Custom execution option read by the SQLite "begin" hook: how to start a transaction.
_TX_OPTION: Final = "dueledger_tx"
_Mode = Literal["autocommit", "write", "read"]


class LedgerError(RuntimeError):
    """The ledger database cannot be used (unreachable, locked, not migrated, bad URL).

    The message names the database (password masked) and what to do about it.
    """


class UnknownEntryError(ValueError):
    """An operation named a ledger entry id that does not exist."""


# --- pure helpers: keys and times ------------------------------------------------------------


def format_due(dt: datetime) -> str:
    """The contract's due string ``YYYY-MM-DDTHH:MM:SSZ`` of an aware datetime.

    Stricter than ``resources.core.slots.format_due`` (same format): the ledger refuses a
    naive datetime instead of assuming it is UTC, because a wrong due is a wrong key.
    """
    return _require_aware(dt, "due").astimezone(UTC).strftime(DUE_FORMAT)


def dedup_key_for_due(due: datetime) -> str:
    """Dedup key of a scheduled/sensor run: ``due:<YYYY-MM-DDTHH:MM:SSZ>``.

    Due times are slot-aligned instants, never "now": a value with seconds or microseconds
    is refused because it almost certainly came from a wall clock.
    """
    _require_aware(due, "due")
    if due.second or due.microsecond:
        raise ValueError(
            f"due {due.isoformat()} is not slot-aligned (it has seconds); a due is the slot's "
            f"start time, never the current time"
        )
    return f"{ORIGIN_DUE}:{format_due(due)}"


def dedup_key_for_request(request_id: str) -> str:
    """Dedup key of a manual launch: ``manual:<request_id>``."""
    return f"{ORIGIN_MANUAL}:{_require_text(request_id, 'request_id')}"


def dedup_key_for_retry(parent_entry_id: int) -> str:
    """Dedup key of a manual retry: ``retry:<parent_entry_id>`` (so at most one per parent)."""
    if isinstance(parent_entry_id, bool) or not isinstance(parent_entry_id, int):
        raise ValueError(f"parent_entry_id must be an int, got {parent_entry_id!r}")
    if parent_entry_id <= 0:
        raise ValueError(f"parent_entry_id must be positive, got {parent_entry_id}")
    return f"{ORIGIN_RETRY}:{parent_entry_id}"


def dedup_key_for_backfill(backfill_id: str, partition: str) -> str:
    """Dedup key of a backfill partition run: ``backfill:<backfill_id>:<partition>``."""
    backfill = _require_text(backfill_id, "backfill_id")
    if ":" in backfill:
        raise ValueError(f"backfill_id {backfill_id!r} must not contain ':'")
    return f"{ORIGIN_BACKFILL}:{backfill}:{_require_text(partition, 'partition')}"


def origin_of(dedup_key: str) -> str:
    """The namespace of a dedup key (its prefix): ``due``, ``manual``, ``retry``, ``backfill``."""
    prefix, sep, rest = str(dedup_key).partition(":")
    if not sep or not rest or prefix not in ORIGINS:
        raise ValueError(
            f"dedup_key {dedup_key!r} must start with one of "
            f"{', '.join(o + ':' for o in ORIGINS)} (use the dedup_key_for_* helpers)"
        )
    return prefix


def truncate_error(error: str) -> str:
    """Bound an error text to MAX_ERROR_CHARS, saying how much was cut."""
    text = str(error)
    if len(text) <= MAX_ERROR_CHARS:
        return text
    marker = f"\n... [truncated: {len(text)} characters in total]"
    return text[: MAX_ERROR_CHARS - len(marker)] + marker


def format_duration(delta: timedelta) -> str:
    """A short human duration such as ``2h 05m 13s`` (negative values read as ``0s``)."""
    total = max(0, int(delta.total_seconds()))
    hours, rest = divmod(total, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {seconds:02d}s"
    if minutes:
        return f"{minutes}m {seconds:02d}s"
    return f"{seconds}s"


def _require_text(value: object, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _require_aware(dt: datetime, name: str) -> datetime:
    if not isinstance(dt, datetime):
        raise ValueError(f"{name} must be a datetime, got {dt!r}")
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ValueError(
            f"{name}={dt.isoformat()} is timezone-naive; pass a timezone-aware UTC datetime "
            f"(e.g. datetime.now(UTC))"
        )
    return dt


def _to_db(dt: datetime | None, name: str) -> datetime | None:
    """Aware datetime -> naive UTC for storage."""
    if dt is None:
        return None
    return _require_aware(dt, name).astimezone(UTC).replace(tzinfo=None)


def _from_db(dt: datetime | None) -> datetime | None:
    """Stored naive UTC -> aware UTC."""
    return None if dt is None else dt.replace(tzinfo=UTC)


def _iso(dt: datetime | None) -> str | None:
    """ISO-8601 UTC with a trailing Z, microsecond precision."""
    if dt is None:
        return None
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _summary(raw: object) -> dict[str, Any]:
    """A summary dict that always carries the three contract lists."""
    data: dict[str, Any] = dict(raw) if isinstance(raw, Mapping) else {}
    for key in SUMMARY_KEYS:
        if not isinstance(data.get(key), list):
            data[key] = []
    return data


def _appended(summary: Mapping[str, Any], key: str, item: Any, keep: int) -> dict[str, Any]:
    """Copy of ``summary`` with ``item`` appended to list ``key``, keeping the newest ``keep``."""
    new = _summary(summary)
    new[key] = [*new[key], item][-keep:]
    return new


# --- value objects ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One ledger entry as stored (times timezone-aware UTC)."""

    id: int
    task_key: str
    trigger: str
    origin: str
    dedup_key: str
    due: datetime | None
    status: str
    attempt: int
    max_attempts: int
    parent_id: int | None
    run_ids: tuple[str, ...]
    lease_owner: str | None
    lease_expires_at: datetime | None
    heartbeat_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    operator: str | None
    reason: str | None
    failure_kind: str | None
    error: str | None
    summary: dict[str, Any] = field(hash=False)
    manual_retry_at: datetime | None
    manual_retry_by: str | None

    @property
    def label(self) -> str:
        """``task@due`` for scheduled entries, ``task[dedup_key]`` otherwise (for messages)."""
        if self.due is not None:
            return f"{self.task_key}@{format_due(self.due)}"
        return f"{self.task_key}[{self.dedup_key}]"

    @property
    def is_terminal(self) -> bool:
        return self.status in tags.TERMINAL_STATUSES

    @property
    def dispatch_failure_run_ids(self) -> frozenset[str]:
        """The runs recorded in ``summary.dispatch_failures``: they ended before claiming."""
        return frozenset(
            str(item["run_id"])
            for item in self.summary.get(SUMMARY_DISPATCH_FAILURES, [])
            if isinstance(item, Mapping) and item.get("run_id")
        )

    def to_json(self) -> dict[str, Any]:
        """The contract's JSON shape of an entry (DESIGN.md), plus a few extra fields."""
        summary = _summary(self.summary)
        return {
            "id": self.id,
            "task_key": self.task_key,
            "trigger": self.trigger,
            "dedup_key": self.dedup_key,
            "due": format_due(self.due) if self.due is not None else None,
            "status": self.status,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "parent_id": self.parent_id,
            "run_ids": list(self.run_ids),
            "lease_expires_at": _iso(self.lease_expires_at),
            "failure_kind": self.failure_kind,
            "error": self.error,
            "operator": self.operator,
            "reason": self.reason,
            "manual_retry_by": self.manual_retry_by,
            "manual_retry_at": _iso(self.manual_retry_at),
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
            "summary": json.loads(json.dumps(summary)),
            "origin": self.origin,
            "lease_owner": self.lease_owner,
            "heartbeat_at": _iso(self.heartbeat_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
        }


def _entry(row: Mapping[Any, Any]) -> Entry:
    created = _from_db(row["created_at"])
    updated = _from_db(row["updated_at"])
    assert created is not None and updated is not None  # NOT NULL columns
    return Entry(
        id=int(row["id"]),
        task_key=row["task_key"],
        trigger=row["trigger"],
        origin=row["origin"],
        dedup_key=row["dedup_key"],
        due=_from_db(row["due"]),
        status=row["status"],
        attempt=int(row["attempt"]),
        max_attempts=int(row["max_attempts"]),
        parent_id=None if row["parent_id"] is None else int(row["parent_id"]),
        run_ids=tuple(row["run_ids"] or ()),
        lease_owner=row["lease_owner"],
        lease_expires_at=_from_db(row["lease_expires_at"]),
        heartbeat_at=_from_db(row["heartbeat_at"]),
        created_at=created,
        started_at=_from_db(row["started_at"]),
        finished_at=_from_db(row["finished_at"]),
        updated_at=updated,
        operator=row["operator"],
        reason=row["reason"],
        failure_kind=row["failure_kind"],
        error=row["error"],
        summary=_summary(row["summary"]),
        manual_retry_at=_from_db(row["manual_retry_at"]),
        manual_retry_by=row["manual_retry_by"],
    )


@dataclass(frozen=True)
class ClaimResult:
    """Outcome of :meth:`RunLedger.claim`: the entry's state after the call and, if refused, why."""

    claimed: bool
    entry: Entry
    reason: str | None


def _who(entry: Entry) -> str:
    return f"entry {entry.id} {entry.label}"


def _state(entry: Entry) -> str:
    """The entry's state in words, for rejection reasons."""
    if entry.status == tags.STATUS_RUNNING:
        return f"running under run {entry.lease_owner} (lease until {_iso(entry.lease_expires_at)})"
    if entry.status == tags.STATUS_FAILED and entry.failure_kind:
        return f"failed ({entry.failure_kind})"
    return entry.status


def _claim_refusal(entry: Entry) -> str:
    """Why ``entry`` cannot be claimed, as one sentence."""
    who = _who(entry)
    if entry.status == tags.STATUS_SUCCESS:
        return f"{who} is already success: duplicate run, nothing done"
    if entry.status == tags.STATUS_FAILED:
        return (
            f"{who} is already {_state(entry)}: late run, nothing done; another attempt needs "
            f"a manual retry (dueledger runs retry {entry.id})"
        )
    if entry.status == tags.STATUS_RUNNING:
        return f"{who} is already {_state(entry)}: duplicate run, nothing done"
    if entry.status == tags.STATUS_DISPATCH_FAILED:
        return f"{who} is dispatch_failed: it must be re-dispatched before a run may claim it"
    if entry.status in CLAIMABLE_STATUSES:
        return (
            f"{who} is {entry.status} but its attempts are exhausted "
            f"({entry.attempt} of {entry.max_attempts} used): nothing done"
        )
    return f"{who} has unknown status {entry.status!r}: nothing done"


# --- prebuilt statements -----------------------------------------------------------------------
# The hot path (claim / heartbeat / succeed) runs thousands of times a second in a busy
# deployment: its statements are built once per dialect with bind parameters, so a call
# costs one cached execution, not a fresh statement construction.

_B_ID = sa.bindparam("b_id", type_=sa.BigInteger())
_B_RUN = sa.bindparam("b_run_id", type_=sa.String())
_B_NOW = sa.bindparam("b_now", type_=sa.DateTime())
_B_EXPIRES = sa.bindparam("b_expires", type_=sa.DateTime())
_B_KIND = sa.bindparam("b_kind", type_=sa.String())
_B_ERROR = sa.bindparam("b_error", type_=sa.Text())
_HAS_ATTEMPTS_LEFT = entries.c.attempt < entries.c.max_attempts
# An unsupported task can never run again, whatever attempts are left: fail it for good.
_WILL_RETRY = sa.and_(_HAS_ATTEMPTS_LEFT, _B_KIND != tags.FAILURE_UNSUPPORTED_TASK)
_OWNED_AND_RUNNING = (
    entries.c.id == _B_ID,
    entries.c.status == tags.STATUS_RUNNING,
    entries.c.lease_owner == _B_RUN,
)


@dataclass(frozen=True)
class _Sql:
    """The ledger's statements for one dialect."""

    insert_entry: Any
    claim: Any
    heartbeat: Any
    succeed: Any
    fail: Any
    select_by_id: Any
    select_for_update: Any


@functools.cache
def _sql(dialect: str) -> _Sql:
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
    return _Sql(
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
            status=tags.STATUS_RUNNING,
            attempt=entries.c.attempt + 1,
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
            status=tags.STATUS_SUCCESS,
            lease_owner=None,
            lease_expires_at=None,
            finished_at=_B_NOW,
            updated_at=_B_NOW,
        ),
        fail=sa.update(entries)
        .where(*_OWNED_AND_RUNNING)
        .values(
            status=sa.case((_WILL_RETRY, tags.STATUS_RETRYING), else_=tags.STATUS_FAILED),
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
    )


#: Hot-path connections a process keeps checked out between calls (one per busy thread).
_HOT_IDLE_MAX: Final = 2
#: Statements of the hot path, by _Sql field name: claim/heartbeat/succeed/fail.
_HOT_PATH: Final = ("claim", "heartbeat", "succeed", "fail")


@dataclass(frozen=True)
class _Prepared:
    """A hot-path statement compiled once by SQLAlchemy, for executing on the DBAPI cursor.

    Why: on a busy host SQLAlchemy's per-execution machinery (execution context, result
    wrapping) costs more client CPU than the driver call itself (measured by
    bench/ledger_claims.py). The SQL is SQLAlchemy's own compilation of the Core statement
    for this engine's dialect; only the per-call wrapping is skipped. Used for psycopg2
    only, whose native adaptation of these parameter and result types (str, int, naive
    datetime, jsonb) is exactly what SQLAlchemy would send and return for them.
    """

    sql: str
    constants: dict[str, Any]


def _prepare(engine: Engine, sql: _Sql) -> dict[str, _Prepared] | None:
    if engine.dialect.name != "postgresql" or engine.dialect.driver != "psycopg2":
        return None
    prepared = {}
    for name in _HOT_PATH:
        compiled = getattr(sql, name).compile(dialect=engine.dialect)
        constants = {k: v for k, v in compiled.params.items() if not k.startswith("b_")}
        prepared[name] = _Prepared(sql=compiled.string, constants=constants)
    return prepared


@dataclass(frozen=True)
class _Runtime:
    """What a RunLedger builds on first use in a process."""

    engine: Engine
    pid: int
    sql: _Sql
    sqlite: bool
    prepared: dict[str, _Prepared] | None
    # Hot-path connections kept checked out of the pool between calls (see _hot_prepared).
    idle: deque[Any] = field(default_factory=deque)
    # After a fork: the parent's runtime, kept referenced so that its connections (shared
    # sockets) are never closed or used from this process.
    inherited: _Runtime | None = None

    def close_idle(self, invalidate: BaseException | None = None) -> None:
        while self.idle:
            try:
                pooled = self.idle.pop()
            except IndexError:  # another thread took the last one
                return
            if invalidate is not None:
                pooled.invalidate(invalidate)
            pooled.close()


@functools.cache
def _migration_head() -> str:
    """The head revision of the ledger migrations shipped with this code."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    assert head is not None, f"no migrations in {MIGRATIONS_DIR}"
    return head


# --- engine setup ----------------------------------------------------------------------------


def mask_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (safe for messages and logs)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<unparseable database URL>"


def _create_engine(url_text: str, busy_timeout_ms: int) -> Engine:
    try:
        url = make_url(url_text)
    except sa.exc.ArgumentError:
        raise LedgerError(
            f"ledger database URL {mask_url(url_text)!r} is not an SQLAlchemy URL; set "
            f"{ENV_DATABASE_URL} to e.g. sqlite:////path/ledger.sqlite or "
            f"postgresql+psycopg2://user:password@host:5432/dbname"
        ) from None
    backend = url.get_backend_name()
    try:
        if backend == "sqlite":
            return _create_sqlite_engine(url, busy_timeout_ms)
        if backend == "postgresql":
            return _create_postgres_engine(url, busy_timeout_ms)
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ImportError) as exc:
        raise LedgerError(
            f"cannot open ledger database {mask_url(url_text)}: {exc}; use the sqlite:/// or "
            f"postgresql+psycopg2:// scheme in {ENV_DATABASE_URL}"
        ) from exc
    raise LedgerError(
        f"ledger database {mask_url(url_text)} uses backend {backend!r}; the ledger supports "
        f"sqlite and postgresql only (set {ENV_DATABASE_URL})"
    )


def _create_sqlite_engine(url: sa.URL, busy_timeout_ms: int) -> Engine:
    database = url.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        # The default ledger lives under DAGSTER_HOME, which may not exist yet.
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"timeout": busy_timeout_ms / 1000})

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module (it would only BEGIN before
        # DML, too late to hold the write lock across a read-modify-write); see _on_begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            cursor.execute("PRAGMA foreign_keys = ON")
            _enable_wal(cursor, busy_timeout_ms)
        finally:
            cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get(_TX_OPTION, "write")
        if mode == "write":
            # Take the write lock now, so what we read cannot change before we write.
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        elif mode == "read":
            conn.exec_driver_sql("BEGIN")
        # "autocommit": no BEGIN; each statement is its own atomic transaction.

    return engine


def _enable_wal(cursor: Any, busy_timeout_ms: int) -> None:
    """Switch the database file to WAL (readers never block the writer), once per file."""
    deadline = time.monotonic() + busy_timeout_ms / 1000
    while True:
        try:
            mode = str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower()
            if mode in ("wal", "memory"):
                return
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except Exception as exc:  # sqlite3.OperationalError: another process holds a lock
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _create_postgres_engine(url: sa.URL, busy_timeout_ms: int) -> Engine:
    connect_args: dict[str, Any] = {}
    if url.get_driver_name() in ("psycopg2", "psycopg"):
        connect_args = {
            # Fail fast with a clear error instead of hanging when the server is down.
            "connect_timeout": 10,
            "application_name": "dueledger",
            # A row lock held by a stuck transaction must not block a claim forever.
            "options": f"-c lock_timeout={int(busy_timeout_ms)}",
        }
    # Engine default is autocommit: compare-and-set transitions are single statements, so a
    # BEGIN/COMMIT pair around them would only add two round trips. Transactions switch to
    # READ COMMITTED explicitly (see RunLedger._connect).
    return sa.create_engine(url, connect_args=connect_args, isolation_level="AUTOCOMMIT")


# --- the resource ------------------------------------------------------------------------------


class RunLedger(dg.ConfigurableResource):
    """The run ledger (see module docstring and docs/ledger.md).

    No database I/O happens when the resource is defined: the engine is created on first use
    and the schema is applied by :meth:`migrate`.
    """

    database_url: str | None = Field(
        default=None,
        description=(
            "SQLAlchemy URL of the ledger database (sqlite:/// or postgresql+psycopg2://). "
            f"None: resources.core.settings decides ({ENV_DATABASE_URL}, else a SQLite file "
            "under DAGSTER_HOME)."
        ),
    )
    busy_timeout_ms: int = Field(
        default=30_000,
        description=(
            "How long to wait for a lock: SQLite busy timeout, PostgreSQL lock_timeout "
            "(milliseconds)."
        ),
    )

    # Everything built on first use, in one object: one attribute lookup on the hot path.
    _runtime: _Runtime | None = PrivateAttr(default=None)

    # --- plumbing ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The database URL in use (from config, else from the settings)."""
        return self.database_url or load_settings().ledger_url

    @property
    def dialect_name(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._rt().engine.dialect.name

    def _rt(self) -> _Runtime:
        runtime = self._runtime
        inherited = None
        if runtime is None or runtime.pid != os.getpid():
            if runtime is not None:
                # Inherited through fork: never use the parent's pooled connections.
                runtime.engine.dispose(close=False)
                inherited = runtime
            if self.busy_timeout_ms <= 0:
                raise ValueError(f"busy_timeout_ms must be positive, got {self.busy_timeout_ms}")
            engine = _create_engine(self.url, self.busy_timeout_ms)
            dialect = engine.dialect.name
            sql = _sql(dialect)
            runtime = _Runtime(
                engine=engine,
                pid=os.getpid(),
                sql=sql,
                sqlite=dialect == "sqlite",
                prepared=_prepare(engine, sql),
                inherited=inherited,
            )
            self._runtime = runtime
        return runtime

    def _get_engine(self) -> Engine:
        """The SQLAlchemy engine (created on first use, per process)."""
        return self._rt().engine

    def dispose(self) -> None:
        """Close pooled connections (the engine is recreated on next use)."""
        runtime = self._runtime
        if runtime is not None and runtime.pid == os.getpid():
            runtime.close_idle()
            runtime.engine.dispose()
        self._runtime = None

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.dispose()

    @contextlib.contextmanager
    def _connect(self, mode: _Mode) -> Iterator[Connection]:
        """A connection that is autocommit (one atomic statement at a time) or in a transaction.

        ``write`` transactions hold the database write lock on SQLite (BEGIN IMMEDIATE); on
        PostgreSQL callers lock the rows they change with SELECT ... FOR UPDATE.
        Database errors come out as :class:`LedgerError`; a transaction is rolled back first.
        """
        runtime = self._rt()
        try:
            with runtime.engine.connect() as conn:
                if runtime.sqlite:
                    conn.execution_options(**{_TX_OPTION: mode})
                elif mode != "autocommit":
                    conn.execution_options(isolation_level="READ COMMITTED")
                if mode == "autocommit":
                    yield conn
                else:
                    with conn.begin():
                        yield conn
        except sa.exc.DBAPIError as exc:
            raise self._error(exc) from exc

    def _hot(self, name: str, params: dict[str, Any], *, returning: bool) -> Any:
        """Run hot-path statement ``name`` as one autocommit statement.

        Returns the RETURNING row as a mapping (or None) when ``returning``, else the row
        count. Same semantics as ``with self._connect("autocommit")``; on psycopg2 it takes
        the prepared route (see _Prepared).
        """
        runtime = self._rt()
        if runtime.prepared is not None:
            return self._hot_prepared(runtime, runtime.prepared[name], params, returning)
        try:
            with runtime.engine.connect() as conn:
                if runtime.sqlite:
                    conn.execution_options(**{_TX_OPTION: "autocommit"})
                result = conn.execute(getattr(runtime.sql, name), params)
                return result.mappings().first() if returning else result.rowcount
        except sa.exc.DBAPIError as exc:
            raise self._error(exc) from exc

    def _hot_prepared(
        self, runtime: _Runtime, prepared: _Prepared, params: dict[str, Any], returning: bool
    ) -> Any:
        # A connection kept from the previous call if there is one: a pool checkout and
        # check-in cost about as much client CPU as the statement itself (bench).
        try:
            pooled = runtime.idle.pop()
        except IndexError:
            try:
                pooled = runtime.engine.raw_connection()
            except sa.exc.DBAPIError as exc:
                raise self._error(exc) from exc
        result: Any = None
        done = False
        try:
            driver_connection: Any = pooled.driver_connection
            if not driver_connection.autocommit:
                # The engine is autocommit and the pool resets connections to it on return;
                # this only guards against a statement being left in an open transaction.
                driver_connection.autocommit = True
            cursor = pooled.cursor()
            try:
                cursor.execute(prepared.sql, {**prepared.constants, **params})
                if not returning:
                    result = cursor.rowcount
                else:
                    row = cursor.fetchone()
                    if row is not None:
                        names = [d[0] for d in cursor.description]
                        result = dict(zip(names, row, strict=True))
            finally:
                cursor.close()
            done = True
        except runtime.engine.dialect.loaded_dbapi.Error as exc:
            if runtime.engine.dialect.is_disconnect(exc, pooled.dbapi_connection, None):
                # As SQLAlchemy does on a disconnect: drop this connection, the kept ones
                # and the idle rest of the pool (they most likely died with it); the next
                # call reconnects.
                pooled.invalidate(exc)
                runtime.close_idle(invalidate=exc)
                runtime.engine.dispose()
            raise self._error(exc) from exc
        finally:
            # Keep a healthy connection for the next call (a few per process at most, so
            # the pool keeps room for transactions); anything else goes back to the pool.
            if done and len(runtime.idle) < _HOT_IDLE_MAX:
                runtime.idle.append(pooled)
            else:
                pooled.close()
        return result

    def _error(self, exc: Exception) -> LedgerError:
        """A LedgerError for a database error (SQLAlchemy-wrapped or raw DBAPI)."""
        where = mask_url(self.url)
        orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
        detail = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
        text = str(orig).lower()
        if "no such table" in text or ("relation" in text and "does not exist" in text):
            return LedgerError(
                f"the ledger tables are missing in {where} ({detail}); apply the migrations "
                f"first with RunLedger(...).migrate()"
            )
        if "database is locked" in text or "lock timeout" in text:
            return LedgerError(
                f"the ledger database {where} stayed locked longer than busy_timeout_ms="
                f"{self.busy_timeout_ms} ({detail}); another process holds a long transaction: "
                f"retry, raise busy_timeout_ms, or use PostgreSQL for many concurrent writers"
            )
        if isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError) or type(
            orig
        ).__name__ in ("OperationalError", "InterfaceError"):
            return LedgerError(
                f"cannot use the ledger database {where}: {detail}; check {ENV_DATABASE_URL}, "
                f"that the server is running and accepts connections, and the credentials"
            )
        return LedgerError(f"ledger database error in {where}: {detail}")

    def _now(self, now: datetime | None) -> datetime:
        return datetime.now(UTC) if now is None else _require_aware(now, "now").astimezone(UTC)

    def _load(self, conn: Connection, entry_id: int, *, lock: bool = False) -> Entry:
        sql = _sql(conn.dialect.name)
        query = sql.select_for_update if lock else sql.select_by_id
        row = conn.execute(query, {"b_id": _check_id(entry_id, "entry_id")}).mappings().first()
        if row is None:
            raise UnknownEntryError(
                f"ledger entry {entry_id} does not exist (list entries with `dueledger runs list`)"
            )
        return _entry(row)

    def _record_rejection(
        self, conn: Connection, entry: Entry, run_id: str, at: datetime, action: str, reason: str
    ) -> Entry:
        """Append a rejection to the (locked) entry's summary; state columns stay as they are."""
        item = {
            "run_id": run_id,
            "at": _iso(at),
            "status": entry.status,
            "action": action,
            "reason": reason,
        }
        summary = _appended(entry.summary, SUMMARY_REJECTIONS, item, MAX_LATE_JOB_REJECTIONS)
        return self._set_summary(conn, entry.id, summary, at)

    def _set_summary(
        self, conn: Connection, entry_id: int, summary: dict[str, Any], at: datetime
    ) -> Entry:
        row = (
            conn.execute(
                sa.update(entries)
                .where(entries.c.id == entry_id)
                .values(summary=summary, updated_at=_to_db(at, "now"))
                .returning(*entries.c)
            )
            .mappings()
            .one()
        )
        return _entry(row)

    # --- schema --------------------------------------------------------------------------

    def migrate(self) -> None:
        """Apply the Alembic migrations up to head. Idempotent; safe when processes race.

        Cheap when the schema is already at head (one read, no lock), because run starts
        and sensor ticks call it. Otherwise the upgrade runs in one transaction that first
        takes a cross-process lock (PostgreSQL: ``pg_advisory_xact_lock``; SQLite: ``BEGIN
        IMMEDIATE``), so a second process waits, then finds the schema at head and does
        nothing.
        """
        from alembic import command
        from alembic.config import Config
        from alembic.util import CommandError

        head = _migration_head()
        try:
            with self._rt().engine.connect() as conn:
                if self._rt().sqlite:
                    conn.execution_options(**{_TX_OPTION: "read"})
                current = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
            if current == [(head,)]:
                return
        except sa.exc.DBAPIError:
            pass  # no version table yet (or unreadable): the locked path below decides
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        with self._connect("write") as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(MIGRATION_LOCK_KEY)))
            config.attributes["connection"] = conn
            try:
                command.upgrade(config, "head")
            except CommandError as exc:
                # Typically a database migrated by a newer dueledger than this one.
                raise LedgerError(
                    f"cannot migrate the ledger in {mask_url(self.url)}: {exc}; this code knows "
                    f"revisions up to {head!r}: deploy the dueledger version that migrated it"
                ) from exc

    # --- creating and reading entries ----------------------------------------------------------

    def ensure_entry(
        self,
        *,
        task_key: str,
        trigger: str,
        dedup_key: str,
        due: datetime | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        operator: str | None = None,
        reason: str | None = None,
        parent_id: int | None = None,
        now: datetime | None = None,
        connection: Connection | None = None,
    ) -> Entry:
        """Insert the entry unless ``(task_key, origin, dedup_key)`` exists; return the row.

        Insert-or-ignore (``ON CONFLICT DO NOTHING``) on both dialects: concurrent callers
        with the same key all get the one row, whichever inserted it. The origin is the
        key's prefix. For ``due:`` keys, ``due`` defaults to the time in the key and must
        match it when given. ``connection`` runs it inside a caller's :meth:`transaction`.
        """
        _require_text(task_key, "task_key")
        if trigger not in tags.TRIGGERS:
            raise ValueError(f"trigger {trigger!r} is not one of {', '.join(tags.TRIGGERS)}")
        origin = origin_of(dedup_key)
        if origin == ORIGIN_DUE:
            key_due = parse_due(dedup_key.removeprefix(f"{ORIGIN_DUE}:"))
            if due is not None and _to_db(due, "due") != _to_db(key_due, "due"):
                raise ValueError(
                    f"due {format_due(due)} does not match dedup_key {dedup_key!r}; "
                    f"build the key with dedup_key_for_due(due)"
                )
            due = key_due
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        if parent_id is not None:
            _check_id(parent_id, "parent_id")
        at = _to_db(self._now(now), "now")
        values: dict[str, Any] = {
            "task_key": task_key,
            "trigger": trigger,
            "origin": origin,
            "dedup_key": dedup_key,
            "due": _to_db(due, "due"),
            "status": tags.STATUS_QUEUED,
            "attempt": 0,
            "max_attempts": max_attempts,
            "parent_id": parent_id,
            "run_ids": [],
            "created_at": at,
            "updated_at": at,
            "operator": operator,
            "reason": reason,
            "summary": _summary(None),
        }
        existing = sa.select(entries).where(
            entries.c.task_key == task_key,
            entries.c.origin == origin,
            entries.c.dedup_key == dedup_key,
        )
        with self._maybe(connection) as conn:
            try:
                row = conn.execute(_sql(conn.dialect.name).insert_entry, values).mappings().first()
            except sa.exc.IntegrityError as exc:
                # The only other constraint an insert can break is the parent foreign key.
                raise ValueError(
                    f"parent_id {parent_id} is not an existing ledger entry ({exc.orig})"
                ) from None
            if row is None:
                row = conn.execute(existing).mappings().one()
        return _entry(row)

    @contextlib.contextmanager
    def _maybe(self, connection: Connection | None) -> Iterator[Connection]:
        if connection is not None:
            yield connection
        else:
            with self._connect("autocommit") as conn:
                yield conn

    def get(
        self, entry_id: int, *, connection: Connection | None = None, for_update: bool = False
    ) -> Entry | None:
        """The entry with this id, or None. ``for_update`` locks the row in ``connection``."""
        with self._maybe(connection) as conn:
            try:
                return self._load(conn, entry_id, lock=for_update)
            except UnknownEntryError:
                return None

    def find(self, task_key: str, dedup_key: str) -> Entry | None:
        """The entry for ``(task_key, dedup_key)`` (origin taken from the key), or None."""
        origin = origin_of(dedup_key)
        query = sa.select(entries).where(
            entries.c.task_key == task_key,
            entries.c.origin == origin,
            entries.c.dedup_key == dedup_key,
        )
        with self._connect("autocommit") as conn:
            row = conn.execute(query).mappings().first()
        return None if row is None else _entry(row)

    def children(self, entry_id: int) -> list[Entry]:
        """Entries whose parent is ``entry_id`` (manual retries), oldest first."""
        query = (
            sa.select(entries)
            .where(entries.c.parent_id == _check_id(entry_id, "entry_id"))
            .order_by(entries.c.id)
        )
        with self._connect("autocommit") as conn:
            return [_entry(r) for r in conn.execute(query).mappings()]

    def list_entries(
        self,
        *,
        task_key: str | None = None,
        statuses: Sequence[str] | None = None,
        trigger: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = DEFAULT_LIST_LIMIT,
        cursor: str | None = None,
    ) -> tuple[list[Entry], str | None]:
        """Entries newest first (by created_at, id), keyset-paginated.

        Returns the page and the cursor of the next page (None on the last page). ``since``
        is inclusive and ``until`` exclusive, both on created_at.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        query = sa.select(entries)
        if task_key is not None:
            query = query.where(entries.c.task_key == task_key)
        if statuses:
            unknown = [s for s in statuses if s not in tags.STATUSES]
            if unknown:
                raise ValueError(
                    f"unknown status {', '.join(map(repr, unknown))}; "
                    f"use {', '.join(tags.STATUSES)}"
                )
            query = query.where(entries.c.status.in_(list(statuses)))
        if trigger is not None:
            if trigger not in tags.TRIGGERS:
                raise ValueError(f"trigger {trigger!r} is not one of {', '.join(tags.TRIGGERS)}")
            query = query.where(entries.c.trigger == trigger)
        if since is not None:
            query = query.where(entries.c.created_at >= _to_db(since, "since"))
        if until is not None:
            query = query.where(entries.c.created_at < _to_db(until, "until"))
        if cursor is not None:
            c_created, c_id = _decode_cursor(cursor)
            # A row-value comparison, not an OR: both databases use it as an index bound,
            # so a page deep in the ledger costs the same as the first one.
            query = query.where(
                sa.tuple_(entries.c.created_at, entries.c.id) < sa.tuple_(c_created, c_id)
            )
        query = query.order_by(entries.c.created_at.desc(), entries.c.id.desc()).limit(limit + 1)
        with self._connect("autocommit") as conn:
            page = [_entry(r) for r in conn.execute(query).mappings()]
        if len(page) <= limit:
            return page, None
        page = page[:limit]
        return page, _encode_cursor(page[-1])

    # --- run lifecycle -------------------------------------------------------------------

    def claim(
        self, entry_id: int, run_id: str, *, lease_ttl: timedelta, now: datetime | None = None
    ) -> ClaimResult:
        """Claim the entry for ``run_id``: ``queued|retrying -> running`` with a lease.

        Compare-and-set: one conditional UPDATE, which also counts the attempt and appends
        the run id. Re-entrant for the lease owner. Anything else is a late or duplicate
        run: refused, recorded in ``summary.late_job_rejections``, state untouched. An
        entry whose attempts are used up is never claimed.
        """
        _check_run_id(run_id)
        ttl = _check_ttl(lease_ttl)
        at = self._now(now)
        entry_id = _check_id(entry_id, "entry_id")
        params = {
            "b_id": entry_id,
            "b_run_id": run_id,
            "b_now": _to_db(at, "now"),
            "b_expires": _to_db(at + ttl, "now"),
        }
        row = self._hot("claim", params, returning=True)
        if row is not None:
            return ClaimResult(claimed=True, entry=_entry(row), reason=None)
        # Slow path: decide again while holding the row, so the answer and the record agree.
        with self._connect("write") as conn:
            entry = self._load(conn, entry_id, lock=True)
            if entry.status == tags.STATUS_RUNNING and entry.lease_owner == run_id:
                return ClaimResult(claimed=True, entry=entry, reason=None)
            if entry.status in CLAIMABLE_STATUSES and entry.attempt < entry.max_attempts:
                # It became claimable since the first UPDATE (e.g. a failure -> retrying).
                row = conn.execute(self._rt().sql.claim, params).mappings().one()
                return ClaimResult(claimed=True, entry=_entry(row), reason=None)
            reason = _claim_refusal(entry)
            entry = self._record_rejection(conn, entry, run_id, at, "claim", reason)
        return ClaimResult(claimed=False, entry=entry, reason=reason)

    def heartbeat(
        self, entry_id: int, run_id: str, *, lease_ttl: timedelta, now: datetime | None = None
    ) -> bool:
        """Extend the lease to ``now + lease_ttl``. Only the owner of a running entry may.

        False means the run no longer owns the entry (reclaimed, finished, or never claimed
        by it): it should stop doing side effects.
        """
        _check_run_id(run_id)
        ttl = _check_ttl(lease_ttl)
        at = self._now(now)
        params = {
            "b_id": _check_id(entry_id, "entry_id"),
            "b_run_id": run_id,
            "b_now": _to_db(at, "now"),
            "b_expires": _to_db(at + ttl, "now"),
        }
        return bool(self._hot("heartbeat", params, returning=False) == 1)

    def succeed(self, entry_id: int, run_id: str, *, now: datetime | None = None) -> bool:
        """``running -> success`` for the lease owner; clears the lease.

        Otherwise (late completion after a reclaim, a duplicate run, ...) the entry is left
        as it is, the attempt is recorded as a rejection and False is returned.
        """
        _check_run_id(run_id)
        at = self._now(now)
        entry_id = _check_id(entry_id, "entry_id")
        params = {"b_id": entry_id, "b_run_id": run_id, "b_now": _to_db(at, "now")}
        if self._hot("succeed", params, returning=False) == 1:
            return True
        with self._connect("write") as conn:
            entry = self._load(conn, entry_id, lock=True)
            reason = f"late completion from run {run_id}: {_who(entry)} is {_state(entry)}"
            self._record_rejection(conn, entry, run_id, at, "succeed", f"{reason}; nothing changed")
        return False

    def fail(
        self,
        entry_id: int,
        run_id: str,
        *,
        error: str,
        kind: str = tags.FAILURE_ERROR,
        now: datetime | None = None,
    ) -> Entry:
        """The owner's run failed: ``running -> retrying`` with attempts left, else ``failed``.

        ``kind`` is ``error``, ``timeout`` or ``unsupported_task`` (always ``failed``: a task
        the code location no longer declares cannot be retried). The error is kept
        (truncated to 4000 characters). From anyone but the running owner this is a late
        report: recorded as a rejection, state untouched (success is never overwritten).
        Returns the entry after the call.
        """
        _check_run_id(run_id)
        if kind not in RUN_FAILURE_KINDS:
            if kind == tags.FAILURE_LEASE_RECLAIMED:
                raise ValueError(
                    "kind 'lease_reclaimed' is set by reclaim_expired(), not reported by a run"
                )
            if kind == tags.FAILURE_DISPATCH:
                raise ValueError(
                    "kind 'dispatch' is set by record_dispatch_failure(), not reported by a run"
                )
            raise ValueError(f"failure kind {kind!r} is not one of {', '.join(RUN_FAILURE_KINDS)}")
        text = truncate_error(error)
        at = self._now(now)
        entry_id = _check_id(entry_id, "entry_id")
        params = {
            "b_id": entry_id,
            "b_run_id": run_id,
            "b_now": _to_db(at, "now"),
            "b_kind": kind,
            "b_error": text,
        }
        row = self._hot("fail", params, returning=True)
        if row is not None:
            return _entry(row)
        with self._connect("write") as conn:
            entry = self._load(conn, entry_id, lock=True)
            first_line = text.strip().splitlines()[0][:200] if text.strip() else ""
            reason = (
                f"late failure report from run {run_id} ({kind}: {first_line}): "
                f"{_who(entry)} is {_state(entry)}; nothing changed"
            )
            return self._record_rejection(conn, entry, run_id, at, "fail", reason)

    def reject(
        self, entry_id: int, run_id: str, *, reason: str, now: datetime | None = None
    ) -> Entry:
        """Record that ``run_id`` was a late or duplicate run for this entry; state untouched."""
        _check_run_id(run_id)
        _require_text(reason, "reason")
        at = self._now(now)
        with self._connect("write") as conn:
            entry = self._load(conn, entry_id, lock=True)
            return self._record_rejection(conn, entry, run_id, at, "reject", reason)

    # --- dispatch --------------------------------------------------------------------------

    def record_dispatch_failure(
        self,
        entry_id: int,
        *,
        error: str,
        run_id: str | None = None,
        now: datetime | None = None,
    ) -> Entry:
        """The launch of a run for this entry failed: ``queued|retrying -> dispatch_failed``.

        Not a business failure: kind ``dispatch``; the error is appended to
        ``summary.dispatch_failures`` (newest 5 kept). A running or terminal entry is left
        untouched (the failed launch was a duplicate). Returns the entry after the call.
        """
        text = truncate_error(error)
        if run_id is not None:
            _check_run_id(run_id)
        at = self._now(now)
        with self._connect("write") as conn:
            entry = self._load(conn, entry_id, lock=True)
            if entry.status not in DISPATCHABLE_STATUSES:
                return entry
            item = {"at": _iso(at), "error": text, "run_id": run_id}
            summary = _appended(
                entry.summary, SUMMARY_DISPATCH_FAILURES, item, MAX_DISPATCH_FAILURES
            )
            row = (
                conn.execute(
                    sa.update(entries)
                    .where(entries.c.id == entry.id)
                    .values(
                        status=tags.STATUS_DISPATCH_FAILED,
                        failure_kind=tags.FAILURE_DISPATCH,
                        error=text,
                        summary=summary,
                        updated_at=_to_db(at, "now"),
                    )
                    .returning(*entries.c)
                )
                .mappings()
                .one()
            )
            return _entry(row)

    def redispatch(self, entry_id: int, *, now: datetime | None = None) -> bool:
        """``dispatch_failed -> queued`` with the attempt count reset; earlier errors kept.

        Refused (False) unless the entry is dispatch_failed, and once a manual retry has
        been made of it (its child runs instead).
        """
        at = self._now(now)
        stmt = (
            sa.update(entries)
            .where(
                entries.c.id == _check_id(entry_id, "entry_id"),
                entries.c.status == tags.STATUS_DISPATCH_FAILED,
                entries.c.manual_retry_at.is_(None),
            )
            .values(status=tags.STATUS_QUEUED, attempt=0, updated_at=_to_db(at, "now"))
        )
        with self._connect("autocommit") as conn:
            return conn.execute(stmt).rowcount == 1

    # --- leases ------------------------------------------------------------------------------

    def reclaim_expired(
        self, *, now: datetime | None = None, dry_run: bool = False, limit: int = 1000
    ) -> list[Entry]:
        """Running entries whose lease expired before ``now`` -> ``failed`` (lease_reclaimed).

        Never re-run automatically: the run may have had side effects. Each entry is
        reclaimed by its own compare-and-set (same owner, lease still expired), so a run that
        heartbeats in between keeps its entry. Returns the reclaimed entries (after); with
        ``dry_run`` the candidates, unchanged.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        at = self._now(now)
        stamp = _to_db(at, "now")
        query = (
            sa.select(entries)
            .where(entries.c.status == tags.STATUS_RUNNING, entries.c.lease_expires_at < stamp)
            .order_by(entries.c.lease_expires_at, entries.c.id)
            .limit(limit)
        )
        with self._connect("autocommit") as conn:
            candidates = [_entry(r) for r in conn.execute(query).mappings()]
            if dry_run:
                return candidates
            reclaimed = []
            for entry in candidates:
                expired_at = entry.lease_expires_at
                assert expired_at is not None  # selected by lease_expires_at < now
                heartbeat = _iso(entry.heartbeat_at) or "never"
                message = (
                    f"lease of run {entry.lease_owner} expired at {_iso(expired_at)}, "
                    f"{format_duration(at - expired_at)} overdue (last heartbeat {heartbeat}); "
                    f"reclaimed at {_iso(at)}. Not re-run automatically: the run may have had "
                    f"side effects. Check run {entry.lease_owner} in Dagster; to run it again "
                    f"use `dueledger runs retry {entry.id} --acknowledge-side-effects`"
                )
                row = (
                    conn.execute(
                        sa.update(entries)
                        .where(
                            entries.c.id == entry.id,
                            entries.c.status == tags.STATUS_RUNNING,
                            entries.c.lease_owner == entry.lease_owner,
                            entries.c.lease_expires_at < stamp,
                        )
                        .values(
                            status=tags.STATUS_FAILED,
                            failure_kind=tags.FAILURE_LEASE_RECLAIMED,
                            error=truncate_error(message),
                            lease_owner=None,
                            lease_expires_at=None,
                            finished_at=stamp,
                            updated_at=stamp,
                        )
                        .returning(*entries.c)
                    )
                    .mappings()
                    .first()
                )
                if row is not None:
                    reclaimed.append(_entry(row))
        return reclaimed

    # --- hooks, audit, manual retry support -------------------------------------------------

    def record_hook_result(self, entry_id: int, result: dict[str, Any]) -> None:
        """Append a hook outcome to ``summary.hooks`` (newest 20 kept)."""
        if not isinstance(result, Mapping):
            raise ValueError(f"hook result must be a dict, got {result!r}")
        try:
            item = json.loads(json.dumps(dict(result)))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"hook result {result!r} is not JSON-serialisable: {exc}") from None
        at = self._now(None)
        with self._connect("write") as conn:
            entry = self._load(conn, entry_id, lock=True)
            summary = _appended(entry.summary, SUMMARY_HOOKS, item, MAX_HOOK_RESULTS)
            self._set_summary(conn, entry.id, summary, at)

    def mark_manual_retry(
        self,
        parent_id: int,
        *,
        operator: str,
        statuses: Sequence[str] = (tags.STATUS_FAILED,),
        now: datetime | None = None,
        connection: Connection | None = None,
    ) -> bool:
        """Stamp ``manual_retry_at/by`` on the parent, once: compare-and-set.

        True only for the first caller while the parent is in ``statuses``; use it in the
        same :meth:`transaction` that creates the child entry and writes the audit record.
        """
        _require_text(operator, "operator")
        unknown = [s for s in statuses if s not in tags.STATUSES]
        if unknown:
            raise ValueError(f"unknown status {', '.join(map(repr, unknown))}")
        at = _to_db(self._now(now), "now")
        stmt = (
            sa.update(entries)
            .where(
                entries.c.id == _check_id(parent_id, "parent_id"),
                entries.c.status.in_(list(statuses)),
                entries.c.manual_retry_at.is_(None),
            )
            .values(manual_retry_at=at, manual_retry_by=operator, updated_at=at)
        )
        with self._maybe(connection) as conn:
            return conn.execute(stmt).rowcount == 1

    def write_audit(
        self,
        *,
        operator: str | None,
        action: str,
        entry_id: int | None,
        child_entry_id: int | None = None,
        reason: str | None = None,
        checks: Mapping[str, Any] | Sequence[Any] | None = None,
        outcome: str,
        now: datetime | None = None,
        connection: Connection | None = None,
    ) -> int:
        """Append an audit record; returns its id. ``connection`` joins a caller's transaction."""
        _require_text(action, "action")
        _require_text(outcome, "outcome")
        try:
            checks_json = None if checks is None else json.loads(json.dumps(checks))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"audit checks {checks!r} are not JSON-serialisable: {exc}") from None
        stmt = (
            sa.insert(audit)
            .values(
                at=_to_db(self._now(now), "now"),
                operator=operator,
                action=action,
                entry_id=entry_id,
                child_entry_id=child_entry_id,
                reason=reason,
                checks=checks_json,
                outcome=outcome,
            )
            .returning(audit.c.id)
        )
        with self._maybe(connection) as conn:
            return int(conn.execute(stmt).scalar_one())

    def audit_for(self, entry_id: int) -> list[dict[str, Any]]:
        """Audit records that name the entry as subject or child, oldest first."""
        entry_id = _check_id(entry_id, "entry_id")
        query = (
            sa.select(audit)
            .where(sa.or_(audit.c.entry_id == entry_id, audit.c.child_entry_id == entry_id))
            .order_by(audit.c.id)
        )
        with self._connect("autocommit") as conn:
            rows = list(conn.execute(query).mappings())
        return [
            {
                "id": int(r["id"]),
                "at": _iso(_from_db(r["at"])),
                "operator": r["operator"],
                "action": r["action"],
                "entry_id": r["entry_id"],
                "child_entry_id": r["child_entry_id"],
                "reason": r["reason"],
                "checks": r["checks"],
                "outcome": r["outcome"],
            }
            for r in rows
        ]

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A connection in a write transaction, committed on success, rolled back on error.

        For multi-statement operations (a manual retry writes the parent stamp, the child
        entry and the audit record together): pass it as ``connection=`` to
        :meth:`ensure_entry`, :meth:`get` (``for_update=True``), :meth:`mark_manual_retry`
        and :meth:`write_audit`. On SQLite it holds the database write lock throughout;
        keep it short.
        """
        with self._connect("write") as conn:
            yield conn

    def summary_counts(
        self, *, now: datetime | None = None, window: timedelta = timedelta(hours=24)
    ) -> dict[str, int]:
        """Counts for `dueledger summary` (added for issue 5), each one indexed COUNT.

        ``active``: running with a live lease; ``stale``: running with an expired lease (what
        the reclaim sensor will fail); ``queued`` / ``retrying``: waiting now. Over the last
        ``window``: ``failed`` / ``success`` / ``lease_reclaimed`` by ``finished_at``,
        ``dispatch_failed`` by ``updated_at`` (the last launch failure), ``manual_retry``
        entries by ``created_at``. Keys of the windowed counts end in ``_window``.
        """
        if not isinstance(window, timedelta) or window <= timedelta(0):
            raise ValueError(f"window must be a positive timedelta, got {window!r}")
        at = self._now(now)
        stamp = _to_db(at, "now")
        since = _to_db(at - window, "now")
        c = entries.c
        where: dict[str, Any] = {
            "active": sa.and_(c.status == tags.STATUS_RUNNING, c.lease_expires_at >= stamp),
            "stale": sa.and_(c.status == tags.STATUS_RUNNING, c.lease_expires_at < stamp),
            "queued": c.status == tags.STATUS_QUEUED,
            "retrying": c.status == tags.STATUS_RETRYING,
            "failed_window": sa.and_(c.status == tags.STATUS_FAILED, c.finished_at >= since),
            "success_window": sa.and_(c.status == tags.STATUS_SUCCESS, c.finished_at >= since),
            "lease_reclaimed_window": sa.and_(
                c.status == tags.STATUS_FAILED,
                c.finished_at >= since,
                c.failure_kind == tags.FAILURE_LEASE_RECLAIMED,
            ),
            "dispatch_failed_window": sa.and_(
                c.status == tags.STATUS_DISPATCH_FAILED, c.updated_at >= since
            ),
            "manual_retry_window": sa.and_(
                c.trigger == tags.TRIGGER_MANUAL_RETRY, c.created_at >= since
            ),
        }
        count = sa.select(sa.func.count()).select_from(entries)
        with self._connect("autocommit") as conn:
            return {
                name: int(conn.execute(count.where(cond)).scalar_one())
                for name, cond in where.items()
            }

    def settle_unretried_run(
        self,
        entry_id: int,
        run_id: str,
        *,
        error: str,
        kind: str = tags.FAILURE_ERROR,
        now: datetime | None = None,
    ) -> Entry | None:
        """Dagster ended ``run_id`` and will not retry it: its entry becomes ``failed``.

        Added for issue 4 (sensors/outcomes.py, the outcome reconciler). Two cases, decided
        under the row lock: ``running`` with ``run_id`` as lease owner (the run died without
        recording its outcome; ``kind``/``error`` are set even with attempts left, because no
        retry run will come to use them), and ``retrying`` whose latest run is ``run_id``
        (the retry it waits for will never be launched; the run's own error and kind are
        kept). Anything else — terminal, another run's lease, a run that never claimed — is
        left untouched and None is returned. Returns the entry after the change.
        """
        _check_run_id(run_id)
        if kind not in RUN_FAILURE_KINDS:
            raise ValueError(f"failure kind {kind!r} is not one of {', '.join(RUN_FAILURE_KINDS)}")
        at = self._now(now)
        stamp = _to_db(at, "now")
        with self._connect("write") as conn:
            entry = self._load(conn, _check_id(entry_id, "entry_id"), lock=True)
            owned = entry.status == tags.STATUS_RUNNING and entry.lease_owner == run_id
            waiting = (
                entry.status == tags.STATUS_RETRYING
                and bool(entry.run_ids)
                and entry.run_ids[-1] == run_id
            )
            if not (owned or waiting):
                return None
            values: dict[str, Any] = {
                "status": tags.STATUS_FAILED,
                "lease_owner": None,
                "lease_expires_at": None,
                "finished_at": stamp,
                "updated_at": stamp,
            }
            if owned or not entry.error:
                values.update(failure_kind=kind, error=truncate_error(error))
            row = (
                conn.execute(
                    sa.update(entries)
                    .where(entries.c.id == entry.id, entries.c.status == entry.status)
                    .values(**values)
                    .returning(*entries.c)
                )
                .mappings()
                .one()
            )
            return _entry(row)


# --- validation and cursors --------------------------------------------------------------------


def _check_id(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    return value


def _check_run_id(run_id: object) -> str:
    text = _require_text(run_id, "run_id")
    if len(text) > MAX_RUN_ID_CHARS:
        raise ValueError(f"run_id {text[:40]!r}... is longer than {MAX_RUN_ID_CHARS} characters")
    return text


def _check_ttl(lease_ttl: object) -> timedelta:
    if not isinstance(lease_ttl, timedelta) or lease_ttl <= timedelta(0):
        raise ValueError(f"lease_ttl must be a positive timedelta, got {lease_ttl!r}")
    return lease_ttl


def _encode_cursor(entry: Entry) -> str:
    raw = f"{_iso(entry.created_at)}|{entry.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, int]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created_text, id_text = base64.urlsafe_b64decode(padded).decode().split("|")
        created = datetime.strptime(created_text, "%Y-%m-%dT%H:%M:%S.%fZ")
        return created, int(id_text)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValueError(f"cursor {cursor!r} is not a cursor returned by a previous page") from None
