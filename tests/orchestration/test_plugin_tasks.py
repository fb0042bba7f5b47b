"""Plugin tasks (entry points ``dueledger.tasks``): loading, the allow-list, validation,
``dueledger tasks``, and what happens to a plugin task's runs once the plugin is gone.

Loading is tested in-process with entry points pointing at tests/fixtures/task_plugin_cases.py.
The end-to-end test installs the example plugin package (tests/fixtures/example_task_plugin)
into a throwaway virtual environment and drives the real code location and Dagster's real
daemons there, before and after uninstalling it (tests/orchestration/plugin_task_phases.py).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from click.testing import CliRunner

from orchestration.cli import main
from orchestration.declarations import (
    ENTRY_POINT_GROUP,
    LOCATION_RESOURCE_KEYS,
    TaskRegistry,
    load_task_registry,
    registered_tasks,
    task_views,
)
from orchestration.manual_launch import EntryRequest
from orchestration.services.hooks.loading import load_hooks
from orchestration.services.hooks.vocabulary import ENV_HOOKS_FILE
from orchestration.services.outcomes import (
    Action,
    Reconciled,
    alert_of,
    end_unregistered,
    reconcile_events,
    settle_abandoned_retries,
)
from orchestration.task_spec import TaskSpecError, task_run_tags, validate_spec
from resources.core import tags as t
from resources.core.entry import FailureKind, Status, Trigger, dedup_key_for_request
from resources.core.settings import ENV_PLUGIN_TASKS
from resources.ledger import RunLedger


@pytest.fixture
def ledger_url(sqlite_url: str) -> str:
    """This module's ledger is SQLite only."""
    return sqlite_url


TESTS_DIR = Path(__file__).resolve().parents[1]
ROOT = TESTS_DIR.parent
EXAMPLE_PLUGIN = TESTS_DIR / "fixtures" / "example_task_plugin"
CASES = "fixtures.task_plugin_cases"
CORE_KEYS = [s.key for s in registered_tasks()]
DUE = "2026-11-30T22:45:00Z"
NOW = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)


def entry_point(name: str, package: str) -> importlib.metadata.EntryPoint:
    """An entry point naming a plugin's package (one of the cases, or any dotted name)."""
    value = package if "." in package or package.endswith("_module") else f"{CASES}.{package}"
    return importlib.metadata.EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP)


def load(*entry_points: importlib.metadata.EntryPoint, allow: str = "", **env: str) -> TaskRegistry:
    environ = {ENV_PLUGIN_TASKS: allow, **env}
    return load_task_registry(
        slot_minutes=15, entry_points=entry_points, environ=environ, log_errors=False
    )


def errors_of(registry: TaskRegistry) -> list[str]:
    return [e.error for e in registry.load_errors]


# --- loading and the allow-list ----------------------------------------------------------------


def test_allowed_plugin_tasks_register_after_the_core_tasks_with_their_source() -> None:
    registry = load(
        entry_point("cases", "good"), entry_point("more", "gamma"), allow="cases, case_gamma"
    )
    assert errors_of(registry) == []
    assert [s.key for s in registry.tasks] == [*CORE_KEYS, "case_alpha", "case_beta", "case_gamma"]
    assert registry.source_of("order_cleanup") == t.SOURCE_CORE
    assert registry.source_of("case_alpha") == "plugin:cases"
    assert registry.source_of("case_gamma") == "plugin:more"
    plugin_tasks = [d for d in registry.declared if d.spec.from_plugin]
    assert [d.spec.key for d in plugin_tasks] == ["case_alpha", "case_beta", "case_gamma"]
    assert plugin_tasks[0].module == f"{CASES}.good.tasks"
    # Every run of a plugin task names its plugin; core runs carry no such tag.
    (beta,) = [s for s in registry.tasks if s.key == "case_beta"]
    assert task_run_tags(beta)[t.TAG_SOURCE] == "plugin:cases"
    assert t.TAG_SOURCE not in task_run_tags(registered_tasks()[0])


@pytest.mark.parametrize(
    ("allow", "registered"),
    [
        ("case_alpha", ["case_alpha"]),  # a task key: that task only
        ("cases", ["case_alpha", "case_beta"]),  # the entry point: all its tasks
        ("CASES", ["case_alpha", "case_beta"]),  # names compare like package names
        ("", []),
    ],
)
def test_the_allow_list_names_a_task_key_or_a_plugin(allow: str, registered: list[str]) -> None:
    registry = load(entry_point("cases", "good"), allow=allow)
    assert [s.key for s in registry.tasks] == [*CORE_KEYS, *registered]
    not_allowed = {"case_alpha", "case_beta"} - set(registered)
    assert {f.spec.key for f in registry.not_allowed} == not_allowed


def test_a_plugin_task_not_allowed_is_listed_with_what_to_allow() -> None:
    registry = load(entry_point("cases", "good"))
    assert [s.key for s in registry.tasks] == CORE_KEYS
    why = registry.why_unregistered("case_alpha")
    assert "plugin:cases" in why and "installed but not allowed" in why
    assert ENV_PLUGIN_TASKS in why and "'cases'" in why


def test_the_allow_list_may_live_in_the_hooks_file(tmp_path: Path) -> None:
    config = tmp_path / "hooks.toml"
    config.write_text('[tasks]\nallow = ["case_beta"]\n', encoding="utf-8")
    registry = load(entry_point("cases", "good"), **{ENV_HOOKS_FILE: str(config)})
    assert [s.key for s in registry.tasks] == [*CORE_KEYS, "case_beta"]
    assert registry.config_file == str(config)
    # The hook loader reads the same file and knows the [tasks] table is not its mistake.
    assert load_hooks(environ={ENV_HOOKS_FILE: str(config)}, entry_points=()).load_errors == ()


@pytest.mark.parametrize(
    ("package", "expected"),
    [
        ("bad_lease", ["task 'case_bad_lease'", "lease_ttl:", "must be greater than timeout"]),
        ("wrong_body", ["task 'case_wrong_body'", "asset:", "case_alpha"]),
        ("plain_asset", ["task 'plain_asset'", "asset:", "task_asset"]),
        ("core_key", ["task 'order_cleanup'", "key: already registered by core"]),
        ("needs_resource", ["task 'needs_mailer'", "asset:", "mailer"]),
        ("not_tasks", ["not a plugin task", "defs.yaml"]),
        ("no_such_package", ["ModuleNotFoundError"]),
    ],
)
def test_a_broken_plugin_is_a_load_error_naming_plugin_task_and_field(
    package: str, expected: list[str]
) -> None:
    registry = load(
        entry_point("broken", package), entry_point("cases", "good"), allow="broken,cases"
    )
    (problem,) = registry.load_errors
    assert (problem.source, problem.name, problem.plugin) == (
        "entry_point",
        "broken",
        "plugin:broken",
    )
    for text in expected:
        assert text in problem.error
    if package not in ("not_tasks", "no_such_package"):
        assert "plugin:broken" in problem.error
    # Nothing of the broken plugin is registered; the other plugin is.
    assert [s.key for s in registry.tasks] == [*CORE_KEYS, "case_alpha", "case_beta"]


def test_a_plugin_that_cannot_be_imported_is_reported_not_raised() -> None:
    registry = load(entry_point("gone", "no_such_plugin_module"), allow="gone")
    (problem,) = registry.load_errors
    assert "ModuleNotFoundError" in problem.error and "no_such_plugin_module" in problem.error
    assert registry.tasks == registered_tasks()
    why = registry.why_unregistered("anything", "plugin:gone")
    assert "plugin:gone" in why and "failed to load" in why


def test_a_plugin_written_against_a_moved_module_is_told_where_its_imports_went() -> None:
    # Plugins once imported orchestration.task_plugins (and .hooks, .registry) directly.
    registry = load(entry_point("old", "old_imports"), allow="old")
    (problem,) = registry.load_errors
    assert "No module named 'orchestration.task_plugins'" in problem.error
    assert "import from orchestration.plugins instead" in problem.error


def test_of_two_allowed_plugins_with_one_key_the_first_registers_and_the_error_names_both() -> None:
    registry = load(
        entry_point("first", "good"), entry_point("second", "good"), allow="first,second"
    )
    assert registry.source_of("case_alpha") == "plugin:first"
    assert len(errors_of(registry)) == 2
    for text in errors_of(registry):
        assert "plugin:second" in text and "already registered by plugin:first" in text


def test_an_allow_list_name_that_matches_nothing_is_reported() -> None:
    registry = load(entry_point("cases", "good"), allow="cases,typo_task")
    (problem,) = registry.load_errors
    assert (problem.source, problem.name) == ("allow_list", "typo_task")


def test_a_spec_claiming_a_bogus_source_is_invalid() -> None:
    with pytest.raises(TaskSpecError, match="source"):
        validate_spec(replace(registered_tasks()[0], source="somewhere"), 15)


def test_the_resources_a_plugin_asset_may_need_are_the_code_locations() -> None:
    import orchestration.definitions as location

    provided = set(location.defs().resources or {}) | {"io_manager"}
    assert provided == set(LOCATION_RESOURCE_KEYS)


# --- the CLI with plugins installed (package metadata in a temporary site directory) -----------


def register_distribution(site: Path, name: str, entry_points: dict[str, str]) -> None:
    """``<name>-0.1.0.dist-info`` with METADATA and entry_points.txt in ``site``: what
    installing a package leaves for importlib.metadata."""
    dist = site / f"{name.replace('-', '_')}-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n", encoding="utf-8"
    )
    lines = [f"[{ENTRY_POINT_GROUP}]"] + [f"{k} = {v}" for k, v in entry_points.items()]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture
def plugins_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    site = tmp_path / "site-packages"
    register_distribution(site, "acme-tasks", {"acme": f"{CASES}.good"})
    register_distribution(site, "other-tasks", {"other": f"{CASES}.gamma"})
    register_distribution(site, "broken-tasks", {"broken": "no_such_plugin_module"})
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    monkeypatch.setenv(ENV_PLUGIN_TASKS, "acme-tasks")
    yield site


def test_dueledger_tasks_shows_each_tasks_source_and_what_is_not_allowed(plugins_installed) -> None:
    result = CliRunner().invoke(main, ["tasks", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["key"]: r for r in json.loads(result.stdout)}
    assert list(rows) == [*CORE_KEYS, "case_alpha", "case_beta"]
    assert {rows[k]["source"] for k in CORE_KEYS} == {"core"}
    assert rows["case_alpha"]["source"] == "plugin:acme-tasks"
    assert rows["case_alpha"]["job"] == "case_alpha_job"
    text = CliRunner().invoke(main, ["tasks"])
    assert text.exit_code == 0
    assert "plugin:acme-tasks" in text.stdout
    assert "not allowed: task 'case_gamma' comes from plugin:other-tasks" in text.stdout
    assert "plugin load error: entry_point broken" in text.stdout
    hooks_json = json.loads(CliRunner().invoke(main, ["hooks", "--json"]).stdout)
    found = {x["key"]: x for x in hooks_json["task_plugins"]["tasks"]}
    assert (found["case_alpha"]["allowed"], found["case_gamma"]["allowed"]) == (True, False)
    assert found["case_gamma"]["distribution"] == "other-tasks"
    assert [e["name"] for e in hooks_json["task_plugins"]["load_errors"]] == ["broken"]
    # The catalog (jobs, schedules, sensors, checks) is built from the same registered tasks.
    assert [v.spec.key for v in task_views()][-2:] == ["case_alpha", "case_beta"]


def test_launching_a_plugin_task_that_is_not_allowed_is_refused_naming_the_plugin(
    plugins_installed,
) -> None:
    result = CliRunner().invoke(
        main, ["launch", "case_gamma", "--operator", "alice", "--reason", "try", "--json"]
    )
    assert result.exit_code == 3, result.output
    error = json.loads(result.stdout)["error"]
    assert "plugin:other-tasks" in error and "not allowed" in error


# --- entries of a task whose plugin is gone (outcome sensor) -----------------------------------


def unsupported_alerts(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "dueledger.alerts"]
    return [x for x in lines if x["alert"] == FailureKind.UNSUPPORTED_TASK]


def raised_alerts(done: list[Reconciled]) -> list[dict[str, Any]]:
    """The unsupported_task alerts the outcome sensor raises for these reconciliations (it
    sends them with the rest of its tick's alerts, ``alert_of``)."""
    alerts = [alert_of(item) for item in done]
    return [fields for kind, fields in filter(None, alerts) if kind == FailureKind.UNSUPPORTED_TASK]


def test_a_retrying_entry_whose_plugin_is_gone_ends_unsupported_once_with_one_alert(
    ledger: RunLedger, caplog: pytest.LogCaptureFixture
) -> None:
    # The plugin was uninstalled after a run failed with attempts left: Dagster cannot
    # retry a run whose job is gone, so nothing would ever claim the entry again.
    caplog.set_level(logging.WARNING, logger="dueledger.alerts")
    tags = {
        t.TAG_TASK: "gone_task",
        t.TAG_TRIGGER: Trigger.SCHEDULE.value,
        t.TAG_DUE: DUE,
        t.TAG_SOURCE: "plugin:gone-plugin",
    }
    job = dg.GraphDefinition(name="noop", node_defs=[]).to_job(name="gone_task_job")
    views = task_views()
    with dg.instance_for_test() as instance:
        run = instance.create_run_for_job(job, tags=tags)
        instance.report_run_failed(run)
        instance.add_run_tags(run.run_id, {t.DAGSTER_WILL_RETRY: "true"})
        entry = ledger.ensure_entry(
            task_key="gone_task",
            trigger=Trigger.SCHEDULE,
            dedup_key=f"due:{DUE}",
            max_attempts=3,
        )
        assert ledger.claim(entry.id, run.run_id, lease_ttl=timedelta(minutes=2)).claimed
        assert ledger.fail(entry.id, run.run_id, error="ValueError: bad").status == "retrying"

        (done,) = settle_abandoned_retries(instance, ledger, views, NOW)
        assert done.action is Action.UNSUPPORTED
        after = ledger.get(entry.id)
        assert after is not None
        assert (after.status, after.failure_kind) == (Status.FAILED, FailureKind.UNSUPPORTED_TASK)
        assert "plugin:gone-plugin" in (after.error or "")
        (alert,) = raised_alerts([done])
        assert (alert["entry_id"], alert["source"]) == (entry.id, "plugin:gone-plugin")
        # Evaluated again (the next tick): nothing changes, nothing to alert.
        assert settle_abandoned_retries(instance, ledger, views, NOW) == []
        assert ledger.get(entry.id) == after


def test_the_failure_that_left_an_entry_retrying_ends_it_for_the_retry_dagster_queued(
    ledger: RunLedger, caplog: pytest.LogCaptureFixture
) -> None:
    # The outcome sensor meets the failed run itself after the plugin is gone (it was not
    # evaluated in between): the entry ends for the queued retry, which can never start.
    caplog.set_level(logging.WARNING, logger="dueledger.alerts")
    tags = {t.TAG_TASK: "gone_task", t.TAG_TRIGGER: Trigger.SCHEDULE.value, t.TAG_DUE: DUE}
    job = dg.GraphDefinition(name="noop", node_defs=[]).to_job(name="gone_task_job")
    views = task_views()
    with dg.instance_for_test(overrides={"run_retries": {"enabled": True}}) as instance:
        failed = instance.create_run_for_job(job, tags={**tags, t.DAGSTER_MAX_RETRIES: "2"})
        entry = ledger.ensure_entry(
            task_key="gone_task", trigger=Trigger.SCHEDULE, dedup_key=f"due:{DUE}", max_attempts=3
        )
        assert ledger.claim(entry.id, failed.run_id, lease_ttl=timedelta(minutes=2)).claimed
        ledger.fail(entry.id, failed.run_id, error="ValueError: bad")
        instance.report_run_failed(failed)
        retry_tags = {
            **tags,
            t.DAGSTER_PARENT_RUN_ID: failed.run_id,
            t.DAGSTER_ROOT_RUN_ID: failed.run_id,
            t.DAGSTER_RETRY_NUMBER: "1",
        }
        retry = instance.create_run_for_job(job, tags=retry_tags)
        instance.add_run_tags(failed.run_id, {t.DAGSTER_AUTO_RETRY_RUN_ID: retry.run_id})

        cursor, done = reconcile_events(instance, ledger, views, None, datetime.now(UTC))
        assert [d.action for d in done] == [Action.UNSUPPORTED]
        after = ledger.get(entry.id)
        assert after is not None
        assert (after.status, after.failure_kind) == (Status.FAILED, FailureKind.UNSUPPORTED_TASK)
        assert list(after.run_ids) == [failed.run_id, retry.run_id]
        # The retry then fails when Dagster dequeues it: nothing more happens.
        instance.report_run_failed(retry)
        _, again = reconcile_events(instance, ledger, views, cursor, datetime.now(UTC))
        assert again == [] and ledger.get(entry.id) == after
        assert len(raised_alerts(done)) == 1


def test_a_queued_entry_whose_run_failed_before_starting_ends_unsupported_once(
    ledger: RunLedger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dueledger.alerts")
    request = EntryRequest(
        "gone_task", Trigger.MANUAL, dedup_key_for_request("r1"), operator="alice", reason="x"
    )
    entry = ledger.ensure_entry(
        task_key="gone_task",
        trigger=Trigger.MANUAL,
        dedup_key=request.dedup_key,
        max_attempts=3,
        operator="alice",
        reason="x",
    )
    first = end_unregistered(
        ledger, request, "run-1", list(registered_tasks()), source="plugin:gone-plugin"
    )
    assert first.action is Action.UNSUPPORTED
    assert first.entry is not None and first.entry.id == entry.id
    assert (first.entry.status, first.entry.failure_kind) == ("failed", "unsupported_task")
    assert "never started the task" in (first.entry.error or "")
    again = end_unregistered(
        ledger, request, "run-1", list(registered_tasks()), source="plugin:gone-plugin"
    )
    assert again.action is Action.NONE
    assert len(raised_alerts([first, again])) == 1


def test_runs_retry_of_an_entry_whose_plugin_is_gone_is_refused_naming_the_plugin(
    ledger: RunLedger, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DUELEDGER_DATABASE_URL", sqlite_url)
    tags = {
        t.TAG_TASK: "gone_task",
        t.TAG_TRIGGER: Trigger.SCHEDULE.value,
        t.TAG_DUE: DUE,
        t.TAG_SOURCE: "plugin:gone-plugin",
    }
    job = dg.GraphDefinition(name="noop", node_defs=[]).to_job(name="gone_task_job")
    with dg.instance_for_test() as instance:  # the CLI's instance: $DAGSTER_HOME
        run = instance.create_run_for_job(job, tags=tags)
        entry = ledger.ensure_entry(
            task_key="gone_task", trigger=Trigger.SCHEDULE, dedup_key=f"due:{DUE}", max_attempts=1
        )
        assert ledger.claim(entry.id, run.run_id, lease_ttl=timedelta(minutes=2)).claimed
        failed = ledger.fail(entry.id, run.run_id, error="ValueError: bad")
        args = ["runs", "retry", str(entry.id), "--operator", "alice", "--reason", "again"]
        result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 3, result.output
    error = json.loads(result.stdout)["error"]
    assert "refused by rule task_registered" in error
    assert "plugin:gone-plugin" in error and "no longer has" in error
    assert ledger.get(entry.id) == failed  # nothing changed


# --- end to end: install the example plugin, run its task, uninstall it -------------------------


def _uv() -> list[str] | None:
    """uv, which `uv run` names in $UV (how the suite runs), else on PATH; None: not found."""
    found = os.environ.get("UV") or shutil.which("uv")
    return [found] if found else None


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kwargs)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


class Venv:
    """A throwaway virtual environment that sees the project's packages and its locked
    dependencies through one .pth file (no install of Dagster), and installs or removes
    one package with the installer at hand, offline."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.python = str(path / "bin" / "python")
        self.uv = _uv()
        if self.uv:
            _run([*self.uv, "venv", str(path), "--python", sys.executable, "--offline", "-q"])
        else:  # the standard library's venv, with pip: slower, but needs nothing else
            _run([sys.executable, "-m", "venv", str(path)])
        site = _run(
            [self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        ).stdout.strip()
        project_site = sysconfig.get_paths()["purelib"]
        Path(site, "dueledger_project.pth").write_text(f"{ROOT}\n{project_site}\n")
        self.site = Path(site)

    def install(self, project: Path) -> None:
        if self.uv:
            cmd = [*self.uv, "pip", "install", "--python", self.python, "--offline"]
        else:
            cmd = [self.python, "-m", "pip", "install", "--no-index"]
        _run([*cmd, "--no-deps", "--no-build-isolation", "-q", str(project)])

    def uninstall(self, name: str) -> None:
        if self.uv:
            _run([*self.uv, "pip", "uninstall", "--python", self.python, "-q", name])
        else:
            _run([self.python, "-m", "pip", "uninstall", "-y", "-q", name])

    def phase(self, name: str, env: dict[str, str]) -> dict[str, Any]:
        script = Path(__file__).with_name("plugin_task_phases.py")
        proc = _run([self.python, "-W", "ignore", str(script), name], env=env, cwd=self.path)
        return json.loads(proc.stdout.strip().splitlines()[-1])


def test_an_installed_plugin_task_runs_and_after_uninstall_its_runs_end_unsupported(
    tmp_path: Path,
) -> None:
    venv = Venv(tmp_path / "venv")
    # Built from a copy: a setuptools build writes build/ and *.egg-info next to its sources.
    source = shutil.copytree(EXAMPLE_PLUGIN, tmp_path / "example_task_plugin")
    venv.install(source)
    # A second plugin that cannot be imported: reported, and the code location still loads.
    register_distribution(venv.site, "broken-dueledger-tasks", {"broken": "gone_module"})
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PYTHONPATH": str(TESTS_DIR),  # dagster_internals and the phases' helpers
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
        "DUELEDGER_DATABASE_URL": f"sqlite:///{tmp_path / 'ledger.sqlite'}",
        "DUELEDGER_SOURCE_URL": f"sqlite:///{tmp_path / 'source.sqlite'}",
        # Allowed by its distribution name (what `pip install` named).
        ENV_PLUGIN_TASKS: "example-dueledger-tasks",
    }
    a = venv.phase("installed", env)
    source_tag = "plugin:example-dueledger-tasks"

    # Installed and allowed: the code location has the task's job and schedule, and the one
    # re-dispatch sensor targets its job too.
    assert "example_heartbeat_job" in a["jobs"]
    assert "example_heartbeat_schedule" in a["schedules"]
    assert "example_heartbeat_job" in a["redispatch_jobs"]
    assert not any(name.startswith("example_heartbeat") for name in a["sensors"])
    rows = {r["key"]: r for r in a["tasks_json"]}
    assert rows["example_heartbeat"]["source"] == source_tag
    assert rows["order_cleanup"]["source"] == "core"
    # Without the allow-list the task is listed as not allowed, and not registered.
    assert "example_heartbeat" not in a["tasks_json_not_allowed"]
    assert (
        "not allowed: task 'example_heartbeat' comes from plugin:example-dueledger-tasks"
        in (a["tasks_not_allowed"])
    )
    assert "plugin load error: entry_point broken" in a["tasks_not_allowed"]
    # Its runs: one succeeded, one failed (its retry queued), one queued; all tagged.
    first, second = a["entries"]
    assert (first["status"], first["attempt"]) == ("success", 1)
    assert (second["status"], second["attempt"], second["max_attempts"]) == ("retrying", 1, 2)
    statuses = [r["status"] for r in a["runs"]]
    assert statuses == ["SUCCESS", "FAILURE", "QUEUED", "QUEUED"], a["runs"]
    assert {r["tags"][t.TAG_SOURCE] for r in a["runs"]} == {source_tag}

    venv.uninstall("example-dueledger-tasks")
    b = venv.phase("uninstalled", env)

    assert "example_heartbeat_job" not in b["jobs"]
    assert "example_heartbeat" not in b["tasks_json"]
    # Dagster launched both queued runs (the retry and the third due); their run workers
    # could not load the job and failed them.
    assert sorted(b["dequeued"]) == sorted(b["queued_before"]) and len(b["dequeued"]) == 2
    assert [r["status"] for r in b["runs"]] == ["SUCCESS"] + ["FAILURE"] * 3
    # The outcome sensor ended both entries unsupported, one alert each, on its first tick.
    by_due = {e["due"]: e for e in b["entries_after_first_tick"]}
    for due in ("2026-11-30T23:00:00Z", "2026-11-30T23:15:00Z"):
        entry = by_due[due]
        assert (entry["status"], entry["failure_kind"]) == ("failed", "unsupported_task"), entry
        assert source_tag in entry["error"]
    assert by_due["2026-11-30T22:45:00Z"]["status"] == "success"
    # Each ended by the run that could not start: the queued retry, and the third due's run.
    run_ids = [r["run_id"] for r in a["runs"]]
    assert by_due["2026-11-30T23:00:00Z"]["run_ids"] == run_ids[1:3]
    assert by_due["2026-11-30T23:15:00Z"]["run_ids"] == run_ids[3:]
    assert sorted(a["entry_id"] for a in b["alerts_after_first_tick"]) == sorted(
        by_due[d]["id"] for d in ("2026-11-30T23:00:00Z", "2026-11-30T23:15:00Z")
    )
    # The next tick changes nothing and alerts nothing.
    assert b["entries"] == b["entries_after_first_tick"]
    assert b["alerts"] == b["alerts_after_first_tick"]
    # Re-executing from the UI is refused by Dagster (the job is gone): no new run.
    assert b["ui_reexecution"] != "launched" and "example_heartbeat_job" in b["ui_reexecution"]
    assert b["runs_after_reexecution"] == len(b["runs"])
    # `dueledger runs retry` is refused by the rule, naming the plugin; nothing changes.
    assert b["retry"]["exit_code"] == 3, b["retry"]
    assert "task_registered" in b["retry"]["output"]["error"]
    assert source_tag in b["retry"]["output"]["error"]
    assert b["entries_after_retry"] == b["entries"]


def test_loading_many_plugin_tasks_imports_their_bodies_once_and_builds_no_asset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Loading once built each plugin task's asset to check it, and asked the registry being
    # loaded while doing so (quadratic; a RecursionError at a few hundred plugin tasks). A
    # declaration is now read, and its body checked, without building anything: the code
    # location builds each asset once, from the registry.
    import orchestration.task_defs as task_defs

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("loading the registry built a task asset")

    monkeypatch.setattr(task_defs, "task_asset", no_build)
    registry = load(entry_point("cases", "good"), entry_point("more", "gamma"), allow="cases")
    assert errors_of(registry) == []
    assert [d.spec.key for d in registry.declared if d.spec.from_plugin] == [
        "case_alpha",
        "case_beta",
    ]
