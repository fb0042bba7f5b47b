"""One process per task run: a task job's one step runs inside its run worker.

A run launched the way Dagster launches it (``dagster job execute`` on the real code
location) must execute its step in the run's own process; with the multiprocess executor
the step would run in a second process that loads the code location again.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

ROOT = Path(__file__).resolve().parents[2]
DAGSTER = Path(sys.executable).with_name("dagster")


def test_every_task_job_runs_its_step_in_process() -> None:
    from orchestration.declarations import registered_tasks
    from orchestration.definitions import defs

    location = defs()
    for spec in registered_tasks():
        job = location.resolve_job_def(spec.job_name)
        assert job.executor_def is dg.in_process_executor, spec.job_name
        assert len(job.nodes) == 1, f"{spec.job_name} has more than one step"


@pytest.mark.slow
def test_a_task_run_is_one_process(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path),
        "DUELEDGER_DATABASE_URL": f"sqlite:///{tmp_path / 'ledger.sqlite'}",
        "DUELEDGER_SOURCE_URL": f"sqlite:///{tmp_path / 'source.sqlite'}",
    }
    # A manually triggerable task: `dagster job execute` is a manual launch.
    command = ["job", "execute", "-m", "orchestration.definitions", "-j", "ledger_health_job"]
    proc = subprocess.run(
        [str(DAGSTER), *command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "RUN_SUCCESS" in out, out[-3000:]
    # Each event line carries the pid of the process that logged it.
    run_pids = set(re.findall(r" - (\d+) - RUN_START - ", out))
    step_pids = set(re.findall(r" - (\d+) - [\w.\[\]]+ - (?:STEP_START|STEP_SUCCESS) - ", out))
    assert run_pids and step_pids, out[-3000:]
    assert step_pids == run_pids, out[-3000:]
    assert "STEP_WORKER_STARTING" not in out


def test_the_catalogs_materialize_runs_in_process_too() -> None:
    # The Catalog's "Materialize" runs the implicit asset job, whose executor is the code
    # location's default: one process per run there as well.
    from orchestration.definitions import defs

    job = defs().resolve_implicit_global_asset_job_def()
    assert job.executor_def is dg.in_process_executor
