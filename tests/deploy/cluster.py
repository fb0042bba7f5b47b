"""A Dagster deployment of several processes for the fault tests: one code server, two
``dagster-daemon`` and two ``dagster-webserver`` on one PostgreSQL (instance storage, ledger,
claim log and effect sink in one database), each process a :class:`Service` that can be
killed with SIGKILL and started again -- on loopback (test_active_active.py) or each in its
own network namespace (test_netns_topology.py, through ``Service.netns``).

Also here: the webserver's GraphQL as the UI calls it, an observer thread that notes when each
entry's lease was reclaimed (the history's ``release`` records), and :func:`write_history`,
which reads the end state into a history for the checker.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, TypeVar

import dagster as dg
import grpc
import sqlalchemy as sa
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from history.collect import (
    create_sink,
    due_records,
    ledger_records,
    sink_records,
    summary_records,
)
from history.history_format import HistoryWriter, Record, stamp
from processes import start_group, stop_group

from orchestration.services.summary import ledger_summary
from orchestration.task_spec import TaskView
from resources.core import tags as t
from resources.core.entry import FailureKind, Status
from resources.ledger import RunLedger

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DEFS = Path(__file__).resolve().parent / "cluster_defs.py"
LOCATION = "cluster"
T = TypeVar("T")
ACTIVE = {
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
}
OPEN = (Status.QUEUED, Status.RUNNING, Status.RETRYING)


def now() -> datetime:
    return datetime.now(UTC)


def ceil_minute(when: datetime) -> datetime:
    floor = when.replace(second=0, microsecond=0)
    return floor if floor == when else floor + timedelta(minutes=1)


def due_text(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Service:
    """One long-lived process (one host or container in production)."""

    name: str
    cmd: list[str]
    cwd: Path
    env: dict[str, str]
    log_path: Path
    netns: str | None = None
    proc: Any = None
    _log: IO[bytes] | None = None

    def start(self) -> None:
        self._log = self.log_path.open("ab")  # a restart appends to the same log
        cmd = (["ip", "netns", "exec", self.netns] if self.netns else []) + self.cmd
        self.proc = start_group(cmd, cwd=self.cwd, env=self.env, log=self._log)

    def kill9(self) -> None:
        """SIGKILL the whole process group: the machine or container is gone at once."""
        if self.running():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.stop()

    def stop(self, timeout: float = 30) -> None:
        if self.proc is not None:
            stop_group(self.proc, timeout=timeout)
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def write_instance(home: Path, pg: dict[str, str]) -> dict[str, str]:
    """``deploy/dagster.yaml`` with the soak's two shortened intervals; its environment."""
    home.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((ROOT / "deploy" / "dagster.yaml").read_text())
    config["run_monitoring"]["poll_interval_seconds"] = 5
    config["run_coordinator"]["config"]["dequeue_interval_seconds"] = 1
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    return {
        "DAGSTER_HOME": str(home),
        "DAGSTER_PG_USERNAME": pg["user"],
        "DAGSTER_PG_PASSWORD": "",  # the throwaway server trusts its clients
        "DAGSTER_PG_HOST": pg["host"],
        "DAGSTER_PG_DB": pg["db"],
        "DAGSTER_PG_PORT": pg["port"],
    }


def write_workspace(path: Path, host: str, port: int) -> Path:
    """``deploy/workspace.grpc.yaml`` pointed at the code server."""
    workspace = yaml.safe_load((ROOT / "deploy" / "workspace.grpc.yaml").read_text())
    (server,) = workspace["load_from"]
    server["grpc_server"].update(host=host, port=port, location_name=LOCATION)
    path.write_text(yaml.safe_dump(workspace))
    return path


def code_server(host: str, port: int, env: dict[str, str], log: Path, netns: str | None = None):
    cmd = [str(BIN / "dagster"), "api", "grpc", "-h", host, "-p", str(port), "-f", str(DEFS)]
    cmd += ["-a", "defs", "--location-name", LOCATION]
    return Service("code server", cmd, DEFS.parent, env, log, netns)


def daemon(name: str, workspace: Path, env: dict[str, str], log: Path, netns: str | None = None):
    cmd = [str(BIN / "dagster-daemon"), "run", "-w", str(workspace)]
    return Service(name, cmd, workspace.parent, env, log, netns)


def webserver(
    name: str,
    host: str,
    port: int,
    workspace: Path,
    env: dict[str, str],
    log: Path,
    netns: str | None = None,
) -> Service:
    cmd = [str(BIN / "dagster-webserver"), "-h", host, "-p", str(port), "-w", str(workspace)]
    return Service(name, cmd, workspace.parent, env, log, netns)


def serving(host: str, port: int) -> bool:
    """The code server's standard gRPC health check (a readiness probe's question)."""
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=2
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def graphql(url: str, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            payload: dict[str, Any] = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        payload = json.loads(exc.read())
    return payload


SCHEDULES = """
query Schedules($location: String!) {
  schedulesOrError(
    repositorySelector: {repositoryLocationName: $location, repositoryName: "__repository__"}
  ) { ... on Schedules { results { name scheduleState { id status } } } }
}
"""
STOP_SCHEDULE = """
mutation Stop($id: String!) {
  stopRunningSchedule(id: $id) {
    ... on ScheduleStateResult { scheduleState { id status } }
    ... on Error { message }
  }
}
"""


def stop_schedules(web_url: str, count: int) -> None:
    """Stop every schedule of the location with the UI's toggle (``stopRunningSchedule``)."""
    payload = graphql(web_url, SCHEDULES, {"location": LOCATION})
    schedules = payload["data"]["schedulesOrError"]["results"]
    assert len(schedules) == count, payload
    for schedule in schedules:
        answer = graphql(web_url, STOP_SCHEDULE, {"id": schedule["scheduleState"]["id"]})
        state = answer["data"]["stopRunningSchedule"].get("scheduleState") or {}
        assert state.get("status") == "STOPPED", answer


def wait_for(
    what: str,
    condition: Callable[[], T | None],
    timeout: float,
    why: Callable[[], str],
    interval: float = 0.5,
) -> T:
    """Poll ``condition`` until truthy; fail with ``why()`` (logs, state) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s\n{why()}"
        time.sleep(interval)


def task_runs(instance: dg.DagsterInstance, tasks: Sequence[str]) -> list[dg.DagsterRun]:
    wanted = set(tasks)
    return [r for r in instance.get_runs() if r.tags.get(t.TAG_TASK) in wanted]


class Observer(threading.Thread):
    """Polls the ledger; notes when each claim of an entry was first seen ended (a ``release``
    record per entry and claim generation, whose time is surely after the change committed:
    ``reclaim`` for a lease reclaim, ``success``, or ``fail`` for any other way the ledger
    took the entry from the claim's run -- an attempt failed by the outcome sensor after
    Dagster ended the run, a dispatch failure of a later retry) and every fault the test
    reports."""

    def __init__(self, ledger_url: str) -> None:
        super().__init__(name="history-observer", daemon=True)
        self.ledger_url = ledger_url
        self.stop_event = threading.Event()
        #: (entry id, claim generation) -> the release record of that claim.
        self.releases: dict[tuple[int, int], Record] = {}
        self.faults: list[Record] = []
        self.errors: list[BaseException] = []

    def fault(self, kind: str, target: str, **detail: Any) -> None:
        self.faults.append(
            {"type": "fault", "kind": kind, "target": target, "at": stamp(now()), **detail}
        )

    def release_of(self, entry_id: int) -> Record | None:
        """The first release seen of ``entry_id`` (None: none yet)."""
        seen = [r for (entry, _), r in self.releases.items() if entry == entry_id]
        return min(seen, key=lambda r: r["token"]) if seen else None

    def run(self) -> None:
        engine = sa.create_engine(self.ledger_url, pool_pre_ping=True)
        query = sa.text(
            "SELECT id, run_ids, claim_generation, status, failure_kind FROM dueledger_entries "
            f"WHERE claim_generation > 0 AND status <> '{Status.RUNNING}'"
        )
        try:
            while not self.stop_event.wait(0.5):
                try:
                    with engine.connect() as conn:
                        rows = conn.execute(query).all()
                except sa.exc.OperationalError:
                    continue  # PostgreSQL restarting or cut off: look again
                for row in rows:
                    key = (int(row.id), int(row.claim_generation))
                    if key in self.releases:
                        continue
                    runs = row.run_ids if isinstance(row.run_ids, list) else json.loads(row.run_ids)
                    if row.failure_kind == FailureKind.LEASE_RECLAIMED:
                        how = "reclaim"
                    else:
                        how = "success" if row.status == Status.SUCCESS else "fail"
                    self.releases[key] = {
                        "type": "release",
                        "entry_id": key[0],
                        "run_id": runs[-1] if runs else None,
                        "token": key[1],
                        "how": how,
                        "status": row.status,
                        "failure_kind": row.failure_kind,
                        "at": stamp(now()),
                    }
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)
        finally:
            engine.dispose()


@dataclass
class HistoryInputs:
    source: str
    tasks: Sequence[str]
    views: Sequence[TaskView]
    dues: Sequence[datetime]
    lease_ttl: timedelta
    window: timedelta
    extra: list[Record] = field(default_factory=list)


def write_history(
    path: Path, inputs: HistoryInputs, instance: dg.DagsterInstance, ledger_url: str
) -> list[Record]:
    """The end state as a history (runs from Dagster, claims and effects from the sink,
    entries and audit from the ledger, ``summary`` with these tasks' views); returns it."""
    with HistoryWriter(path) as writer:
        writer.write(
            "meta",
            source=inputs.source,
            backend="postgresql",
            slot_seconds=60,
            window_seconds=inputs.window.total_seconds(),
            started_at=stamp(inputs.dues[0]),
        )
        for task in inputs.tasks:
            writer.write("task", task=task, lease_ttl_seconds=inputs.lease_ttl.total_seconds())
        writer.write_all(due_records(inputs.tasks, inputs.dues))
        for run in task_runs(instance, inputs.tasks):
            writer.write(
                "run",
                run_id=run.run_id,
                task=run.tags[t.TAG_TASK],
                due=run.tags.get(t.TAG_DUE),
                trigger=run.tags.get(t.TAG_TRIGGER),
                status=run.status.value,
                outcome=run.tags.get(t.TAG_OUTCOME),
                parent_entry=run.tags.get(t.TAG_PARENT_ENTRY),
                parent_run_id=run.tags.get(t.DAGSTER_PARENT_RUN_ID),
            )
        engine = sa.create_engine(ledger_url)
        try:
            writer.write_all(sink_records(engine))
        finally:
            engine.dispose()
        ledger = RunLedger(database_url=ledger_url)
        try:
            _, records = ledger_records(ledger)
            writer.write_all(records)
            summary = ledger_summary(ledger, inputs.views, now(), instance=instance)
        finally:
            ledger.dispose()
        writer.write_all(summary_records(summary, inputs.tasks, inputs.dues))
        writer.write_all(inputs.extra)
    from history.history_format import read_history  # the file is the record of truth

    return read_history(path)


def prepare_database(ledger_url: str) -> None:
    """Migrate the ledger and create the sink tables (the code server would migrate too)."""
    ledger = RunLedger(database_url=ledger_url)
    ledger.migrate()
    ledger.dispose()
    engine = sa.create_engine(ledger_url)
    create_sink(engine)
    engine.dispose()
