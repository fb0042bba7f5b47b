"""Fuzzing the CLI's arguments: random strings, huge numbers, unicode, calendar edges.

Every command that reads or refuses is run through the console script's entry point
(``orchestration.cli:main``) with ``--json``, on SQLite and PostgreSQL ledgers that hold a
few entries. Whatever the arguments:

- the exit code is 0, 2 (invalid input) or 3 (refused by a rule) -- never 1, the
  "unexpected" code a traceback gets; ``liveness`` may also say 1, its documented "stale";
- stdout is one JSON document, and a failure is ``{"error": "..."}``;
- when the exit code is not 0 the ledger's entries are exactly as before (a refusal may
  add its audit record, nothing else).

Commands that would start a Dagster run are fuzzed where their input is refused before a
launch (a task name that is not registered; an entry that cannot be retried; a caller whose
role does not allow it).

Free text includes what a hostile user types: control characters, escape sequences,
bidirectional overrides, and text that is not UTF-8 (a lone surrogate, what Python makes of
such bytes in ``argv`` and the environment). A webhook whose URL holds a planted secret is
configured throughout, and a second fuzz varies the environment itself -- every alert
setting, the source and ledger URLs, the configuration files, the identity -- with the secret
planted in every secret position (a webhook URL's user info, path and query, the SMTP
password, a database password): whatever happens, the secret is in no output and in no row
of the ledger's tables.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alert_sinks import WebhookSink, free_port, start
from cli_process import stored_text
from click.testing import CliRunner
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from orchestration.cli import main
from orchestration.declarations import registered_tasks
from resources.core import alerting as a
from resources.core.entry import STATUSES, Trigger, dedup_key_for_due
from resources.core.settings import (
    ENV_DATABASE_URL,
    ENV_IDENTITY,
    ENV_OPERATORS,
    ENV_PLUGIN_TASKS,
    ENV_SLOT_MINUTES,
    ENV_SOURCE_URL,
    ENV_TIMEZONE,
)
from resources.ledger import RunLedger
from resources.ledger.schema import entries

DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
FLAG = "--yes-delete-everything"
TASK_KEYS = {spec.key for spec in registered_tasks()}

#: Planted in every secret position; must never be printed or stored.
SECRET = "PLANTEDSECRET9"
#: Characters that once broke a command: control, escape, bidi override, not UTF-8.
HOSTILE = ["\x00", "\x07", "\x1b[31m", "\r\n", "\t", "\u202e", "\udcff", "\ud800", "\x85"]
hostile_texts = st.one_of(
    st.sampled_from(HOSTILE),
    st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=8)), min_size=1, max_size=5).map(
        "".join
    ),
    st.text(alphabet=st.characters(categories=["Cc", "Cs", "Cf", "Zl", "Zp"]), max_size=20),
)
# Text as a careless or hostile user types it: unicode, control characters, SQL, huge.
texts = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=300),
    st.sampled_from(["", " ", "' OR '1'='1", "x" * 5000, "\x00", "-1", "--json", "☃", "é" * 201]),
    hostile_texts,
)
numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["0", "1", "9223372036854775807", "9223372036854775808", "1e3", "NaN"]),
)
instants = st.one_of(
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)).map(
        lambda d: d.isoformat()
    ),
    st.sampled_from(
        [
            "0001-01-01T00:00:00+05:00",
            "9999-12-31T23:59:59-05:00",
            "2026-02-30",
            "2026-11-30T22:45:00Z",
            "2026-11-30T24:00:00",
        ]
    ),
    texts,
)
# Cursors as the ledger writes them (base64 of "<created>|<id>"), with any id: tampered.
cursors = st.one_of(
    texts,
    st.tuples(st.datetimes(max_value=datetime(9999, 12, 31)), numbers).map(
        lambda p: base64.urlsafe_b64encode(
            f"{p[0].strftime('%Y-%m-%dT%H:%M:%S.%f')}Z|{p[1]}".encode()
        ).decode()
    ),
)
unknown_tasks = texts.filter(lambda s: s.strip() not in TASK_KEYS)
statuses = st.one_of(st.sampled_from([*STATUSES, "failed,success", "failed,"]), texts)


def _optional(name: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return st.one_of(st.just([]), values.map(lambda v: [name, v]))


def _options(*pairs: tuple[str, st.SearchStrategy[str]]) -> st.SearchStrategy[list[str]]:
    joined = st.tuples(*(_optional(n, v) for n, v in pairs))
    return joined.map(lambda parts: [arg for part in parts for arg in part])


commands = st.one_of(
    st.tuples(
        st.just(["runs", "list"]),
        _options(
            ("--status", statuses),
            ("--task", texts),
            ("--trigger", texts),
            ("--since", instants),
            ("--until", instants),
            ("--limit", numbers),
            ("--cursor", cursors),
            ("--operator", texts),
        ),
    ),
    st.tuples(numbers.map(lambda n: ["runs", "show", n]), _options(("--operator", texts))),
    st.tuples(
        st.one_of(numbers, st.sampled_from(["1", "2"])).map(lambda n: ["runs", "retry", n]),
        _options(("--operator", texts), ("--reason", texts)),
    ),
    st.tuples(st.just(["summary"]), _options(("--operator", texts))),
    st.tuples(
        st.just(["alerts"]),
        _options(
            ("--status", st.one_of(texts, st.sampled_from(["failed", "pending,delivered"]))),
            ("--kind", texts),
            ("--limit", numbers),
            ("--operator", texts),
        ),
    ),
    st.tuples(
        st.sampled_from([["liveness"], ["liveness", "--alert"]]),
        _options(("--max-age-seconds", numbers)),
    ),
    st.tuples(st.sampled_from([["reclaim", "--dry-run"], ["reclaim"]]), st.just([])),
    st.tuples(
        st.one_of(unknown_tasks, st.sampled_from(sorted(TASK_KEYS))).map(
            lambda task: ["launch", task]
        ),
        _options(("--operator", texts), ("--reason", texts), ("--request-id", texts)),
    ),
    st.tuples(
        st.sampled_from(
            [["sample-data"], ["sample-data", "--replace"], ["sample-data", "--replace", FLAG]]
        ),
        _options(("--as-of", instants), ("--services", numbers), ("--seed", numbers)),
    ),
    st.tuples(st.sampled_from([["tasks"], ["hooks"]]), st.just([])),
)


def _snapshot(url: str) -> list[tuple[Any, ...]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.select(entries).order_by(entries.c.id))]
    finally:
        engine.dispose()


@pytest.fixture
def secret_webhook() -> Iterator[WebhookSink]:
    """A webhook whose error page echoes the path it was posted to, colored."""
    with start(WebhookSink()) as sink:
        sink.status = 404
        sink.answer = f"\x1b[31mno hook at /hooks/{SECRET}\x1b[0m".encode()
        yield sink


@pytest.fixture
def fuzz_env(
    ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, secret_webhook: WebhookSink
) -> Iterator[tuple[str, Path]]:
    """A ledger with a success and a failed entry, a fresh DAGSTER_HOME, an allow-list (so
    role and identity rules are fuzzed too), and a webhook whose URL holds the secret."""
    monkeypatch.setenv(ENV_DATABASE_URL, ledger_url)
    monkeypatch.setenv(ENV_SOURCE_URL, f"sqlite:///{tmp_path / 'source.sqlite'}")
    monkeypatch.setenv(a.ENV_WEBHOOK_URL, secret_webhook.url(f"/hooks/{SECRET}?key={SECRET}"))
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    operators = tmp_path / "operators.toml"
    operators.write_text('[operators]\nalice = ["admin"]\ncarol = ["viewer"]\n')
    monkeypatch.setenv(ENV_OPERATORS, str(operators))
    monkeypatch.setenv(ENV_IDENTITY, "carol")  # a viewer: every retry or launch is refused
    ledger = RunLedger(database_url=ledger_url)
    ledger.migrate()
    for k, ok in ((0, True), (1, False)):
        entry = ledger.ensure_entry(
            task_key="order_cleanup",
            trigger=Trigger.SCHEDULE,
            dedup_key=dedup_key_for_due(DUE + timedelta(minutes=15 * k)),
            max_attempts=1,
        )
        assert ledger.claim(entry.id, f"run-{k}", lease_ttl=timedelta(minutes=5)).claimed
        if ok:
            assert ledger.succeed(entry.id, f"run-{k}")
        else:
            ledger.fail(entry.id, f"run-{k}", error="boom")
    ledger.dispose()
    yield ledger_url, home


FUZZ_SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}


def _cursor(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode()


@settings(max_examples=150, **FUZZ_SETTINGS)  # type: ignore[arg-type]
@given(command=commands)
# The findings of the hostile-user review, always tried (each was an exit 1 traceback).
@example(
    command=(["runs", "list"], ["--cursor", _cursor("2026-12-01T00:00:00.000000Z|" + "9" * 20)])
)
@example(command=(["runs", "list"], ["--since", "0001-01-01T00:00:00+05:00"]))
@example(command=(["runs", "list"], ["--until", "9999-12-31T23:59:59-05:00"]))
@example(command=(["liveness"], ["--max-age-seconds", "9" * 20]))
@example(command=(["runs", "show", "9" * 30], []))
def test_any_arguments_give_a_clean_exit_valid_json_and_change_nothing_on_failure(
    fuzz_env: tuple[str, Path], command: tuple[list[str], list[str]]
) -> None:
    url, _home = fuzz_env
    args = [*command[0], *command[1], "--json"]
    before = _snapshot(url)
    result = CliRunner().invoke(main, args, catch_exceptions=True)
    allowed = {0, 1, 2, 3} if args[0] == "liveness" else {0, 2, 3}
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        args,
        repr(result.exception),
    )
    assert result.exit_code in allowed, (args, result.exit_code, result.stdout[-500:])
    data = json.loads(result.stdout)
    if result.exit_code in (2, 3):
        assert set(data) == {"error"} and isinstance(data["error"], str) and data["error"]
    if result.exit_code != 0:
        assert _snapshot(url) == before, args
    _assert_no_secret(result.stdout + result.stderr, url, args)


def _assert_no_secret(output: str, url: str, what: object) -> None:
    assert SECRET not in output, (what, output[-2000:])
    assert "\x1b" not in output, (what, output[-2000:])
    leaked = [row for row in stored_text(url) if SECRET in row]
    assert not leaked, (what, leaked)


# --- the environment ----------------------------------------------------------------------------


def _as_env(text: str) -> str:
    """``text`` as an environment variable can hold it: no NUL (the OS string ends there), and
    of the surrogates only U+DC80-U+DCFF (how Python decodes a byte that is not UTF-8)."""
    return "".join(
        ""
        if c == "\x00"
        else "\udcff"
        if "\ud800" <= c <= "\udfff" and not "\udc80" <= c <= "\udcff"
        else c
        for c in text
    )


def _webhook_urls(port: int) -> st.SearchStrategy[str]:
    """Webhook URLs with the secret in their user info, path or query, around a host that
    is this machine (a real sink, a closed port) or cannot be one; never a name to resolve."""
    closed = free_port()
    hosts = st.sampled_from(
        [
            f"127.0.0.1:{port}",
            f"127.0.0.1:{closed}",
            f"[::1]:{closed}",
            "[::1",
            "127.0.0.1:0",
            "127.0.0.1:99999",
            "127.0.0.1:x",
            "",
        ]
    )
    userinfo = st.sampled_from(["", f"bot:{SECRET}@", f"{SECRET}@", ":@", f"b%40t:{SECRET}%40x@"])
    suffixes = hostile_texts.map(_as_env)
    paths = st.tuples(st.sampled_from(["", "/hooks/", "/"]), st.one_of(st.just(""), suffixes))
    return st.builds(
        lambda scheme, user, host, path, query: (
            f"{scheme}{user}{host}{path[0]}{SECRET}{path[1]}{query}"
        ),
        st.sampled_from(["http://", "https://", "HTTP://", "ftp://", "", "http:/"]),
        userinfo,
        hosts,
        paths,
        st.sampled_from(["", f"?token={SECRET}", f"?a=1&token={SECRET}#frag", "?"]),
    )


def _env_strategy(tmp: Path, port: int, ledger_url: str) -> st.SearchStrategy[dict[str, str]]:
    """Values for every dueledger variable a command reads: valid ones, and the hostile."""
    closed = free_port()
    a_file = tmp / "a-file"
    files = {
        "alerts_ok": f'[webhook]\nurl = "http://127.0.0.1:{port}/hooks/{SECRET}"\n',
        "alerts_hostile": f'[webhook]\nurl = "http://127.0.0.1:{port}/{SECRET}\\u001b[2J"\n',
        "alerts_bad_key": '"\\u001b[31mkey" = 1\n',
        "alerts_email": (
            f'[email]\nto = ["ops@example.org"]\nfrom = "d@example.org"\n'
            f'smtp_host = "127.0.0.1"\nsmtp_port = {closed}\nsmtp_user = "u"\n'
            f'smtp_password = "{SECRET}"\n'
        ),
        "not_toml": "[[[\n",
        "operators": '[operators]\nalice = ["admin"]\ncarol = ["viewer"]\n',
        "hooks": '[[listeners]]\ntarget = "no_such_module:x"\nevents = ["task_failed"]\n',
    }
    for name, text in files.items():
        (tmp / f"{name}.toml").write_text(text)
    a_file.write_text("x")
    paths = st.one_of(
        st.sampled_from(
            [str(tmp / f"{name}.toml") for name in files]
            + ["/dev/zero", str(tmp), str(tmp / "missing.toml"), f"{a_file}/x.toml"]
        ),
        hostile_texts.map(lambda text: _as_env(text) or "\x1b"),
    )
    plain = st.one_of(st.text(max_size=30), hostile_texts).map(_as_env)
    secret_urls = st.sampled_from(
        [
            f"postgresql+psycopg2://u:{SECRET}@127.0.0.1:{closed}/db",
            f"postgresql+psycopg2://u:{SECRET}@[::1/db",
            f"postgresql+psycopg2://u:{SECRET}@host:99999/db",
            f"postgresql+psycopg2://u:p@ss{SECRET}@127.0.0.1:{closed}/db",
            f"mysql://u:{SECRET}@127.0.0.1:{closed}/db",
            f"postgresql+psycopg2://u@127.0.0.1:{closed}/db?password={SECRET}",
            f"sqlite:///{a_file}/source.sqlite",
            f"sqlite:///{tmp / 'source.sqlite'}",
            "sqlite:///:memory:",
            "sqlite://",
            "sqlite:///relative.sqlite",
            f"postgresql+psycopg2://u:{SECRET}\udcff@127.0.0.1:{closed}/db",
            f"postgresql+psycopg2://u:{SECRET}\r\n@127.0.0.1:{closed}/db",
        ]
    )
    # The ledger: the fuzzed one, or a URL that cannot work before any connection is made (a
    # well-formed URL of a server that is down is exit 1 by the contract: unexpected).
    ledger_urls = st.one_of(
        st.just(ledger_url),
        st.sampled_from(
            [
                "sqlite:///:memory:",
                "sqlite:///relative.sqlite",
                f"postgresql+psycopg2://u:{SECRET}@[::1/db",
                f"postgresql+psycopg2://u:{SECRET}@host:99999/db",
                f"postgresql+psycopg2://u:{SECRET}\x1b@host/db",
                f"postgresql+psycopg2://u:{SECRET}\udcff@host/db",
                f"nonsense://u:{SECRET}@host/db",
            ]
        ),
    )
    smtp_hosts = st.sampled_from(
        ["127.0.0.1", "::1", "smtp example.org", "smtp.example.org:587", "\x1b[31m", "h\udcff", ""]
    )
    # Values that work (or carry the secret where it belongs), most of them left unset ...
    usual: dict[str, st.SearchStrategy[str]] = {
        a.ENV_WEBHOOK_URL: _webhook_urls(port),
        a.ENV_WEBHOOK_FORMAT: st.sampled_from(["json", "SLACK"]),
        a.ENV_EMAIL_TO: st.just("ops@example.org"),
        a.ENV_EMAIL_FROM: st.just("d@example.org"),
        a.ENV_SMTP_HOST: st.sampled_from(["127.0.0.1", "::1"]),
        a.ENV_SMTP_PORT: st.just(str(closed)),
        a.ENV_SMTP_USER: st.just("u"),
        a.ENV_SMTP_PASSWORD: st.just(SECRET),
        a.ENV_KINDS: st.sampled_from(["liveness,lease_reclaimed", "slot_health"]),
        a.ENV_ALERTS_FILE: st.sampled_from(
            [str(tmp / f"{n}.toml") for n in files if "alerts" in n]
        ),
        ENV_SOURCE_URL: secret_urls,
        ENV_TIMEZONE: st.sampled_from(["UTC", "Europe/Berlin"]),
        ENV_OPERATORS: st.just(str(tmp / "operators.toml")),
        "DUELEDGER_HOOKS_FILE": st.just(str(tmp / "hooks.toml")),
    }
    # The caller: mostly the admin, so that commands act (and alert) as well as refuse.
    caller = st.sampled_from(["alice", "alice", "alice", "carol", "mallory"])
    # ... and one or two variables set to something hostile.
    hostile: dict[str, st.SearchStrategy[str]] = {
        a.ENV_WEBHOOK_URL: _webhook_urls(port),
        a.ENV_WEBHOOK_FORMAT: st.one_of(st.just("xml"), plain),
        a.ENV_EMAIL_TO: plain,
        a.ENV_EMAIL_FROM: plain,
        a.ENV_SMTP_HOST: smtp_hosts,
        a.ENV_SMTP_PORT: st.one_of(numbers, plain),
        a.ENV_SMTP_USER: plain,
        a.ENV_SMTP_PASSWORD: st.sampled_from(
            [f"{SECRET}\r\n", f"{SECRET}\udcff", f"\x1b{SECRET}", f"{SECRET}\u202e"]
        ),
        a.ENV_SMTP_STARTTLS: plain,
        a.ENV_TIMEOUT: st.one_of(st.sampled_from(["0", "NaN", "1e9", "inf"]), plain),
        a.ENV_KINDS: st.one_of(st.sampled_from(["liveness,,x", "nope"]), plain),
        a.ENV_MAX_ATTEMPTS: st.one_of(numbers, plain),
        a.ENV_ALERTS_FILE: paths,
        ENV_SOURCE_URL: secret_urls,
        ENV_DATABASE_URL: ledger_urls,
        ENV_SLOT_MINUTES: st.one_of(st.just("7"), plain),
        ENV_TIMEZONE: st.one_of(st.just("Mars/Base"), plain),
        ENV_PLUGIN_TASKS: st.one_of(st.just("a,,b"), plain),
        ENV_OPERATORS: paths,
        ENV_IDENTITY: plain,
        "DUELEDGER_HOOKS_FILE": paths,
    }
    overrides = st.lists(st.sampled_from(sorted(hostile)), max_size=2, unique=True).flatmap(
        lambda keys: st.fixed_dictionaries({k: hostile[k] for k in keys})
    )
    return st.builds(
        lambda base, bad: {**base, **bad},
        st.fixed_dictionaries({ENV_IDENTITY: caller}, optional=usual),
        overrides,
    )


ENV_COMMANDS = [
    ["alerts"],
    ["reclaim"],
    ["reclaim", "--dry-run"],
    ["liveness", "--alert", "--max-age-seconds", "60"],
    ["summary"],
    ["runs", "list", "--limit", "3"],
    ["tasks"],
    ["hooks"],
    ["sample-data", "--services", "2"],
    ["launch", "no_such_task", "--operator", "alice", "--reason", "r"],
]


class EnvFuzz:
    """The fuzzed ledger and the environments to try (a short repr for hypothesis' report)."""

    def __init__(self, url: str, environments: st.SearchStrategy[dict[str, str]]) -> None:
        self.url = url
        self.environments = environments

    def __repr__(self) -> str:
        return f"EnvFuzz({self.url})"


@pytest.fixture
def env_fuzz(fuzz_env: tuple[str, Path], secret_webhook: WebhookSink, tmp_path: Path) -> EnvFuzz:
    url, _home = fuzz_env
    # An entry whose lease expired: `reclaim` has something to reclaim and alert about.
    ledger = RunLedger(database_url=url)
    try:
        due = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=30)
        entry = ledger.ensure_entry(
            task_key="order_cleanup", trigger=Trigger.SCHEDULE, dedup_key=dedup_key_for_due(due)
        )
        ledger.claim(entry.id, "run-dead", lease_ttl=timedelta(minutes=1), now=due)
    finally:
        ledger.dispose()
    folder = tmp_path / "env"
    folder.mkdir()
    return EnvFuzz(url, _env_strategy(folder, secret_webhook.port, url))


@settings(max_examples=40, **FUZZ_SETTINGS)  # type: ignore[arg-type]
@given(data=st.data())
def test_any_environment_gives_a_clean_exit_valid_json_and_never_leaks_a_secret(
    env_fuzz: EnvFuzz, data: st.DataObject
) -> None:
    url = env_fuzz.url
    command = data.draw(st.sampled_from(ENV_COMMANDS), label="command")
    env = data.draw(env_fuzz.environments, label="env")
    args = [*command, "--json"]
    result = CliRunner().invoke(main, args, env=env, catch_exceptions=True)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        args,
        env,
        repr(result.exception),
    )
    event(f"{command[0]}: exit {result.exit_code}")  # --hypothesis-show-statistics
    allowed = {0, 1, 2, 3} if args[0] == "liveness" else {0, 2, 3}
    assert result.exit_code in allowed, (args, env, result.exit_code, result.stdout[-800:])
    data_out = json.loads(result.stdout)
    if result.exit_code in (2, 3):
        assert set(data_out) == {"error"} and data_out["error"], data_out
    _assert_no_secret(result.stdout + result.stderr, url, (args, env))
