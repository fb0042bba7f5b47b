"""A throwaway PostgreSQL server for tests and benchmarks (standard library only).

Used by ``tests/conftest.py`` (session fixture ``pg_server``) and as a small CLI::

    python tests/pg_server.py start --dir DIR   # prints a postgresql+psycopg2:// URL
    python tests/pg_server.py stop --dir DIR    # stops the server and removes DIR
    python tests/pg_server.py ensure            # locate the binaries; install them if root
    python tests/pg_server.py bindir            # print the binaries' directory (exit 1 if none)

The server listens on 127.0.0.1 only, on a free port, with no Unix socket, trust
authentication and durability switched off (``fsync``, ``synchronous_commit``,
``full_page_writes``): it is for tests, never for data anyone wants to keep.

PostgreSQL refuses to run as root. As root the server runs as the ``postgres`` system
user when it exists, else as a system user created for it (``dueledger-pg``); as any
other user it runs as that user.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REQUIRED_BINARIES = ("initdb", "pg_ctl", "postgres")
DEBIAN_LIB_GLOB = "/usr/lib/postgresql/*/bin"
FALLBACK_USER = "dueledger-pg"
SUPERUSER = "postgres"
STATE_FILE = "server.json"
DATA_SUBDIR = "data"
LOG_FILE = "postgres.log"
START_ATTEMPTS = 3
START_TIMEOUT_S = 60

SERVER_SETTINGS: Mapping[str, str] = {
    "listen_addresses": "'127.0.0.1'",
    # No Unix socket: TCP on loopback only (also avoids socket path length limits).
    "unix_socket_directories": "''",
    "max_connections": "200",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "128MB",
    "max_wal_size": "1GB",
    "logging_collector": "off",
    "timezone": "'UTC'",
}

HBA = """\
# dueledger throwaway test server: trust on loopback only.
local   all   all                 trust
host    all   all   127.0.0.1/32  trust
"""


class PgServerError(RuntimeError):
    """The throwaway server could not be located, installed, started or stopped."""


# --------------------------------------------------------------------------- binaries


def _has_binaries(directory: Path) -> bool:
    return all(
        (directory / name).is_file() and os.access(directory / name, os.X_OK)
        for name in REQUIRED_BINARIES
    )


def _version_key(path: Path) -> tuple[int, ...]:
    # /usr/lib/postgresql/15/bin -> (15,); unknown layouts sort last.
    return tuple(int(part) for part in re.findall(r"\d+", path.parent.name)) or (-1,)


def candidate_bindirs(
    path_env: str | None = None,
    lib_glob: str = DEBIAN_LIB_GLOB,
    env: Mapping[str, str] | None = None,
) -> list[Path]:
    """Directories that may hold the server binaries, most preferred first.

    Order: ``$PG_BINDIR``; ``pg_config --bindir`` (pg_config found on ``path_env``);
    ``/usr/lib/postgresql/*/bin`` newest version first; each directory on ``path_env``.
    """
    env = os.environ if env is None else env
    path_env = env.get("PATH", os.defpath) if path_env is None else path_env
    out: list[Path] = []
    if env.get("PG_BINDIR"):
        out.append(Path(env["PG_BINDIR"]))
    pg_config = shutil.which("pg_config", path=path_env)
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            result = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=30
            )
            if result.returncode == 0 and result.stdout.strip():
                out.append(Path(result.stdout.strip()))
    out.extend(sorted((Path(p) for p in glob.glob(lib_glob)), key=_version_key, reverse=True))
    out.extend(Path(p) for p in path_env.split(os.pathsep) if p)
    return out


def find_bindir(
    path_env: str | None = None,
    lib_glob: str = DEBIAN_LIB_GLOB,
    env: Mapping[str, str] | None = None,
) -> Path | None:
    """The first candidate directory holding initdb, pg_ctl and postgres, or None."""
    for directory in candidate_bindirs(path_env, lib_glob, env):
        if _has_binaries(directory):
            return directory
    return None


def is_root() -> bool:
    return os.geteuid() == 0


def install_server_packages() -> None:
    """Install Debian's PostgreSQL server packages (root only, non-interactive)."""
    if shutil.which("apt-get") is None:
        raise PgServerError("PostgreSQL server binaries are missing and apt-get is not available")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    print("pg_server: installing PostgreSQL server (apt-get install postgresql)", file=sys.stderr)
    for cmd in (
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "--no-install-recommends", "postgresql"],
    ):
        result = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            raise PgServerError(f"{' '.join(cmd)} failed with exit code {result.returncode}")


MISSING_MESSAGE = (
    "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: looked at $PG_BINDIR, "
    "`pg_config --bindir`, {glob} and $PATH. Install them (Debian: "
    "`sudo apt-get install postgresql`) or set PG_BINDIR; run `bash scripts/test.sh` as root "
    "to have them installed; or deselect the PostgreSQL tests with `-m 'not postgres'`."
)


def ensure_bindir(
    *,
    install: bool = True,
    path_env: str | None = None,
    lib_glob: str = DEBIAN_LIB_GLOB,
    root: bool | None = None,
    installer: Any = None,
    env: Mapping[str, str] | None = None,
) -> Path:
    """Locate the server binaries; install them when missing and running as root.

    Raises PgServerError with an actionable message when they cannot be had.
    """
    found = find_bindir(path_env, lib_glob, env)
    if found is not None:
        return found
    root = is_root() if root is None else root
    if install and root:
        (installer or install_server_packages)()
        found = find_bindir(path_env, lib_glob, env)
        if found is not None:
            return found
        raise PgServerError("installed postgresql but still cannot find its server binaries")
    raise PgServerError(MISSING_MESSAGE.format(glob=lib_glob))


# ------------------------------------------------------------------------ the OS user


def server_user() -> str | None:
    """The OS user to run the server as when root (None: run as the current user)."""
    if not is_root():
        return None
    for name in ("postgres", FALLBACK_USER):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    result = subprocess.run(
        [
            "useradd",
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            FALLBACK_USER,
        ],
        capture_output=True,
        text=True,
    )
    # A concurrent session may have created it in the meantime (exit 9: already exists).
    with contextlib.suppress(KeyError):
        pwd.getpwnam(FALLBACK_USER)
        return FALLBACK_USER
    raise PgServerError(f"could not create system user {FALLBACK_USER}: {result.stderr.strip()}")


def _run_as(
    user: str | None, cmd: list[str], *, cwd: Path, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run cmd as ``user`` (None = current user), output captured.

    Uses Python's own setuid/setgid (``subprocess`` ``user=``/``group=``/``extra_groups=``)
    so neither runuser nor setpriv is needed; supplementary groups are dropped.
    """
    kwargs: dict[str, Any] = {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    if user is not None:
        entry = pwd.getpwnam(user)
        kwargs = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        env.update(HOME=str(cwd), USER=user, LOGNAME=user)
    result = subprocess.run(
        cmd,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        **kwargs,
    )
    if check and result.returncode != 0:
        raise PgServerError(
            f"{' '.join(cmd)} failed (exit {result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result


def _chown_tree(path: Path, user: str | None) -> None:
    if user is None:
        return
    entry = pwd.getpwnam(user)
    for dirpath, dirnames, filenames in os.walk(path):
        os.chown(dirpath, entry.pw_uid, entry.pw_gid)
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), entry.pw_uid, entry.pw_gid, follow_symlinks=False)


# ---------------------------------------------------------------------------- server


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _check_name(name: str) -> None:
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
        raise ValueError(f"invalid database name {name!r}")


@dataclass
class PgServer:
    """A running throwaway server. ``base_dir`` holds data/, the log and server.json."""

    base_dir: str
    bindir: str
    user: str | None
    host: str
    port: int
    superuser: str = SUPERUSER
    started_in_s: float = 0.0

    @property
    def data_dir(self) -> Path:
        return Path(self.base_dir) / DATA_SUBDIR

    @property
    def log_file(self) -> Path:
        return Path(self.base_dir) / LOG_FILE

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL (psycopg2 driver) for ``database`` on this server."""
        return f"postgresql+psycopg2://{self.superuser}@{self.host}:{self.port}/{database}"

    def dsn(self, database: str = "postgres") -> str:
        """libpq DSN, for psycopg2.connect()."""
        return f"host={self.host} port={self.port} user={self.superuser} dbname={database}"

    @contextlib.contextmanager
    def _admin_cursor(self) -> Iterator[Any]:
        import psycopg2  # only needed once the server runs (keeps the CLI stdlib-only)

        conn = psycopg2.connect(self.dsn(), connect_timeout=10)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                yield cur
        finally:
            conn.close()

    def create_database(self, name: str) -> str:
        """Create an empty database ``name`` (must be a plain identifier); return its URL."""
        _check_name(name)
        with self._admin_cursor() as cur:
            # FILE_COPY (PostgreSQL 15+): ~40 ms instead of ~250 ms (WAL_LOG) per database.
            strategy = " STRATEGY FILE_COPY" if cur.connection.server_version >= 150000 else ""
            cur.execute(f'CREATE DATABASE "{name}" TEMPLATE template0{strategy}')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name``, forcing off any connections still open to it."""
        _check_name(name)
        with self._admin_cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def save_state(self) -> None:
        (Path(self.base_dir) / STATE_FILE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load_state(cls, base_dir: str | os.PathLike[str]) -> PgServer:
        path = Path(base_dir) / STATE_FILE
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise PgServerError(f"no throwaway server state in {path}: {exc}") from exc

    def restart(self, mode: str = "fast") -> None:
        """Restart the server (``pg_ctl restart -m mode``): every connection is cut, and the
        server is back on the same address and port. The new postmaster starts in the
        calling thread's network namespace."""
        _run_as(
            self.user,
            [
                str(Path(self.bindir) / "pg_ctl"),
                "restart",
                "-D",
                str(self.data_dir),
                "-m",
                mode,
                "-l",
                str(self.log_file),
                "-w",
                "-t",
                str(START_TIMEOUT_S),
            ],
            cwd=Path(self.base_dir),
            timeout=START_TIMEOUT_S + 15,
        )

    def stop(self, remove: bool = True) -> None:
        """Stop (immediate), kill whatever is left of it, and remove base_dir."""
        pid = self.postmaster_pid()
        if self.data_dir.is_dir():
            with contextlib.suppress(PgServerError, subprocess.SubprocessError, OSError):
                _run_as(
                    self.user,
                    [
                        str(Path(self.bindir) / "pg_ctl"),
                        "stop",
                        "-D",
                        str(self.data_dir),
                        "-m",
                        "immediate",
                        "-w",
                        "-t",
                        "30",
                    ],
                    cwd=Path(self.base_dir),
                    check=False,
                    timeout=40,
                )
        if pid is not None:
            _kill_postmaster(pid)
        if remove:
            shutil.rmtree(self.base_dir, ignore_errors=True)


def _children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (Linux /proc; empty elsewhere)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # Field 4 is the ppid; the command name (field 2) may hold spaces, so split after ')'.
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
    return out


def _kill_postmaster(pid: int) -> None:
    """SIGKILL the postmaster and its children (each PostgreSQL child is its own session)."""
    if not _alive(pid):
        return
    for target in [pid, *_children(pid)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped by its parent) is dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: trust kill(0)
    return state not in ("Z", "X")


def start_server(
    base_dir: str | os.PathLike[str] | None = None,
    *,
    install: bool = True,
    listen_address: str = "127.0.0.1",
    trusted_network: str | None = None,
) -> PgServer:
    """initdb + start a throwaway server in ``base_dir`` (a new temp dir when None).

    ``base_dir`` must not exist or be empty. On failure everything is stopped and
    removed again and PgServerError is raised with the server log. ``listen_address`` and
    ``trusted_network`` (a CIDR whose clients are trusted too) serve the network-namespace
    tests, whose server runs on its own address in its own namespace (tests/deploy/netns.py).
    """
    t0 = time.monotonic()
    bindir = ensure_bindir(install=install)
    user = server_user()
    if base_dir is None:
        base = Path(tempfile.mkdtemp(prefix="dueledger-pg-"))
    else:
        base = Path(base_dir).absolute()
        if base.exists() and any(base.iterdir()):
            raise PgServerError(f"{base} is not empty (is a server already running there?)")
        base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o700)
    _chown_tree(base, user)
    server = PgServer(str(base), str(bindir), user, listen_address, 0)
    try:
        if user is not None:
            probe = _run_as(
                user,
                ["/bin/sh", "-c", 'test -w "$0" && test -x "$0"', str(base)],
                cwd=Path("/"),
                check=False,
            )
            if probe.returncode != 0:
                raise PgServerError(
                    f"{base} is not reachable by user {user!r} (a parent directory is not "
                    "searchable by it): choose a directory under /tmp"
                )
        _run_as(
            user,
            [
                str(bindir / "initdb"),
                "-D",
                str(server.data_dir),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
            cwd=base,
        )
        hba = HBA + (f"host    all   all   {trusted_network}  trust\n" if trusted_network else "")
        (server.data_dir / "pg_hba.conf").write_text(hba)
        settings = {**SERVER_SETTINGS, "listen_addresses": f"'{listen_address}'"}
        with (server.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# dueledger throwaway test server\n")
            for key, value in settings.items():
                conf.write(f"{key} = {value}\n")
            conf.write("include_if_exists = 'dueledger_port.conf'\n")
        _chown_tree(server.data_dir, user)
        last_error = ""
        for _ in range(START_ATTEMPTS):
            server.port = free_port()
            port_conf = server.data_dir / "dueledger_port.conf"
            port_conf.write_text(f"port = {server.port}\n")
            _chown_tree(port_conf, user)
            result = _run_as(
                user,
                [
                    str(bindir / "pg_ctl"),
                    "start",
                    "-D",
                    str(server.data_dir),
                    "-l",
                    str(server.log_file),
                    "-w",
                    "-t",
                    str(START_TIMEOUT_S),
                ],
                cwd=base,
                check=False,
                timeout=START_TIMEOUT_S + 15,
            )
            if result.returncode == 0:
                server.started_in_s = round(time.monotonic() - t0, 3)
                server.save_state()
                return server
            last_error = f"{result.stdout}\n{result.stderr}\n--- log ---\n{server.log_tail()}"
            server.stop(remove=False)  # a half-started postmaster, if any
            if "Address already in use" not in last_error and "could not bind" not in last_error:
                break
        raise PgServerError(f"PostgreSQL did not start:\n{last_error}")
    except BaseException:
        server.stop(remove=True)
        raise


# ------------------------------------------------------------------------------- CLI


def _watchdog(base_dir: str, parent_pid: int) -> int:
    """Stop the server in base_dir once parent_pid is gone (backstop for killed sessions)."""
    while Path(base_dir, STATE_FILE).exists():
        if not _alive(parent_pid):
            with contextlib.suppress(PgServerError):
                PgServer.load_state(base_dir).stop(remove=True)
            return 0
        time.sleep(1.0)
    return 0


def start_watchdog(server: PgServer) -> subprocess.Popen[bytes]:
    """A detached process that stops ``server`` if this process dies without cleanup."""
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "_watchdog", server.base_dir, str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start", help="start a server in DIR; print its URL")
    p_start.add_argument("--dir", required=True, help="new or empty directory for the server")
    p_start.add_argument("--json", action="store_true", help="print the server state as JSON")
    p_start.add_argument("--no-install", action="store_true", help="never apt-get install")
    p_stop = sub.add_parser("stop", help="stop the server in DIR and remove DIR")
    p_stop.add_argument("--dir", required=True)
    p_stop.add_argument("--keep", action="store_true", help="keep DIR (data and log)")
    sub.add_parser("ensure", help="locate the server binaries; install them if root")
    sub.add_parser("bindir", help="print the server binaries' directory; exit 1 if none")
    p_wd = sub.add_parser("_watchdog")
    p_wd.add_argument("base_dir")
    p_wd.add_argument("parent_pid", type=int)
    args = parser.parse_args(list(argv) if argv is not None else None)

    try:
        if args.command == "start":
            server = start_server(args.dir, install=not args.no_install)
            print(json.dumps(asdict(server) | {"url": server.url()}) if args.json else server.url())
        elif args.command == "stop":
            PgServer.load_state(args.dir).stop(remove=not args.keep)
        elif args.command == "ensure":
            print(ensure_bindir(install=True))
        elif args.command == "bindir":
            found = find_bindir()
            if found is None:
                return 1
            print(found)
        elif args.command == "_watchdog":
            return _watchdog(args.base_dir, args.parent_pid)
    except PgServerError as exc:
        print(f"pg_server: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
