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

    jobs = {job["name"] for job in listed["jobs"]}
    schedules = {schedule["name"] for schedule in listed["schedules"]}
    sensors = {sensor["name"] for sensor in listed["sensors"]}
    assets = {asset["asset_key"] for asset in listed["assets"]}

    assert jobs == {job.name for job in defs.jobs or []}
    assert schedules == {schedule.name for schedule in defs.schedules or []}
    assert sensors == {sensor.name for sensor in defs.sensors or []}
    assert assets == {
        key.to_user_string()
        for asset in defs.assets or []
        if isinstance(asset, dg.AssetsDefinition)
        for key in asset.keys
    }
    for task in registered_tasks():
        assert f"{task.key}_job" in jobs, task.key
        assert f"{task.key}_schedule" in schedules, task.key
    assert {"lease_reclaim_sensor", "ledger_outcome_sensor", "slot_health_sensor"} <= sensors
