"""`dueledger runs list|show|retry` and `summary`: exit codes, JSON shapes, validation,
pagination, roles — through click's CliRunner on real SQLite and PostgreSQL ledgers.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result
from contract import ENTRY_KEYS, SUMMARY_LISTS

from orchestration.cli import main
from orchestration.cli.runs import CHECK_IDENTITY
from orchestration.reclaim import reclaim_expired
from orchestration.retry import CHECK_ACKNOWLEDGED, CHECK_ROLE_ADMIN, CHECK_ROLE_RETRIER
from resources.core import tags as t
from resources.core.arguments import MAX_REASON_CHARS
from resources.core.entry import (
    Entry,
    Trigger,
    dedup_key_for_due,
    dedup_key_for_request,
    dedup_key_for_retry,
)
from resources.core.settings import ENV_DATABASE_URL, ENV_IDENTITY, ENV_OPERATORS
from resources.ledger import RunLedger
from resources.ledger.schema import entries

TASK, OTHER = "order_cleanup", "service_lifecycle_maintenance"
DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
SLOT = timedelta(minutes=15)
TTL = timedelta(minutes=5)

# --- the contract's JSON shapes (fields may be added, never renamed) -------------------------
SHOW_KEYS = ENTRY_KEYS | {"children", "audit", "parent", "attempts"}
RETRY_KEYS = {"entry_id", "run_id", "parent_entry_id", "parent_run_id", "root_run_id", "launch"}
SUMMARY_KEYS = {
    "active",
    "stale",
    "failed_24h",
    "success_24h",
    "manual_retry_24h",
    "dispatch_failed_24h",
    "missed_24h",
}
AUDIT_KEYS = {"id", "at", "operator", "action", "entry_id", "child_entry_id", "reason"}
AUDIT_KEYS |= {"checks", "outcome"}


@dataclass
class Cli:
    runner: CliRunner
    ledger: RunLedger
    url: str
    #: Run each command as the operator it names (DUELEDGER_IDENTITY = its --operator), as
    #: each person of a team runs the CLI as themselves; None: as this test's own login.
    as_named: bool = False
    identity: str | None = None

    def __call__(self, *args: str) -> Result:
        env: dict[str, str | None] = {ENV_IDENTITY: self.identity}
        if self.as_named and "--operator" in args:
            env[ENV_IDENTITY] = args[args.index("--operator") + 1]
        return self.runner.invoke(main, list(args), env=env, catch_exceptions=False)

    def json(self, *args: str, code: int = 0) -> Any:
        result = self(*args, "--json")
        assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
        return json.loads(result.stdout)

    def error(self, *args: str, code: int) -> str:
        data = self.json(*args, code=code)
        assert set(data) == {"error"}
        return str(data["error"])


def _cli(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:
    monkeypatch.setenv(ENV_DATABASE_URL, url)
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.delenv(ENV_OPERATORS, raising=False)
    ledger = RunLedger(database_url=url)
    ledger.migrate()
    yield Cli(CliRunner(), ledger, url)
    ledger.dispose()


@pytest.fixture
def cli(ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:
    """The CLI over a fresh ledger (SQLite and PostgreSQL) and a fresh DAGSTER_HOME."""
    yield from _cli(ledger_url, tmp_path, monkeypatch)


@pytest.fixture
def sqlite_cli(sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:
    """The same on SQLite only, for tests about Dagster rather than the ledger backend."""
    yield from _cli(sqlite_url, tmp_path, monkeypatch)


def scheduled(ledger: RunLedger, k: int, task: str = TASK, **kw: Any) -> Entry:
    return ledger.ensure_entry(
        task_key=task,
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(DUE + k * SLOT),
        max_attempts=1,
        **kw,
    )


def failed(ledger: RunLedger, k: int = 0, run_id: str = "run-gone", **kw: Any) -> Entry:
    entry = scheduled(ledger, k, **kw)
    assert ledger.claim(entry.id, run_id, lease_ttl=TTL).claimed
    ledger.fail(entry.id, run_id, error="boom")
    found = ledger.get(entry.id)
    assert found is not None
    return found


def count_rows(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(entries)).scalar_one())
    finally:
        engine.dispose()


# --- shapes ----------------------------------------------------------------------------------


def test_list_json_shape(cli: Cli) -> None:
    failed(cli.ledger)
    data = cli.json("runs", "list")
    assert set(data) == {"entries", "next_cursor"}
    [entry] = data["entries"]
    assert set(entry) >= ENTRY_KEYS
    assert set(entry["summary"]) >= SUMMARY_LISTS
    assert data["next_cursor"] is None
    assert entry["created_at"].endswith("Z") and entry["due"] == "2026-11-30T22:45:00Z"


def test_show_json_shape_with_children_audit_and_dagster_status(sqlite_cli: Cli) -> None:
    cli = sqlite_cli
    with dg.DagsterInstance.get() as instance:  # the CLI's instance: $DAGSTER_HOME
        real_run = dg.materialize([_probe], instance=instance).run_id
    parent = failed(cli.ledger, run_id=real_run)
    cli.ledger.ensure_entry(
        task_key=TASK,
        trigger=Trigger.MANUAL_RETRY,
        dedup_key=dedup_key_for_retry(parent.id),
        parent_id=parent.id,
        operator="alice",
        reason="why",
    )
    cli.ledger.write_audit(
        operator="alice", action="manual_retry", entry_id=parent.id, outcome="allowed: test"
    )

    data = cli.json("runs", "show", str(parent.id))

    assert set(data) >= SHOW_KEYS
    [child] = data["children"]
    assert set(child) >= ENTRY_KEYS and child["parent_id"] == parent.id
    [audit] = data["audit"]
    assert set(audit) == AUDIT_KEYS
    [attempt] = data["attempts"]
    assert (attempt["run_id"], attempt["dagster_status"], attempt["found"]) == (
        real_run,
        "SUCCESS",
        True,
    )
    child_view = cli.json("runs", "show", str(child["id"]))
    assert child_view["parent"]["id"] == parent.id


def test_show_tolerates_runs_dagster_no_longer_has(cli: Cli) -> None:
    parent = failed(cli.ledger, run_id="run-deleted-long-ago")
    [attempt] = cli.json("runs", "show", str(parent.id))["attempts"]
    assert (attempt["found"], attempt["dagster_status"]) == (False, None)
    text = cli("runs", "show", str(parent.id))
    assert text.exit_code == 0 and "run-deleted-long-ago run not found" in text.stdout


def test_summary_json_shape_and_counts(cli: Cli) -> None:
    now = datetime.now(UTC)
    ledger = cli.ledger
    live = scheduled(ledger, 0)
    assert ledger.claim(live.id, "run-live", lease_ttl=TTL).claimed  # active
    stale = scheduled(ledger, 1)
    assert ledger.claim(stale.id, "run-stale", lease_ttl=TTL, now=now - timedelta(hours=1)).claimed
    done = scheduled(ledger, 2)
    assert ledger.claim(done.id, "run-ok", lease_ttl=TTL).claimed
    assert ledger.succeed(done.id, "run-ok")
    old = scheduled(ledger, 3)
    assert ledger.claim(old.id, "run-old", lease_ttl=TTL, now=now - timedelta(days=2)).claimed
    assert ledger.succeed(old.id, "run-old", now=now - timedelta(days=2))  # outside 24 h
    parent = failed(ledger, 4)
    ledger.ensure_entry(
        task_key=TASK,
        trigger=Trigger.MANUAL_RETRY,
        dedup_key=dedup_key_for_retry(parent.id),
        parent_id=parent.id,
    )
    launch = scheduled(ledger, 5)
    ledger.record_dispatch_failure(launch.id, error="launcher down")

    data = cli.json("summary")

    assert set(data) >= SUMMARY_KEYS
    assert {k: data[k] for k in SUMMARY_KEYS - {"missed_24h"}} == {
        "active": 1,
        "stale": 1,
        "failed_24h": 1,
        "success_24h": 1,
        "manual_retry_24h": 1,
        "dispatch_failed_24h": 1,
    }
    assert data["queued"] == 1  # the retry child
    # missed_24h is the gap audit's (sensors/health.py), the same numbers as ledger_health.
    assert isinstance(data["missed_24h"], int)
    assert data["missed_24h"] == sum(row["missed_24h"] for row in data["tasks"])
    human = cli("summary")
    assert human.exit_code == 0 and "active=1" in human.stdout


def _at_the_limit(text: str) -> str:
    """A reason of exactly MAX_REASON_CHARS characters made of ``text`` repeated."""
    return (text * MAX_REASON_CHARS)[: MAX_REASON_CHARS - 1] + "."


def test_retry_json_shape_and_a_real_dagster_re_execution(sqlite_cli: Cli) -> None:
    """`launch` and `runs retry` through the real `dagster job launch` and `dagster-graphql`:
    Dagster's lineage, our tags, and 2,000-character reasons kept character for character
    (a 40,000-character one once failed the launch: they travel on stdin, not argv)."""
    cli = sqlite_cli
    why = _at_the_limit('Zählung "3" $HOME `id` \\ ;\n')
    again = _at_the_limit("'upstream' fixed\t& ")
    launched = cli.json("launch", TASK, "--operator", "alice", "--reason", why)
    first = launched["run_id"]  # queued: no daemon runs it
    parent = cli.ledger.get(launched["entry_id"])
    assert parent is not None and parent.reason == why
    for _ in range(parent.max_attempts):  # every attempt fails: the entry is failed
        assert cli.ledger.claim(parent.id, first, lease_ttl=TTL).claimed
        cli.ledger.fail(parent.id, first, error="boom")

    # Recorded as checked, stripped: " bob " is bob (the retry once kept what was typed).
    data = cli.json(
        "runs", "retry", str(parent.id), "--operator", " bob ", "--reason", f"  {again}\n"
    )

    assert set(data) >= RETRY_KEYS
    assert (data["parent_entry_id"], data["launch"]) == (parent.id, "reexecution")
    assert (data["parent_run_id"], data["root_run_id"]) == (first, first)
    with dg.DagsterInstance.get() as instance:
        parent_run = instance.get_run_by_id(first)
        run = instance.get_run_by_id(data["run_id"])
    assert parent_run is not None and parent_run.tags[t.TAG_REASON] == why
    assert run is not None and run.status == dg.DagsterRunStatus.QUEUED  # not waited for
    assert (run.parent_run_id, run.root_run_id) == (first, first)
    assert run.tags[t.DAGSTER_PARENT_RUN_ID] == first
    assert run.tags[t.TAG_TRIGGER] == Trigger.MANUAL_RETRY
    assert run.tags[t.TAG_PARENT_ENTRY] == str(parent.id)
    assert (run.tags[t.TAG_OPERATOR], run.tags[t.TAG_REASON]) == ("bob", again)
    assert run.tags[t.TAG_TASK] == TASK
    child = cli.ledger.get(data["entry_id"])
    assert child is not None and child.parent_id == parent.id
    assert (child.operator, child.reason) == ("bob", again)


@dg.asset
def _probe() -> int:
    return 1


# --- exit codes and validation ------------------------------------------------------------------


def _cursor(raw: str) -> str:
    """A cursor as the ledger encodes one, around any text (to tamper with it)."""
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--status", "failed,bogus"], "valid statuses: queued, running, retrying, success"),
        (["--status", ""], "valid statuses"),
        (["--status", "failed,"], "valid statuses"),
        (["--trigger", "cron"], "valid triggers: schedule, sensor, manual"),
        (["--task", "Order-Cleanup"], "is not a task key"),
        (["--since", "yesterday"], "is not an ISO-8601 time"),
        (["--until", "2026-13-01"], "is not an ISO-8601 time"),
        (["--since", "2026-12-01", "--until", "2026-11-01"], "must be before --until"),
        (["--limit", "0"], "from 1 to 500"),
        (["--limit", "501"], "from 1 to 500"),
        (["--limit", "ten"], "from 1 to 500"),
        (["--cursor", "!!"], "is not a cursor returned by a previous page"),
        (["--cursor", "bm90LWEtY3Vyc29y"], "is not a cursor returned by a previous page"),
        # Well-formed but tampered: an id beyond BIGINT (PostgreSQL refused it with a traceback).
        (["--cursor", _cursor("2026-12-01T00:00:00.000000Z|99999999999999999999")], "a previous"),
        (["--cursor", _cursor("2026-12-01T00:00:00.000000Z|-1")], "a previous page"),
    ],
)
def test_list_rejects_invalid_filters_with_exit_2(cli: Cli, args: list[str], message: str) -> None:
    assert message in cli.error("runs", "list", *args, code=2)
    human = cli("runs", "list", *args)
    assert human.exit_code == 2 and message in human.stderr


# Values shaped like SQL injection: validation rejects them, and the table is untouched.
INJECTIONS = [
    ["--task", "x' OR '1'='1"],
    ["--task", "order_cleanup; DROP TABLE dueledger_entries; --"],
    ["--status", "failed' OR 1=1 --"],
    ["--status", "failed,success) OR (1=1"],
    ["--trigger", "schedule'; DELETE FROM dueledger_entries; --"],
    ["--cursor", "' UNION SELECT * FROM dueledger_audit --"],
    ["--since", "2026-01-01' OR '1'='1"],
]


@pytest.mark.parametrize("args", INJECTIONS, ids=[a[0] + ":" + a[1][:12] for a in INJECTIONS])
def test_injection_shaped_filters_are_rejected_by_validation(cli: Cli, args: list[str]) -> None:
    failed(cli.ledger)
    before = count_rows(cli.url)
    cli.error("runs", "list", *args, code=2)
    assert count_rows(cli.url) == before
    assert len(cli.json("runs", "list")["entries"]) == before


def test_injection_shaped_values_reaching_the_ledger_are_plain_data(cli: Cli) -> None:
    failed(cli.ledger)
    page, cursor = cli.ledger.list_entries(task_key="x' OR '1'='1")
    assert (page, cursor) == ([], None)
    with pytest.raises(ValueError, match="unknown status"):
        cli.ledger.list_entries(statuses=["failed' OR 1=1 --"])
    assert count_rows(cli.url) == 1


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["runs", "show", "abc"], 2, "must be a positive whole number"),
        (["runs", "show", "0"], 2, "must be a positive whole number"),
        (["runs", "show", "1 OR 1=1"], 2, "must be a positive whole number"),
        (["runs", "show", "999999"], 2, "ledger entry 999999 does not exist"),
        (["runs", "retry", "x", "--operator", "a", "--reason", "r"], 2, "positive whole number"),
        (["runs", "retry", "999999", "--operator", "a", "--reason", "r"], 2, "does not exist"),
        (["runs", "retry", "1", "--operator", " ", "--reason", "r"], 2, "--operator must name"),
        (["runs", "retry", "1", "--operator", "a", "--reason", "  "], 2, "--reason must say"),
    ],
)
def test_show_and_retry_input_errors_exit_2(
    cli: Cli, args: list[str], code: int, message: str
) -> None:
    assert message in cli.error(*args, code=code)


def test_a_refused_retry_exits_3_names_the_rule_and_changes_nothing(cli: Cli) -> None:
    entry = scheduled(cli.ledger, 0)  # queued: not failed
    message = cli.error(
        "runs", "retry", str(entry.id), "--operator", "alice", "--reason", "why", code=3
    )
    assert "refused by rule parent_is_failed" in message and "Nothing was changed" in message
    assert cli.ledger.get(entry.id) == entry
    assert cli.ledger.children(entry.id) == []
    [audit] = cli.ledger.audit_for(entry.id)
    assert audit["outcome"].startswith("refused: parent_is_failed")
    human = cli("runs", "retry", str(entry.id), "--operator", "alice", "--reason", "why")
    assert human.exit_code == 3 and "refused by rule parent_is_failed" in human.stderr


# --- pagination --------------------------------------------------------------------------------


def _all_pages(cli: Cli, *args: str, limit: int = 7) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    cursor: list[str] = []
    while True:
        page = cli.json("runs", "list", "--limit", str(limit), *args, *cursor)
        seen += page["entries"]
        assert len(page["entries"]) <= limit
        if page["next_cursor"] is None:
            return seen
        cursor = ["--cursor", page["next_cursor"]]


def test_pages_are_newest_first_disjoint_and_complete_for_each_filter(cli: Cli) -> None:
    ledger = cli.ledger
    base = datetime(2026, 11, 1, tzinfo=UTC)
    made: list[Entry] = []
    for k in range(30):
        task = TASK if k % 3 else OTHER
        entry = scheduled(ledger, k, task=task, now=base + timedelta(minutes=k))
        if k % 4 == 0:
            assert ledger.claim(entry.id, f"r{k}", lease_ttl=TTL).claimed
            ledger.fail(entry.id, f"r{k}", error="x")
        made.append(entry)
    manual = ledger.ensure_entry(
        task_key=TASK,
        trigger=Trigger.MANUAL,
        dedup_key=dedup_key_for_request("req"),
        now=base + timedelta(minutes=5),  # same instant as entry 5: the id breaks the tie
    )
    made.append(manual)

    everything = _all_pages(cli)
    ids = [e["id"] for e in everything]
    assert sorted(ids) == sorted(e.id for e in made) and len(set(ids)) == len(ids)
    keys = [(e["created_at"], e["id"]) for e in everything]
    assert keys == sorted(keys, reverse=True)

    def expect(pred: Any) -> list[int]:
        return [e["id"] for e in everything if pred(e)]

    since, until = "2026-11-01T00:10:00Z", "2026-11-01T00:20:00+00:00"
    cases: list[tuple[list[str], Any]] = [
        (["--task", OTHER], lambda e: e["task_key"] == OTHER),
        (["--status", "failed"], lambda e: e["status"] == "failed"),
        (["--status", "failed,queued"], lambda e: e["status"] in ("failed", "queued")),
        (["--trigger", "manual"], lambda e: e["trigger"] == "manual"),
        (
            ["--since", since, "--until", until],
            lambda e: "2026-11-01T00:10" <= e["created_at"] < "2026-11-01T00:20",
        ),
        (
            ["--task", TASK, "--status", "queued", "--since", since],
            lambda e: (
                e["task_key"] == TASK
                and e["status"] == "queued"
                and e["created_at"] >= "2026-11-01T00:10"
            ),
        ),
    ]
    for args, pred in cases:
        assert [e["id"] for e in _all_pages(cli, *args, limit=3)] == expect(pred), args


def _inserter(url: str, stop: threading.Event, made: list[int], errors: list[str]) -> None:
    ledger = RunLedger(database_url=url)
    k = 0
    try:
        while not stop.is_set():
            k += 1
            # New entries (now) and backdated ones into the region being paged through.
            when = None if k % 2 else datetime(2026, 11, 1, tzinfo=UTC) + timedelta(seconds=k)
            entry = ledger.ensure_entry(
                task_key=TASK,
                trigger=Trigger.MANUAL,
                dedup_key=dedup_key_for_request(f"concurrent-{k}"),
                now=when,
            )
            made.append(entry.id)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        ledger.dispose()


def test_pagination_stays_consistent_while_entries_are_inserted(cli: Cli) -> None:
    base = datetime(2026, 11, 1, tzinfo=UTC)
    existing = [scheduled(cli.ledger, k, now=base + timedelta(seconds=k * 7)).id for k in range(60)]
    stop, made, errors = threading.Event(), [], []  # type: ignore[var-annotated]
    thread = threading.Thread(target=_inserter, args=(cli.url, stop, made, errors))
    thread.start()
    try:
        seen = _all_pages(cli, limit=5)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors, errors
    assert made, "the inserter ran while pages were read"
    ids = [e["id"] for e in seen]
    assert len(ids) == len(set(ids)), "an entry appeared on two pages"
    assert set(existing) <= set(ids), "an entry that existed before paging was skipped"
    keys = [(e["created_at"], e["id"]) for e in seen]
    assert keys == sorted(keys, reverse=True)


# --- roles -------------------------------------------------------------------------------------


@pytest.fixture
def team(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    path = tmp_path / "operators.toml"
    path.write_text('[operators]\nalice = ["admin"]\nbob = ["retrier"]\ncarol = ["viewer"]\n')
    monkeypatch.setenv(ENV_OPERATORS, str(path))
    cli.as_named = True
    return cli


def test_a_viewer_may_look_but_not_retry(team: Cli) -> None:
    parent = failed(team.ledger)
    assert team.json("runs", "list", "--operator", "carol")["entries"]
    assert team.json("runs", "show", str(parent.id), "--operator", "carol")["id"] == parent.id
    assert "active" in team.json("summary", "--operator", "carol")
    message = team.error(
        "runs", "retry", str(parent.id), "--operator", "carol", "--reason", "r", code=3
    )
    assert f"refused by rule {CHECK_ROLE_RETRIER}" in message
    assert team.ledger.children(parent.id) == []
    assert team.ledger.audit_for(parent.id)[-1]["operator"] == "carol"


def test_an_unknown_operator_is_refused_and_audited(team: Cli) -> None:
    parent = failed(team.ledger)
    message = team.error("runs", "show", str(parent.id), "--operator", "mallory", code=3)
    assert "'mallory' is not on the allow-list" in message
    [audit] = team.ledger.audit_for(parent.id)
    assert (audit["operator"], audit["action"]) == ("mallory", "runs_show")
    assert audit["outcome"].startswith("refused: operator_has_role_viewer")
    team.error("runs", "list", "--operator", "mallory", code=3)
    team.error("summary", "--operator", "mallory", code=3)


def test_acknowledging_side_effects_needs_an_admin(team: Cli) -> None:
    ledger = team.ledger
    entry = scheduled(ledger, 0)
    assert ledger.claim(entry.id, "run-x", lease_ttl=TTL, now=DUE).claimed
    [reclaimed] = reclaim_expired(ledger, now=DUE + timedelta(hours=1))
    args = ["runs", "retry", str(reclaimed.id), "--reason", "checked the mails"]

    assert f"rule {CHECK_ACKNOWLEDGED}" in team.error(*args, "--operator", "alice", code=3)
    assert f"rule {CHECK_ROLE_ADMIN}" in team.error(
        *args, "--operator", "bob", "--acknowledge-side-effects", code=3
    )
    assert ledger.children(reclaimed.id) == []


def test_launch_needs_the_retrier_role(team: Cli) -> None:
    message = team.error("launch", TASK, "--operator", "carol", "--reason", "r", code=3)
    assert f"refused by rule {CHECK_ROLE_RETRIER}" in message
    assert count_rows(team.url) == 0  # nothing launched, no entry


def test_with_an_allow_list_you_act_as_yourself_not_as_the_name_you_type(team: Cli) -> None:
    parent = failed(team.ledger)
    bob = replace(team, as_named=False, identity="bob")  # a retrier
    retry = ["runs", "retry", str(parent.id), "--reason", "r"]
    message = bob.error(*retry, "--operator", "alice", code=3)
    assert f"refused by rule {CHECK_IDENTITY}" in message and "you are 'bob'" in message
    assert team.ledger.children(parent.id) == []
    audit = team.ledger.audit_for(parent.id)[-1]
    assert (audit["operator"], audit["action"]) == ("bob", "manual_retry")
    assert audit["outcome"].startswith(f"refused: {CHECK_IDENTITY}")
    # Launching and looking under another name are refused the same way; nothing launched.
    assert CHECK_IDENTITY in bob.error(
        "launch", TASK, "--operator", "alice", "--reason", "r", code=3
    )
    carol = replace(team, as_named=False, identity="carol")  # a viewer
    assert CHECK_IDENTITY in carol.error("summary", "--operator", "alice", code=3)
    assert count_rows(team.url) == 1
    # Without --operator (or naming yourself) you are yourself: carol may look, not retry.
    assert carol.json("runs", "show", str(parent.id))["id"] == parent.id
    assert f"rule {CHECK_ROLE_RETRIER}" in carol.error(*retry, "--operator", "carol", code=3)
    assert team.ledger.audit_for(parent.id)[-1]["operator"] == "carol"


def test_an_admin_may_act_for_someone_with_their_roles_and_both_are_audited(team: Cli) -> None:
    ledger = team.ledger
    entry = scheduled(ledger, 0)
    assert ledger.claim(entry.id, "run-x", lease_ttl=TTL, now=DUE).claimed
    [reclaimed] = reclaim_expired(ledger, now=DUE + timedelta(hours=1))
    alice = replace(team, as_named=False, identity="alice")  # the admin
    assert alice.json("runs", "show", str(reclaimed.id), "--operator", "carol")["id"]
    acted = ledger.audit_for(reclaimed.id)[-1]
    assert (acted["operator"], acted["action"]) == ("alice", "runs_show")
    assert acted["outcome"] == "acting for: alice runs runs_show as carol"
    assert acted["checks"][0]["check"] == CHECK_IDENTITY and acted["checks"][0]["passed"]
    # Acting for bob (a retrier) gives bob's roles, not alice's: no side-effect acknowledgement.
    message = alice.error(
        "runs",
        "retry",
        str(reclaimed.id),
        "--operator",
        "bob",
        "--reason",
        "checked",
        "--acknowledge-side-effects",
        code=3,
    )
    assert f"rule {CHECK_ROLE_ADMIN}" in message
    assert ledger.children(reclaimed.id) == []
    assert [a["operator"] for a in ledger.audit_for(reclaimed.id)[-2:]] == ["alice", "bob"]


def test_the_identity_variable_names_the_caller(team: Cli) -> None:
    parent = failed(team.ledger)
    nobody = replace(team, as_named=False, identity="mallory")
    assert "'mallory' is not on the allow-list" in nobody.error(
        "runs", "show", str(parent.id), code=3
    )
    assert team.ledger.audit_for(parent.id)[-1]["operator"] == "mallory"


def test_an_operators_file_that_does_not_exist_refuses_everyone(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = failed(cli.ledger)
    missing = tmp_path / "operaters.toml"  # a typo in the path must not open every role
    monkeypatch.setenv(ENV_OPERATORS, str(missing))
    for args in (
        ["runs", "list", "--operator", "alice"],
        ["runs", "retry", str(parent.id), "--operator", "alice", "--reason", "r"],
        ["launch", TASK, "--operator", "alice", "--reason", "r"],
    ):
        message = cli.error(*args, code=2)
        assert f"{ENV_OPERATORS}={missing} names a file that does not exist" in message
    assert cli.ledger.children(parent.id) == []
    assert cli.ledger.audit_for(parent.id) == []
    assert count_rows(cli.url) == 1  # only the parent: nothing launched


def test_without_an_operators_file_everyone_is_the_local_operator(cli: Cli) -> None:
    assert cli.json("runs", "list", "--operator", "whoever") == {
        "entries": [],
        "next_cursor": None,
    }


def test_an_overlong_reason_is_invalid_input_and_changes_nothing(cli: Cli) -> None:
    parent = failed(cli.ledger)
    huge = "x" * 40_000
    message = cli.error(
        "runs", "retry", str(parent.id), "--operator", "alice", "--reason", huge, code=2
    )
    assert "--reason is 40000 characters; at most 2000" in message
    message = cli.error("launch", TASK, "--operator", "alice", "--reason", huge, code=2)
    assert "--reason is 40000 characters" in message
    long_id = "r" * 300
    message = cli.error(
        "launch", TASK, "--operator", "alice", "--reason", "r", "--request-id", long_id, code=2
    )
    assert "--request-id is 300 characters; at most 200" in message
    for command in (["launch", TASK], ["runs", "retry", str(parent.id)]):
        # PostgreSQL once refused a 300-character operator ("value too long") SQLite kept.
        message = cli.error(*command, "--operator", "o" * 300, "--reason", "r", code=2)
        assert "must be 1-200 characters" in message
    assert cli.ledger.children(parent.id) == []
    assert cli.ledger.audit_for(parent.id) == []
    assert count_rows(cli.url) == 1  # only the parent


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["runs", "list", "--since", "0001-01-01T00:00:00+05:00"], "--since '0001-01-01"),
        (["runs", "list", "--until", "9999-12-31T23:59:59-05:00"], "--until '9999-12-31"),
        (["runs", "list", "--since", "1900-01-01T00:00:00Z"], "is out of range"),
        (["sample-data", "--as-of", "9999-12-31T00:00:00Z"], "--as-of '9999-12-31"),
        (["liveness", "--max-age-seconds", "99999999999999999999"], "from 1 to 31622400"),
    ],
)
def test_times_out_of_range_are_invalid_input_not_a_traceback(
    sqlite_cli: Cli, args: list[str], expected: str
) -> None:
    assert expected in sqlite_cli.error(*args, code=2)
