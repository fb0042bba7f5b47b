"""Hostile input: each finding reproduced through the `dueledger` console
script, run as a subprocess as a user runs it, on SQLite and PostgreSQL ledgers where a
database is involved.

Webhook secrets (a path, a query, user info) never reach an output or a stored row; a
dispatch-failed manual request is re-dispatched when it is launched again, whoever recorded
the failure; and the smaller ones: IPv6 and in-memory URLs, text that is not UTF-8, source
store errors, roles of the operations commands, /dev/zero as a configuration file, and the
messages that say what is wrong.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from alert_sinks import WebhookSink, free_port, start
from cli_process import Ran, base_env, run_cli, stored_text

from orchestration.declarations import task_views
from orchestration.services.launch import manual_run_id
from resources.core import alerting as a
from resources.core import tags as t
from resources.core.entry import Status, Trigger, dedup_key_for_due
from resources.core.settings import (
    ENV_DATABASE_URL,
    ENV_IDENTITY,
    ENV_KEEPER_INTERVAL,
    ENV_OPERATORS,
    ENV_PLUGIN_TASKS,
    ENV_SOURCE_URL,
)
from resources.ledger import LedgerError, RunLedger
from resources.ledger.schema import alert_deliveries, audit
from resources.sample_data import generate_sample_data
from resources.source_store import make_engine
from sensors.outcomes import build_outcome_sensor

TASK = "order_cleanup"
SECRET = "SECRETTOKEN1"
TEAM = '[operators]\nalice = ["admin"]\nbob = ["retrier"]\ncarol = ["viewer"]\n'


@dataclass
class Box:
    """A ledger (SQLite or PostgreSQL), a fresh DAGSTER_HOME and a SQLite source store."""

    url: str
    tmp: Path
    env: dict[str, str]
    ledger: RunLedger

    def run(self, *args: str, **extra: str) -> Ran:
        return run_cli(args, {**self.env, **extra})

    def expired_lease(self, run_id: str = "run-dead") -> int:
        due = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=15)
        entry = self.ledger.ensure_entry(
            task_key=TASK, trigger=Trigger.SCHEDULE, dedup_key=dedup_key_for_due(due)
        )
        assert self.ledger.claim(entry.id, run_id, lease_ttl=timedelta(minutes=1), now=due)
        return entry.id

    def status(self, entry_id: int) -> str:
        entry = self.ledger.get(entry_id)
        assert entry is not None
        return entry.status

    def dagster_runs(self) -> list[str]:
        """The ids of the runs the Dagster instance of this DAGSTER_HOME holds."""
        home = Path(self.env["DAGSTER_HOME"])
        if not (home / "dagster.yaml").exists():
            return []
        with dg.DagsterInstance.from_config(str(home)) as instance:
            return [r.run_id for r in instance.get_runs()]

    def rows(self, table: sa.Table) -> list[dict[str, object]]:
        engine = sa.create_engine(self.url)
        try:
            with engine.connect() as conn:
                return [dict(r) for r in conn.execute(sa.select(table)).mappings()]
        finally:
            engine.dispose()


def _box(url: str, tmp_path: Path) -> Iterator[Box]:
    home = tmp_path / "home"
    home.mkdir()
    env = base_env(
        DAGSTER_HOME=str(home),
        **{ENV_DATABASE_URL: url, ENV_SOURCE_URL: f"sqlite:///{tmp_path / 'source.sqlite'}"},
    )
    ledger = RunLedger(database_url=url)
    ledger.migrate()
    yield Box(url, tmp_path, env, ledger)
    ledger.dispose()


@pytest.fixture
def box(ledger_url: str, tmp_path: Path) -> Iterator[Box]:
    yield from _box(ledger_url, tmp_path)


@pytest.fixture
def sqlite_box(sqlite_url: str, tmp_path: Path) -> Iterator[Box]:
    yield from _box(sqlite_url, tmp_path)


@pytest.fixture
def webhook() -> Iterator[WebhookSink]:
    with start(WebhookSink()) as sink:
        yield sink


def no_secret(ran: Ran, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in ran.output, (ran.args, secret, ran.output[-2000:])
    assert "\x1b" not in ran.output, ran.args


# --- webhook URLs -----------------------------------------------------------------------------


#: CR LF and a space, once carried into InvalidURL's text with the path; a broken IPv6
#: host, once ``ValueError: Invalid IPv6 URL`` and exit 1; and an escape sequence.
BAD_WEBHOOK_URLS = {
    "crlf": f"http://127.0.0.1:18086/TOK {SECRET}\r\nX-Injected: 1",
    "ipv6": f"http://[::1/{SECRET}",
    "escape": f"http://127.0.0.1:18086/{SECRET}\x1b[2J",
}


def test_a_webhook_url_that_cannot_work_is_exit_2_naming_it_before_anything_changes(
    box: Box,
) -> None:
    entry_id = box.expired_lease()
    cases = [("crlf", ["reclaim", "--json"]), ("ipv6", ["alerts", "--json"])]
    if box.url.startswith("sqlite"):  # refused before the ledger is read: once is enough
        cases += [("ipv6", ["reclaim", "--json"]), ("escape", ["liveness", "--alert", "--json"])]
    for name, args in cases:
        ran = box.run(*args, **{a.ENV_WEBHOOK_URL: BAD_WEBHOOK_URLS[name]})
        assert a.ENV_WEBHOOK_URL in ran.error(2), name
        no_secret(ran, SECRET, "X-Injected")
    assert box.status(entry_id) == Status.RUNNING  # reclaim changed nothing
    assert box.rows(alert_deliveries) == []


def test_a_webhook_secret_in_path_query_or_error_page_never_reaches_output_or_the_ledger(
    box: Box, webhook: WebhookSink
) -> None:
    key = "SECRETKEY2"
    webhook.status = 404
    # A server's error page that echoes the path and query, colored for a terminal.
    webhook.answer = f"\x1b[31mno hook at /hooks/T0/{SECRET}?key={key}\x1b[0m".encode()
    url = webhook.url(f"/hooks/T0/{SECRET}") + f"?key={key}"
    entry_id = box.expired_lease()

    ran = box.run("reclaim", "--json", **{a.ENV_WEBHOOK_URL: url})
    assert ran.code == 0, ran.output
    (delivery,) = ran.json()["alert_deliveries"]
    assert delivery["status"] == "failed" and "HTTP 404" in delivery["last_error"]
    assert "no hook at" in delivery["last_error"]  # the answer is kept, its secrets are not
    no_secret(ran, SECRET, key)
    assert box.status(entry_id) == Status.FAILED
    for args in (["alerts", "--json"], ["alerts"]):
        shown = box.run(*args, **{a.ENV_WEBHOOK_URL: url})
        assert shown.code == 0 and "HTTP 404" in shown.out
        no_secret(shown, SECRET, key)
    stored = "\n".join(stored_text(box.url))
    assert "HTTP 404" in stored
    assert SECRET not in stored and key not in stored and "\x1b" not in stored


def test_user_info_in_a_webhook_url_is_sent_as_basic_auth_and_never_shown(
    box: Box, webhook: WebhookSink
) -> None:
    # urllib once took `alertbot:pa%40ss-...@127.0.0.1` for the host name.
    password = f"pa@ss-{SECRET}"
    url = f"http://alertbot:pa%40ss-{SECRET}@127.0.0.1:{webhook.port}/hook"
    box.expired_lease()
    ran = box.run("reclaim", "--json", **{a.ENV_WEBHOOK_URL: url})
    assert ran.code == 0, ran.output
    (delivery,) = ran.json()["alert_deliveries"]
    assert delivery["status"] == "delivered", delivery
    (post,) = webhook.received
    assert post.path == "/hook"
    expected = base64.b64encode(f"alertbot:{password}".encode()).decode()
    assert post.headers["authorization"] == f"Basic {expected}"
    shown = box.run("alerts", "--json", **{a.ENV_WEBHOOK_URL: url})
    assert shown.json()["channels"][0]["target"] == f"http://127.0.0.1:{webhook.port}/***"
    no_secret(shown, SECRET, "alertbot")
    no_secret(ran, SECRET, "alertbot")
    assert not [row for row in stored_text(box.url) if SECRET in row]


# --- text that is not UTF-8 -------------------------------------------------------------------


def test_text_that_is_not_utf8_in_a_flag_is_exit_2_and_writes_nothing(box: Box) -> None:
    base = ["launch", TASK, "--operator", "ops", "--json"]
    for extra, flag in (
        (["--reason", "bad\udcff"], "--reason"),
        (["--reason", "ok", "--request-id", "bad\udcff"], "--request-id"),
    ):
        message = box.run(*base, *extra).error(2)
        assert message.startswith(f"{flag} is not valid UTF-8 (byte 0xff")
    assert box.ledger.list_entries(limit=5)[0] == []
    assert box.dagster_runs() == []


# --- databases that cannot be shared or used ---------------------------------------------------


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("sqlite:///:memory:", "in-memory SQLite database"),
        ("sqlite://", "in-memory SQLite database"),
        ("sqlite:///ledger.sqlite", "relative SQLite path"),
    ],
)
def test_a_ledger_other_processes_cannot_share_is_exit_2_and_nothing_is_launched(
    sqlite_box: Box, url: str, said: str
) -> None:
    ran = sqlite_box.run(
        "launch", TASK, "--operator", "ops", "--reason", "r", "--json", **{ENV_DATABASE_URL: url}
    )
    message = ran.error(2)
    assert message.startswith(f"{ENV_DATABASE_URL}=") and said in message
    assert "sqlite:////" in message  # the fix: an absolute path
    assert sqlite_box.dagster_runs() == []


def test_a_source_store_that_cannot_work_is_exit_2_naming_the_variable_masked(
    sqlite_box: Box,
) -> None:
    a_file = sqlite_box.tmp / "a-file"
    a_file.write_text("x")
    for url, said in (
        ("mysql://u:hunter2@localhost/db", "driver that is not installed"),
        (f"sqlite:///{a_file}/source.sqlite", "cannot create the SQLite file's folder"),
        (f"postgresql+psycopg2://u:hunter2@127.0.0.1:{free_port()}/db", "Connection refused"),
        ("sqlite:///:memory:", "in-memory SQLite database"),
    ):
        ran = sqlite_box.run("sample-data", "--services", "2", "--json", **{ENV_SOURCE_URL: url})
        message = ran.error(2)
        assert ENV_SOURCE_URL in message and said in message, message
        no_secret(ran, "hunter2")


# --- roles of the operations commands ---------------------------------------------------------


def _audits(box: Box, action: str) -> list[dict[str, object]]:
    return [row for row in box.rows(audit) if row["action"] == action]


def test_with_an_allow_list_operations_commands_need_a_role_and_are_audited(
    box: Box, webhook: WebhookSink
) -> None:
    team = box.tmp / "operators.toml"
    team.write_text(TEAM)
    box.env[ENV_OPERATORS] = str(team)
    box.env[a.ENV_WEBHOOK_URL] = webhook.url()
    source = make_engine(box.env[ENV_SOURCE_URL])
    try:
        generate_sample_data(source, services=3, as_of=datetime(2026, 11, 30, tzinfo=UTC))
    finally:
        source.dispose()
    before = stored_text(box.env[ENV_SOURCE_URL])
    entry_id = box.expired_lease()
    replace = ["sample-data", "--services", "3", "--replace", "--json"]

    def as_(name: str, *args: str, code: int) -> Ran:
        ran = box.run(*args, **{ENV_IDENTITY: name})
        assert ran.code == code, (name, args, ran.output[-2000:])
        return ran

    # A viewer may neither reclaim, nor alert, nor wipe the store (exit 3, audited).
    assert "operator_has_role_retrier" in as_("carol", "reclaim", "--json", code=3).out
    as_("carol", "liveness", "--alert", "--json", code=3)
    as_("carol", *replace, "--yes-delete-everything", code=3)
    # A retrier may not replace the store either: that is the admin's.
    assert "operator_has_role_admin" in as_("bob", *replace, code=3).out
    assert box.status(entry_id) == Status.RUNNING
    assert box.rows(alert_deliveries) == [] and webhook.received == []
    assert stored_text(box.env[ENV_SOURCE_URL]) == before
    refused = {(r["operator"], r["action"]) for r in box.rows(audit)}
    assert refused == {
        ("carol", "reclaim"),
        ("carol", "liveness_alert"),
        ("carol", "sample_data_replace"),
        ("bob", "sample_data_replace"),
    }
    assert all(str(r["outcome"]).startswith("refused: ") for r in box.rows(audit))

    # With the role each one acts, and says so in the audit.
    assert as_("bob", "reclaim", "--json", code=0).json()["count"] == 1
    assert box.status(entry_id) == Status.FAILED
    assert as_("bob", "liveness", "--alert", "--json", code=1).json()["alert_deliveries"]
    as_("alice", *replace, code=0)
    done = [r for r in box.rows(audit) if not str(r["outcome"]).startswith("refused")]
    assert {(r["operator"], r["action"]) for r in done} == {
        ("bob", "reclaim"),
        ("bob", "liveness_alert"),
        ("alice", "sample_data_replace"),
    }
    # Each reclaim is audited in the transaction that makes it, naming its entry.
    (reclaimed,) = [r for r in done if r["action"] == "reclaim"]
    assert reclaimed["entry_id"] == entry_id
    assert f"reclaimed the expired lease of entry {entry_id}" in str(reclaimed["outcome"])


# --- configuration files are read with a bound -------------------------------------------------


def test_dev_zero_as_a_configuration_file_fails_fast_naming_the_variable(
    sqlite_box: Box,
) -> None:
    for variable, args in (
        (a.ENV_ALERTS_FILE, ["alerts", "--json"]),
        (ENV_OPERATORS, ["summary", "--json"]),
    ):
        ran = run_cli(args, {**sqlite_box.env, variable: "/dev/zero"}, timeout=60)
        assert f"{variable}=/dev/zero: a device, pipe or socket" in ran.error(2)
    # The hooks file's problems are load errors (docs/plugins.md): listed, never fatal.
    ran = run_cli(["hooks", "--json"], {**sqlite_box.env, "DUELEDGER_HOOKS_FILE": "/dev/zero"})
    assert ran.code == 0, ran.output
    errors = [e["error"] for e in ran.json()["load_errors"]]
    assert errors == [
        "DUELEDGER_HOOKS_FILE=/dev/zero: a device, pipe or socket, not a regular file; "
        "name a TOML file"
    ]


def test_a_folder_as_a_configuration_file_is_named_as_one(sqlite_box: Box) -> None:
    # Found by the environment fuzz: a folder got past the open and failed in Python's
    # wrapping of it, an IsADirectoryError with exit 1 from every command.
    folder = str(sqlite_box.tmp)
    for variable, args in (
        (a.ENV_ALERTS_FILE, ["alerts", "--json"]),
        (ENV_OPERATORS, ["summary", "--json"]),
    ):
        ran = run_cli(args, {**sqlite_box.env, variable: folder}, timeout=60)
        assert f"{variable}={folder}: a folder, not a regular file" in ran.error(2)
    for args in (["summary", "--json"], ["hooks", "--json"]):
        ran = run_cli(args, {**sqlite_box.env, "DUELEDGER_HOOKS_FILE": folder}, timeout=60)
        assert ran.code == 0, ran.output
    errors = [e["error"] for e in ran.json()["load_errors"]]
    assert errors and all("a folder, not a regular file" in e for e in errors), errors


# --- messages -----------------------------------------------------------------------------------


def test_messages_say_what_is_wrong(sqlite_box: Box) -> None:
    for flag, value in (
        ("--since", "0001-01-01T00:00:00+05:00"),
        ("--until", "9999-12-31T23:59:59-05:00"),
    ):
        message = sqlite_box.run("runs", "list", flag, value, "--json").error(2)
        assert f"{flag} {value!r} is out of range" in message
    team = sqlite_box.tmp / "operators.toml"
    team.write_text(TEAM)
    message = sqlite_box.run(
        "summary", "--json", **{ENV_OPERATORS: str(team), ENV_IDENTITY: "not a name"}
    ).error(2)
    assert (
        message.startswith(f"{ENV_IDENTITY} 'not a name' must be") and "--operator" not in message
    )
    message = sqlite_box.run("tasks", "--json", **{ENV_PLUGIN_TASKS: "acme-tasks,,other"}).error(2)
    assert message.startswith(f"{ENV_PLUGIN_TASKS}='acme-tasks,,other' has an empty item")
    message = sqlite_box.run("tasks", "--json", **{ENV_KEEPER_INTERVAL: "5"}).error(2)
    assert message.startswith(f"{ENV_KEEPER_INTERVAL}='5' must be a whole number of seconds")


def test_tasks_json_reports_plugin_tasks_not_allowed_and_load_errors(sqlite_box: Box) -> None:
    site = sqlite_box.tmp / "site"
    for name, target in (
        ("other-tasks", "fixtures.task_plugin_cases.gamma"),
        ("broken-tasks", "no_such_plugin_module"),
    ):
        dist = site / f"{name.replace('-', '_')}-0.1.0.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
        (dist / "entry_points.txt").write_text(f"[dueledger.tasks]\n{name} = {target}\n")
    tests_dir = Path(__file__).resolve().parents[1]
    ran = sqlite_box.run("tasks", "--json", PYTHONPATH=f"{site}:{tests_dir}")
    assert ran.code == 0, ran.output
    assert [r["source"] for r in ran.json()] == ["core"] * len(ran.json())  # registered only
    assert "not allowed: task 'case_gamma' comes from plugin:other-tasks" in ran.err
    assert "plugin load error: entry_point broken-tasks" in ran.err


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_read_only_ledger_says_so_not_check_the_server_and_credentials(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = request.getfixturevalue(f"{backend}_url")
    box = next(_box(url, tmp_path))
    try:
        box.expired_lease()
        if backend == "sqlite":
            read_only = f"sqlite:///file:{url.removeprefix('sqlite:///')}?mode=ro&uri=true"
        else:
            engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
            with engine.connect() as conn:
                name = sa.engine.make_url(url).database
                conn.exec_driver_sql(
                    f'ALTER DATABASE "{name}" SET default_transaction_read_only = on'
                )
            engine.dispose()
            read_only = url
        box.ledger.dispose()
        ran = box.run("reclaim", "--json", **{ENV_DATABASE_URL: read_only})
        message = ran.error(1)
        assert "is read-only" in message and "credentials" not in message, message
    finally:
        box.ledger.dispose()


def test_a_full_disk_says_so(sqlite_url: str) -> None:
    ledger = RunLedger(database_url=sqlite_url)
    ledger.migrate()

    def cap(dbapi_connection: object, _record: object) -> None:
        # SQLite's own "database or disk is full": the file may not grow past its size now.
        cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
        pages = cursor.execute("PRAGMA page_count").fetchone()[0]
        cursor.execute(f"PRAGMA max_page_count = {pages}")
        cursor.close()

    sa.event.listen(sa.engine.Engine, "connect", cap)
    try:
        ledger.dispose()
        with pytest.raises(LedgerError, match="out of disk space") as raised:
            for k in range(200):
                ledger.ensure_entry(
                    task_key=TASK,
                    trigger=Trigger.MANUAL,
                    dedup_key=f"manual:{k}",
                    reason="r" * 2000,
                )
        assert "credentials" not in str(raised.value)
    finally:
        sa.event.remove(sa.engine.Engine, "connect", cap)
        ledger.dispose()


# --- a canceled manual launch is launched again (and a hook outcome with a NUL) ---------------

HOOKS_MODULE = """
from orchestration.plugins import degrade


def stamp(context):
    return degrade(reason="checked\\x00by the NUL listener")
"""


def test_repeating_a_manual_launch_whose_run_was_canceled_re_dispatches_it(
    box: Box, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (box.tmp / "nul_hooks.py").write_text(HOOKS_MODULE)
    hooks = box.tmp / "hooks.toml"
    hooks.write_text('[[listeners]]\ntarget = "nul_hooks:stamp"\nevents = ["before_task_create"]\n')
    box.env.update(PYTHONPATH=str(box.tmp), DUELEDGER_HOOKS_FILE=str(hooks))
    launch = ["launch", "ticket_auto_close", "--operator", "ops", "--reason", "r"]
    launch += ["--request-id", "CANCELME", "--json"]
    first = box.run(*launch)
    assert first.code == 0, first.output
    assert first.json()["run_status"] == "QUEUED"
    run_id = first.json()["run_id"]
    entry_id = first.json()["entry_id"]

    monkeypatch.setenv("DAGSTER_HOME", box.env["DAGSTER_HOME"])
    with dg.DagsterInstance.get() as instance:
        # The operator cancels the queued run in Dagster (what the UI's Terminate does).
        assert instance.run_coordinator.cancel_run(run_id)
        # ledger_outcome_sensor's real evaluation records the dispatch failure.
        sensor = build_outcome_sensor(task_views())
        with (
            caplog.at_level(logging.WARNING, logger="dueledger.alerts"),
            dg.build_sensor_context(instance=instance, resources={"ledger": box.ledger}) as ctx,
        ):
            sensor(ctx)
        entry = box.ledger.get(entry_id)
        assert entry is not None and entry.status == Status.DISPATCH_FAILED
        (alert,) = [json.loads(r.getMessage()) for r in caplog.records]
        assert alert["alert"] == "dispatch_failed"
        assert "`dueledger launch ticket_auto_close --request-id CANCELME" in alert["action"]
        assert "redispatch_sensor" not in alert["action"]

        again = box.run(*launch)
        assert again.code == 0, again.output
        data = again.json()
        assert (data["existing"], data["redispatched"], data["run_status"]) == (
            False,
            True,
            "QUEUED",
        )
        assert data["run_id"] == manual_run_id("ticket_auto_close", "CANCELME", 1) != run_id
        entry = box.ledger.get(entry_id)
        assert entry is not None and entry.status == Status.QUEUED
        (failure,) = entry.summary["dispatch_failures"]  # rule 5: the earlier error is kept
        assert failure["run_id"] == run_id and "canceled" in failure["error"]
        new_run = instance.get_run_by_id(data["run_id"])
        assert new_run is not None and new_run.tags[t.TAG_REQUEST_ID] == "CANCELME"
        # The same request once more: the re-dispatched run, found existing.
        third = box.run(*launch).json()
        assert (third["existing"], third["run_id"]) == (True, data["run_id"])
        assert len(instance.get_run_records()) == 2
    # The listener's outcomes, NUL and all, are stored on both backends (once per dispatch).
    hooks_seen = entry.summary["hooks"]
    assert len(hooks_seen) == 2 and all("NUL listener" in h["reason"] for h in hooks_seen)


# --- a listener that prints cannot corrupt a command's output -----------------------------------

LOUD_HOOKS_MODULE = """
def shout(context):
    print("LOUD " * 100_000)
"""


def test_a_listener_that_prints_cannot_corrupt_json_output(box: Box) -> None:
    # A listener's print once came before the JSON document on stdout (a 50 MB print, exit 0).
    (box.tmp / "loud_hooks.py").write_text(LOUD_HOOKS_MODULE)
    hooks = box.tmp / "hooks.toml"
    hooks.write_text(
        '[[listeners]]\ntarget = "loud_hooks:shout"\nevents = ["before_task_create"]\n'
    )
    box.env.update(PYTHONPATH=str(box.tmp), DUELEDGER_HOOKS_FILE=str(hooks))
    ran = box.run("launch", "ticket_auto_close", "--operator", "ops", "--reason", "r", "--json")
    assert ran.code == 0, ran.output[-2000:]
    launched = json.loads(ran.out)  # the whole of stdout is one JSON document
    assert launched["entry_id"] > 0
    assert "LOUD" not in ran.out
    # What it printed went to stderr, bounded, with a note of what was dropped.
    assert "LOUD LOUD" in ran.err and "the rest was dropped" in ran.err
    assert len(ran.err) < 200_000


# --- a ledger database that records a migration its tables do not match -----------------------


def test_a_ledger_with_a_version_row_and_no_tables_is_exit_2_saying_what_to_point_at(
    sqlite_box: Box,
) -> None:
    # Such a database (a newer release's version row, its tables lost) once exited 1 telling
    # a CLI user to call RunLedger(...).migrate() from Python.
    path = sqlite_box.tmp / "partial.sqlite"
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE dueledger_alembic_version (version_num VARCHAR(32))"))
        conn.execute(sa.text("INSERT INTO dueledger_alembic_version VALUES ('9999_from_later')"))
    engine.dispose()
    ran = sqlite_box.run("summary", "--json", **{ENV_DATABASE_URL: f"sqlite:///{path}"})
    assert ran.code == 2, ran.output[-2000:]
    error = json.loads(ran.out)["error"]
    assert "the ledger tables are missing" in error and "DUELEDGER_DATABASE_URL" in error
    assert "migrate()" not in error and "Traceback" not in ran.output
