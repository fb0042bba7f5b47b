"""A zombie run worker commits no side effect after its lease was reclaimed.

The worker is Dagster's real run worker process (``dagster api execute_run``) for a run the
real scheduler created, running ``fenced_task`` of tests/fixtures/ledger_defs.py: it claims
its entry (lease TTL 2 s), waits for a release file, then cancels every pending order and
queues a notification -- the hosting tasks' own write functions, fenced by the run's claim.
The test freezes it (SIGSTOP) past its lease, lets the real reclaim sensor fail the entry,
then wakes it (SIGCONT): nothing may be committed after the reclaim, and ``dueledger runs
show`` must say why.

Both ledger backends: SQLite with the source data in a file of its own (the fence is asked
right before each commit), and PostgreSQL with the source data in the ledger's database
(the check is a statement of the effect's own transaction).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from dagster_internals import (
    daemon_instance,
    daemon_workspace,
    run_scheduler_tick,
    run_sensor_tick,
    start_run_worker,
)
from sensor_support import LedgerEnv, fixture_module, target, task_runs, utc_now, wait_for

from orchestration.cli import main
from resources.core import tags as t
from resources.core.due import floor_to_slot
from resources.core.entry import Entry, FailureKind, Status
from resources.core.settings import ENV_DATABASE_URL
from resources.idempotency import create_domain_schema, notification_outbox, side_effects
from resources.ledger import RunLedger
from resources.source_schema import customers, orders
from resources.source_store import create_schema, make_engine

SENSOR_INTERVAL = timedelta(seconds=31)  # past the reclaim sensor's minimum interval
TASK = "fenced_task"


@dataclass(frozen=True)
class World:
    env: LedgerEnv
    source_url: str
    release: Path

    def source(self) -> sa.Engine:
        return make_engine(self.source_url)

    def order_statuses(self) -> list[str]:
        engine = self.source()
        try:
            with engine.connect() as conn:
                return [r.status for r in conn.execute(sa.select(orders).order_by(orders.c.id))]
        finally:
            engine.dispose()

    def effect_rows(self) -> tuple[int, int]:
        """(notification_outbox rows, side_effects rows) in the source store."""
        engine = self.source()
        try:
            with engine.connect() as conn:
                outbox = conn.execute(sa.select(sa.func.count()).select_from(notification_outbox))
                effects = conn.execute(sa.select(sa.func.count()).select_from(side_effects))
                return int(outbox.scalar_one()), int(effects.scalar_one())
        finally:
            engine.dispose()


@pytest.fixture
def world(ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """A migrated ledger and a source store holding two pending orders of a day ago."""
    monkeypatch.setenv(ENV_DATABASE_URL, ledger_url)
    source_url = ledger_url if ledger_url.startswith("postgresql") else f"sqlite:///{tmp_path}/s.db"
    release = tmp_path / "release"
    monkeypatch.setenv("LEDGER_DEFS_SOURCE", source_url)
    monkeypatch.setenv("LEDGER_DEFS_RELEASE", str(release))
    ledger = RunLedger(database_url=ledger_url)
    ledger.migrate()
    engine = make_engine(source_url)
    create_schema(engine)
    create_domain_schema(engine)
    day_ago = datetime.now() - timedelta(days=1)  # naive UTC-ish: only "pending" matters
    with engine.begin() as conn:
        conn.execute(
            sa.insert(customers),
            [{"id": 1, "name": "c1", "email": "c1@example.org", "phone": "+1", "channels": ""}],
        )
        conn.execute(
            sa.insert(orders),
            [
                {"customer_id": 1, "product": "vps", "status": "pending", "created_at": day_ago}
                for _ in range(2)
            ],
        )
    engine.dispose()
    yield World(LedgerEnv(ledger, ledger_url, tmp_path), source_url, release)
    ledger.dispose()


@dataclass
class Worker:
    instance: dg.DagsterInstance
    ctx: Any
    run: dg.DagsterRun
    process: Any


@pytest.fixture
def worker(world: World) -> Iterator[Worker]:
    """A scheduled fenced_task run, its real worker started and holding the entry's lease,
    waiting for the release file before its side effects."""
    due = floor_to_slot(utc_now(), 15) - timedelta(minutes=15)
    with (
        daemon_instance("mocked", temp_dir=world.env.tmp / "instance") as instance,
        daemon_workspace(instance, target("fenced_defs")) as ctx,
    ):
        run_scheduler_tick(ctx, due - timedelta(minutes=1))
        run_sensor_tick(ctx, due - timedelta(minutes=1))
        run_scheduler_tick(ctx, due + timedelta(seconds=5))
        (run,) = task_runs(instance, TASK)
        process = start_run_worker(instance, run.run_id, env=world.env.worker_env())
        try:
            wait_for(
                "the worker's claim",
                lambda: [e for e in world.env.entries(TASK) if e.status == Status.RUNNING],
            )
            # Frozen only once it waits: frozen mid-write it would hold a lock on Dagster's
            # SQLite storage, and the reclaim sensor's tick could not open the instance.
            marker = Path(fixture_module().waiting_marker(world.release))
            wait_for("the worker's wait", marker.exists)
            yield Worker(instance, ctx, run, process)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def only_entry(world: World) -> Entry:
    (entry,) = world.env.entries(TASK)
    return entry


# The control: the same worker, not paused, does commit (so the zombie test can fail). Once:
# tests/resources/test_fencing.py covers a held fence on both backends and layouts.
@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_a_worker_that_holds_its_lease_commits_its_side_effects(world: World, worker: Worker):
    world.release.touch()
    assert worker.process.wait(timeout=120) == 0, worker.process.stderr.read().decode()[-3000:]

    assert only_entry(world).status == Status.SUCCESS
    assert world.order_statuses() == ["cancelled", "cancelled"]
    assert world.effect_rows() == (1, 1)


def test_a_zombie_worker_commits_nothing_after_the_reclaim_and_runs_show_says_why(
    world: World, worker: Worker
):
    os.killpg(worker.process.pid, signal.SIGSTOP)  # paused mid-run: no heartbeat, no progress
    frozen_at = utc_now()
    run_sensor_tick(worker.ctx, frozen_at + SENSOR_INTERVAL)  # the real reclaim sensor
    reclaimed = only_entry(world)
    assert (reclaimed.status, reclaimed.failure_kind) == (
        Status.FAILED,
        FailureKind.LEASE_RECLAIMED,
    )

    world.release.touch()  # its wait is over...
    os.killpg(worker.process.pid, signal.SIGCONT)  # ...and it resumes, to its side effects
    worker.process.wait(timeout=120)

    # Nothing of either effect was committed after the reclaim.
    assert world.order_statuses() == ["pending", "pending"]
    assert world.effect_rows() == (0, 0)
    after = only_entry(world)
    assert (after.status, after.failure_kind, after.error) == (
        reclaimed.status,
        reclaimed.failure_kind,
        reclaimed.error,
    )
    finished = worker.instance.get_run_by_id(worker.run.run_id)
    assert finished is not None and finished.status == dg.DagsterRunStatus.FAILURE
    assert finished.tags[t.DAGSTER_MAX_RETRIES] == "0"  # a retry could only be refused

    shown = CliRunner().invoke(main, ["runs", "show", str(after.id), "--json"])
    assert shown.exit_code == 0, shown.output
    rejections = json.loads(shown.stdout)["summary"]["late_job_rejections"]
    refused = [r for r in rejections if r["action"] == "side_effect"]
    assert [r["run_id"] for r in refused] == [worker.run.run_id]
    assert "cancel orders" in refused[0]["reason"]
    assert "lost its lease" in refused[0]["reason"]
    text = CliRunner().invoke(main, ["runs", "show", str(after.id)])
    assert "side_effect" in text.output and "cancel orders" in text.output
