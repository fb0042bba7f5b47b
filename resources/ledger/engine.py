"""The ledger's database plumbing: engines, connections, the raw-DBAPI hot path, errors.

A :class:`Runtime` is what a ledger builds on first use in a process: the SQLAlchemy engine,
the statements for its dialect and, on psycopg2, the hot-path statements prepared for the
DBAPI cursor. After a fork the child builds its own (see ``LedgerStore._rt``).

- SQLite runs in WAL mode with a busy timeout; SQLAlchemy's pysqlite driver is told to let
  us emit BEGIN ourselves (the documented event-hook recipe), because its own legacy
  transaction handling cannot take the write lock up front.
- PostgreSQL engines are autocommit: a compare-and-set transition is one statement, so a
  BEGIN/COMMIT pair would only add round trips; transactions ask for READ COMMITTED.
- Database errors come out as :class:`LedgerError` naming the database (password masked)
  and the fix.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, make_url

from resources.core.settings import ENV_DATABASE_URL, mask_url
from resources.ledger.memo import was_migrated
from resources.ledger.model import LedgerConfigError, LedgerConflict, LedgerError
from resources.ledger.statements import Statements, statements_for

# Custom execution option read by the SQLite "begin" hook: how to start a transaction.
TX_OPTION: Final = "dueledger_tx"
Mode = Literal["autocommit", "write", "read"]

#: Hot-path connections a process keeps checked out between calls (one per busy thread).
_HOT_IDLE_MAX: Final = 2
#: Statements of the hot path, by Statements field name: claim/heartbeat/succeed/fail.
HOT_PATH: Final = ("claim", "heartbeat", "succeed", "fail")

# This process's id, kept current across forks: every ledger call checks it (a runtime
# inherited through fork must not be used), and os.getpid() is a system call, about 0.7 us
# on this VM -- three per claim cycle (bench/ledger_claims.py).
_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def current_pid() -> int:
    """``os.getpid()`` without the system call (updated in a forked child)."""
    return _pid


@dataclass(frozen=True)
class Prepared:
    """A hot-path statement compiled once by SQLAlchemy, for executing on the DBAPI cursor.

    Why: on a busy host SQLAlchemy's per-execution machinery (execution context, result
    wrapping) costs more client CPU than the driver call itself (measured by
    bench/ledger_claims.py). The SQL is SQLAlchemy's own compilation of the Core statement
    for this engine's dialect; only the per-call wrapping is skipped. Used for psycopg2
    only, whose native adaptation of these parameter and result types (str, int, naive
    datetime, jsonb) is exactly what SQLAlchemy would send and return for them.

    The statement's constants (statuses, NULLs, the attempt increment) are rendered into
    the SQL here, once, as the dialect renders literals; psycopg2 interpolates parameters
    on the client, so the server receives the same text, and a call adapts only its own
    values. ``columns`` names the RETURNING columns, in order (empty without RETURNING).
    """

    sql: str
    columns: tuple[str, ...]


def prepare(engine: Engine, sql: Statements) -> dict[str, Prepared] | None:
    if engine.dialect.name != "postgresql" or engine.dialect.driver != "psycopg2":
        return None
    prepared = {}
    for name in HOT_PATH:
        statement = getattr(sql, name)
        compiled = statement.compile(dialect=engine.dialect)
        text = compiled.string
        for key, value in compiled.params.items():
            if key.startswith("b_"):
                continue  # a per-call value
            literal = sa.literal(value, type_=compiled.binds[key].type).compile(
                dialect=engine.dialect, compile_kwargs={"literal_binds": True}
            )
            placeholder = f"%({key})s"
            if placeholder not in text:  # pragma: no cover - a dialect change would show here
                raise AssertionError(f"hot-path statement {name}: no {placeholder} in {text}")
            text = text.replace(placeholder, str(literal).replace("%", "%%"))
        columns = tuple(c.key for c in statement.exported_columns)
        prepared[name] = Prepared(sql=text, columns=columns)
    return prepared


@dataclass(frozen=True)
class Runtime:
    """What a ledger builds on first use in a process: engine, statements, kept connections."""

    url: str
    busy_timeout_ms: int
    engine: Engine
    pid: int
    sql: Statements
    sqlite: bool
    prepared: dict[str, Prepared] | None
    # Hot-path (connection, cursor) pairs kept checked out of the pool between calls
    # (see _hot_prepared).
    idle: deque[tuple[Any, Any]] = field(default_factory=deque)
    # After a fork: the parent's runtime, kept referenced so that its connections (shared
    # sockets) are never closed or used from this process.
    inherited: Runtime | None = None

    def close_idle(self, invalidate: BaseException | None = None) -> None:
        while self.idle:
            try:
                pooled, cursor = self.idle.pop()
            except IndexError:  # another thread took the last one
                return
            with contextlib.suppress(Exception):  # a dead connection's cursor
                cursor.close()
            if invalidate is not None:
                pooled.invalidate(invalidate)
            pooled.close()

    @contextlib.contextmanager
    def connect(self, mode: Mode) -> Iterator[Connection]:
        """A connection that is autocommit (one atomic statement at a time) or in a transaction.

        ``write`` transactions hold the database write lock on SQLite (BEGIN IMMEDIATE); on
        PostgreSQL callers lock the rows they change with SELECT ... FOR UPDATE.
        Database errors come out as :class:`LedgerError`; a transaction is rolled back first.
        """
        try:
            with self.engine.connect() as conn:
                if self.sqlite:
                    conn.execution_options(**{TX_OPTION: mode})
                elif mode != "autocommit":
                    conn.execution_options(isolation_level="READ COMMITTED")
                if mode == "autocommit":
                    yield conn
                else:
                    with conn.begin():
                        yield conn
        except sa.exc.DBAPIError as exc:
            raise self.error(exc) from exc

    def hot(self, name: str, params: dict[str, Any], *, returning: bool) -> Any:
        """Run hot-path statement ``name`` as one autocommit statement.

        Returns the RETURNING row as a mapping (or None) when ``returning``, else the row
        count. Same semantics as ``with self.connect("autocommit")``; on psycopg2 it takes
        the prepared route (see Prepared).
        """
        if self.prepared is not None:
            return self._hot_prepared(self.prepared[name], params, returning)
        try:
            with self.engine.connect() as conn:
                if self.sqlite:
                    conn.execution_options(**{TX_OPTION: "autocommit"})
                result = conn.execute(getattr(self.sql, name), params)
                return result.mappings().first() if returning else result.rowcount
        except sa.exc.DBAPIError as exc:
            raise self.error(exc) from exc

    def _hot_prepared(self, prepared: Prepared, params: dict[str, Any], returning: bool) -> Any:
        # A connection (and its cursor) kept from the previous call if there is one: a pool
        # checkout and check-in cost about as much client CPU as the statement itself (bench).
        try:
            pooled, cursor = self.idle.pop()
        except IndexError:
            pooled, cursor = self._hot_connection()
        result: Any = None
        done = False
        try:
            cursor.execute(prepared.sql, params)
            if not returning:
                result = cursor.rowcount
            else:
                row = cursor.fetchone()
                if row is not None:
                    result = dict(zip(prepared.columns, row, strict=True))
            done = True
        except self.engine.dialect.loaded_dbapi.Error as exc:
            if self.engine.dialect.is_disconnect(exc, pooled.dbapi_connection, None):
                # As SQLAlchemy does on a disconnect: drop this connection, the kept ones
                # and the idle rest of the pool (they most likely died with it); the next
                # call reconnects.
                pooled.invalidate(exc)
                self.close_idle(invalidate=exc)
                self.engine.dispose()
            raise self.error(exc) from exc
        finally:
            # Keep a healthy connection for the next call (a few per process at most, so
            # the pool keeps room for transactions); anything else goes back to the pool.
            if done and len(self.idle) < _HOT_IDLE_MAX:
                self.idle.append((pooled, cursor))
            else:
                with contextlib.suppress(Exception):  # a dead connection's cursor
                    cursor.close()
                pooled.close()
        return result

    def _hot_connection(self) -> tuple[Any, Any]:
        """A pooled DBAPI connection in autocommit, with the cursor the hot path reuses."""
        try:
            pooled = self.engine.raw_connection()
        except sa.exc.DBAPIError as exc:
            raise self.error(exc) from exc
        try:
            driver_connection: Any = pooled.driver_connection
            if not driver_connection.autocommit:
                # The engine is autocommit and the pool resets connections to it on return;
                # this only guards against a statement being left in an open transaction.
                driver_connection.autocommit = True
            return pooled, pooled.cursor()
        except self.engine.dialect.loaded_dbapi.Error as exc:
            pooled.invalidate(exc)
            raise self.error(exc) from exc

    def error(self, exc: Exception) -> LedgerError:
        """A LedgerError for a database error (SQLAlchemy-wrapped or raw DBAPI)."""
        where = mask_url(self.url)
        orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
        detail = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
        text = str(orig).lower()
        if isinstance(exc, sa.exc.IntegrityError) or type(orig).__name__ in (
            "IntegrityError",
            "UniqueViolation",
        ):
            return LedgerConflict(f"ledger write conflict in {where}: {detail}")
        if "no such table" in text or ("relation" in text and "does not exist" in text):
            if not was_migrated(self.url):
                return LedgerConfigError(
                    f"the ledger tables are missing in {where} ({detail}): this ledger was "
                    f"never migrated. Every `dueledger` command and run creates them in a "
                    f"database it opens; from Python, call RunLedger(...).migrate() first"
                )
            return LedgerConfigError(
                f"the ledger tables are missing in {where} ({detail}), though this process "
                f"found the database at the newest migration: it records a migration its "
                f"tables do not match (restored or copied in part). Point "
                f"DUELEDGER_DATABASE_URL at the ledger's database, or at an empty one to "
                f"start a new ledger"
            )
        if "database is locked" in text or "lock timeout" in text:
            return LedgerError(
                f"the ledger database {where} stayed locked longer than busy_timeout_ms="
                f"{self.busy_timeout_ms} ({detail}); another process holds a long transaction: "
                f"retry, raise busy_timeout_ms, or use PostgreSQL for many concurrent writers"
            )
        if any(s in text for s in ("disk is full", "no space left", "could not extend file")):
            return LedgerError(
                f"the ledger database {where} is out of disk space ({detail}); the statement "
                f"was not applied: free space on the volume that holds it, then retry"
            )
        if "readonly database" in text or "read-only" in text:
            return LedgerError(
                f"the ledger database {where} is read-only ({detail}); the statement was not "
                f"applied: "
                + (
                    "make the file, and the folder that holds it and its -wal/-shm files, "
                    "writable by this user"
                    if self.sqlite
                    else f"point {ENV_DATABASE_URL} at the writable primary, not a replica or "
                    f"a database set to default_transaction_read_only"
                )
            )
        if isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError) or type(
            orig
        ).__name__ in ("OperationalError", "InterfaceError"):
            return LedgerError(
                f"cannot use the ledger database {where}: {detail}; check {ENV_DATABASE_URL}, "
                + (
                    "and that the file's folder exists and this user may write there"
                    if self.sqlite
                    else "that the server is running and accepts connections, and the credentials"
                )
            )
        return LedgerError(f"ledger database error in {where}: {detail}")


def build_runtime(url: str, busy_timeout_ms: int, inherited: Runtime | None = None) -> Runtime:
    """A new runtime for this process (``inherited``: the parent's, after a fork)."""
    if busy_timeout_ms <= 0:
        raise ValueError(f"busy_timeout_ms must be positive, got {busy_timeout_ms}")
    engine = create_engine(url, busy_timeout_ms)
    dialect = engine.dialect.name
    sql = statements_for(dialect)
    return Runtime(
        url=url,
        busy_timeout_ms=busy_timeout_ms,
        engine=engine,
        pid=current_pid(),
        sql=sql,
        sqlite=dialect == "sqlite",
        prepared=prepare(engine, sql),
        inherited=inherited,
    )


# --- engine setup ----------------------------------------------------------------------------


def create_engine(url_text: str, busy_timeout_ms: int) -> Engine:
    try:
        url = make_url(url_text)
    except sa.exc.ArgumentError:
        raise LedgerConfigError(
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
        raise LedgerConfigError(
            f"cannot open ledger database {mask_url(url_text)}: {exc}; use the sqlite:/// or "
            f"postgresql+psycopg2:// scheme in {ENV_DATABASE_URL}"
        ) from exc
    raise LedgerConfigError(
        f"ledger database {mask_url(url_text)} uses backend {backend!r}; the ledger supports "
        f"sqlite and postgresql only (set {ENV_DATABASE_URL})"
    )


def _create_sqlite_engine(url: sa.URL, busy_timeout_ms: int) -> Engine:
    database = url.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        # The default ledger lives under DAGSTER_HOME, which may not exist yet.
        try:
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # e.g. a path component is a regular file
            raise LedgerConfigError(
                f"cannot create the folder of the SQLite ledger {mask_url(str(url))}: "
                f"{exc.strerror or exc} ({exc.filename}); set {ENV_DATABASE_URL} to a path "
                f"under a folder you can write, e.g. sqlite:////var/lib/dueledger/ledger.sqlite"
            ) from None
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
        mode = conn.get_execution_options().get(TX_OPTION, "write")
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
    # READ COMMITTED explicitly (see Runtime.connect).
    return sa.create_engine(url, connect_args=connect_args, isolation_level="AUTOCOMMIT")
