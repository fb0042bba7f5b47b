"""Two active daemons: two ``dagster-daemon run`` and two ``dagster-webserver`` on one PostgreSQL
(Dagster's storage and the ledger in one database), one code server, all reaching it through
``deploy/workspace.grpc.yaml`` -- the supported active-active topology of docs/deployment.md.

Both daemons run every daemon (scheduler, sensors, run queue, run monitoring, run retries), so
a due may be fired by both and a queued run dequeued by both. While the dues of the window
come, one daemon at a time is SIGKILLed at a random moment and started again a random while
later; the other is never down at the same time. Afterwards the history (tests/history) of
every due is checked: one side effect per due from one claim held by one process, the other
daemon's run refused (``dueledger/outcome=refused``, not a failure in ``summary``), every due
classified -- none missed -- and every failed run visible.

Size: ``DUELEDGER_CLUSTER_TASKS`` tasks (default 8) for ``DUELEDGER_CLUSTER_SLOTS`` one-minute
slots (default 2): 16 dues, about 3 minutes on a 2-core machine. Full size
(docs/reliability.md): 20 tasks x 25 slots = 500 dues. ``DUELEDGER_CLUSTER_SEED`` replays
the kill times. Marked ``cluster``: ``-m "not cluster"`` leaves it out.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
from cluster import (
    ACTIVE,
    LOCATION,
    OPEN,
    SCHEDULES,
    HistoryInputs,
    Observer,
    Service,
    ceil_minute,
    code_server,
    daemon,
    due_text,
    graphql,
    now,
    prepare_database,
    serving,
    stop_schedules,
    task_runs,
    wait_for,
    webserver,
    write_history,
    write_instance,
    write_workspace,
)
from dagster_internals import schedule_start_times, started_schedules
from history.history_checker import check, figures, untraced_failed_runs
from pg_server import PgServer, free_port

from orchestration.task_spec import TaskSpec, build_views
from orchestration.timetable import EverySlots
from resources.core import tags as t
from resources.core.settings import ENV_DATABASE_URL
from resources.ledger import RunLedger

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.daemon,
    pytest.mark.cluster,
    pytest.mark.timeout(3600),
]

TASKS = int(os.environ.get("DUELEDGER_CLUSTER_TASKS") or 8)
SLOTS = int(os.environ.get("DUELEDGER_CLUSTER_SLOTS") or 2)
LEASE_TTL = timedelta(seconds=40)  # cluster_defs.LEASE_TTL
#: A due must be settled this long after it (plus the lease TTL): the queue drains after the
#: last due at the machine's pace (each run worker a fresh process).
WINDOW = timedelta(minutes=6)
DOWN_SECONDS = (15.0, 45.0)
CLI = Path(sys.executable).with_name("dueledger")


@dataclass
class Cluster:
    code: Service
    daemons: list[Service]
    webs: list[Service]
    web_urls: list[str]
    ledger_url: str
    env: dict[str, str]
    code_port: int

    @property
    def services(self) -> list[Service]:
        return [self.code, *self.daemons, *self.webs]

    def why(self) -> str:
        return "\n".join(f"--- {s.name} ---\n{s.tail()}" for s in self.services)


@pytest.fixture
def cluster(
    tmp_path: Path, pg_server: PgServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    database = f"aa_{uuid.uuid4().hex[:10]}"
    ledger_url = pg_server.create_database(database)
    dagster_env = write_instance(
        tmp_path / "home",
        {
            "user": pg_server.superuser,
            "host": pg_server.host,
            "port": str(pg_server.port),
            "db": database,
        },
    )
    prepare_database(ledger_url)
    port = free_port()
    workspace = write_workspace(tmp_path / "workspace.yaml", "127.0.0.1", port)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "DUELEDGER_"))}
    code_env = {
        **base,
        **dagster_env,
        ENV_DATABASE_URL: ledger_url,
        "CLUSTER_TASKS": str(TASKS),
        "CLUSTER_HOST": "loopback",
    }
    web_ports = [free_port(), free_port()]
    env = {**base, **dagster_env}
    for name, value in {**dagster_env, ENV_DATABASE_URL: ledger_url}.items():
        monkeypatch.setenv(name, value)
    made = Cluster(
        code=code_server("127.0.0.1", port, code_env, tmp_path / "code.log"),
        daemons=[daemon(f"daemon {n}", workspace, env, tmp_path / f"daemon-{n}.log") for n in "AB"],
        webs=[
            webserver(f"webserver {n}", "127.0.0.1", p, workspace, env, tmp_path / f"web-{n}.log")
            for n, p in zip("AB", web_ports, strict=True)
        ],
        web_urls=[f"http://127.0.0.1:{p}" for p in web_ports],
        ledger_url=ledger_url,
        env=env,
        code_port=port,
    )
    try:
        yield made
    finally:
        for service in made.services:
            service.stop()
        pg_server.drop_database(database)


class DaemonKiller(threading.Thread):
    """Kills one daemon at a time with SIGKILL at random moments until ``until``, and starts
    it again after a random outage; never both down."""

    def __init__(self, cluster: Cluster, rng: random.Random, until: float, observer: Observer):
        super().__init__(name="daemon-killer", daemon=True)
        self.cluster, self.rng, self.until, self.observer = cluster, rng, until, observer
        self.kills = 0
        self.errors: list[BaseException] = []
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop.wait(self.rng.uniform(5.0, 35.0)) and time.monotonic() < self.until:
                victim = self.rng.choice(self.cluster.daemons)
                victim.kill9()
                self.kills += 1
                self.observer.fault("daemon_kill", victim.name)
                self.stop.wait(self.rng.uniform(*DOWN_SECONDS))
                victim.start()
                self.observer.fault("daemon_restart", victim.name)
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)


def _views():
    specs = [
        TaskSpec(
            key=f"cluster_{i:02d}",
            rule=EverySlots(1),
            declared_cadence="every slot",
            timeout=timedelta(seconds=30),
            lease_ttl=LEASE_TTL,
            # Short: the fault budgets hold, and retries still wait at their claim.
            retry_backoff=timedelta(seconds=2),
            max_attempts=2,
        )
        for i in range(TASKS)
    ]
    return build_views(specs, 1, "UTC")


def test_two_active_daemons_run_every_due_once_through_random_kill_9s(
    cluster: Cluster, tmp_path: Path
) -> None:
    seed = int(os.environ.get("DUELEDGER_CLUSTER_SEED") or time.time_ns() % 1_000_000)
    rng = random.Random(seed)
    views = _views()
    tasks = [v.spec.key for v in views]
    started = time.monotonic()
    cluster.code.start()
    wait_for(
        "code server serving", lambda: serving("127.0.0.1", cluster.code_port), 120, cluster.why
    )
    for service in [*cluster.daemons, *cluster.webs]:
        service.start()
    observer = Observer(cluster.ledger_url)
    killer: DaemonKiller | None = None
    with dg.DagsterInstance.get() as instance:
        try:
            wait_for(
                "the schedules started",
                lambda: len(started_schedules(instance)) == TASKS,
                180,
                cluster.why,
            )
            firsts = {
                ceil_minute(datetime.fromtimestamp(s, UTC))
                for s in schedule_start_times(instance).values()
            }
            first = min(firsts)
            dues = [first + timedelta(minutes=k) for k in range(SLOTS)]
            observer.start()
            killer = DaemonKiller(
                cluster, rng, time.monotonic() + (dues[-1] - now()).total_seconds(), observer
            )
            killer.start()

            last = due_text(dues[-1])

            def last_due_fired() -> bool:
                fired = {
                    r.tags[t.TAG_TASK]
                    for r in task_runs(instance, tasks)
                    if r.tags.get(t.TAG_DUE) == last
                }
                return len(fired) == TASKS

            wait_for(
                f"every task's run of the last due {last}",
                last_due_fired,
                (dues[-1] - now()).total_seconds() + 150,
                cluster.why,
                interval=2,
            )
            killer.stop.set()
            killer.join(timeout=120)
            for daemon_ in cluster.daemons:
                if not daemon_.running():
                    daemon_.start()
            for url in cluster.web_urls:  # both webservers answer for the whole deployment
                listed = graphql(url, SCHEDULES, {"location": LOCATION})
                assert len(listed["data"]["schedulesOrError"]["results"]) == TASKS, listed
            stop_schedules(cluster.web_urls[1], TASKS)
            window = {due_text(d) for d in dues}

            def settled() -> bool:
                runs = [r for r in task_runs(instance, tasks) if r.tags.get(t.TAG_DUE) in window]
                if any(r.status in ACTIVE for r in runs):
                    return False
                ledger = RunLedger(database_url=cluster.ledger_url)
                try:
                    entries = ledger.list_entries(limit=500)[0]
                finally:
                    ledger.dispose()
                if any(e.status in OPEN for e in entries):
                    return False
                # A run that failed before it claimed (run monitoring ends a run a killed
                # daemon left starting, minutes later) is traced by the outcome sensor at its
                # next tick: the history is written once every failed run is in the ledger.
                ran = [(r.run_id, r.status.value, r.tags.get(t.TAG_OUTCOME)) for r in runs]
                return not untraced_failed_runs(ran, (e.to_json() for e in entries))

            wait_for(
                "every run of the window ended and its entry settled",
                settled,
                600,
                cluster.why,
                interval=3,
            )
            observer.stop_event.set()
            observer.join(timeout=10)
            path = tmp_path / "history.jsonl"
            inputs = HistoryInputs(
                source="two active daemons",
                tasks=tasks,
                views=views,
                dues=dues,
                lease_ttl=LEASE_TTL,
                window=WINDOW,
                extra=[*observer.faults, *observer.releases.values()],
            )
            records = write_history(path, inputs, instance, cluster.ledger_url)
        finally:
            if killer is not None:
                killer.stop.set()
            observer.stop_event.set()
            for service in cluster.services:
                service.stop()

    summary = subprocess.run(
        [str(CLI), "summary", "--json"],
        capture_output=True,
        text=True,
        env={**cluster.env, ENV_DATABASE_URL: cluster.ledger_url},
        timeout=120,
    )
    assert summary.returncode == 0, summary.stdout + summary.stderr
    totals = json.loads(summary.stdout)
    violations = check(records)
    found = figures(records, violations)
    scheduled = [r for r in records if r["type"] == "run" and r.get("trigger") == "schedule"]
    both = len(scheduled) - len({(r["task"], r["due"]) for r in scheduled})
    kills = killer.kills if killer else 0
    report = (
        f"active-active seed={seed}: {json.dumps(found)}; daemon kills {kills}; dues fired by "
        f"both daemons: {both}; {time.monotonic() - started:.0f} s; history {path}"
    )
    print(report)
    assert not violations, report + "\n" + "\n".join(map(str, violations[:40])) + cluster.why()
    assert killer is not None and not killer.errors and killer.kills >= 1, report
    assert not observer.errors, observer.errors
    assert found["missed"] == 0 and found["dues"] == TASKS * SLOTS, report
    # The work was done, not only kept from doubling: every due was claimed by a run that
    # reached its body (a run whose body fails at once claims and records nothing).
    assert found["claims"] >= found["dues"] and found["effects"] > 0, report
    entries = [r for r in records if r["type"] == "entry"]
    assert totals["failed_24h"] == sum(e["status"] == "failed" for e in entries), totals
