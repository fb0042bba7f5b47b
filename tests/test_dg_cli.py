"""`dg`, Dagster's own CLI, works in the project: `[tool.dg]` in pyproject.toml points it at
the code location `orchestration.definitions`.

Runs the venv's `dg` console script from the project root with a throwaway DAGSTER_HOME
seeded from the project's dagster.yaml: `dg check defs` exits 0, and `dg list defs --json`
lists exactly the jobs, schedules, sensors and assets of `orchestration.definitions.defs`
(and every task's job and schedule), so the test fails if dg loads another module.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from orchestration.declarations import registered_tasks
from orchestration.definitions import defs
from resources.core.settings import PROJECT_ROOT

DG = Path(sys.executable).parent / "dg"


@pytest.fixture
def dg_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    shutil.copyfile(PROJECT_ROOT / "dagster.yaml.local", home / "dagster.yaml")
    # VIRTUAL_ENV as `uv run` sets it: dg otherwise warns that the active venv is not the
    # project's one.
    return {**os.environ, "DAGSTER_HOME": str(home), "VIRTUAL_ENV": sys.prefix}


def _dg(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    assert DG.exists(), f"{DG} missing: dagster-dg-cli is not installed in the venv"
    return subprocess.run(
        [str(DG), *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_dg_check_defs_passes(dg_env: dict[str, str]):
    result = _dg(dg_env, "check", "defs")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "All definitions loaded successfully" in result.stdout + result.stderr


def test_dg_list_defs_lists_the_code_location(dg_env: dict[str, str]):
    result = _dg(dg_env, "list", "defs", "--json")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    listed = json.loads(result.stdout)
    location = defs()

    jobs = {job["name"] for job in listed["jobs"]}
    schedules = {schedule["name"] for schedule in listed["schedules"]}
    sensors = {sensor["name"] for sensor in listed["sensors"]}
    assets = {asset["asset_key"] for asset in listed["assets"]}

    assert jobs == {job.name for job in location.jobs or []}
    assert schedules == {schedule.name for schedule in location.schedules or []}
    assert sensors == {sensor.name for sensor in location.sensors or []}
    assert assets == {
        key.to_user_string()
        for asset in location.assets or []
        if isinstance(asset, dg.AssetsDefinition)
        for key in asset.keys
    }
    for task in registered_tasks():
        assert f"{task.key}_job" in jobs, task.key
        assert f"{task.key}_schedule" in schedules, task.key
    assert "ledger_sensor" in sensors


# --- the DueTask component: dg lists it, scaffolds a task, validates its declaration -------

COMPONENT = "orchestration.component.DueTask"


def test_dg_lists_the_due_task_component(dg_env: dict[str, str]):
    result = _dg(dg_env, "list", "components", "--json")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    listed = {component["key"] for component in json.loads(result.stdout)["items"]}
    assert COMPONENT in listed, sorted(listed)


def test_component_schema_is_the_declaration_schema():
    """dg validates a defs.yaml against the component's fields; the CLI and the sensors read
    the same file with ``declarations``: the two must accept the same attributes."""
    from orchestration.component import DueTask
    from orchestration.declarations import ASSET_FIELDS, SPEC_FIELDS

    assert set(DueTask.model_fields) == set(SPEC_FIELDS) | set(ASSET_FIELDS)


def test_dg_loading_the_defs_folder_builds_the_code_locations_tasks():
    """Loaded the way dg loads a defs folder (each ``defs.yaml`` a DueTask component), the
    task folders build the same assets, jobs and schedules as the code location, which reads
    the same files without needing the project's pyproject.toml (an installed package)."""
    from orchestration.declarations import SOURCE_CORE

    loaded = dg.load_from_defs_folder(path_within_project=PROJECT_ROOT)
    core = [task for task in registered_tasks() if task.source == SOURCE_CORE]
    location = defs()
    assert core, "no core task declared"
    assert {a.key.to_user_string() for a in loaded.assets or []} == {t.key for t in core}
    assert {j.name for j in loaded.jobs or []} == {t.job_name for t in core}
    assert {s.name for s in loaded.schedules or []} == {t.schedule_name for t in core}
    for task in core:
        mine = location.resolve_schedule_def(task.schedule_name)
        theirs = next(s for s in loaded.schedules or [] if s.name == task.schedule_name)
        assert (theirs.cron_schedule, theirs.execution_timezone, theirs.default_status) == (
            mine.cron_schedule,
            mine.execution_timezone,
            mine.default_status,
        ), task.key


def _project_copy(tmp_path: Path) -> Path:
    """The project's code in a folder of its own, importable ahead of the installed one."""
    copy = tmp_path / "project"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("orchestration", "assets", "sensors", "resources"):
        shutil.copytree(PROJECT_ROOT / package, copy / package, ignore=ignore)
    for name in ("pyproject.toml", "workspace.yaml"):
        shutil.copyfile(PROJECT_ROOT / name, copy / name)
    return copy


def _in_copy(copy: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH puts the copy ahead of the editable install (whose finder comes last).
    return subprocess.run(
        [*args],
        cwd=copy,
        env={**env, "PYTHONPATH": str(copy)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_dg_scaffold_defs_adds_a_task_that_loads_and_is_listed(
    tmp_path: Path, dg_env: dict[str, str]
):
    copy = _project_copy(tmp_path)
    scaffold = _in_copy(
        copy, dg_env, str(DG), "scaffold", "defs", COMPONENT, "nightly_export", "--every-slots", "4"
    )
    assert scaffold.returncode == 0, scaffold.stdout[-3000:] + scaffold.stderr[-3000:]
    folder = copy / "assets" / "nightly_export"
    assert (folder / "defs.yaml").is_file() and (folder / "tasks.py").is_file()
    assert "every_slots: 4" in (folder / "defs.yaml").read_text()

    check = _in_copy(copy, dg_env, str(DG), "check", "defs")
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]

    listed = _in_copy(copy, dg_env, str(DG), "list", "defs", "--json")
    assert listed.returncode == 0, listed.stderr[-3000:]
    defs_json = json.loads(listed.stdout)
    assert "nightly_export" in {asset["asset_key"] for asset in defs_json["assets"]}
    assert "nightly_export_job" in {job["name"] for job in defs_json["jobs"]}
    assert "nightly_export_schedule" in {s["name"] for s in defs_json["schedules"]}

    # The CLI reads the same declaration without loading Dagster definitions.
    tasks = _in_copy(
        copy, dg_env, str(Path(sys.executable).parent / "dueledger"), "tasks", "--json"
    )
    assert tasks.returncode == 0, tasks.stderr[-3000:]
    by_key = {task["key"]: task for task in json.loads(tasks.stdout)}
    assert by_key["nightly_export"]["rule"] == "every 4 slots", by_key["nightly_export"]
    assert by_key["nightly_export"]["job"] == "nightly_export_job"


def test_dg_check_defs_names_a_bad_declaration_field(tmp_path: Path, dg_env: dict[str, str]):
    copy = _project_copy(tmp_path)
    declaration = copy / "assets" / "orders" / "defs.yaml"
    text = declaration.read_text()
    assert "lease_ttl:" in text
    declaration.write_text(text.replace("lease_ttl:", "lease_tll:", 1))

    check = _in_copy(copy, dg_env, str(DG), "check", "defs")
    assert check.returncode != 0
    output = check.stdout + check.stderr
    assert "lease_tll" in output, output[-3000:]
