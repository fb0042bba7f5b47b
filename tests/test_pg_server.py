"""The test infrastructure itself: throwaway PostgreSQL server, database URLs, isolation."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pg_server as pg
import pytest
import sqlalchemy as sa

PG_SERVER_PY = Path(pg.__file__).resolve()


# ------------------------------------------------------------------ locating binaries


def _fake_bindir(directory: Path, names: tuple[str, ...] = pg.REQUIRED_BINARIES) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = directory / name
        path.write_text("#!/bin/sh\nexit 0\n")
        path.chmod(0o755)
    return directory


def test_locator_finds_binaries_on_path(tmp_path: Path) -> None:
    fake = _fake_bindir(tmp_path / "bin")
    found = pg.find_bindir(path_env=str(fake), lib_glob=str(tmp_path / "none/*/bin"), env={})
    assert found == fake


def test_locator_needs_all_three_binaries(tmp_path: Path) -> None:
    partial = _fake_bindir(tmp_path / "bin", names=("initdb", "pg_ctl"))  # no postgres
    (tmp_path / "bin" / "postgres").write_text("not executable")
    assert pg.find_bindir(path_env=str(partial), lib_glob=str(tmp_path / "x/*/bin"), env={}) is None


def test_locator_prefers_newest_debian_version(tmp_path: Path) -> None:
    for version in ("9.6", "13", "15"):
        _fake_bindir(tmp_path / "lib" / version / "bin")
    found = pg.find_bindir(path_env="", lib_glob=str(tmp_path / "lib/*/bin"), env={})
    assert found == tmp_path / "lib" / "15" / "bin"


def test_locator_uses_pg_config_bindir(tmp_path: Path) -> None:
    server_bin = _fake_bindir(tmp_path / "server")
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "pg_config").write_text(f"#!/bin/sh\necho {server_bin}\n")
    (tools / "pg_config").chmod(0o755)
    found = pg.find_bindir(path_env=str(tools), lib_glob=str(tmp_path / "x/*/bin"), env={})
    assert found == server_bin


def test_locator_honours_pg_bindir_env(tmp_path: Path) -> None:
    chosen = _fake_bindir(tmp_path / "chosen")
    other = _fake_bindir(tmp_path / "other")
    env = {"PG_BINDIR": str(chosen)}
    found = pg.find_bindir(path_env=str(other), lib_glob=str(tmp_path / "x/*/bin"), env=env)
    assert found == chosen


def test_missing_binaries_fail_clearly_when_not_root(tmp_path: Path) -> None:
    def installer() -> None:
        raise AssertionError("must not install when not root")

    with pytest.raises(pg.PgServerError, match=r"not found.*apt-get install postgresql"):
        pg.ensure_bindir(
            path_env=str(tmp_path),
            lib_glob=str(tmp_path / "x/*/bin"),
            root=False,
            installer=installer,
            env={},
        )


def test_missing_binaries_are_installed_when_root(tmp_path: Path) -> None:
    calls: list[str] = []

    def installer() -> None:
        calls.append("install")
        _fake_bindir(tmp_path / "lib" / "15" / "bin")

    found = pg.ensure_bindir(
        path_env="", lib_glob=str(tmp_path / "lib/*/bin"), root=True, installer=installer, env={}
    )
    assert calls == ["install"]
    assert found == tmp_path / "lib" / "15" / "bin"


def test_install_that_brings_nothing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(pg.PgServerError, match="still cannot find"):
        pg.ensure_bindir(
            path_env="",
            lib_glob=str(tmp_path / "x/*/bin"),
            root=True,
            installer=lambda: None,
            env={},
        )


def test_installer_runs_apt_get_non_interactively(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "apt.log"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-get").write_text(f'#!/bin/sh\necho "$DEBIAN_FRONTEND $*" >> {log}\n')
    (fake / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    pg.install_server_packages()
    assert log.read_text().splitlines() == [
        "noninteractive update",
        "noninteractive install -y --no-install-recommends postgresql",
    ]


# ------------------------------------------------------------------------- the server


def test_connect_and_create_table(postgres_url: str) -> None:
    assert postgres_url.startswith("postgresql+psycopg2://")
    engine = sa.create_engine(postgres_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE t (id serial PRIMARY KEY, v text NOT NULL)"))
            conn.execute(sa.text("INSERT INTO t (v) VALUES ('a'), ('b')"))
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM t")).scalar_one() == 2
    finally:
        engine.dispose()


_SEEN_DATABASES: list[str] = []


@pytest.mark.parametrize("round_", [1, 2])
def test_each_test_gets_a_fresh_empty_database(postgres_url: str, round_: int) -> None:
    engine = sa.create_engine(postgres_url)
    try:
        assert sa.inspect(engine).get_table_names() == []
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE leftover (id int)"))
            name = conn.execute(sa.text("SELECT current_database()")).scalar_one()
    finally:
        engine.dispose()
    assert name not in _SEEN_DATABASES
    _SEEN_DATABASES.append(name)


def test_database_is_dropped_even_with_open_connections(pg_server: pg.PgServer) -> None:
    url = pg_server.create_database("t_dropme")
    engine = sa.create_engine(url)
    conn = engine.connect()  # left open on purpose: the drop must force it off
    try:
        pg_server.drop_database("t_dropme")
        with pytest.raises(sa.exc.DBAPIError):
            conn.execute(sa.text("SELECT 1"))
    finally:
        conn.invalidate()
        engine.dispose()
    admin = sa.create_engine(pg_server.url())
    try:
        with admin.connect() as c:
            names = c.execute(sa.text("SELECT datname FROM pg_database")).scalars().all()
    finally:
        admin.dispose()
    assert "t_dropme" not in names


def test_server_settings(pg_server: pg.PgServer) -> None:
    engine = sa.create_engine(pg_server.url())
    try:
        with engine.connect() as conn:

            def show(name: str) -> str:
                return str(conn.execute(sa.text(f"SHOW {name}")).scalar_one())

            assert show("listen_addresses") == "127.0.0.1"
            assert show("unix_socket_directories") == ""
            assert show("fsync") == "off"
            assert show("synchronous_commit") == "off"
            assert show("full_page_writes") == "off"
            assert show("max_connections") == "200"
            assert show("server_encoding") == "UTF8"
    finally:
        engine.dispose()


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a LISTEN socket on ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) == port and fields[3] == "0A":  # 0A = LISTEN
                found.add(address)
    return found


def test_listens_on_loopback_only(pg_server: pg.PgServer) -> None:
    assert pg_server.host == "127.0.0.1"
    # 0100007F is 127.0.0.1 in /proc's little-endian hex; nothing on 0.0.0.0 or IPv6.
    assert _listening_addresses(pg_server.port) == {"0100007F"}
    with socket.create_connection(("127.0.0.1", pg_server.port), timeout=5):
        pass


def test_server_never_runs_as_root(pg_server: pg.PgServer) -> None:
    pid = pg_server.postmaster_pid()
    assert pid is not None
    uid = int(
        next(
            line.split()[1]
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("Uid:")
        )
    )
    assert uid != 0
    if os.geteuid() != 0:
        assert uid == os.geteuid()
        assert pg_server.user is None
    else:
        assert pg_server.user in ("postgres", pg.FALLBACK_USER)


def test_many_connections(pg_server: pg.PgServer) -> None:
    engine = sa.create_engine(pg_server.url(), pool_size=50, max_overflow=0)
    try:
        conns = [engine.connect() for _ in range(50)]
        for c in conns:
            c.close()
    finally:
        engine.dispose()


# ------------------------------------------------------------------------------ CLI


@pytest.fixture
def server_dir() -> Iterator[Path]:
    """A not-yet-existing server directory; whatever runs there is stopped afterwards."""
    parent = Path(tempfile.mkdtemp(prefix="dueledger-pg-test-"))
    parent.chmod(0o711)  # mkdtemp makes it 0700: the server's OS user must traverse it
    base = parent / "server"
    try:
        yield base
    finally:
        if (base / pg.STATE_FILE).exists():
            pg.PgServer.load_state(base).stop(remove=True)
        shutil.rmtree(parent, ignore_errors=True)


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PG_SERVER_PY), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.postgres
def test_cli_start_and_stop(server_dir: Path) -> None:
    base = server_dir
    started = _cli("start", "--dir", str(base))
    try:
        assert started.returncode == 0, started.stderr
        url = started.stdout.strip()
        assert url.startswith("postgresql+psycopg2://postgres@127.0.0.1:")
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
        engine.dispose()
        again = _cli("start", "--dir", str(base))
        assert again.returncode == 1 and "not empty" in again.stderr
    finally:
        stopped = _cli("stop", "--dir", str(base))
    assert stopped.returncode == 0, stopped.stderr
    assert not base.exists()


@pytest.mark.postgres
def test_watchdog_stops_server_when_owner_dies(server_dir: Path) -> None:
    base = server_dir
    server = pg.start_server(base)
    owner = subprocess.Popen(["sleep", "60"])
    watchdog = subprocess.Popen(
        [sys.executable, str(PG_SERVER_PY), "_watchdog", str(base), str(owner.pid)],
        start_new_session=True,
    )
    try:
        pid = server.postmaster_pid()
        assert pid is not None
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        watchdog.wait(timeout=60)
        deadline = time.monotonic() + 10
        while base.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not base.exists()
        assert (
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
        )
    finally:
        if watchdog.poll() is None:
            watchdog.kill()
            watchdog.wait()
        server.stop(remove=True)


# ------------------------------------------------------------------- other fixtures


def test_sqlite_url_points_into_tmp_path(sqlite_url: str, tmp_path: Path) -> None:
    assert sqlite_url == f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    engine = sa.create_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE t (id int)"))
    engine.dispose()
    assert (tmp_path / "ledger.sqlite").exists()


def test_ledger_url_is_fresh_and_usable(ledger_url: str, request: pytest.FixtureRequest) -> None:
    backend = request.node.callspec.id
    assert backend in ("sqlite", "postgres")
    assert ledger_url.startswith("sqlite:///" if backend == "sqlite" else "postgresql+psycopg2://")
    assert (request.node.get_closest_marker("postgres") is not None) == (backend == "postgres")
    engine = sa.create_engine(ledger_url)
    try:
        assert sa.inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


def test_dagster_home_is_isolated(dagster_home: Path) -> None:
    assert os.environ["DAGSTER_HOME"] == str(dagster_home)
    assert dagster_home.is_dir()
    repo = Path(__file__).resolve().parent.parent
    assert repo not in dagster_home.parents
    assert not [k for k in os.environ if k.startswith("DUELEDGER_")]


# ------------------------------------------------------------ local dagster.yaml


def test_local_dagster_yaml_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """dagster.yaml.local (what scripts/dev.sh installs) is valid for the installed Dagster."""
    import dagster as dg

    repo = Path(__file__).resolve().parent.parent
    shutil.copy(repo / "dagster.yaml.local", tmp_path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with dg.DagsterInstance.get() as instance:
        coordinator = instance.run_coordinator
        assert isinstance(coordinator, dg.QueuedRunCoordinator)
        # The daemon reads the queue's limits from the instance's `concurrency` block.
        concurrency = instance.get_concurrency_config()
        queue = concurrency.run_queue_config
        assert queue is not None
        assert queue.max_concurrent_runs == 4
        # No tag limit on dueledger/task: the overlap policy decides (pools hold `queue`).
        assert not queue.tag_concurrency_limits
        # One run per task pool whatever tags a run carries (UI launches, backfills).
        assert concurrency.pool_config.default_pool_limit == 1
        assert concurrency.pool_config.pool_granularity is not None
        assert concurrency.pool_config.pool_granularity.value == "run"
        assert instance.run_monitoring_enabled
        assert instance.run_monitoring_start_timeout_seconds == 180
        assert instance.run_monitoring_max_runtime_seconds == 0
        assert instance.run_monitoring_settings["poll_interval_seconds"] == 30
        assert instance.run_retries_enabled
        assert instance.run_retries_max_retries == 0
        assert instance.run_retries_retry_on_asset_or_op_failure
        assert not instance.telemetry_enabled
        assert instance.storage_directory().startswith(str(tmp_path))
