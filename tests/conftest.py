"""Root test configuration: isolation from the developer's environment, database URLs.

Fixtures:
- ``pg_server`` (session): a throwaway PostgreSQL server (``pg_server.PgServer``).
- ``postgres_url``: a fresh, empty database on it, as a ``postgresql+psycopg2://`` URL.
- ``sqlite_url``: a ``sqlite:///`` URL to a file in the test's tmp_path (not created).
- ``ledger_url``: parametrized ``sqlite`` / ``postgres`` (the latter marked ``postgres``).
- ``ledger``: a migrated ``RunLedger`` on ``ledger_url`` that checks nothing was deleted;
  ``sqlite_ledger``; ``ledger_in_environment`` (also named by ``DUELEDGER_DATABASE_URL``).
- ``dagster_home`` (session, autouse): a temp ``DAGSTER_HOME``; ``DUELEDGER_*`` cleared
  (``DUELEDGER_SOAK_SEED``, ``DUELEDGER_HISTORY_*`` and ``DUELEDGER_CLUSTER_*``, which steer
  the soak, the fault harness and the cluster tests, are kept).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    # Test helper modules (pg_server, dagster_internals, ...) import as top-level modules.
    sys.path.insert(0, str(TESTS_DIR))
if str(TESTS_DIR.parent) not in sys.path:
    # With tests/ on sys.path, a test folder named like a package (tests/sensors, ...) is a
    # namespace portion that shadows the real package: the editable install's finder runs
    # after the path finder. A regular package anywhere on sys.path wins over namespace
    # portions, so the project root goes at the end (helpers above still come first).
    sys.path.append(str(TESTS_DIR.parent))

import pg_server as pg  # noqa: E402
from processes import restore_default_signals  # noqa: E402

from resources.core.settings import ENV_DATABASE_URL  # noqa: E402
from resources.ledger import RunLedger  # noqa: E402

# A suite started in the background (CI, nohup, a non-interactive shell) inherits SIGINT
# ignored; Dagster maps SIGTERM onto SIGINT's handler, so SIGTERM is then ignored too, and
# every process a run starts inherits that -- its compute-log `tail -F` mirrors, which
# Dagster stops with SIGTERM, would outlive the run (and hold each run's end for 30 s).
restore_default_signals()

_ISOLATED_ENV: dict[str, str] = {}
_SAVED_ENV: dict[str, str] = {}


#: Variables that steer a test, not dueledger: kept through the isolation.
_TEST_CONTROLS = frozenset(
    {
        "DUELEDGER_SOAK_SEED",
        "DUELEDGER_SCREENSHOTS",
        "DUELEDGER_HISTORY_SEED",
        "DUELEDGER_HISTORY_DUES",
        "DUELEDGER_CLUSTER_SEED",
        "DUELEDGER_CLUSTER_TASKS",
        "DUELEDGER_CLUSTER_SLOTS",
        "DUELEDGER_DST_EXAMPLES",
    }
)


def _apply_isolated_env() -> None:
    for key in [k for k in os.environ if k.startswith("DUELEDGER_") and k not in _TEST_CONTROLS]:
        del os.environ[key]
    os.environ.update(_ISOLATED_ENV)


def pytest_configure(config: pytest.Config) -> None:
    # Done this early (not only in a fixture) so that imports during collection never see
    # the developer's real DAGSTER_HOME or DUELEDGER_* settings either.
    _SAVED_ENV.update(
        {k: v for k, v in os.environ.items() if k.startswith("DUELEDGER_") or k == "DAGSTER_HOME"}
    )
    home = tempfile.mkdtemp(prefix="dueledger-test-dagster-home-")
    _ISOLATED_ENV["DAGSTER_HOME"] = home
    _apply_isolated_env()


def pytest_unconfigure(config: pytest.Config) -> None:
    home = _ISOLATED_ENV.pop("DAGSTER_HOME", None)
    if home:
        shutil.rmtree(home, ignore_errors=True)
        if os.environ.get("DAGSTER_HOME") == home:
            del os.environ["DAGSTER_HOME"]
    os.environ.update(_SAVED_ENV)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Anything that needs the server is a postgres test, so `-m "not postgres"` deselects it.
    for item in items:
        if "pg_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)
    # The browser suite runs last. Its session-wide Playwright (sync API) keeps an asyncio
    # loop running on the main thread until the session ends, and every later
    # `asyncio.run` -- dagster-graphql's execute_query, which other tests call -- would fail
    # with "cannot be called from a running event loop".
    items.sort(key=lambda item: item.get_closest_marker("browser") is not None)


@pytest.fixture(scope="session", autouse=True)
def dagster_home() -> Iterator[Path]:
    """The session's temporary DAGSTER_HOME (also re-applies the isolation)."""
    _apply_isolated_env()
    yield Path(_ISOLATED_ENV["DAGSTER_HOME"])


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pg.PgServer]:
    """A throwaway PostgreSQL server on 127.0.0.1, stopped and removed at session end."""
    try:
        server = pg.start_server()
    except pg.PgServerError as exc:
        pytest.fail(f"throwaway PostgreSQL server unavailable: {exc}", pytrace=False)
    watchdog = pg.start_watchdog(server)
    try:
        yield server
    finally:
        server.stop(remove=True)
        watchdog.kill()
        watchdog.wait()


@pytest.fixture
def postgres_url(pg_server: pg.PgServer) -> Iterator[str]:
    """A new empty database for this test; dropped (connections forced off) afterwards."""
    name = f"t_{uuid.uuid4().hex[:20]}"
    url = pg_server.create_database(name)
    yield url
    with contextlib.suppress(Exception):
        pg_server.drop_database(name)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """SQLAlchemy URL of a SQLite file (not yet created) in this test's tmp_path."""
    return f"sqlite:///{tmp_path / 'ledger.sqlite'}"


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def ledger_url(request: pytest.FixtureRequest) -> str:
    """A fresh ledger database URL: SQLite file or PostgreSQL database."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[RunLedger]:
    """A migrated ledger on ``ledger_url`` (SQLite and PostgreSQL; a module narrows the
    backends by overriding ``ledger_url``). Afterwards: no statement of the test deleted or
    dropped anything, whatever the test did (ledger rows are never deleted)."""
    resource = RunLedger(database_url=ledger_url)
    resource.migrate()
    destructive: list[str] = []

    def watch(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith(("DELETE", "DROP TABLE", "TRUNCATE")):
            destructive.append(statement)

    # The resource's own engine: the only way to see every statement it sends.
    engine = resource._get_engine()
    sa.event.listen(engine, "before_cursor_execute", watch)
    yield resource
    sa.event.remove(engine, "before_cursor_execute", watch)
    resource.dispose()
    assert destructive == [], "ledger rows are never deleted"


@pytest.fixture
def sqlite_ledger(sqlite_url: str) -> Iterator[RunLedger]:
    """A migrated SQLite ledger, beside a module's parametrized ``ledger``."""
    resource = RunLedger(database_url=sqlite_url)
    resource.migrate()
    yield resource
    resource.dispose()


@pytest.fixture
def ledger_in_environment(
    ledger: RunLedger, ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> RunLedger:
    """``ledger``, also named by ``DUELEDGER_DATABASE_URL``: the one the code location's own
    ``RunLedger()`` (its sensors, assets and the CLI) opens."""
    monkeypatch.setenv(ENV_DATABASE_URL, ledger_url)
    return ledger
