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
launch (a task name that is not registered; an entry that cannot be retried).
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
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from orchestration.cli import main
from orchestration.tasks import TASKS
from resources.core import tags as t
from resources.core.settings import ENV_DATABASE_URL, ENV_IDENTITY, ENV_OPERATORS
from resources.ledger import RunLedger, dedup_key_for_due
from resources.ledger.schema import entries

DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
TASK_KEYS = {spec.key for spec in TASKS}

# Text as a careless or hostile user types it: unicode, control characters, SQL, huge.
texts = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=300),
    st.sampled_from(["", " ", "' OR '1'='1", "x" * 5000, "\x00", "-1", "--json", "☃", "é" * 201]),
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
statuses = st.one_of(st.sampled_from([*t.STATUSES, "failed,success", "failed,"]), texts)


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
    st.tuples(st.just(["liveness"]), _options(("--max-age-seconds", numbers))),
    st.tuples(st.just(["reclaim", "--dry-run"]), st.just([])),
    st.tuples(
        unknown_tasks.map(lambda task: ["launch", task]),
        _options(("--operator", texts), ("--reason", texts), ("--request-id", texts)),
    ),
)


def _snapshot(url: str) -> list[tuple[Any, ...]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.select(entries).order_by(entries.c.id))]
    finally:
        engine.dispose()


@pytest.fixture
def fuzz_env(
    ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Path]]:
    """A ledger with a success and a failed entry, a fresh DAGSTER_HOME, and an allow-list
    (so role and identity rules are fuzzed too)."""
    monkeypatch.setenv(ENV_DATABASE_URL, ledger_url)
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
            trigger=t.TRIGGER_SCHEDULE,
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
    allowed = {0, 1, 2} if args[0] == "liveness" else {0, 2, 3}
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
