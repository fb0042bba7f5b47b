"""The one place that decides the environment (local vs production) and its settings.

Everything else asks this module: where DAGSTER_HOME is, which database the ledger and the
source store use, the slot length and the timezone crons are read in. Reading the
process environment happens here only; nothing here does I/O.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from resources.core.text import bad_character, printable

ENV_SLOT_MINUTES = "DUELEDGER_SLOT_MINUTES"
ENV_TIMEZONE = "DUELEDGER_TIMEZONE"
ENV_DATABASE_URL = "DUELEDGER_DATABASE_URL"
ENV_SOURCE_URL = "DUELEDGER_SOURCE_URL"
ENV_OPERATORS = "DUELEDGER_OPERATORS"
#: The caller's identity when a service runs dueledger on someone's behalf (else: OS login).
ENV_IDENTITY = "DUELEDGER_IDENTITY"
#: Which plugin tasks the code location registers: task keys or plugin names, comma-separated
#: (orchestration/services/task_plugins.py; docs/plugins.md "Plugin tasks").
ENV_PLUGIN_TASKS = "DUELEDGER_PLUGIN_TASKS"
#: How often ``ledger_sensor`` runs its duties, in seconds (sensors/keeper.py; default: a
#: quarter of a slot, 30-60 s). Each duty's delay is at most this; each tick is a stored
#: Dagster tick, so a shorter interval costs more at rest.
ENV_KEEPER_INTERVAL = "DUELEDGER_KEEPER_INTERVAL_SECONDS"
KEEPER_INTERVAL_RANGE = (10, 600)

DEFAULT_SLOT_MINUTES = 15
MINUTES_PER_DAY = 24 * 60

#: The repository checkout this package runs from (editable install / `dagster dev`).
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class SettingsError(ValueError):
    """A dueledger environment variable holds a value that cannot be used."""


@dataclass(frozen=True)
class Settings:
    """Resolved settings for this process."""

    environment: str  # "local" (embedded SQLite) or "production" (external database)
    dagster_home: Path
    ledger_url: str
    source_url: str
    slot_minutes: int
    timezone: str
    #: ``DUELEDGER_KEEPER_INTERVAL_SECONDS``; None: the keeper's own default.
    keeper_interval_seconds: int | None = None


def _sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def parse_slot_minutes(raw: str | None) -> int:
    """Validate a slot length: a whole number of minutes that divides a day."""
    if raw is None or raw.strip() == "":
        return DEFAULT_SLOT_MINUTES
    try:
        minutes = int(raw)
    except ValueError:
        raise SettingsError(
            f"{ENV_SLOT_MINUTES}={raw!r} is not a whole number of minutes; "
            f"use a divisor of 1440 such as 1, 5, 15 or 60"
        ) from None
    if minutes <= 0 or MINUTES_PER_DAY % minutes != 0:
        raise SettingsError(
            f"{ENV_SLOT_MINUTES}={minutes} must be a positive divisor of 1440 "
            f"(minutes per day) so that slots tile every day, e.g. 1, 5, 15, 30 or 60"
        )
    return minutes


def parse_keeper_interval(raw: str | None) -> int | None:
    """Validate ``DUELEDGER_KEEPER_INTERVAL_SECONDS``: whole seconds, 10-600 (None: unset)."""
    if raw is None or raw.strip() == "":
        return None
    low, high = KEEPER_INTERVAL_RANGE
    try:
        seconds = int(raw)
    except ValueError:
        seconds = None
    if seconds is None or not low <= seconds <= high:
        raise SettingsError(
            f"{ENV_KEEPER_INTERVAL}={printable(raw)!r} must be a whole number of seconds from "
            f"{low} to {high} (how often ledger_sensor runs); unset it for the default, a "
            f"quarter of a slot (60 s on 15-minute slots)"
        )
    return seconds


def parse_timezone(raw: str | None) -> str:
    """Validate an IANA timezone name (crons are read in it; keys are always UTC)."""
    name = (raw or "").strip() or "UTC"
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise SettingsError(
            f"{ENV_TIMEZONE}={name!r} is not an IANA timezone name (e.g. 'UTC', 'Europe/Berlin')"
        ) from None
    return name


def parse_plugin_tasks(raw: str | None) -> tuple[str, ...]:
    """The plugin tasks allowed by ``DUELEDGER_PLUGIN_TASKS`` (comma-separated task keys or
    plugin names); an empty item or one with a control character is refused, as in
    ``DUELEDGER_ALERT_KINDS``."""
    if raw is None or not raw.strip():
        return ()
    items = [item.strip() for item in raw.split(",")]
    if any(not item for item in items):
        raise SettingsError(
            f"{ENV_PLUGIN_TASKS}={printable(raw)!r} has an empty item; separate the task keys "
            f"or plugin names with single commas (e.g. invoice_export,acme-tasks)"
        )
    for item in items:
        problem = bad_character(item)
        if problem is not None:
            raise SettingsError(
                f"{ENV_PLUGIN_TASKS} item {printable(item)!r} {problem}; name task keys or "
                f"plugin names in plain text"
            )
    return tuple(items)


def _check_plain_variable(variable: str, value: str | None, *, secret: bool = False) -> None:
    """A variable's value with a byte that is not UTF-8 or a control character is refused
    before anything uses it (a driver or a terminal would fail on it later, less clearly)."""
    problem = bad_character(value or "")
    if problem is not None:
        shown = "" if secret else f"={printable(value or '')!r}"
        raise SettingsError(f"{variable}{shown} {problem}; set it to plain text")


def check_database_url(variable: str, url: str) -> None:
    """SettingsError when ``url`` cannot be the shared database it must be: a host or port
    that cannot be read, or a SQLite database other processes cannot share.

    The ledger and the source store are shared by the daemon, every run and every CLI call.
    An in-memory database (``sqlite://``, ``:memory:``, ``mode=memory``) lives and dies
    with one process, so a launch recorded there vanishes when the command exits; a
    relative path is a different file in each working directory.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # the engine names a URL it cannot parse
    except ValueError:  # e.g. `@[::1/db`: the port is read from what follows the colon
        raise SettingsError(
            f"{variable}={mask_url(url)} has a host or port that cannot be read (an IPv6 "
            f"address is written in brackets: postgresql+psycopg2://user:pw@[::1]:5432/db)"
        ) from None
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise SettingsError(f"{variable}={mask_url(url)} has a port outside 1-65535")
    if parsed.host is not None and any(c.isspace() for c in parsed.host):
        raise SettingsError(f"{variable}={mask_url(url)} has a space in its host name")
    if parsed.get_backend_name() != "sqlite":
        return
    database = parsed.database or ""
    path = database.removeprefix("file:").partition("?")[0]
    shown = mask_url(url).replace("%3A", ":")  # sqlite:///:memory: as it was written
    fix = (
        f"set {variable} to a file by its absolute path, e.g. "
        f"sqlite:////var/lib/dueledger/ledger.sqlite (four slashes), or a PostgreSQL URL"
    )
    in_memory = (
        path in ("", ":memory:")
        or parsed.query.get("mode") == "memory"
        or "mode=memory" in database
    )
    if in_memory:
        raise SettingsError(
            f"{variable}={shown} is an in-memory SQLite database: it vanishes when the "
            f"process exits and no other process (the daemon, a run, the next command) sees "
            f"it; {fix}"
        )
    if not Path(path).expanduser().is_absolute():
        raise SettingsError(
            f"{variable}={shown} is a relative SQLite path: each process would open "
            f"its own file in its own working directory; {fix}"
        )


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Decide the environment from the process environment (or the mapping given)."""
    env = os.environ if environ is None else environ
    for variable in (ENV_DATABASE_URL, ENV_SOURCE_URL):
        _check_plain_variable(variable, env.get(variable), secret=True)
    for variable in (
        ENV_SLOT_MINUTES,
        ENV_TIMEZONE,
        ENV_OPERATORS,
        ENV_IDENTITY,
        ENV_KEEPER_INTERVAL,
    ):
        _check_plain_variable(variable, env.get(variable))
    parse_plugin_tasks(env.get(ENV_PLUGIN_TASKS))
    home = Path(env.get("DAGSTER_HOME") or PROJECT_ROOT / ".dagster_home")
    ledger_url = env.get(ENV_DATABASE_URL) or _sqlite_url(home / "dueledger_ledger.sqlite")
    source_url = env.get(ENV_SOURCE_URL) or _sqlite_url(home / "dueledger_source.sqlite")
    for variable, url in ((ENV_DATABASE_URL, ledger_url), (ENV_SOURCE_URL, source_url)):
        check_userinfo(variable, url)
        if env.get(variable):  # the defaults are files under DAGSTER_HOME
            check_database_url(variable, url)
    environment = "local" if ledger_url.startswith("sqlite") else "production"
    return Settings(
        environment=environment,
        dagster_home=home,
        ledger_url=ledger_url,
        source_url=source_url,
        slot_minutes=parse_slot_minutes(env.get(ENV_SLOT_MINUTES)),
        timezone=parse_timezone(env.get(ENV_TIMEZONE)),
        keeper_interval_seconds=parse_keeper_interval(env.get(ENV_KEEPER_INTERVAL)),
    )


#: Query parameters of a database URL whose values are secrets (libpq's and drivers' names).
_SECRET_QUERY_KEYS = ("password", "passwd", "pwd", "secret", "token", "sslpassword")


def _has_unencoded_at(url: str) -> bool:
    """True when the part before the host (``user:password@``) holds another ``@``."""
    _scheme, sep, rest = url.partition("://")
    return bool(sep) and rest.partition("/")[0].count("@") > 1


def check_userinfo(variable: str, url: str) -> None:
    """SettingsError when ``url`` has an unencoded ``@`` in its user or password.

    The URL would be parsed up to the first ``@``: the driver then connects to a host made of
    the rest of the password and prints it in its error. Refused before any connection.
    """
    if _has_unencoded_at(url):
        raise SettingsError(
            f"{variable}={mask_url(url)} has an '@' in its user name or password; write it "
            f"as %40 there (e.g. postgresql+psycopg2://user:p%40ss@host/db), or the part "
            f"after it is taken for the host"
        )


def _mask_unencoded_userinfo(url: str) -> str:
    """A password with an unencoded ``@`` (``u:p@ss@host``) is parsed up to its first ``@``,
    so the rest would show as part of the host: mask everything up to the last ``@``."""
    if not _has_unencoded_at(url):
        return url
    scheme, _, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    userinfo, _, host = netloc.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    return f"{scheme}://{user}{':***' if colon else ''}@{host}{slash}{path}"


def mask_url(url: str) -> str:
    """The database URL safe for messages, logs and ``--json`` output: its password and any
    secret-looking query value (``?password=...``) replaced by ``***``."""
    try:
        parsed = make_url(_mask_unencoded_userinfo(url))
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        return "<unparseable database URL>"
    secret = {
        key: "***"
        for key in parsed.query
        if any(word in key.lower() for word in _SECRET_QUERY_KEYS)
    }
    if secret:
        parsed = parsed.update_query_dict(secret)
    return parsed.render_as_string(hide_password=True)
