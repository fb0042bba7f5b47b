"""Lease reclaim: a run worker that dies (or freezes) mid-task loses its entry after the lease
TTL; nothing is re-run; a late completion is rejected and traced.

The worker is Dagster's real run worker process (``dagster api execute_run``) for a run the
real scheduler created; the reclaim happens in the real sensor daemon path. Leases are
written with the wall clock, so the sensor ticks are frozen at instants measured from the
moment the worker was stopped, never at absolute times.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
from click.testing import CliRunner
from dagster_internals import (
    daemon_instance,
    daemon_workspace,
    run_retry_iteration,
    run_scheduler_tick,
    run_sensor_tick,
    start_run_worker,
)
from sensor_support import LedgerEnv, fixture_module, target, task_runs, utc_now, wait_for

from orchestration.cli import main
from orchestration.reclaim import ALERT_KIND, reclaim_leases
from resources.core import tags as t
from resources.core.due import floor_to_slot
from resources.core.entry import FailureKind, Status, Trigger, dedup_key_for_due
from resources.ledger import RunLedger

TTL = timedelta(seconds=2)  # sleepy_task's lease (tests/fixtures/ledger_defs.py)
SENSOR_INTERVAL = timedelta(seconds=31)  # past the sensors' minimum interval
RETRIES_ON = {"run_retries": {"enabled": True, "max_retries": 0}}


@pytest.fixture
def sleepy(ledger_env: LedgerEnv, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    """A scheduled ``sleepy_task`` run (created by the scheduler, not yet executed), its
    worker started and holding the entry's lease; yields the pieces."""
    monkeypatch.setenv("LEDGER_DEFS_RELEASE", str(ledger_env.tmp / "release"))
    # A due in the recent past: the schedule ticks are frozen there, the reclaim sensor
    # ticks at (frozen copies of) the wall clock the worker writes its lease with.
    due = floor_to_slot(utc_now(), 15) - timedelta(minutes=15)
    with (
        daemon_instance(
            "mocked", temp_dir=ledger_env.tmp / "instance", overrides=RETRIES_ON
        ) as instance,
        daemon_workspace(instance, target("lease_defs")) as ctx,
    ):
        run_scheduler_tick(ctx, due - timedelta(minutes=1))
        run_sensor_tick(ctx, due - timedelta(minutes=1))
        run_scheduler_tick(ctx, due + timedelta(seconds=5))
        (run,) = task_runs(instance, "sleepy_task")
        worker = start_run_worker(instance, run.run_id, env=ledger_env.worker_env())
        try:
            wait_for(
                "the worker's claim",
                lambda: [
                    e for e in ledger_env.entries("sleepy_task") if e.status == Status.RUNNING
                ],
            )
            # Frozen or killed only once it waits: frozen mid-write it would hold a lock on
            # Dagster's SQLite storage, and the sensor tick could not open the instance.
            marker = Path(fixture_module().waiting_marker(ledger_env.tmp / "release"))
            wait_for("the worker's wait", marker.exists)
            yield {"instance": instance, "ctx": ctx, "run": run, "worker": worker, "due": due}
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=30)


def _alerts(caplog: pytest.LogCaptureFixture, kind: str) -> list[dict]:
    lines = [r.getMessage() for r in caplog.records if r.name == "dueledger.alerts"]
    return [a for a in map(json.loads, lines) if a["alert"] == kind]


def test_a_killed_worker_loses_its_entry_after_the_ttl_and_nothing_runs_again(
    sleepy, ledger_env: LedgerEnv, caplog: pytest.LogCaptureFixture
):
    ctx, instance, run = sleepy["ctx"], sleepy["instance"], sleepy["run"]
    os.killpg(sleepy["worker"].pid, signal.SIGKILL)  # kill -9 mid-task
    sleepy["worker"].wait(timeout=30)
    killed_at = utc_now()
    caplog.set_level(logging.WARNING, logger="dueledger.alerts")

    run_sensor_tick(ctx, killed_at)  # within the TTL of the last heartbeat: kept
    (entry,) = ledger_env.entries("sleepy_task")
    assert (entry.status, entry.lease_owner) == (Status.RUNNING, run.run_id)

    run_sensor_tick(ctx, killed_at + SENSOR_INTERVAL)  # well past the TTL
    (entry,) = ledger_env.entries("sleepy_task")
    assert (entry.status, entry.failure_kind) == (Status.FAILED, FailureKind.LEASE_RECLAIMED)
    assert entry.attempt == 1 and list(entry.run_ids) == [run.run_id]
    (alert,) = _alerts(caplog, ALERT_KIND)
    assert (alert["task"], alert["entry_id"], alert["run_id"]) == (
        "sleepy_task",
        entry.id,
        run.run_id,
    )
    assert alert["overdue_seconds"] >= (SENSOR_INTERVAL - TTL).total_seconds() - 1

    # No second run: not from the reclaim, not from Dagster's retries, not from the sensors.
    run_retry_iteration(ctx, killed_at + 2 * SENSOR_INTERVAL)
    run_sensor_tick(ctx, killed_at + 2 * SENSOR_INTERVAL)
    assert [r.run_id for r in task_runs(instance, "sleepy_task")] == [run.run_id]
    assert ledger_env.entries("sleepy_task") == [entry]
    # The reclaimed run is told not to be retried by Dagster should it ever fail.
    assert instance.get_run_by_id(run.run_id).tags[t.DAGSTER_MAX_RETRIES] == "0"


def test_a_frozen_worker_that_completes_after_the_reclaim_is_rejected_and_traced(
    sleepy, ledger_env: LedgerEnv
):
    # Reclaimed from the command line this time (no sensor, so nothing tags the run): the
    # late run itself must keep Dagster from retrying it.
    ctx, instance, run, worker = sleepy["ctx"], sleepy["instance"], sleepy["run"], sleepy["worker"]
    os.killpg(worker.pid, signal.SIGSTOP)  # the worker freezes mid-task (no heartbeats)
    frozen_at = utc_now()

    def reclaimed_by_cli() -> list[dict]:
        result = CliRunner().invoke(main, ["reclaim", "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["reclaims"]

    (alert,) = wait_for("the lease to expire", reclaimed_by_cli, timeout=30)
    assert (alert["task"], alert["run_id"]) == ("sleepy_task", run.run_id)
    (entry,) = ledger_env.entries("sleepy_task")
    assert entry.failure_kind == FailureKind.LEASE_RECLAIMED

    (ledger_env.tmp / "release").touch()  # its work is done...
    os.killpg(worker.pid, signal.SIGCONT)  # ...and it wakes up to report success
    worker.wait(timeout=60)

    (after,) = ledger_env.entries("sleepy_task")
    assert (after.status, after.failure_kind, after.error) == (
        Status.FAILED,
        FailureKind.LEASE_RECLAIMED,
        entry.error,
    )
    late = [r for r in after.summary["late_job_rejections"] if r["run_id"] == run.run_id]
    assert late and late[-1]["action"] == "succeed"
    finished = instance.get_run_by_id(run.run_id)
    assert finished is not None and finished.status == dg.DagsterRunStatus.FAILURE
    assert finished.tags[t.DAGSTER_WILL_RETRY] == "false"  # a retry could only be refused
    run_retry_iteration(ctx, frozen_at + 2 * SENSOR_INTERVAL)
    run_sensor_tick(ctx, frozen_at + 2 * SENSOR_INTERVAL)
    assert [r.run_id for r in task_runs(instance, "sleepy_task")] == [run.run_id]
    assert ledger_env.entries("sleepy_task") == [after]


# --- the same from the command line (no daemon) -------------------------------------------------


@pytest.fixture
def expired(
    ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[RunLedger, int, int]]:
    """A ledger with one lease that expired an hour-ish ago and one that is live."""
    monkeypatch.setenv("DUELEDGER_DATABASE_URL", ledger_url)
    ledger = RunLedger(database_url=ledger_url)
    ledger.migrate()
    now = utc_now()
    ids = []
    for due, claimed_at in (
        (floor_to_slot(now, 15) - timedelta(hours=1), now - timedelta(hours=1)),
        (floor_to_slot(now, 15), now),
    ):
        entry = ledger.ensure_entry(
            task_key="order_cleanup",
            trigger=Trigger.SCHEDULE,
            dedup_key=dedup_key_for_due(due),
            now=claimed_at,
        )
        assert ledger.claim(
            entry.id, f"run-{entry.id}", lease_ttl=timedelta(minutes=10), now=claimed_at
        ).claimed
        ids.append(entry.id)
    yield ledger, ids[0], ids[1]
    ledger.dispose()


def test_reclaim_dry_run_lists_the_expired_lease_and_changes_nothing(expired):
    ledger, stale, _live = expired
    result = CliRunner().invoke(main, ["reclaim", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["dry_run"] is True and data["count"] == 1
    (item,) = data["reclaims"]
    assert (item["entry_id"], item["run_id"], item["reclaimed"]) == (stale, f"run-{stale}", False)
    assert item["overdue_seconds"] >= 45 * 60  # expired 50 minutes before "now"
    assert ledger.get(stale).status == Status.RUNNING


def test_reclaim_fails_the_expired_lease_with_one_alert_line_and_no_run(expired):
    ledger, stale, live = expired
    result = CliRunner().invoke(main, ["reclaim"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [(a["alert"], a["task"], a["entry_id"], a["run_id"]) for a in lines] == [
        (ALERT_KIND, "order_cleanup", stale, f"run-{stale}")
    ]
    assert lines[0]["overdue_seconds"] > 0
    reclaimed, running = ledger.get(stale), ledger.get(live)
    assert reclaimed is not None and running is not None
    assert (reclaimed.status, reclaimed.failure_kind) == (
        Status.FAILED,
        FailureKind.LEASE_RECLAIMED,
    )
    assert running.status == Status.RUNNING
    again = CliRunner().invoke(main, ["reclaim", "--json"])
    assert json.loads(again.output)["count"] == 0


def test_a_lease_renewed_by_a_heartbeat_is_not_reclaimed(expired):
    ledger, stale, _ = expired
    ledger.heartbeat(stale, f"run-{stale}", lease_ttl=timedelta(hours=2))
    assert reclaim_leases(ledger, datetime.now(UTC)) == []
    assert ledger.get(stale).status == Status.RUNNING
