"""One run of a task at a time, whatever launched it.

Runs of ``order_cleanup`` are submitted the three ways a user makes them -- the
launchpad's and the Catalog's GraphQL ``launchRun`` (no dueledger tags: Dagster 1.13 does
not apply a job's run tags there) and a scheduled run from the real scheduler -- to an
instance configured like ``dagster.yaml.local`` (QueuedRunCoordinator, one slot per
task pool at run granularity). Dagster's real run-queue daemon then decides what starts.
Runs are launched by MockedRunLauncher and stay in progress until the test ends them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from dagster_graphql.cli import execute_query
from dagster_internals import (
    CodeTarget,
    daemon_instance,
    daemon_workspace,
    dequeue_iteration,
    run_scheduler_tick,
    run_sensor_tick,
)

from resources.core import tags as t

pytestmark = pytest.mark.daemon

TARGET = CodeTarget.from_module("orchestration.definitions", attribute="defs")
LOCAL_YAML = Path(__file__).resolve().parents[2] / "dagster.yaml.local"
DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
TASK = "order_cleanup"

LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on Error { message }
  }
}
"""


def _local_queue_config() -> dict[str, Any]:
    """The run coordinator and concurrency blocks of dagster.yaml.local, as they are."""
    local = yaml.safe_load(LOCAL_YAML.read_text())
    concurrency = local["concurrency"]
    concurrency["runs"]["max_concurrent_runs"] = 20  # every task may start: pools decide
    return {"run_coordinator": local["run_coordinator"], "concurrency": concurrency}


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[Any]:
    with (
        daemon_instance(
            "mocked", temp_dir=tmp_path / "instance", overrides=_local_queue_config()
        ) as instance,
        daemon_workspace(instance, TARGET) as context,
    ):
        run_scheduler_tick(context, DUE - timedelta(minutes=1))  # schedules start before the due
        # As under `dagster dev`: the sensors run at start-up, and the policy sensor creates
        # the task pools before a run of them is queued (orchestration/overlap.py says why).
        run_sensor_tick(context, DUE - timedelta(seconds=50))
        yield context


def _ui_launch(ctx: Any, job: str, assets: list[str] | None = None) -> str:
    selector: dict[str, Any] = {
        "repositoryLocationName": TARGET.location_name,
        "repositoryName": "__repository__",
        "jobName": job,
    }
    if assets:
        selector["assetSelection"] = [{"path": [a]} for a in assets]
    result = execute_query(
        ctx,
        LAUNCH,
        {
            "params": {
                "selector": selector,
                "executionMetadata": {"tags": [{"key": "dagster/from_ui", "value": "true"}]},
            }
        },
    )
    payload = result["data"]["launchRun"]
    assert payload["__typename"] == "LaunchRunSuccess", result
    assert payload["run"]["status"] == "QUEUED"
    return str(payload["run"]["runId"])


def _task_run_ids(instance: dg.DagsterInstance, launchpad: str, catalog: str) -> set[str]:
    scheduled = instance.get_runs(dg.RunsFilter(tags={t.TAG_TASK: TASK}))
    return {launchpad, catalog, *(r.run_id for r in scheduled)}


def test_ui_catalog_and_scheduled_runs_of_one_task_start_one_at_a_time(ctx: Any) -> None:
    instance = ctx.instance
    # The policy sensor gave every task a pool of one slot.
    assert instance.event_log_storage.get_concurrency_info(TASK).slot_count == 1
    launchpad = _ui_launch(ctx, f"{TASK}_job")
    catalog = _ui_launch(ctx, "__ASSET_JOB", assets=[TASK])
    run_scheduler_tick(ctx, DUE + timedelta(seconds=5))
    runs = _task_run_ids(instance, launchpad, catalog)
    assert len(runs) == 3  # one scheduled run for the due, two UI launches
    assert not {t.TAG_TASK} & set(instance.get_run_by_id(launchpad).tags)

    started: list[str] = []
    for _ in range(len(runs)):
        launched = [r for r in dequeue_iteration(ctx) if r in runs]
        assert len(launched) == 1, launched  # one run of the task at a time
        assert dequeue_iteration(ctx) == []  # its pool is busy: the others keep waiting
        started += launched
        # The run ends; the next one of the task may start.
        instance.report_run_failed(instance.get_run_by_id(launched[0]))

    assert sorted(started) == sorted(runs)  # none dropped


def test_other_tasks_are_not_held_back_by_a_busy_pool(ctx: Any) -> None:
    instance = ctx.instance
    _ui_launch(ctx, f"{TASK}_job")
    _ui_launch(ctx, f"{TASK}_job")
    run_scheduler_tick(ctx, DUE + timedelta(seconds=5))  # every task due at 22:45

    launched = [instance.get_run_by_id(r) for r in dequeue_iteration(ctx)]

    by_job: dict[str, int] = {}
    for run in launched:
        by_job[run.job_name] = by_job.get(run.job_name, 0) + 1
    assert by_job[f"{TASK}_job"] == 1
    assert len(by_job) > 1 and set(by_job.values()) == {1}
