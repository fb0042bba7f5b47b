"""The two halves of test_plugin_tasks.py's end-to-end test, each run by the python of a
throwaway virtual environment (``python plugin_task_phases.py PHASE``) that sees the
project's packages and dependencies through a ``.pth`` file, and prints one JSON object.

``installed`` (the example task plugin installed and allowed): loads the code location,
runs ``dueledger tasks``, then drives Dagster's real daemons against the instance in
``$DAGSTER_HOME`` (QueuedRunCoordinator, in-process launcher): the plugin's schedule queues
a run that executes (ledger entry success), a second one that fails (entry ``retrying``,
whose automatic retry Dagster's retry daemon queues), and a third that stays queued.

``uninstalled`` (the plugin removed, a fresh process = a reloaded code location): the
queued runs are dequeued and their run workers -- ``dagster api execute_run``, what a run
launcher starts -- fail them, the job being gone; the outcome sensor ends their entries; a
second sensor tick changes nothing; the UI's re-execution and ``dueledger runs retry`` of
the plugin task's entry are refused.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import dagster as dg
import yaml
from click.testing import CliRunner
from dagster_graphql.cli import execute_query
from dagster_internals import (
    CodeTarget,
    daemon_instance,
    daemon_workspace,
    dequeue_iteration,
    run_retry_iteration,
    run_scheduler_tick,
    run_sensor_tick,
    start_run_worker,
    stop_schedules,
)

from orchestration.cli import main
from orchestration.services.launch import (
    REEXECUTE_MUTATION,
    LaunchFailed,
    reexecution_variables,
    run_id_from_reexecution,
)
from resources.core.settings import ENV_PLUGIN_TASKS
from resources.ledger import RunLedger

TASK = "example_heartbeat"
JOB = f"{TASK}_job"
SCHEDULE = f"{TASK}_schedule"
FAIL_ENV = "EXAMPLE_TASK_PLUGIN_FAIL"
TARGET = CodeTarget.from_module("orchestration.definitions")
LOCAL_YAML = Path(__file__).resolve().parents[2] / "dagster.yaml.local"
DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
SLOT = timedelta(minutes=15)


def _queue_config() -> dict[str, Any]:
    """dagster.yaml.local's run queue and run retries (what `dagster dev` runs with)."""
    local = yaml.safe_load(LOCAL_YAML.read_text())
    return {"run_coordinator": local["run_coordinator"], "run_retries": local["run_retries"]}


@contextmanager
def _instance(
    launcher: Literal["mocked", "sync"],
) -> Iterator[tuple[dg.DagsterInstance, Any]]:
    home = os.environ["DAGSTER_HOME"]
    with (
        daemon_instance(launcher, temp_dir=home, overrides=_queue_config()) as instance,
        daemon_workspace(instance, TARGET) as ctx,
    ):
        yield instance, ctx


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout


def _entries() -> list[dict[str, Any]]:
    ledger = RunLedger(database_url=os.environ["DUELEDGER_DATABASE_URL"])
    page, _ = ledger.list_entries(task_key=TASK, limit=50)
    ledger.dispose()
    return [e.to_json() for e in sorted(page, key=lambda e: e.id)]


def _runs(instance: dg.DagsterInstance) -> list[dict[str, Any]]:
    runs = reversed(instance.get_runs(dg.RunsFilter(job_name=JOB)))
    return [{"run_id": r.run_id, "status": r.status.value, "tags": dict(r.tags)} for r in runs]


def installed() -> dict[str, Any]:
    import orchestration.definitions as location

    defs = location.defs()
    out: dict[str, Any] = {
        "jobs": sorted(j.name for j in defs.resolve_all_job_defs()),
        "schedules": sorted(s.name for s in defs.schedules or ()),
        "sensors": sorted(s.name for s in defs.sensors or ()),
        "redispatch_jobs": sorted(
            j.name for s in defs.sensors or () if s.name == "ledger_sensor" for j in s.jobs
        ),
    }
    out["tasks_json"] = json.loads(_cli("tasks", "--json")[1])
    allowed = os.environ.pop(ENV_PLUGIN_TASKS)
    out["tasks_not_allowed"] = _cli("tasks")[1]
    out["tasks_json_not_allowed"] = [r["key"] for r in json.loads(_cli("tasks", "--json")[1])]
    os.environ[ENV_PLUGIN_TASKS] = allowed

    with _instance("sync") as (instance, ctx):
        # Only the plugin's schedule ticks: the core tasks' runs are not this test's subject.
        stop_schedules(instance, TARGET, keep={SCHEDULE})
        run_scheduler_tick(ctx, DUE - timedelta(minutes=1))  # the daemon was up before
        run_scheduler_tick(ctx, DUE)
        out["first"] = dequeue_iteration(ctx)  # executes in this process: success
        os.environ[FAIL_ENV] = "1"
        run_scheduler_tick(ctx, DUE + SLOT)
        out["second"] = dequeue_iteration(ctx)  # fails, attempts left: retrying
        del os.environ[FAIL_ENV]
        # Dagster's retry daemon queues the failed run's retry, as it does within seconds,
        # and the outcome sensor (every 30 s) sees the failure: the entry waits for it.
        run_retry_iteration(ctx, DUE + SLOT + timedelta(seconds=10))
        run_sensor_tick(ctx, datetime.now(UTC))
        run_scheduler_tick(ctx, DUE + 2 * SLOT)  # a third run, left queued
        out["runs"] = _runs(instance)
    out["entries"] = _entries()
    return out


def uninstalled() -> dict[str, Any]:
    import orchestration.definitions as location

    alerts: list[dict[str, Any]] = []

    class Alerts(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            alerts.append(json.loads(record.getMessage()))

    logging.getLogger("dueledger.alerts").addHandler(Alerts())
    out: dict[str, Any] = {
        "jobs": sorted(j.name for j in location.defs().resolve_all_job_defs()),
        "tasks_json": [r["key"] for r in json.loads(_cli("tasks", "--json")[1])],
    }
    with _instance("mocked") as (instance, ctx):
        queued = [r["run_id"] for r in _runs(instance) if r["status"] == "QUEUED"]
        out["queued_before"] = queued
        out["dequeued"], out["worker_exits"] = [], []
        # One run of a task at a time (its pool): each run launched in turn (STARTING), then
        # what a run launcher starts for it -- a run worker, which cannot load the job.
        while launched := dequeue_iteration(ctx):
            for run_id in launched:
                out["dequeued"].append(run_id)
                out["worker_exits"].append(start_run_worker(instance, run_id).wait(timeout=120))
        # Dagster's clock for the daemons: past the sensors' intervals since the installed
        # phase's tick (the sensors themselves read the wall clock).
        now = datetime.now(UTC) + timedelta(minutes=2)
        run_retry_iteration(ctx, now)  # Dagster's retry daemon: the job is gone, no retry
        run_sensor_tick(ctx, now)
        out["entries_after_first_tick"] = _entries()
        out["alerts_after_first_tick"] = [a for a in alerts if a["alert"] == "unsupported_task"]
        run_sensor_tick(ctx, now + timedelta(minutes=2))
        out["entries"] = _entries()
        out["alerts"] = [a for a in alerts if a["alert"] == "unsupported_task"]
        out["runs"] = _runs(instance)
        # The entry of the run that failed while the plugin was installed (then retrying).
        retried = next(e for e in out["entries"] if e["due"] == "2026-11-30T23:00:00Z")
        # The UI's "Re-execute" of its first run (the mutation the button sends).
        variables = reexecution_variables(retried["run_ids"][0], {})
        try:
            run_id_from_reexecution(execute_query(ctx, REEXECUTE_MUTATION, variables))
            out["ui_reexecution"] = "launched"
        except LaunchFailed as exc:
            out["ui_reexecution"] = str(exc)
        out["runs_after_reexecution"] = len(_runs(instance))
    code, text = _cli(
        "runs", "retry", str(retried["id"]), "--operator", "alice", "--reason", "rerun", "--json"
    )
    out["retry"] = {"exit_code": code, "output": json.loads(text)}
    out["entries_after_retry"] = _entries()
    return out


if __name__ == "__main__":
    phase = {"installed": installed, "uninstalled": uninstalled}[sys.argv[1]]
    print(json.dumps(phase(), default=str))
