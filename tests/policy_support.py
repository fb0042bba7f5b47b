"""What the scheduling-policy tests share: one task of tests/fixtures/policy_defs.py
loaded in the daemon's workspace on an instance queued like ``dagster.yaml.local``, and the
ways a user makes its runs: the real scheduler's tick, the UI's GraphQL ``launchRun``, Dagster's
run queue, a run executed as its worker would execute it (in a thread)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml
from dagster_graphql.cli import execute_query
from dagster_internals import (
    CodeTarget,
    daemon_instance,
    daemon_workspace,
    dequeue_iteration,
    execute_run_in_thread,
    instigator_ticks,
    run_scheduler_tick,
    run_sensor_tick,
)

from resources.core import tags as t
from resources.core.entry import Entry
from resources.ledger import RunLedger

POLICY_DEFS = Path(__file__).resolve().parent / "fixtures" / "policy_defs.py"
LOCAL_YAML = Path(__file__).resolve().parents[1] / "dagster.yaml.local"
DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
#: How long a run may take to end once its work is over (a loaded 2-core machine).
RUN_END_SECONDS = 180
SLOT = timedelta(minutes=15)

LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on Error { message }
  }
}
"""


@dataclass
class World:
    ctx: Any
    ledger: RunLedger
    task: str
    directory: Path
    #: The first due of the test (slot 0).
    first: datetime = DUE

    @property
    def instance(self) -> dg.DagsterInstance:
        return self.ctx.instance

    def at(self, slots: int) -> datetime:
        """The due ``slots`` after the first one."""
        return self.first + slots * SLOT

    def tick(self, slots: int) -> list[str]:
        """Tick the scheduler for the due ``slots`` after the first; the runs it made."""
        before = {r.run_id for r in self.instance.get_runs()}
        run_scheduler_tick(self.ctx, self.at(slots) + timedelta(seconds=5))
        return sorted({r.run_id for r in self.instance.get_runs()} - before)

    def keep(self, slots: int, seconds: int = 30) -> list[str]:
        """Tick the sensor daemon (``ledger_sensor``) ``seconds`` into the slot ``slots`` after
        the first due; the runs it made."""
        before = {r.run_id for r in self.instance.get_runs()}
        run_sensor_tick(self.ctx, self.at(slots) + timedelta(seconds=seconds))
        return sorted({r.run_id for r in self.instance.get_runs()} - before)

    def tick_reason(self) -> str:
        """The skip reason of the task schedule's newest tick (empty: none)."""
        (tick,) = instigator_ticks(self.ctx, f"{self.task}_schedule", limit=1)
        return tick.skip_reason or ""

    def due(self, slots: int) -> str:
        """Tick the scheduler for the due ``slots`` after the first; the id of its run."""
        (run_id,) = self.tick(slots)
        return run_id

    def ui_launch(self, tags: dict[str, str] | None = None) -> str:
        """What the launchpad sends: GraphQL launchRun, no dueledger tags."""
        metadata = [{"key": "dagster/from_ui", "value": "true"}]
        metadata += [{"key": k, "value": v} for k, v in (tags or {}).items()]
        result = execute_query(
            self.ctx,
            LAUNCH,
            {
                "params": {
                    "selector": {
                        "repositoryLocationName": "dueledger",
                        "repositoryName": "__repository__",
                        "jobName": f"{self.task}_job",
                    },
                    "executionMetadata": {"tags": metadata},
                }
            },
        )
        payload = result["data"]["launchRun"]
        assert payload["__typename"] == "LaunchRunSuccess", result
        return str(payload["run"]["runId"])

    def start(self, run_id: str) -> Any:
        """Dequeue ``run_id`` with Dagster's run queue (unless it launched it already) and
        execute it; the thread."""
        run = self.instance.get_run_by_id(run_id)
        if run is not None and run.status == dg.DagsterRunStatus.QUEUED:
            dequeue_iteration(self.ctx)
        run = self.instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.STARTING, run
        return execute_run_in_thread(self.instance, run_id)

    def wait_claimed(self, entry_marker_count: int) -> None:
        deadline = datetime.now(UTC) + timedelta(seconds=60)
        while len(list(self.directory.glob("*.claimed"))) < entry_marker_count:
            assert datetime.now(UTC) < deadline, "no run claimed"

    def entry_of(self, run_id: str) -> Entry:
        tagged = self.instance.get_run_by_id(run_id)
        assert tagged is not None
        entry_id = tagged.tags.get(t.TAG_ENTRY)
        assert entry_id, f"run {run_id} names no entry: {tagged.tags}"
        found = self.ledger.get(int(entry_id))
        assert found is not None
        return found

    def outcome(self, run_id: str, *, finished: bool = True) -> tuple[str, str | None]:
        """The run's status and ``dueledger/outcome`` tag; with ``finished``, once Dagster has
        ended the run (a canceled run passes CANCELING first: under load that takes a while),
        asked through Dagster's own run records until a deadline."""
        deadline = time.monotonic() + RUN_END_SECONDS
        while True:
            run = self.instance.get_run_by_id(run_id)
            assert run is not None
            if not finished or run.is_finished:
                return run.status.value, run.tags.get(t.TAG_OUTCOME)
            assert time.monotonic() < deadline, (
                f"run {run_id} not ended within {RUN_END_SECONDS} s: {run.status.value}"
            )
            time.sleep(0.2)

    def release(self) -> None:
        (self.directory / "release").touch()

    def effects(self) -> list[int]:
        engine = sa.create_engine(f"sqlite:///{self.directory / 'effects.sqlite'}")
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT entry FROM effects ORDER BY entry")).all()
        engine.dispose()
        return [r[0] for r in rows]


def _queue_config() -> dict[str, Any]:
    local = yaml.safe_load(LOCAL_YAML.read_text())
    concurrency = local["concurrency"]
    concurrency["runs"]["max_concurrent_runs"] = 20
    return {"run_coordinator": local["run_coordinator"], "concurrency": concurrency}


def soon() -> datetime:
    """A due in the near future: ledger stamps (the wall clock) fall just before it."""
    now = datetime.now(UTC)
    return now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0) + 2 * SLOT


@contextmanager
def policy_world(
    task: str,
    ledger: RunLedger,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    start: datetime = DUE,
) -> Iterator[World]:
    """``task``'s code location of tests/fixtures/policy_defs.py in the daemon's workspace,
    its schedule started a minute before ``start`` (its first due); the release file is
    written at the end."""
    directory = tmp_path / "policy"
    directory.mkdir()
    monkeypatch.setenv("POLICY_DEFS_DIR", str(directory))
    target = CodeTarget.from_file(POLICY_DEFS, attribute=task.replace("_task", "_defs"))
    with (
        daemon_instance("mocked", temp_dir=tmp_path / "dagster", overrides=_queue_config()) as inst,
        daemon_workspace(inst, target) as ctx,
    ):
        run_scheduler_tick(ctx, start - timedelta(minutes=1))  # the schedule starts
        yield World(ctx, ledger, task, directory, start)
        (directory / "release").touch()  # let any waiting run end
