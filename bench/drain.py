"""Benchmark: how fast the real ``dagster-daemon`` drains a queue of dueledger task runs,
against the same queue of one-asset Dagster jobs with the same daemon configuration.

    uv run --frozen python bench/drain.py [--runs N] [--pairs P] [--backend sqlite|postgres]
                                          [--project LABEL=DIR ...] [--tasks a,b] [--json PATH]

Per workload, one after the other (the baseline first, then every project, ``--pairs``
times): a fresh ``DAGSTER_HOME`` whose ``dagster.yaml`` is ``deploy/dagster.yaml`` --
``QueuedRunCoordinator`` with its dequeue threads, the default run launcher (a subprocess
per run), its concurrency limits, run monitoring and run retries -- with the storage
swapped for SQLite (Dagster's default, under ``DAGSTER_HOME``) or a throwaway PostgreSQL
database (``tests/pg_server.py``), and the dequeue interval at 1 s (as the soak has it).

1. ``dagster-webserver`` starts on the workspace and ``--runs`` runs are submitted through
   its GraphQL API (``DagsterGraphQLClient.submit_job_execution``); the coordinator holds
   them QUEUED, as nothing dequeues yet. The webserver stops (untimed).
2. ``dagster-daemon run`` starts on the same workspace and drains the queue. The figure is
   runs completed per minute from the first dequeue (the first ``RUN_STARTING`` event: the
   coordinator marks a run STARTING as it dequeues and launches it) to the last run's end.

The dueledger runs go round-robin over the manually launchable tasks (``--tasks``: those
named), each with the tags of ``dueledger launch`` (its own request id), so each claims its
own ledger entry; the baseline location has as many one-asset jobs, each asset in its own
pool, and its runs carry ``dueledger/task`` too, so the per-task pools of
``deploy/dagster.yaml`` bind both the same way. Most manually launchable tasks run a domain
rule, which imports pandas and computes on the sample data -- their work, which the
one-asset jobs do not have; ``--tasks ledger_health`` (no pandas: a few reads of the ledger)
comes closest to what dueledger adds around a run (one task: its runs, like the single
baseline job's, go one at a time). ``--bare-executor`` (default ``in_process``, what task jobs use)
chooses the baseline jobs' executor. Sample data is generated first (untimed).

No scheduled run competes with the queue: the processes run with
``DUELEDGER_SLOT_MINUTES=1440``, so every dueledger schedule fires at 00:00 UTC only, and a
workload that would reach midnight (``--allowance`` seconds) waits for it to pass.
``--project LABEL=DIR`` (repeatable) measures another checkout
with this venv, e.g. a worktree of an older commit. Target: >= 0.85x the baseline.

Each workload's log line also gives the median run's start-up (``RUN_STARTING`` to
``RUN_START``: the launch, the worker process, Dagster and the code location loading) and
its execution (``RUN_START`` to the end). The dequeue daemon waits for every launch of an
iteration before it looks at the queue again, so a slower start-up also delays the next
dequeues.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import _paths  # first: puts the project and tests/ on sys.path

# isort: split

import dagster as dg
import yaml
from dagster_graphql import DagsterGraphQLClient
from idle import location_loaded, wait_out_slot_boundary  # same start-up and slot rules
from pg_server import free_port  # tests/pg_server.py
from processes import start_group, stop_group  # tests/processes.py
from run import KIND_CHECK, Row, write_json

AREA = "queue drain"
BARE = "bare"
TARGET_RATIO = 0.85
SLOT_MINUTES = 1440  # schedules fire at midnight only
BENCH_TAG = "dueledger-bench/drain"
TAG_TASK = "dueledger/task"  # resources.core.tags.TAG_TASK, read from the project's copy

BARE_LOCATION = """\
import dagster as dg

K = {count}


def _make(k):
    @dg.asset(name=f"bare_{{k}}", pool=f"bare_{{k}}")
    def one():
        return 1

    return one


defs = dg.Definitions(
    assets=[_make(k) for k in range(K)],
    jobs=[
        dg.define_asset_job(
            f"bare_{{k}}_job", selection=[f"bare_{{k}}"], executor_def=dg.{executor}_executor
        )
        for k in range(K)
    ],
)
"""


@dataclass(frozen=True)
class Workload:
    label: str
    root: Path  # cwd and PYTHONPATH of every process
    workspace: dict[str, Any]
    location: str
    jobs: list[tuple[str, dict[str, str]]]  # round-robin (job name, tags per run)
    make_tags: Callable[[int], dict[str, str]] = field(default=lambda n: {})
    sample_data: bool = False
    #: More PYTHONPATH entries after the root's (bench/scale.py: its generated task plugin).
    paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class Drain:
    label: str
    runs: int
    succeeded: int
    seconds: float  # first dequeue -> last end
    startup: float = 0.0  # median run: RUN_STARTING -> RUN_START
    execution: float = 0.0  # median run: RUN_START -> end

    @property
    def per_minute(self) -> float:
        return 60.0 * self.runs / self.seconds if self.seconds > 0 else 0.0


def _start(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return start_group(cmd, cwd=cwd, env=env, log=fh)


def instance_config(storage: dict[str, Any] | None) -> dict[str, Any]:
    """deploy/dagster.yaml with the storage swapped, a 1 s dequeue interval and a 600 s
    code-server start-up timeout."""
    config = yaml.safe_load((_paths.ROOT / "deploy" / "dagster.yaml").read_text())
    config.pop("storage", None)
    if storage is not None:
        config["storage"] = storage
    config["run_coordinator"]["config"]["dequeue_interval_seconds"] = 1
    # The daemon (re)starts its code server while run workers load theirs: on a loaded
    # machine that outlasted Dagster's 180 s default and failed dequeues (2026-12-02).
    config["code_servers"] = {"local_startup_timeout": 600}
    return config


def dueledger_workload(label: str, root: Path, tasks: Sequence[str] = ()) -> Workload:
    # Imported here: the project's task registry and tags, read from this checkout only
    # to name the jobs (the measured processes import the checkout given by ``root``).
    from orchestration.declarations import registered_tasks
    from orchestration.manual_launch import manual_tags

    specs = [s for s in registered_tasks() if s.manual_trigger and (not tasks or s.key in tasks)]
    jobs: list[tuple[str, dict[str, str]]] = [(s.job_name, {}) for s in specs]

    def tags(n: int) -> dict[str, str]:
        spec = specs[n % len(specs)]
        return manual_tags(spec, f"drain-{uuid.uuid4().hex}", "bench", "queue drain bench")

    module = {
        "module_name": "orchestration.definitions",
        "attribute": "defs",
        "location_name": "dueledger",
        "working_directory": str(root),
    }
    return Workload(
        label,
        root,
        {"load_from": [{"python_module": module}]},
        "dueledger",
        jobs,
        tags,
        sample_data=True,
    )


def bare_workload(base: Path, count: int, executor: str) -> Workload:
    path = base / "drain_bare_location.py"
    path.write_text(BARE_LOCATION.format(count=count, executor=executor))
    jobs = [(f"bare_{k}_job", {TAG_TASK: f"bare_{k}"}) for k in range(count)]
    location = {
        "python_file": {
            "relative_path": str(path),
            "working_directory": str(base),
            "location_name": BARE,
        }
    }
    return Workload(BARE, _paths.ROOT, {"load_from": [location]}, BARE, jobs)


def submit(workload: Workload, port: int, runs: int) -> list[str]:
    client = DagsterGraphQLClient("127.0.0.1", port_number=port)
    ids = []
    for n in range(runs):
        job, tags = workload.jobs[n % len(workload.jobs)]
        all_tags = {**tags, **workload.make_tags(n), BENCH_TAG: "1"}
        ids.append(
            client.submit_job_execution(
                job, repository_location_name=workload.location, tags=all_tags
            )
        )
    return ids


def measure(
    workload: Workload,
    runs: int,
    work: Path,
    storage: dict[str, Any] | None,
    env_extra: dict[str, str],
    *,
    allowance: float,
    timeout: float,
) -> Drain:
    wait = wait_out_slot_boundary(timedelta(seconds=allowance))
    if wait:
        print(f"  waiting {wait:.0f} s for the slot boundary to pass", file=sys.stderr)
        time.sleep(wait)
    run_dir = Path(tempfile.mkdtemp(prefix=f"drain-{workload.label}-", dir=work))
    home = run_dir / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance_config(storage)))
    workspace = run_dir / "workspace.yaml"
    workspace.write_text(json.dumps(workload.workspace))
    env = {
        **os.environ,
        **env_extra,
        "DAGSTER_HOME": str(home),
        "DUELEDGER_SLOT_MINUTES": str(SLOT_MINUTES),
        # A run launch waits for the worker process to start; on a loaded machine that can
        # outlast Dagster's 60 s gRPC deadline and fail the run before it starts.
        "DAGSTER_GRPC_TIMEOUT_SECONDS": os.environ.get("DAGSTER_GRPC_TIMEOUT_SECONDS", "300"),
        "PYTHONPATH": os.pathsep.join(
            [str(workload.root), str(_paths.ROOT / "tests"), *workload.paths]
        ),
    }
    log = run_dir / "processes.log"
    bin_dir = Path(sys.executable).parent
    if workload.sample_data:
        cmd = [str(bin_dir / "dueledger"), "sample-data"]
        subprocess.run(cmd, cwd=workload.root, env=env, check=True, capture_output=True)
    port = free_port()
    web = _start(
        [
            str(bin_dir / "dagster-webserver"),
            "-w",
            str(workspace),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        workload.root,
        env,
        log,
    )
    try:
        deadline = time.monotonic() + 600
        while not location_loaded(port):
            if web.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"dagster-webserver on {workload.label} did not load: "
                    + log.read_text(errors="replace")[-3000:]
                )
            time.sleep(1)
        ids = submit(workload, port, runs)
    finally:
        stop_group(web)
    daemon = _start(
        [str(bin_dir / "dagster-daemon"), "run", "-w", str(workspace)], workload.root, env, log
    )
    previous = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        with dg.DagsterInstance.get() as instance:
            deadline = time.monotonic() + timeout
            while True:
                records = instance.get_run_records(filters=dg.RunsFilter(run_ids=ids))
                if len(records) == len(ids) and all(r.dagster_run.is_finished for r in records):
                    break
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{workload.label}: the queue did not drain: "
                        + log.read_text(errors="replace")[-3000:]
                    )
                time.sleep(1)
            dequeued, startups, executions = [], [], []
            for record in records:
                run_id = record.dagster_run.run_id
                starting, started = (
                    [
                        e.timestamp
                        for e in instance.get_records_for_run(run_id, of_type=kind).records
                    ]
                    for kind in (dg.DagsterEventType.RUN_STARTING, dg.DagsterEventType.RUN_START)
                )
                dequeued += starting
                if starting and started:
                    startups.append(started[0] - starting[0])
                    if record.end_time is not None:
                        executions.append(record.end_time - started[0])
            ended = [r.end_time for r in records if r.end_time is not None]
            succeeded = sum(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in records)
    finally:
        stop_group(daemon)
        if previous is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = previous
    seconds = max(ended) - min(dequeued) if ended and dequeued else 0.0
    result = Drain(
        workload.label,
        len(ids),
        succeeded,
        seconds,
        statistics.median(startups) if startups else 0.0,
        statistics.median(executions) if executions else 0.0,
    )
    print(
        f"  {workload.label}: {result.per_minute:.1f} runs/min ({runs} runs in {seconds:.0f} s, "
        f"{succeeded} succeeded; median run: start-up {result.startup:.1f} s, execution "
        f"{result.execution:.1f} s)",
        file=sys.stderr,
        flush=True,
    )
    return result


def rows(
    results: Sequence[Sequence[Drain]], runs: int, backend: str, tasks: Sequence[str] = ()
) -> list[Row]:
    size = f"{runs} runs x {len(results)} pairs"
    jobs = f" of {', '.join(tasks)}" if tasks else ""
    bare = statistics.median(r[0].per_minute for r in results)
    out = [
        Row(
            area=AREA,
            measurement="runs completed/min by dagster-daemon, one-asset jobs",
            size=size,
            value=round(bare, 2),
            unit="runs/min",
            backend=backend,
        )
    ]
    for i, first in enumerate(results[0][1:], start=1):
        value = statistics.median(r[i].per_minute for r in results)
        ratio = statistics.median(r[i].per_minute / max(r[0].per_minute, 1e-9) for r in results)
        name = "" if first.label == "dueledger" else f" ({first.label})"
        out.append(
            Row(
                area=AREA,
                measurement=(
                    f"runs completed/min by dagster-daemon, dueledger task jobs{jobs}{name}"
                ),
                size=size,
                value=round(value, 2),
                unit="runs/min",
                backend=backend,
                baseline=round(bare, 2),
                baseline_label="one-asset jobs",
                ratio=round(ratio, 3),
                target=f">= {TARGET_RATIO}x",
                met=ratio >= TARGET_RATIO,
            )
        )
    failed = sum(d.runs - d.succeeded for pair in results for d in pair)
    out.append(
        Row(
            area=AREA,
            measurement="drained runs that did not succeed",
            size=size,
            value=failed,
            unit="runs",
            backend=backend,
            target="0",
            met=failed == 0,
            kind=KIND_CHECK,
        )
    )
    return out


def parse_tasks(text: str) -> list[str]:
    """``--tasks``: manually launchable task keys (the runs are manual launches)."""
    from orchestration.declarations import registered_tasks  # this checkout's tasks

    manual = [s.key for s in registered_tasks() if s.manual_trigger]
    wanted = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in wanted if t not in manual]
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown) or '(none)'}: not a manually launchable task; choose from "
            f"{', '.join(manual)}"
        )
    return wanted


def workloads(
    base: Path, projects: Sequence[str], bare_executor: str, tasks: Sequence[str] = ()
) -> list[Workload]:
    out: list[Workload] = []
    for spec in projects or [f"dueledger={_paths.ROOT}"]:
        label, _, directory = spec.partition("=")
        root = Path(directory or ".").resolve()
        if not label or label == BARE or not (root / "workspace.yaml").is_file():
            raise SystemExit(f"--project {spec!r}: want LABEL=DIR with DIR/workspace.yaml")
        out.append(dueledger_workload(label, root, tasks))
    count = len(out[0].jobs)
    return [bare_workload(base, count, bare_executor), *out]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="queued runs per workload")
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--project", action="append", default=[], metavar="LABEL=DIR")
    parser.add_argument(
        "--tasks",
        type=parse_tasks,
        default=[],
        help="comma-separated task keys to launch (default: every manually launchable task)",
    )
    parser.add_argument("--bare-executor", choices=("in_process", "multiprocess"))
    parser.add_argument("--allowance", type=float, help="seconds one workload may take")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--work", metavar="DIR", help="keep the homes and logs here")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.pairs < 1:
        parser.error("--runs >= 1 and --pairs >= 1")
    allowance = args.allowance if args.allowance is not None else 600 + 30 * args.runs
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dueledger-drain-") as tmp:
        base = Path(args.work or tmp)
        base.mkdir(parents=True, exist_ok=True)
        chosen = workloads(base, args.project, args.bare_executor or "in_process", args.tasks)
        server = None
        watchdog = None
        make_storage: Callable[[str], dict[str, Any] | None] = lambda name: None  # noqa: E731
        extra: Callable[[str], dict[str, str]] = lambda name: {}  # noqa: E731
        if args.backend == "postgres":
            import pg_server  # tests/pg_server.py

            print("starting a throwaway PostgreSQL ...", file=sys.stderr, flush=True)
            server = pg_server.start_server()
            watchdog = pg_server.start_watchdog(server)
            pg = server

            def make_storage(name: str) -> dict[str, Any] | None:
                return {"postgres": {"postgres_url": pg.create_database(name)}}

            def extra(name: str) -> dict[str, str]:
                return {"DUELEDGER_DATABASE_URL": pg.url(name)}

        results: list[list[Drain]] = []
        try:
            for n in range(args.pairs):
                print(f"pair {n + 1}/{args.pairs}", file=sys.stderr, flush=True)
                pair = []
                for w in chosen:
                    db = f"drain_{w.label}_{n}_{uuid.uuid4().hex[:6]}".lower()
                    storage = make_storage(db)
                    pair.append(
                        measure(
                            w,
                            args.runs,
                            base,
                            storage,
                            extra(db) if storage is not None else {},
                            allowance=allowance,
                            timeout=args.timeout,
                        )
                    )
                results.append(pair)
        except RuntimeError as exc:
            problems.append(str(exc))
        finally:
            if watchdog is not None:
                watchdog.kill()
                watchdog.wait()
            if server is not None:
                server.stop()
    if problems or not results:
        print("\n".join(problems) or "no result", file=sys.stderr)
        return 1
    table = rows(results, args.runs, args.backend, args.tasks)
    for row in table:
        ratio = f", {row.ratio:.2f}x the one-asset jobs" if row.ratio is not None else ""
        print(f"{row.measurement} ({row.backend}): {row.value:g} {row.unit}{ratio}")
    if args.json:
        write_json(args.json, "drain", table)
    return 0 if all(r.met is not False for r in table if r.kind == KIND_CHECK) else 1


if __name__ == "__main__":
    sys.exit(main())
