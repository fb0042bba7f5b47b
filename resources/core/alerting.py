"""Alert delivery vocabulary and settings: kinds, subjects, channels, statuses, the retry
backoff, and the channels' configuration from the environment or a TOML file.

Pure (no Dagster, no database, no network): :func:`load_alert_settings` reads environment
variables and, when ``DUELEDGER_ALERTS_FILE`` names one, a TOML file; everything it returns is
validated, and every problem is a :class:`AlertSettingsError` naming the variable (or the
file and key) and the fix. Secrets -- a webhook URL's path and query (Slack puts its token
there) and the SMTP password -- never appear in a message, a ``repr`` or ``as_json``.

Each setting comes from its environment variable when that is set and not empty, else from
the file, else its default::

    # DUELEDGER_ALERTS_FILE=/etc/dueledger/alerts.toml
    max_attempts = 10                     # DUELEDGER_ALERT_MAX_ATTEMPTS
    kinds = ["lease_reclaimed", "slot_health"]   # DUELEDGER_ALERT_KINDS (default: all)

    [webhook]
    url = "https://hooks.slack.com/services/T0/B0/XXXX"   # DUELEDGER_ALERT_WEBHOOK_URL
    format = "slack"                      # DUELEDGER_ALERT_WEBHOOK_FORMAT: json | slack
    timeout_seconds = 5                   # DUELEDGER_ALERT_TIMEOUT_SECONDS
    [email]
    to = ["oncall@example.org"]           # DUELEDGER_ALERT_EMAIL_TO (comma-separated)
    from = "dueledger@example.org"        # DUELEDGER_ALERT_EMAIL_FROM
    smtp_host = "smtp.example.org"        # DUELEDGER_ALERT_SMTP_HOST
    smtp_port = 587                       # DUELEDGER_ALERT_SMTP_PORT
    smtp_user = "dueledger"               # DUELEDGER_ALERT_SMTP_USER
    smtp_password = "..."                 # DUELEDGER_ALERT_SMTP_PASSWORD (better: the variable)
    smtp_starttls = true                  # DUELEDGER_ALERT_SMTP_STARTTLS
    timeout_seconds = 10                  # DUELEDGER_ALERT_TIMEOUT_SECONDS
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from resources.core.config_files import ConfigFileError, read_config_file
from resources.core.due import format_due
from resources.core.entry import FailureKind, Status
from resources.core.settings import SettingsError
from resources.core.text import bad_character, printable
from resources.core.webhook_url import (
    WebhookTarget,
    mask_webhook_url,
    parse_webhook_url,
    scrub_webhook_text,
)

# --- kinds and subjects ---------------------------------------------------------------------

KIND_LEASE_RECLAIMED: Final = FailureKind.LEASE_RECLAIMED  # ledger_sensor (reclaim), `reclaim`
KIND_LAUNCH_STRANDED: Final = "launch_stranded"  # the same, for a launch whose run never came
KIND_DISPATCH_FAILED: Final = Status.DISPATCH_FAILED  # ledger_sensor (outcomes)
KIND_RETRY_LOST: Final = "retry_lost"  # ledger_sensor (outcomes): Dagster lost a retry
KIND_UNSUPPORTED_TASK: Final = FailureKind.UNSUPPORTED_TASK  # the run of a removed task
KIND_SLOT_HEALTH: Final = "slot_health"  # ledger_sensor (slot health), once per slot
KIND_LIVENESS: Final = "liveness"  # `dueledger liveness --alert`
#: ledger_sensor (policies): pause_after_failures paused it.
KIND_TASK_PAUSED: Final = "task_paused"
#: ledger_sensor (policies): a due passed its deadline.
KIND_DEADLINE_MISSED: Final = "deadline_missed"
#: Every alert kind dueledger emits (a ``kinds`` filter may name only these).
ALERT_KINDS: Final = (
    KIND_LEASE_RECLAIMED,
    KIND_LAUNCH_STRANDED,
    KIND_DISPATCH_FAILED,
    KIND_RETRY_LOST,
    KIND_UNSUPPORTED_TASK,
    KIND_SLOT_HEALTH,
    KIND_LIVENESS,
    KIND_TASK_PAUSED,
    KIND_DEADLINE_MISSED,
)

#: Longest subject key the delivery records hold.
MAX_SUBJECT_CHARS: Final = 400


def entry_subject(entry_id: int) -> str:
    """The subject of an alert about one ledger entry: ``entry:<id>``."""
    return f"entry:{int(entry_id)}"


def slot_subject(slot: datetime) -> str:
    """The subject of an alert about one slot: ``slot:<due>``."""
    return f"slot:{format_due(slot)}"


def check_subject(check: str, observed_at: datetime | None) -> str:
    """The subject of a liveness alert: the check and the evidence it went stale on
    (``check:scheduler_heartbeat@2026-11-30T22:45:07Z``; ``@never`` with none), so one
    outage alerts once however often the probe runs, and the next outage alerts again."""
    return f"check:{check}@{format_due(observed_at) if observed_at else 'never'}"


# --- channels, statuses, backoff ------------------------------------------------------------

CHANNEL_WEBHOOK: Final = "webhook"
CHANNEL_EMAIL: Final = "email"
CHANNELS: Final = (CHANNEL_WEBHOOK, CHANNEL_EMAIL)

DELIVERY_PENDING: Final = "pending"  # recorded, not attempted yet
DELIVERY_DELIVERED: Final = "delivered"  # the channel accepted it (terminal)
DELIVERY_FAILED: Final = "failed"  # the last attempt failed; retried while attempts are left
DELIVERY_STATUSES: Final = (DELIVERY_PENDING, DELIVERY_DELIVERED, DELIVERY_FAILED)

FORMAT_JSON: Final = "json"
FORMAT_SLACK: Final = "slack"
WEBHOOK_FORMATS: Final = (FORMAT_JSON, FORMAT_SLACK)

DEFAULT_MAX_ATTEMPTS: Final = 10
MAX_MAX_ATTEMPTS: Final = 100
DEFAULT_WEBHOOK_TIMEOUT: Final = 5.0
DEFAULT_EMAIL_TIMEOUT: Final = 10.0
#: A channel's timeout is capped: a delivery must never hold a sensor tick for long.
MAX_TIMEOUT_SECONDS: Final = 30.0
#: Backoff after the n-th failed attempt: BACKOFF_BASE * 2**(n-1), at most BACKOFF_CAP
#: (30 s, 1, 2, 4, 8, 16, 32 min, then hourly: 10 attempts span about 4 hours).
BACKOFF_BASE: Final = timedelta(seconds=30)
BACKOFF_CAP: Final = timedelta(hours=1)


def retry_delay(failed_attempts: int) -> timedelta:
    """How long to wait after the ``failed_attempts``-th failed attempt before the next."""
    if failed_attempts < 1:
        raise ValueError(f"failed_attempts must be at least 1, got {failed_attempts}")
    exponent = min(failed_attempts - 1, 20)  # 2**20 * 30 s is far past the cap already
    return min(BACKOFF_BASE * 2**exponent, BACKOFF_CAP)


def attempt_lease(timeout_seconds: float) -> timedelta:
    """How long an attempt in progress keeps others off its delivery (a process that died
    mid-attempt leaves it to be retried after this): well past the channel's timeout."""
    return timedelta(seconds=max(60.0, 4 * timeout_seconds))


# --- settings -------------------------------------------------------------------------------

ENV_ALERTS_FILE: Final = "DUELEDGER_ALERTS_FILE"
ENV_WEBHOOK_URL: Final = "DUELEDGER_ALERT_WEBHOOK_URL"
ENV_WEBHOOK_FORMAT: Final = "DUELEDGER_ALERT_WEBHOOK_FORMAT"
ENV_EMAIL_TO: Final = "DUELEDGER_ALERT_EMAIL_TO"
ENV_EMAIL_FROM: Final = "DUELEDGER_ALERT_EMAIL_FROM"
ENV_SMTP_HOST: Final = "DUELEDGER_ALERT_SMTP_HOST"
ENV_SMTP_PORT: Final = "DUELEDGER_ALERT_SMTP_PORT"
ENV_SMTP_USER: Final = "DUELEDGER_ALERT_SMTP_USER"
ENV_SMTP_PASSWORD: Final = "DUELEDGER_ALERT_SMTP_PASSWORD"
ENV_SMTP_STARTTLS: Final = "DUELEDGER_ALERT_SMTP_STARTTLS"
ENV_TIMEOUT: Final = "DUELEDGER_ALERT_TIMEOUT_SECONDS"
ENV_KINDS: Final = "DUELEDGER_ALERT_KINDS"
ENV_MAX_ATTEMPTS: Final = "DUELEDGER_ALERT_MAX_ATTEMPTS"

#: The file's keys: top level and per channel table, with the variable each one mirrors.
_TOP_KEYS: Final = {"max_attempts": ENV_MAX_ATTEMPTS, "kinds": ENV_KINDS}
_WEBHOOK_KEYS: Final = {
    "url": ENV_WEBHOOK_URL,
    "format": ENV_WEBHOOK_FORMAT,
    "timeout_seconds": ENV_TIMEOUT,
    "kinds": ENV_KINDS,
}
_EMAIL_KEYS: Final = {
    "to": ENV_EMAIL_TO,
    "from": ENV_EMAIL_FROM,
    "smtp_host": ENV_SMTP_HOST,
    "smtp_port": ENV_SMTP_PORT,
    "smtp_user": ENV_SMTP_USER,
    "smtp_password": ENV_SMTP_PASSWORD,
    "smtp_starttls": ENV_SMTP_STARTTLS,
    "timeout_seconds": ENV_TIMEOUT,
    "kinds": ENV_KINDS,
}
_TABLES: Final = {CHANNEL_WEBHOOK: _WEBHOOK_KEYS, CHANNEL_EMAIL: _EMAIL_KEYS}


class AlertSettingsError(SettingsError):
    """The alert channels' configuration cannot be used (the message names where and the fix)."""


@dataclass(frozen=True)
class WebhookSettings:
    """An HTTP(S) webhook: a JSON POST of the alert, or a Slack incoming-webhook body."""

    url: str = field(repr=False)  # secret: its path/query may hold the token
    format: str = FORMAT_JSON
    timeout_seconds: float = DEFAULT_WEBHOOK_TIMEOUT
    kinds: frozenset[str] | None = None  # None: every kind

    @property
    def masked_url(self) -> str:
        return mask_webhook_url(self.url)

    @property
    def target(self) -> WebhookTarget:
        """Where to post and with which credentials (the URL was checked when read)."""
        return parse_webhook_url(self.url)

    def scrub(self, text: str) -> str:
        """``text`` without any secret part of this webhook's URL (see
        :func:`scrub_webhook_text`)."""
        return scrub_webhook_text(text, self.url)

    def as_json(self) -> dict[str, Any]:
        return {
            "channel": CHANNEL_WEBHOOK,
            "target": self.masked_url,
            "format": self.format,
            "timeout_seconds": self.timeout_seconds,
            "kinds": sorted(self.kinds) if self.kinds is not None else None,
        }


@dataclass(frozen=True)
class EmailSettings:
    """Email over SMTP (sent by resources.notifier's SMTP code)."""

    to: tuple[str, ...]
    sender: str
    smtp_host: str
    smtp_port: int = 25
    smtp_user: str | None = None
    smtp_password: str | None = field(default=None, repr=False)  # secret
    smtp_starttls: bool = False
    timeout_seconds: float = DEFAULT_EMAIL_TIMEOUT
    kinds: frozenset[str] | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "channel": CHANNEL_EMAIL,
            "target": f"{', '.join(self.to)} via {self.smtp_host}:{self.smtp_port}",
            "from": self.sender,
            "starttls": self.smtp_starttls,
            "login": self.smtp_user is not None,
            "timeout_seconds": self.timeout_seconds,
            "kinds": sorted(self.kinds) if self.kinds is not None else None,
        }


@dataclass(frozen=True)
class AlertSettings:
    """The configured channels (none: alerts are log lines only) and the retry budget."""

    webhook: WebhookSettings | None = None
    email: EmailSettings | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    source: str = "environment"

    @property
    def channels(self) -> tuple[WebhookSettings | EmailSettings, ...]:
        return tuple(c for c in (self.webhook, self.email) if c is not None)

    def as_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "max_attempts": self.max_attempts,
            "channels": [c.as_json() for c in self.channels],
        }


@dataclass(frozen=True)
class _Value:
    """One raw setting and where it came from (for the error message)."""

    raw: Any
    where: str  # "DUELEDGER_ALERT_SMTP_PORT" or "DUELEDGER_ALERTS_FILE=/x.toml: [email] smtp_port"
    secret: bool = False

    def shown(self) -> str:
        return "<hidden>" if self.secret else repr(self.raw)


class _Source:
    """Reads each setting from its variable, else from the file's table."""

    def __init__(self, env: Mapping[str, str], data: Mapping[str, Any], file_label: str) -> None:
        self.env = env
        self.data = data
        self.file_label = file_label

    def get(self, table: str | None, key: str, variable: str, *, secret: bool = False) -> _Value:
        text = self.env.get(variable, "")
        if text.strip():
            return _Value(text.strip(), variable, secret)
        section = self.data if table is None else self.data.get(table, {})
        in_file = f"{self.file_label}: {f'[{table}] ' if table else ''}{key}"
        if key in section:
            return _Value(section[key], in_file, secret)
        # Set nowhere: name the variable (and the file's key, when there is a file).
        return _Value(None, f"{variable} (or {in_file})" if self.file_label else variable, secret)


def _fail(value: _Value, problem: str) -> AlertSettingsError:
    return AlertSettingsError(f"{value.where}={value.shown()} {problem}")


def _text(value: _Value, fix: str) -> str | None:
    if value.raw is None:
        return None
    if not isinstance(value.raw, str) or not value.raw.strip():
        raise _fail(value, f"must be a non-empty string; {fix}")
    _plain(value, value.raw)
    return value.raw.strip()


def _plain(value: _Value, text: str) -> None:
    """Refuse a value with a control character, a byte that is not UTF-8 or a bidirectional
    override: it would break a header, a log line or a terminal (resources/core/text.py)."""
    problem = bad_character(text)
    if problem is not None:
        raise _fail(value, f"{problem}; write it as plain text")


def _number(value: _Value, default: float, low: float, high: float, what: str) -> float:
    if value.raw is None:
        return default
    try:
        number = float(value.raw)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value.raw, bool) or not (low <= number <= high):
        raise _fail(value, f"must be a number of {what} from {low:g} to {high:g}")
    return number


def _integer(value: _Value, default: int, low: int, high: int, what: str) -> int:
    if value.raw is None:
        return default
    try:
        number = int(str(value.raw).strip()) if not isinstance(value.raw, bool) else None
    except ValueError:
        number = None
    if number is None or not (low <= number <= high):
        raise _fail(value, f"must be a whole number of {what} from {low} to {high}")
    return number


def _flag(value: _Value) -> bool:
    if value.raw is None:
        return False
    if isinstance(value.raw, bool):
        return value.raw
    text = str(value.raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise _fail(value, "must be true or false")


def _items(value: _Value) -> list[str] | None:
    """A comma-separated string (variable) or an array of strings (file)."""
    if value.raw is None:
        return None
    if isinstance(value.raw, str):
        items = [x.strip() for x in value.raw.split(",")]
    elif isinstance(value.raw, list) and all(isinstance(x, str) for x in value.raw):
        items = [x.strip() for x in value.raw]
    else:
        raise _fail(value, "must be a comma-separated string or an array of strings")
    if not items or any(not x for x in items):
        raise _fail(value, "has an empty item; separate the items with single commas")
    for item in items:
        _plain(value, item)
    return items


def _kinds(value: _Value) -> frozenset[str] | None:
    items = _items(value)
    if items is None:
        return None
    unknown = [k for k in items if k not in ALERT_KINDS]
    if unknown:
        raise _fail(
            value,
            f"names unknown alert kind(s) {', '.join(unknown)}; known kinds: "
            f"{', '.join(ALERT_KINDS)}",
        )
    return frozenset(items)


def _webhook(source: _Source, kinds: frozenset[str] | None) -> WebhookSettings | None:
    url_value = source.get(CHANNEL_WEBHOOK, "url", ENV_WEBHOOK_URL, secret=True)
    fix = "set it to the incoming-webhook URL, e.g. https://hooks.example.org/alerts"
    url = _text(url_value, fix)
    if url is None:
        return None
    try:
        parse_webhook_url(url)
    except ValueError as exc:
        raise AlertSettingsError(
            f"{url_value.where} ({mask_webhook_url(url)}) {exc}; {fix}"
        ) from None
    format_value = source.get(CHANNEL_WEBHOOK, "format", ENV_WEBHOOK_FORMAT)
    chosen = (_text(format_value, "use json or slack") or FORMAT_JSON).lower()
    if chosen not in WEBHOOK_FORMATS:
        raise _fail(format_value, f"must be one of {', '.join(WEBHOOK_FORMATS)}")
    timeout = _number(
        source.get(CHANNEL_WEBHOOK, "timeout_seconds", ENV_TIMEOUT),
        DEFAULT_WEBHOOK_TIMEOUT,
        0.1,
        MAX_TIMEOUT_SECONDS,
        "seconds",
    )
    own = _kinds(source.get(CHANNEL_WEBHOOK, "kinds", ENV_KINDS))
    return WebhookSettings(url, chosen, timeout, own if own is not None else kinds)


_HOST_NAME: Final = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252}[A-Za-z0-9_.])?$")


def _is_host(text: str) -> bool:
    """A DNS name (letters, digits, ``.-_``) or an IP address, as smtplib connects to it."""
    if _HOST_NAME.match(text):
        return True
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _email(source: _Source, kinds: frozenset[str] | None) -> EmailSettings | None:
    to_value = source.get(CHANNEL_EMAIL, "to", ENV_EMAIL_TO)
    recipients = _items(to_value)
    if recipients is None:
        return None
    bad = [a for a in recipients if "@" not in a or any(c.isspace() for c in a)]
    if bad:
        raise _fail(
            to_value,
            f"has {', '.join(repr(a) for a in bad)}, not an email address; give addresses "
            f"such as oncall@example.org, separated by commas",
        )
    host_value = source.get(CHANNEL_EMAIL, "smtp_host", ENV_SMTP_HOST)
    host = _text(host_value, "set it to the SMTP server's host name")
    if host is None:
        raise AlertSettingsError(
            f"alert email is configured ({to_value.where}) but {host_value.where} is not set: "
            f"set it to the SMTP server's host name"
        )
    if not _is_host(host):
        raise _fail(
            host_value,
            f"is not a host name or IP address; give the name only (e.g. smtp.example.org), "
            f"the port goes in {ENV_SMTP_PORT}",
        )
    from_value = source.get(CHANNEL_EMAIL, "from", ENV_EMAIL_FROM)
    sender = _text(from_value, "set it to the From address, e.g. dueledger@example.org")
    if sender is None or "@" not in sender or any(c.isspace() for c in sender):
        raise AlertSettingsError(
            f"alert email is configured ({to_value.where}) but {from_value.where} is "
            f"{'not set' if sender is None else f'{sender!r}, not an address'}: set it to the "
            f"From address of alert mails, e.g. dueledger@example.org"
        )
    port = _integer(source.get(CHANNEL_EMAIL, "smtp_port", ENV_SMTP_PORT), 25, 1, 65535, "port")
    user = _text(source.get(CHANNEL_EMAIL, "smtp_user", ENV_SMTP_USER), "or leave it unset")
    password_value = source.get(CHANNEL_EMAIL, "smtp_password", ENV_SMTP_PASSWORD, secret=True)
    password = _text(password_value, "or leave it unset")
    if password is not None and user is None:
        raise AlertSettingsError(
            f"{password_value.where} is set but no SMTP user is: set {ENV_SMTP_USER} (or "
            f"smtp_user in the file) to log in, or unset the password"
        )
    timeout = _number(
        source.get(CHANNEL_EMAIL, "timeout_seconds", ENV_TIMEOUT),
        DEFAULT_EMAIL_TIMEOUT,
        0.1,
        MAX_TIMEOUT_SECONDS,
        "seconds",
    )
    own = _kinds(source.get(CHANNEL_EMAIL, "kinds", ENV_KINDS))
    return EmailSettings(
        to=tuple(recipients),
        sender=sender,
        smtp_host=host,
        smtp_port=port,
        smtp_user=user,
        smtp_password=password,
        smtp_starttls=_flag(source.get(CHANNEL_EMAIL, "smtp_starttls", ENV_SMTP_STARTTLS)),
        timeout_seconds=timeout,
        kinds=own if own is not None else kinds,
    )


def _read_file(path_text: str) -> tuple[dict[str, Any], str]:
    label = f"{ENV_ALERTS_FILE}={printable(path_text)}"
    problem = bad_character(path_text)
    if problem is not None:
        raise AlertSettingsError(f"{label} {problem}; name the file by a plain path")
    path = Path(path_text).expanduser()
    try:
        data = tomllib.loads(read_config_file(path, label))
    except FileNotFoundError:
        raise AlertSettingsError(
            f"{label}: the file does not exist; create it (see docs/operations.md, "
            f"'Alert delivery') or unset {ENV_ALERTS_FILE}"
        ) from None
    except ConfigFileError as exc:
        raise AlertSettingsError(f"{exc} (see docs/operations.md, 'Alert delivery')") from None
    except tomllib.TOMLDecodeError as exc:
        raise AlertSettingsError(f"{label}: not valid TOML: {exc}") from None
    known = {*_TOP_KEYS, *_TABLES}
    unknown = sorted(set(data) - known)
    if unknown:
        raise AlertSettingsError(
            f"{label}: unknown key(s) {printable(', '.join(unknown))}; known: "
            f"{', '.join(sorted(known))}"
        )
    for table, keys in _TABLES.items():
        section = data.get(table, {})
        if not isinstance(section, dict):
            raise AlertSettingsError(f"{label}: [{table}] must be a table")
        extra = sorted(set(section) - set(keys))
        if extra:
            raise AlertSettingsError(
                f"{label}: unknown key(s) {printable(', '.join(extra))} in [{table}]; known: "
                f"{', '.join(sorted(keys))}"
            )
    return data, label


def load_alert_settings(environ: Mapping[str, str] | None = None) -> AlertSettings:
    """The alert channels of this process, from the environment and ``DUELEDGER_ALERTS_FILE``.

    Nothing configured: no channels (alerts stay log lines). Raises
    :class:`AlertSettingsError` naming the variable or the file's key and the fix.
    """
    env = os.environ if environ is None else environ
    path_text = env.get(ENV_ALERTS_FILE, "").strip()
    data, label = _read_file(path_text) if path_text else ({}, "")
    source = _Source(env, data, label)
    kinds = _kinds(source.get(None, "kinds", ENV_KINDS))
    max_attempts = _integer(
        source.get(None, "max_attempts", ENV_MAX_ATTEMPTS),
        DEFAULT_MAX_ATTEMPTS,
        1,
        MAX_MAX_ATTEMPTS,
        "attempts",
    )
    return AlertSettings(
        webhook=_webhook(source, kinds),
        email=_email(source, kinds),
        max_attempts=max_attempts,
        source=f"environment and {label}" if label else "environment",
    )
