"""The production topology, one process per service as one container per service runs them:
a code server (``dagster api grpc``) on a loopback TCP port, ``dagster-daemon run`` and
``dagster-webserver`` reaching it through ``deploy/workspace.grpc.yaml`` (``grpc_server``),
all on ``deploy/dagster.yaml`` (PostgreSQL, queued run coordinator, task pools), the ledger in
the same database. The code server is restarted (its process group stopped, then started
again on the same port) while a UI launch -- and a due's runs, when the first due comes
before the restart could be done -- wait in the queue.

Each service gets only the environment its container would: the daemon and the webserver
the Dagster variables (DAGSTER_HOME, DAGSTER_PG_*), the code server those plus DUELEDGER_*
(its run workers and sensors use the ledger). The code location (topology_defs.py) is the
production one cut to two tasks on a 1-minute slot, so a due arrives within a minute.

What happens, in order:

1. The task pools are held at 0 (``dagster instance concurrency set <task> 0``, the deploy
   procedure of docs/deployment.md): no run of a task starts, so nothing runs inside the
   code server's process group when it is stopped (with the default run launcher a run
   worker is a child of the code server and dies with it; the ledger would reclaim it,
   never re-run it).
2. The code server and the webserver start, the daemon once the code server serves. A UI
   launch goes through the webserver's GraphQL ``launchRun`` (the mutation the UI sends);
   with less than RESTART_BUDGET left before the first due, its runs are waited for too.
   All of them wait in the queue.
3. The code server is stopped (SIGTERM, then SIGKILL to its group). A UI launch meanwhile is
   refused with an error and creates nothing. The pools are released while it is down, so
   the queue tries to launch the waiting runs and cannot reach it: each goes back into the
   queue (``max_user_code_failure_retries`` in deploy/dagster.yaml; Dagster's default fails
   it, and so does this test without that setting).
4. The code server starts again on the same port. The webserver and the daemon reconnect
   by themselves; a UI launch is accepted again (retried until it is); the waiting runs
   launch; the first due after the restart fires. Then the schedules are stopped through
   GraphQL (the UI's toggle) so no further due loads the machine while the runs finish.

Checked at the end, through ``dueledger runs list --json`` and ``dueledger summary --json``:
exactly one ``success`` entry per task per due in the window and one per accepted launch,
every Dagster run SUCCESS, nothing else. A due whose slot boundary fell while the code server
was down is not run by Dagster's scheduler (a schedule without partitions does not catch up);
if the restart was that slow, such a due must show in ``summary``'s ``missed_dues``.

Wall time: up to a minute waiting for the first due, the restart, up to a minute for the due
after it, the runs (each a fresh process). Measured on a 2-core machine shared with other
test runs: about 2 minutes at load average 3-5, 3.5-4 minutes at 6-18; 90-100 s of CPU.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, TypeVar

import dagster as dg
import grpc
import pytest
import yaml
from click.testing import CliRunner
from dagster_internals import schedule_start_times, started_schedules
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pg_server import PgServer, free_port
from processes import start_group, stop_group
from topology_defs import TASKS

from orchestration.cli import main as dueledger
from resources.core import tags as t
from resources.core.entry import Status, Trigger
from resources.core.settings import ENV_DATABASE_URL, ENV_SLOT_MINUTES, ENV_SOURCE_URL
from resources.ledger import RunLedger
from resources.source_store import create_schema, make_engine

pytestmark = [pytest.mark.slow, pytest.mark.daemon, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
DEFS = Path(__file__).resolve().parent / "topology_defs.py"
BIN = Path(sys.executable).parent
LOCATION = "dueledger"
#: The UI launches: the one waiting across the restart and the one after it. Different tasks,
#: so their runs do not queue behind each other in one task pool.
FIRST_LAUNCH, SECOND_LAUNCH = TASKS[1], TASKS[0]
ACTIVE = {
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
}
#: A scheduled run is created NOT_STARTED, then submitted to the queue.
WAITING = {dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.QUEUED}
OPEN = (Status.QUEUED, Status.RUNNING, Status.RETRYING)
#: After the code server is back, the daemon reconnects within seconds (its gRPC watch polls
#: every second); a due in this margin may still be skipped.
RELOAD_MARGIN = timedelta(seconds=10)
#: Runs of the window still running or queued after this: something is stuck (a run worker
#: takes 5-20 s; on a loaded 2-core machine the queue launched about 2 runs a minute).
SETTLE_LIMIT = timedelta(minutes=5)
#: Time a restart needs before a due (seen taking 10-40 s on a loaded 2-core machine). With
#: less left before the first due, the restart waits for its runs to be queued and the next
#: due is the first one after the restart.
RESTART_BUDGET = timedelta(seconds=45)
T = TypeVar("T")

LAUNCH_RUN = """
mutation LaunchRun($executionParams: ExecutionParams!) {
  launchRun(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on Error { message }
  }
}
"""
SCHEDULES = """
query Schedules($location: String!) {
  schedulesOrError(
    repositorySelector: {repositoryLocationName: $location, repositoryName: "__repository__"}
  ) {
    ... on Schedules { results { name scheduleState { id status } } }
  }
}
"""
STOP_SCHEDULE = """
mutation StopSchedule($id: String!) {
  stopRunningSchedule(id: $id) {
    ... on ScheduleStateResult { scheduleState { id status } }
    ... on Error { message }
  }
}
"""
WORKSPACE = """
{
  workspaceOrError {
    ... on Workspace {
      locationEntries { name locationOrLoadError { __typename } }
    }
  }
}
"""


def _now() -> datetime:
    return datetime.now(UTC)


def _ceil_to_minute(when: datetime) -> datetime:
    floor = when.replace(second=0, microsecond=0)
    return floor if floor == when else floor + timedelta(minutes=1)


def _due(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Service:
    """One long-lived process of the topology (one container in production)."""

    name: str
    cmd: list[str]
    cwd: Path
    env: dict[str, str]
    log_path: Path
    proc: Any = None
    _log: IO[bytes] | None = None

    def start(self) -> None:
        self._log = self.log_path.open("ab")  # a restart appends to the same log
        self.proc = start_group(self.cmd, cwd=self.cwd, env=self.env, log=self._log)

    def stop(self, timeout: float = 30) -> None:
        if self.proc is not None:
            stop_group(self.proc, timeout=timeout)
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def terminate(self) -> None:
        if self.running():
            os.killpg(self.proc.pid, signal.SIGTERM)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class Topology:
    code: Service
    daemon: Service
    web: Service
    code_port: int
    web_port: int
    events: list[str] = field(default_factory=list)

    @property
    def services(self) -> list[Service]:
        return [self.code, self.daemon, self.web]

    def stop(self) -> None:
        """Stop every service: SIGTERM to all first, so they shut down side by side."""
        for service in self.services:
            service.terminate()
        for service in self.services:
            service.stop()

    def note(self, message: str) -> None:
        self.events.append(f"{_now():%H:%M:%S} {message}")

    def diagnostics(self) -> str:
        parts = ["timeline:", *self.events]
        with dg.DagsterInstance.get() as instance:
            parts.append("runs:")
            parts += [
                f"  {r.run_id[:8]} {r.job_name} {r.status.value} due={r.tags.get(t.TAG_DUE)}"
                for r in instance.get_runs()
            ]
        parts.append("ledger:")
        parts += [
            f"  {e['id']} {e['task_key']} {e['dedup_key']} {e['status']} {e['run_ids']}"
            for e in _entries()
        ]
        for service in self.services:
            parts.append(f"--- {service.name} log (tail) ---\n{service.tail()}")
        return "\n".join(parts)

    def wait_for(
        self,
        what: str,
        condition: Callable[[], T | None],
        timeout: float,
        alive: Sequence[Service] | None = None,
        interval: float = 0.5,
    ) -> T:
        """Poll ``condition`` until it returns a truthy value; fail with the services' logs
        when ``timeout`` passes or one of the ``alive`` services (default all) exits."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            for service in self.services if alive is None else alive:
                assert service.running(), f"{service.name} exited while waiting for {what}\n" + (
                    self.diagnostics()
                )
            assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s\n" + (
                self.diagnostics()
            )
            time.sleep(interval)

    # --- the webserver's GraphQL, over HTTP as the UI calls it ---------------------------

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.web_port}/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                payload: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # a PythonError answer comes with HTTP 500
            payload = json.loads(exc.read())
        return payload

    def launch(self, job_name: str) -> dict[str, Any]:
        """The UI launchpad's ``launchRun``: no run config, only the ``dagster/from_ui`` tag."""
        params = {
            "selector": {
                "repositoryLocationName": LOCATION,
                "repositoryName": "__repository__",
                "jobName": job_name,
            },
            "runConfigData": {},
            "executionMetadata": {"tags": [{"key": "dagster/from_ui", "value": "true"}]},
        }
        payload = self.graphql(LAUNCH_RUN, {"executionParams": params})
        result: dict[str, Any] = (payload.get("data") or {}).get("launchRun") or {
            "__typename": "GraphQLError",
            "message": str(payload.get("errors")),
        }
        return result

    def stop_schedules(self) -> None:
        """Stop every schedule of the code location with the UI's ``stopRunningSchedule``."""
        payload = self.graphql(SCHEDULES, {"location": LOCATION})
        schedules = payload["data"]["schedulesOrError"]["results"]
        assert len(schedules) == len(TASKS), payload
        for schedule in schedules:
            answer = self.graphql(STOP_SCHEDULE, {"id": schedule["scheduleState"]["id"]})
            state = answer["data"]["stopRunningSchedule"].get("scheduleState") or {}
            assert state.get("status") == "STOPPED", answer

    def location_loaded(self) -> bool:
        try:
            payload = self.graphql(WORKSPACE)
        except OSError:  # not listening yet
            return False
        entries = ((payload.get("data") or {}).get("workspaceOrError") or {}).get(
            "locationEntries"
        ) or []
        return any(
            e["name"] == LOCATION and e["locationOrLoadError"]["__typename"] == "RepositoryLocation"
            for e in entries
        )

    def code_server_serving(self) -> bool:
        """The standard gRPC health check Dagster's code server answers (what
        ``dagster api grpc-health-check`` and a container's readiness probe ask)."""
        with grpc.insecure_channel(f"127.0.0.1:{self.code_port}") as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=2
                )
            except grpc.RpcError:
                return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def _later_key(dedup_key: str, last_due: datetime) -> bool:
    """Is this the ledger key of a due after ``last_due`` (outside the test's window)?"""
    return dedup_key.startswith("due:") and dedup_key > f"due:{_due(last_due)}"


def _timing(record: dg.RunRecord) -> str:
    """When a run was created, started and ended (for the report)."""

    def clock(timestamp: float | None) -> str:
        return (
            "--:--:--"
            if timestamp is None
            else f"{datetime.fromtimestamp(timestamp, UTC):%H:%M:%S}"
        )

    run = record.dagster_run
    return (
        f"{clock(record.create_timestamp.timestamp())} run {run.run_id[:8]} {run.job_name} "
        f"due={run.tags.get(t.TAG_DUE, '-')} started {clock(record.start_time)} "
        f"ended {clock(record.end_time)} {run.status.value}"
    )


def _entries() -> list[dict[str, Any]]:
    """Every ledger entry, through the CLI as an operator reads them."""
    result = CliRunner().invoke(dueledger, ["runs", "list", "--json", "--limit", "200"])
    assert result.exit_code == 0, result.output
    listing = json.loads(result.output)
    assert listing["next_cursor"] is None, "more entries than one page"
    entries: list[dict[str, Any]] = listing["entries"]
    return entries


def _hold_task_pools(instance: dg.DagsterInstance, slots: int) -> None:
    # What `dagster instance concurrency set <task> <slots>` does, for every task.
    for task in TASKS:
        instance.event_log_storage.set_concurrency_slots(task, slots)


@pytest.fixture
def topology(
    tmp_path: Path, pg_server: PgServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Topology]:
    suffix = uuid.uuid4().hex[:10]
    dagster_db, source_db = f"topo_dagster_{suffix}", f"topo_source_{suffix}"
    ledger_url = pg_server.create_database(dagster_db)  # the ledger shares Dagster's database
    source_url = pg_server.create_database(source_db)
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((ROOT / "deploy" / "dagster.yaml").read_text())
    code_port, web_port = free_port(), free_port()
    workspace = yaml.safe_load((ROOT / "deploy" / "workspace.grpc.yaml").read_text())
    (server,) = workspace["load_from"]
    assert server["grpc_server"]["location_name"] == LOCATION
    server["grpc_server"].update(host="127.0.0.1", port=code_port)
    workspace_file = tmp_path / "workspace.yaml"
    workspace_file.write_text(yaml.safe_dump(workspace))

    dagster_env = {
        "DAGSTER_HOME": str(home),
        "DAGSTER_PG_USERNAME": pg_server.superuser,
        "DAGSTER_PG_PASSWORD": "",  # the throwaway server trusts local users
        "DAGSTER_PG_HOST": pg_server.host,
        "DAGSTER_PG_DB": dagster_db,
        "DAGSTER_PG_PORT": str(pg_server.port),
    }
    ledger_env = {
        ENV_DATABASE_URL: ledger_url,
        ENV_SOURCE_URL: source_url,
        ENV_SLOT_MINUTES: "1",
    }
    # This process reads the same instance and ledger (and audits a 1-minute slot).
    for name, value in {**dagster_env, **ledger_env}.items():
        monkeypatch.setenv(name, value)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "DUELEDGER_"))}
    web_daemon_env = {**base, **dagster_env}
    code_env = {**base, **dagster_env, **ledger_env}

    ledger = RunLedger(database_url=ledger_url)
    ledger.migrate()
    ledger.dispose()
    source = make_engine(source_url)
    create_schema(source)
    source.dispose()

    topo = Topology(
        code=Service(
            "code server",
            [
                str(BIN / "dagster"),
                "api",
                "grpc",
                "-h",
                "127.0.0.1",
                "-p",
                str(code_port),
                "-f",
                str(DEFS),
                "-a",
                "defs",
                "--location-name",
                LOCATION,
            ],
            DEFS.parent,
            code_env,
            tmp_path / "code-server.log",
        ),
        daemon=Service(
            "daemon",
            [str(BIN / "dagster-daemon"), "run", "-w", str(workspace_file)],
            tmp_path,
            web_daemon_env,
            tmp_path / "daemon.log",
        ),
        web=Service(
            "webserver",
            [
                str(BIN / "dagster-webserver"),
                "-h",
                "127.0.0.1",
                "-p",
                str(web_port),
                "-w",
                str(workspace_file),
            ],
            tmp_path,
            web_daemon_env,
            tmp_path / "webserver.log",
        ),
        code_port=code_port,
        web_port=web_port,
    )
    try:
        yield topo
    finally:
        topo.stop()
        pg_server.drop_database(source_db)
        pg_server.drop_database(dagster_db)


def test_a_code_server_restart_loses_no_due_and_no_ui_launch(topology: Topology) -> None:
    topo = topology
    started = time.monotonic()
    with dg.DagsterInstance.get() as instance:

        def runs_for_due(due: datetime) -> list[dg.DagsterRun]:
            return list(instance.get_runs(dg.RunsFilter(tags={t.TAG_DUE: _due(due)})))

        # 1. Deploy procedure, first step: hold every task's pool so no run starts.
        _hold_task_pools(instance, 0)

        # 2. The daemon starts once the code server serves (what a readiness probe gives it):
        # a scheduler that finds no code location records its schedules only at the next
        # minute. The webserver picks the code location up whenever it comes.
        topo.code.start()
        topo.web.start()
        topo.wait_for("code server serving", topo.code_server_serving, 120, [topo.code])
        topo.note("code server serving")
        topo.daemon.start()
        topo.wait_for("webserver loaded the code location", topo.location_loaded, 120)
        topo.wait_for(
            "daemon started the schedules",
            lambda: len(started_schedules(instance)) == len(TASKS),
            120,
        )
        firsts = {
            _ceil_to_minute(datetime.fromtimestamp(s, UTC))
            for s in schedule_start_times(instance).values()
        }
        assert len(firsts) == 1, f"schedules started for different first dues: {firsts}"
        first_due = firsts.pop()
        topo.note(f"webserver and daemon up after {time.monotonic() - started:.0f} s")

        before = topo.launch(f"{FIRST_LAUNCH}_job")
        assert before["__typename"] == "LaunchRunSuccess", before
        launched = [before["run"]["runId"]]
        topo.note(f"UI launch {launched[0][:8]} accepted")
        held = list(launched)

        def all_queued(runs: Sequence[dg.DagsterRun], count: int) -> bool:
            started = [r.run_id for r in runs if r.status not in WAITING]
            assert not started, f"runs {started} got past the held pools\n{topo.diagnostics()}"
            return len(runs) == count and all(r.status == dg.DagsterRunStatus.QUEUED for r in runs)

        if first_due - _now() < RESTART_BUDGET:
            # Too close to the first due for a restart before it: its runs wait too.
            topo.wait_for(
                f"the runs of due {_due(first_due)} queued",
                lambda: all_queued(runs_for_due(first_due), len(TASKS)),
                (first_due - _now()).total_seconds() + 60,
            )
            held += [r.run_id for r in runs_for_due(first_due)]
            topo.note(f"due {_due(first_due)} queued")
        assert all_queued(instance.get_runs(dg.RunsFilter(run_ids=held)), len(held))

        # 3. The code server goes away (a container stopped: SIGTERM, then SIGKILL) while
        # these runs wait in the queue.
        killed_at = _now()
        topo.code.stop(timeout=10)
        topo.note("code server stopped")
        alive = [topo.daemon, topo.web]
        runs_before = instance.get_runs_count()
        refused = topo.launch(f"{SECOND_LAUNCH}_job")
        assert refused["__typename"] != "LaunchRunSuccess", refused
        assert instance.get_runs_count() == runs_before, "a refused launch created a run"
        topo.note(f"UI launch refused while down: {refused['__typename']}")

        # The queue may launch again while the code server is still down.
        _hold_task_pools(instance, 1)

        def requeued() -> bool:
            runs = [instance.get_run_by_id(run_id) for run_id in held]
            failed = [r.run_id for r in runs if r and r.status == dg.DagsterRunStatus.FAILURE]
            assert not failed, (
                f"the run queue failed {failed} while the code server was down "
                "(deploy/dagster.yaml: run_coordinator max_user_code_failure_retries)\n"
                + topo.diagnostics()
            )
            return any(
                len(instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_ENQUEUED)) > 1
                for run_id in held
            )

        topo.wait_for("a waiting run re-queued by the run queue", requeued, 90, alive)
        topo.note("the run queue could not reach the code server and re-queued")

        # 4. The code server again, on the same port.
        topo.code.start()
        topo.wait_for("code server serving again", topo.code_server_serving, 120)
        back_at = _now()
        outage = back_at - killed_at
        topo.note(f"code server serving again ({outage.total_seconds():.0f} s down)")

        refusals: list[str] = []

        def accepted() -> str | None:
            answer = topo.launch(f"{SECOND_LAUNCH}_job")
            if answer["__typename"] == "LaunchRunSuccess":
                return str(answer["run"]["runId"])
            refusals.append(f"{answer['__typename']}: {answer.get('message', '')[:120]}")
            return None

        launched.append(topo.wait_for("a UI launch accepted again", accepted, 90, interval=1))
        web_back = (_now() - back_at).total_seconds()
        topo.note(f"UI launch {launched[-1][:8]} accepted ({len(refusals)} refused before)")

        # The next due after the restart is evaluated on the new code server. A due whose
        # slot boundary fell inside the outage is skipped by Dagster's scheduler (checked below).
        # Later dues keep coming every minute; they are outside the window and not waited for.
        last_due = _ceil_to_minute(back_at + RELOAD_MARGIN)
        dues = [first_due]
        while dues[-1] < last_due:
            dues.append(dues[-1] + timedelta(minutes=1))
        window = {_due(d) for d in dues}
        keys = {f"due:{due}" for due in window} | {f"manual:{run_id}" for run_id in launched}

        def in_window(run: dg.DagsterRun) -> bool:
            return run.run_id in launched or run.tags.get(t.TAG_DUE) in window

        def later(run: dg.DagsterRun) -> bool:
            return run.tags.get(t.TAG_DUE, "") > _due(last_due)

        topo.wait_for(
            f"the runs of due {_due(last_due)}",
            lambda: len(runs_for_due(last_due)) == len(TASKS),
            (last_due - _now()).total_seconds() + 60,
        )
        # The window is complete: stop the schedules as the UI's toggle does, so no more dues
        # load the machine while the runs finish.
        topo.stop_schedules()
        topo.note(f"due {_due(last_due)} queued; schedules stopped")

        def settled() -> bool:
            if any(r.status in ACTIVE for r in instance.get_runs() if in_window(r)):
                return False
            # A run writes its entry's outcome itself; a failed one is settled by a sensor.
            return all(e["status"] not in OPEN for e in _entries() if e["dedup_key"] in keys)

        topo.wait_for(
            "every run of the window ended and its entry settled",
            settled,
            SETTLE_LIMIT.total_seconds(),
            interval=2,
        )
        topo.note("settled")
        all_runs = list(instance.get_runs())
        timings = [_timing(r) for r in instance.get_run_records() if not later(r.dagster_run)]

    topo.stop()
    runs = [r for r in all_runs if not later(r)]
    entries = [e for e in _entries() if not _later_key(e["dedup_key"], last_due)]
    fired = {
        (r.tags[t.TAG_TASK], r.tags[t.TAG_DUE])
        for r in runs
        if r.tags.get(t.TAG_TRIGGER) == Trigger.SCHEDULE
    }
    summary = CliRunner().invoke(dueledger, ["summary", "--json"])
    assert summary.exit_code == 0, summary.output
    missed = {
        (task["task_key"], due)
        for task in json.loads(summary.output)["tasks"]
        for due in task["missed_dues"]
        if due in window
    }
    elapsed = time.monotonic() - started
    skipped = {(task, due) for task in TASKS for due in window} - fired
    report = (
        f"topology: dues {sorted(window)}, skipped in the outage: {sorted(skipped)}, UI "
        f"launches {[r[:8] for r in launched]}; code server down {outage.total_seconds():.0f} s, "
        f"webserver accepted launches {web_back:.0f} s after it was back ({len(refusals)} "
        f"refused: {sorted(set(refusals))}); {len(runs)} runs, {len(entries)} entries; "
        f"{elapsed:.0f} s in all\n" + "\n".join(topo.events + sorted(timings))
    )
    print(report)

    # One success entry per task and due, one per accepted UI launch, nothing else.
    expected = {(task, f"due:{due}") for task, due in fired} | {
        (FIRST_LAUNCH, f"manual:{launched[0]}"),
        (SECOND_LAUNCH, f"manual:{launched[1]}"),
    }
    got = [(e["task_key"], e["dedup_key"]) for e in entries]
    assert sorted(got) == sorted(expected), report + "\n" + topo.diagnostics()
    bad = [e for e in entries if e["status"] != Status.SUCCESS or len(e["run_ids"]) != 1]
    assert not bad, report + "\n" + json.dumps(bad, indent=1)
    manual = {e["dedup_key"]: e for e in entries if e["trigger"] == Trigger.MANUAL}
    for run_id in launched:
        assert manual[f"manual:{run_id}"]["run_ids"] == [run_id]
        assert manual[f"manual:{run_id}"]["operator"] == "dagster-ui"
    # Every Dagster run succeeded: none was failed by the queue, none ran twice, and no run
    # came from anything but the schedules and the two launches.
    assert all(in_window(r) for r in runs), report
    assert {r.status for r in runs} == {dg.DagsterRunStatus.SUCCESS}, report
    assert len(runs) == len(entries), report
    # Only a due whose boundary fell while the code server was down (or the daemon had not
    # reconnected yet) may be skipped, and not silently: the audit names it.
    outage_dues = {_due(d) for d in dues if killed_at < d < back_at + RELOAD_MARGIN}
    assert {due for _, due in skipped} <= outage_dues, report
    assert missed == skipped, (missed, report)
