"""Hosts apart, with real network faults: every service on its own machine -- a Linux network
namespace with its own address (tests/deploy/netns.py) -- and partitions made by pulling a
machine's cable (its switch port down), bounded in time and healed in any case.

Machines: PostgreSQL (Dagster's storage, the ledger, claim log and effect sink), daemon A,
daemon B, the code server, the webserver, the run workers (the code server starts each run
worker on the ``wrk`` machine) and the test's own (``ctl``). The deployment is
``deploy/dagster.yaml`` + ``deploy/workspace.grpc.yaml``, the code location
tests/deploy/cluster_defs.py (the first task pauses mid-run so a fault can land there), the
lease 20 s (timeout 15 s).

Faults, in order, over three one-minute dues T0, T0+1, T0+2:

1. daemon B partitioned from T0-12 s to T0+45 s: daemon A fires and runs everything;
2. the run workers' machine partitioned from PostgreSQL while the first task's run of T0 holds
   its lease, until the ledger has taken the entry from that run -- the reclaim sensor (on the
   daemons, which still reach PostgreSQL) once the lease expired (``lease_reclaimed``), or the
   outcome sensor once Dagster's run monitoring ended the run at its timeout (an attempt
   failed ``timeout``; the timeout is shorter than the lease, so which comes first depends on
   the two sensors' phases); then healed: the frozen worker commits nothing after that, and
   the due is not run twice;
3. PostgreSQL restarted (``pg_ctl restart -m fast``) 5 s after T0+1, runs in flight;
4. the code server partitioned from T0+2 - 8 s to T0+2 + 15 s: schedule evaluations and
   launches fail meanwhile; the due is fired after it heals, or reported missed.

Then the history of every due is checked (tests/history): one effect per due, none after its
claim ended, every due classified in time (or missed with why), every failed run visible.

Size: ``DUELEDGER_CLUSTER_TASKS`` tasks (default 4): 12 dues, about 5 minutes on a 2-core
machine. Root only (``ip netns``); marked ``cluster``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pg_server
import pytest
import sqlalchemy as sa
from cluster import (
    ACTIVE,
    LOCATION,
    OPEN,
    SCHEDULES,
    HistoryInputs,
    Observer,
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
from netns import Lab, remove_stale_labs

from orchestration.task_spec import TaskSpec, build_views
from orchestration.timetable import EverySlots
from resources.core import tags as t
from resources.core.settings import ENV_DATABASE_URL
from resources.ledger import RunLedger

pytestmark = [pytest.mark.daemon, pytest.mark.cluster, pytest.mark.timeout(1800)]

HOSTS = ("pg", "da", "db", "code", "web", "wrk", "ctl")
TASKS = int(os.environ.get("DUELEDGER_CLUSTER_TASKS") or 4)
SLOTS = 3
LEASE = timedelta(seconds=20)
SLOW_SECONDS = 12
WINDOW = timedelta(minutes=6)
CODE_PORT, WEB_PORT = 4000, 3000
CLI = Path(sys.executable).with_name("dueledger")


@pytest.fixture
def lab() -> Iterator[Lab]:
    remove_stale_labs()
    made = Lab(HOSTS)
    try:
        made.create()
        yield made
    finally:
        made.destroy()


@pytest.fixture
def pg(lab: Lab) -> Iterator[pg_server.PgServer]:
    """A throwaway PostgreSQL server on the ``pg`` machine."""
    server = lab.run_in(
        "pg",
        lambda: pg_server.start_server(
            listen_address=lab.address("pg"), trusted_network=lab.network
        ),
    )
    watchdog = pg_server.start_watchdog(server)
    try:
        yield server
    finally:
        server.stop(remove=True)
        watchdog.kill()
        watchdog.wait()


def _views():
    specs = [
        TaskSpec(
            key=f"cluster_{i:02d}",
            rule=EverySlots(1),
            declared_cadence="every slot",
            timeout=LEASE * 3 / 4,
            lease_ttl=LEASE,
            # Short: the fault budgets hold, and retries still wait at their claim.
            retry_backoff=timedelta(seconds=2),
            max_attempts=2,
        )
        for i in range(TASKS)
    ]
    return build_views(specs, 1, "UTC")


def _sleep_until(when: datetime) -> None:
    time.sleep(max(0.0, (when - now()).total_seconds()))


def test_services_on_separate_hosts_survive_partitions_and_a_postgres_restart(
    lab: Lab, pg: pg_server.PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    views = _views()
    tasks = [v.spec.key for v in views]
    started = time.monotonic()
    with lab.inside("ctl"):
        database = f"ns_{uuid.uuid4().hex[:10]}"
        ledger_url = pg.create_database(database)
        dagster_env = write_instance(
            tmp_path / "home",
            {"user": pg.superuser, "host": pg.host, "port": str(pg.port), "db": database},
        )
        prepare_database(ledger_url)
        for name, value in {**dagster_env, ENV_DATABASE_URL: ledger_url}.items():
            monkeypatch.setenv(name, value)
        workspace = write_workspace(tmp_path / "workspace.yaml", lab.address("code"), CODE_PORT)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "DUELEDGER_"))}
        env = {**base, **dagster_env}
        wrapper = lab.wrapper("wrk", sys.executable, tmp_path, {"CLUSTER_HOST": "wrk"})
        code_env = {
            **env,
            ENV_DATABASE_URL: ledger_url,
            "CLUSTER_TASKS": str(TASKS),
            "CLUSTER_LEASE_SECONDS": str(LEASE.total_seconds()),
            "CLUSTER_SLOW_SECONDS": str(SLOW_SECONDS),
            "CLUSTER_HOST": "code",
            "CLUSTER_WORKER_EXECUTABLE": str(wrapper),
        }
        code = code_server(
            lab.address("code"), CODE_PORT, code_env, tmp_path / "code.log", lab.ns("code")
        )
        daemon_a = daemon("daemon A", workspace, env, tmp_path / "daemon-A.log", lab.ns("da"))
        daemon_b = daemon("daemon B", workspace, env, tmp_path / "daemon-B.log", lab.ns("db"))
        web = webserver(
            "webserver",
            lab.address("web"),
            WEB_PORT,
            workspace,
            env,
            tmp_path / "web.log",
            lab.ns("web"),
        )
        web_url = f"http://{lab.address('web')}:{WEB_PORT}"
        services = [code, daemon_a, daemon_b, web]
        observer = Observer(ledger_url)

        def why() -> str:
            return "\n".join(f"--- {s.name} ---\n{s.tail()}" for s in services) + (
                "\n" + "\n".join(json.dumps(f) for f in observer.faults)
            )

        def fault(kind: str, target: str, **detail: object) -> None:
            observer.fault(kind, target, **detail)

        try:
            code.start()
            wait_for(
                "code server serving", lambda: serving(lab.address("code"), CODE_PORT), 120, why
            )
            for service in (daemon_a, daemon_b, web):
                service.start()
            with dg.DagsterInstance.get() as instance:
                wait_for(
                    "the schedules started",
                    lambda: len(started_schedules(instance)) == TASKS,
                    180,
                    why,
                )
                first = min(
                    ceil_minute(datetime.fromtimestamp(s, UTC))
                    for s in schedule_start_times(instance).values()
                )
                while (first - now()).total_seconds() < 20:
                    first += timedelta(minutes=1)  # room to cut daemon B off before it
                dues = [first + timedelta(minutes=k) for k in range(SLOTS)]
                observer.start()

                # 1. daemon B cut off across the first due.
                _sleep_until(dues[0] - timedelta(seconds=12))
                lab.partition("db")
                fault("partition", "daemon B")
                try:
                    # 2. the run workers' machine cut off while the slow run holds its lease.
                    slow_run, slow_entry = wait_for(
                        "the first task's run of the first due claimed",
                        lambda: _claim_of(ledger_url, tasks[0], dues[0]),
                        120,
                        why,
                        interval=0.3,
                    )
                    lab.partition("wrk")
                    fault("partition", "run workers", run=slow_run, entry=slow_entry)
                    try:
                        wait_for(
                            f"entry {slow_entry} taken from its run while its worker is cut off",
                            lambda: observer.release_of(slow_entry),
                            150,
                            why,
                        )
                    finally:
                        lab.heal("wrk")
                        fault("heal", "run workers")
                    healed_workers_at = now()
                    _sleep_until(dues[0] + timedelta(seconds=45))
                finally:
                    lab.heal("db")
                    fault("heal", "daemon B")

                # 3. PostgreSQL restarted while the second due's runs work.
                _sleep_until(dues[1] + timedelta(seconds=5))
                fault("pg_restart", "postgresql")
                lab.run_in("pg", lambda: pg.restart("fast"))
                fault("pg_restarted", "postgresql")

                # 4. the code server cut off across the third due.
                _sleep_until(dues[2] - timedelta(seconds=8))
                lab.partition("code")
                fault("partition", "code server")
                try:
                    _sleep_until(dues[2] + timedelta(seconds=15))
                finally:
                    lab.heal("code")
                    fault("heal", "code server")
                wait_for(
                    "the code server serving again",
                    lambda: serving(lab.address("code"), CODE_PORT),
                    60,
                    why,
                )
                time.sleep(20)  # the scheduler's next evaluation after the outage
                wait_for(
                    "the webserver lists the schedules again",
                    lambda: _listed(web_url, TASKS),
                    120,
                    why,
                    interval=2,
                )
                stop_schedules(web_url, TASKS)
                window = {due_text(d) for d in dues}

                def settled() -> bool:
                    runs = [
                        r for r in task_runs(instance, tasks) if r.tags.get(t.TAG_DUE) in window
                    ]
                    if any(r.status in ACTIVE for r in runs):
                        return False
                    ledger = RunLedger(database_url=ledger_url)
                    try:
                        entries = ledger.list_entries(limit=500)[0]
                    finally:
                        ledger.dispose()
                    if now() <= dues[-1] + timedelta(minutes=1) or any(
                        e.status in OPEN for e in entries
                    ):
                        return False
                    # A run that failed before it claimed is traced at the outcome sensor's
                    # next tick: wait for it, as the history's checker expects it traced.
                    ran = [(r.run_id, r.status.value, r.tags.get(t.TAG_OUTCOME)) for r in runs]
                    return not untraced_failed_runs(ran, (e.to_json() for e in entries))

                wait_for("every run ended and every entry settled", settled, 420, why, interval=3)
                observer.stop_event.set()
                observer.join(timeout=10)
                path = tmp_path / "history.jsonl"
                inputs = HistoryInputs(
                    source="network namespaces",
                    tasks=tasks,
                    views=views,
                    dues=dues,
                    lease_ttl=LEASE,
                    window=WINDOW,
                    extra=[*observer.faults, *observer.releases.values()],
                )
                records = write_history(path, inputs, instance, ledger_url)
            summary = subprocess.run(
                [str(CLI), "summary", "--json"],
                capture_output=True,
                text=True,
                env={**env, ENV_DATABASE_URL: ledger_url},
                timeout=120,
            )
        finally:
            observer.stop_event.set()
            for service in services:
                service.stop()

    assert summary.returncode == 0, summary.stdout + summary.stderr
    violations = check(records)
    found = figures(records, violations)
    release = observer.release_of(slow_entry)
    assert release is not None
    late = [
        r
        for r in records
        if r["type"] == "effect" and r["run_id"] == slow_run and r["at"] > release["at"]
    ]
    refused = next(r for r in records if r["type"] == "entry" and r["id"] == slow_entry)
    report = (
        f"netns topology: {json.dumps(found)}; slow run {slow_run} released ({release['how']}, "
        f"{release['failure_kind']}) at {release['at']}, "
        f"workers healed {healed_workers_at:%H:%M:%S}, "
        f"{len(refused['summary']['late_job_rejections'])} rejections traced on its entry; "
        f"{time.monotonic() - started:.0f} s; history {path}"
    )
    print(report)
    assert not violations, report + "\n" + "\n".join(map(str, violations[:40]))
    assert not late, late
    # The ledger took the entry from the frozen run one of two ways, whichever came first (the
    # sensors' phases decide): the reclaim sensor once its lease expired -- the entry ends
    # failed, lease_reclaimed, and Dagster's retry is turned off -- or the outcome sensor once
    # Dagster's run monitoring ended the run at its timeout (dagster/max_runtime, shorter than
    # the lease): that attempt failed with kind timeout, and the entry went on to a retry.
    # Either way the worker, healed, committed nothing after it (``late`` above).
    assert release["run_id"] == slow_run, release
    if release["how"] == "reclaim":
        assert (refused["status"], refused["failure_kind"]) == ("failed", "lease_reclaimed"), (
            refused
        )
    else:
        # First seen ``timeout``, or already ``dispatch`` when Dagster's retry failed to start
        # (the workers still cut off) before the outcome sensor's tick that took both ends.
        assert release["how"] == "fail", release
        assert release["failure_kind"] in ("timeout", "dispatch"), release
        assert slow_run in refused["run_ids"], refused
    assert found["dues"] == TASKS * SLOTS and not observer.errors, report
    # The work was done, not only kept from doubling: every due was claimed by a run that
    # reached its body -- but a due whose boundary fell while the code server was cut off:
    # when both daemons' evaluations of its tick failed, Dagster's scheduler drops the tick
    # (it retries a failed tick once), and then `summary` must report the due missed, with
    # why (the checker holds every due classified).
    missed = {(r["task"], r["due"]) for r in records if r["type"] == "missed"}
    assert {due for _, due in missed} <= {due_text(dues[2])}, report
    claimed = {(e["task_key"], e["due"]) for e in records if e["type"] == "entry" and e["run_ids"]}
    every = {(task, due_text(d)) for task in tasks for d in dues}
    assert every - claimed <= missed, (sorted(every - claimed - missed), report)
    assert found["effects"] > 0, report
    entries = [r for r in records if r["type"] == "entry"]
    totals = json.loads(summary.stdout)
    assert totals["failed_24h"] == sum(e["status"] == "failed" for e in entries), totals


def _claim_of(ledger_url: str, task: str, due: datetime) -> tuple[str, int] | None:
    """(run id, entry id) of the claim logged for ``task``'s due, once there is one."""
    query = sa.text(
        "SELECT c.run_id, c.entry_id FROM history_claims c "
        "JOIN dueledger_entries e ON e.id = c.entry_id "
        "WHERE e.task_key = :task AND e.dedup_key = :key ORDER BY c.id LIMIT 1"
    )
    engine = sa.create_engine(ledger_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(query, {"task": task, "key": f"due:{due_text(due)}"}).first()
    finally:
        engine.dispose()
    return (row.run_id, int(row.entry_id)) if row else None


def _listed(web_url: str, count: int) -> bool:
    try:
        payload = graphql(web_url, SCHEDULES, {"location": LOCATION})
    except OSError:
        return False
    results = ((payload.get("data") or {}).get("schedulesOrError") or {}).get("results") or []
    return len(results) == count
