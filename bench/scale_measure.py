"""The measurements of ``bench/scale.py``, one code location at a time (see its docstring).

- :func:`load_location`: ``dagster definitions validate`` on the location (loaded in process
  as a code server loads it, every job resolved, the snapshot built): CPU seconds and peak
  resident memory of that process;
- :func:`session`: ``dagster dev`` on the location, on a fresh ``DAGSTER_HOME`` seeded from
  ``dagster.yaml.local``; its start-up, then a window of whole slots (starting just before a
  slot boundary): the CPU of the whole process tree, the due -> ``RUN_START`` latency of the
  scheduled runs of the window, and the rows Dagster and the ledger stored during it;
- :func:`scheduler_iteration`: one iteration of Dagster's real scheduler daemon at a slot
  boundary, in this process (``tests/dagster_internals.py``, ``MockedRunLauncher``).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import _paths  # first: puts the project and tests/ on sys.path

# isort: split

import dagster as dg
from idle import location_loaded, tree_cpu
from pg_server import free_port  # tests/pg_server.py
from processes import start_group, stop_group  # tests/processes.py
from scale_location import DUELEDGER, Location

SCHEDULED_TIME_TAG = ".dagster/scheduled_execution_time"  # Dagster's hidden schedule tag
SCHEDULE_TAG = "dagster/schedule_name"
#: What a dagster dev or code server may take to load 500 tasks on a busy machine.
LOAD_TIMEOUT = 900.0


def base_env(location: Location, home: Path) -> dict[str, str]:
    """This process's environment without any DAGSTER_/DUELEDGER_ setting, plus the
    location's and a fresh home (the ledger in it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "DUELEDGER_"))}
    env.update(location.env)
    env["DAGSTER_HOME"] = str(home)
    env["DUELEDGER_DATABASE_URL"] = f"sqlite:///{home / 'ledger.sqlite'}"
    return env


@dataclass(frozen=True)
class Cost:
    cpu: float
    peak_mib: float
    ok: bool


#: What the plugin loader logs for each plugin task it refuses (services/task_plugins.py).
LOAD_ERROR_MARK = b'"task_plugin_load_error"'


def load_location(location: Location, work: Path) -> Cost:
    """``dagster definitions validate`` on ``location``: Dagster loads the code location in
    process as a code server does -- imports it, resolves every job, builds the repository's
    snapshot -- and exits. CPU (user + system) and peak resident memory of that process."""
    home = Path(tempfile.mkdtemp(prefix=f"load-{location.side}-", dir=work))
    cmd = [sys.executable, "-m", "dagster", "definitions", "validate"]
    cmd += ["-f", str(location.path), "-d", str(location.path.parent)]
    with (home / "validate.log").open("ab") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=location.path.parent,
            env=base_env(location, home),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    # A plugin task that fails to load is logged, not raised: the location still validates,
    # with fewer tasks. Such a load measured something else; it counts as failed.
    complete = LOAD_ERROR_MARK not in (home / "validate.log").read_bytes()
    return Cost(
        usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, proc.returncode == 0 and complete
    )


# --- a dagster dev session --------------------------------------------------------------------


@dataclass
class Session:
    """One ``dagster dev`` session on a location (see the module docstring)."""

    side: str
    n: int
    startup_cpu: float
    startup_wall: float
    window_cpu: float
    window_wall: float
    boundaries: int
    processes: int
    latencies: list[float] = field(default_factory=list)  # due -> RUN_START, seconds
    not_started: int = 0  # scheduled runs of the window that never started
    failed: int = 0  # scheduled runs of the window that ended FAILURE or CANCELED
    rows: dict[str, int] = field(default_factory=dict)  # stored during the window

    @property
    def percent(self) -> float:
        return 100.0 * self.window_cpu / self.window_wall if self.window_wall else 0.0

    def per_day(self, kind: str) -> float:
        return self.rows.get(kind, 0) * 86400.0 / self.window_wall if self.window_wall else 0.0


def _count(db: Path, table: str) -> int:
    for _ in range(20):  # a writer may hold the lock for a moment
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
                return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return 0
            time.sleep(0.2)
    raise RuntimeError(f"cannot count {table} in {db}")


def stored_rows(home: Path) -> dict[str, int]:
    """Rows Dagster's SQLite storage (its default layout under ``DAGSTER_HOME``) and the
    ledger hold: ticks, runs, event rows (every event log shard: one per run, the index and
    the runless one), ledger rows (entries, audit, alert deliveries)."""
    rows = {"ticks": 0, "runs": 0, "events": 0, "ledger": 0}
    schedules = home / "schedules" / "schedules.db"
    if schedules.exists():
        rows["ticks"] = _count(schedules, "job_ticks")
    history = home / "history"
    if (history / "runs.db").exists():
        rows["runs"] = _count(history / "runs.db", "runs")
    for db in sorted((history / "runs").glob("*.db")):
        rows["events"] += _count(db, "event_logs")
    ledger = home / "ledger.sqlite"
    if ledger.exists():
        for table in ("dueledger_entries", "dueledger_audit", "dueledger_alert_deliveries"):
            rows["ledger"] += _count(ledger, table)
    return rows


def next_window_start(now: datetime, slot_minutes: int, lead: float) -> float:
    """Seconds from ``now`` until ``lead`` seconds before the next slot boundary that is at
    least that far away: every window then sees its boundaries at the same offsets."""
    slot = slot_minutes * 60
    epoch = now.timestamp()
    boundary = (epoch // slot + 1) * slot
    if boundary - lead < epoch:
        boundary += slot
    return boundary - lead - epoch


def _latencies(home: Path, since: float, until: float, wait: float) -> tuple[list[float], int, int]:
    """Due -> RUN_START of the scheduled runs created in ``[since, until]``; waits up to
    ``wait`` seconds for them to start. Returns the latencies, how many never started, and
    how many ended FAILURE or CANCELED."""
    previous = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        with dg.DagsterInstance.get() as instance:
            deadline = time.monotonic() + wait
            while True:
                records = [
                    r
                    for r in instance.get_run_records(
                        filters=dg.RunsFilter(
                            created_after=datetime.fromtimestamp(since, UTC),
                            created_before=datetime.fromtimestamp(until, UTC),
                        )
                    )
                    if SCHEDULE_TAG in r.dagster_run.tags
                ]
                starts = {}
                for record in records:
                    run_id = record.dagster_run.run_id
                    found = instance.get_records_for_run(
                        run_id, of_type=dg.DagsterEventType.RUN_START, limit=1
                    ).records
                    if found:
                        starts[run_id] = found[0].timestamp
                pending = [r for r in records if r.dagster_run.run_id not in starts]
                if not pending or time.monotonic() > deadline:
                    break
                time.sleep(2)
            latencies = []
            for record in records:
                start = starts.get(record.dagster_run.run_id)
                due = record.dagster_run.tags.get(SCHEDULED_TIME_TAG)
                if start is not None and due:
                    latencies.append(start - datetime.fromisoformat(due).timestamp())
            failed = (
                sum(
                    r.dagster_run.status
                    in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
                    for r in instance.get_run_records(
                        filters=dg.RunsFilter(run_ids=[r.dagster_run.run_id for r in records])
                    )
                )
                if records
                else 0
            )
            return sorted(latencies), len(pending), failed
    finally:
        if previous is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = previous


def session(
    location: Location,
    work: Path,
    *,
    window: float,
    settle: float,
    latency_wait: float = 300.0,
) -> Session:
    """``dagster dev`` on ``location``: start-up, then a window starting shortly (20 s, or a
    third of a short window) before a slot boundary (see the module docstring)."""
    lead = min(20.0, window / 3)
    run_dir = Path(tempfile.mkdtemp(prefix=f"dev-{location.side}-{location.n}-", dir=work))
    home = run_dir / "home"
    home.mkdir()
    shutil.copyfile(_paths.ROOT / "dagster.yaml.local", home / "dagster.yaml")
    workspace = run_dir / "workspace.yaml"
    workspace.write_text(json.dumps(location.workspace()))
    port = free_port()
    cmd = [sys.executable, "-m", "dagster", "dev", "-w", str(workspace)]
    cmd += ["-h", "127.0.0.1", "-p", str(port)]
    log_path = run_dir / "dagster-dev.log"
    started = time.monotonic()
    with log_path.open("wb") as log:
        proc = start_group(cmd, cwd=location.path.parent, env=base_env(location, home), log=log)
        try:
            while not location_loaded(port):
                if proc.poll() is not None or time.monotonic() > started + LOAD_TIMEOUT:
                    raise RuntimeError(
                        f"dagster dev on {location.side} N={location.n} did not load: "
                        + log_path.read_text(errors="replace")[-3000:]
                    )
                time.sleep(1)
            startup_wall = time.monotonic() - started
            startup_cpu, _ = tree_cpu(proc.pid)
            time.sleep(settle)
            time.sleep(next_window_start(datetime.now(UTC), location.slot_minutes, lead))
            rows0 = stored_rows(home)
            cpu0, _ = tree_cpu(proc.pid)
            t0, w0 = time.time(), time.monotonic()
            time.sleep(window)
            cpu1, count = tree_cpu(proc.pid)
            t1, wall = time.time(), time.monotonic() - w0
            rows1 = stored_rows(home)
            latencies, not_started, failed = _latencies(home, t0, t1, latency_wait)
        finally:
            stop_group(proc, timeout=5)  # a throwaway home: no need to wait for a clean stop
    slot = location.slot_minutes * 60
    boundaries = int(t1 // slot) - int(t0 // slot)
    result = Session(
        location.side,
        location.n,
        startup_cpu,
        startup_wall,
        cpu1 - cpu0,
        wall,
        boundaries,
        count,
        latencies,
        not_started,
        failed,
        {k: rows1[k] - rows0[k] for k in rows1},
    )
    print(
        f"  {location.side} N={location.n}: start-up {startup_cpu:.1f} CPU-s in "
        f"{startup_wall:.0f} s; window {wall:.0f} s ({boundaries} slot boundaries): "
        f"{result.percent:.2f} % of a core, {len(latencies)} scheduled runs started "
        f"({not_started} never), rows {result.rows}",
        file=sys.stderr,
        flush=True,
    )
    return result


# --- one scheduler iteration at a slot boundary, in this process ------------------------------


@dataclass(frozen=True)
class Iteration:
    wall: float
    cpu: float
    dues: int  # runs created (one per due schedule)
    problems: tuple[str, ...] = ()


def scheduler_iteration(location: Location, boundary: datetime, instance_dir: Path) -> Iteration:
    """Dagster's scheduler daemon, one iteration at ``boundary`` (the daemon was up half a
    minute before): its wall and CPU seconds (this process), and the runs it created."""
    # Imported here: tests/dagster_internals.py drives Dagster's daemon internals, which
    # only this measurement needs (the sessions run the real processes).
    from dagster_internals import CodeTarget, daemon_instance, daemon_workspace, run_scheduler_tick

    target = CodeTarget.from_file(
        location.path, "defs", location_name=f"{location.location_name}_{location.n}"
    )
    with (
        daemon_instance("mocked", temp_dir=instance_dir) as instance,
        daemon_workspace(instance, target) as ctx,
    ):
        times: dict[str, Any] = {}  # one long-lived daemon across both iterations
        # Half a minute before: past the previous boundary even on 1-minute slots.
        run_scheduler_tick(ctx, boundary - timedelta(seconds=30), iteration_times=times)
        before = instance.get_runs_count()
        started, cpu_started = time.perf_counter(), time.process_time()
        run_scheduler_tick(ctx, boundary + timedelta(seconds=1), iteration_times=times)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        runs = list(instance.get_runs())
        problems = []
        if before:
            problems.append(f"{location.side} N={location.n}: runs before the boundary")
        names = [r.tags.get(SCHEDULE_TAG) for r in runs]
        if len(set(names)) != len(runs):
            problems.append(f"{location.side} N={location.n}: two runs for one schedule")
        if location.side == DUELEDGER:
            due = boundary.strftime("%Y-%m-%dT%H:%M:%SZ")
            unkeyed = [r for r in runs if r.tags.get("dagster/run_key") != due]
            if unkeyed:
                problems.append(f"dueledger N={location.n}: {len(unkeyed)} runs not keyed {due}")
        return Iteration(wall, cpu, len(runs), tuple(problems))
