"""Benchmark: scheduling overhead per due -- dueledger schedules vs plain Dagster cron schedules.

    uv run --frozen python bench/scheduling.py [--sizes 1,20,200] [--repeat R]
                                               [--backend sqlite|postgres] [--json PATH]

Both sides go through Dagster's REAL scheduler daemon path (``launch_scheduled_runs``,
driven by ``tests/dagster_internals.py``): tick, evaluation, run_key lookup, run creation
and launch (``MockedRunLauncher``: the launch is recorded, nothing executes).

For each N in ``--sizes`` two code locations are generated, each with N schedules that are
all due at the same instant (15-minute cron, UTC) and N trivial one-asset jobs:

- **dueledger**: N ``TaskSpec``s (``EverySlots(1)``) through the production factories
  (``registry.build_views`` + ``factory.build_task_definitions``): due-keyed evaluation,
  run_key = the due, dueledger tags, plugin creation hooks (whatever is installed);
- **plain** (the baseline): N ``dg.ScheduleDefinition(cron_schedule=<the same cron>,
  job=<the same asset job, without dueledger's tags>)``, running by default.

Each repeat (``--repeat``, more for small N so that every figure rests on at least 10
due schedules per side) uses a fresh Dagster instance (SQLite storage in a temp dir by default;
``--backend postgres``: dagster-postgres storage on a throwaway server, a fresh database per
repeat) and a fresh workspace. A RUNNING-by-default schedule's first daemon iteration only
records its start, so the daemon ticks once a minute before the due (untimed) and the
iteration AT the due is timed: every schedule fires once, N runs are created and launched.
The two sides alternate within each repeat (which one goes first alternates too).

Reports, per N, the median seconds per due (iteration time / N) of each side and the ratio
dueledger / plain -- the median of the per-repeat ratios, each of two back-to-back
measurements (steadier than the ratio of the medians on a machine whose load drifts);
target <= 1.10. The same for the CPU time of this process (the daemon iteration runs in
it), which other load on the machine disturbs much less (with ``--backend postgres`` the
database server's share is not in it). Checks that every iteration made
exactly one launched run per schedule (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _paths import BENCH_DIR, ROOT  # first: puts the project and tests/ on sys.path

# isort: split

import dagster as dg
from dagster_internals import (
    CodeTarget,
    daemon_instance,
    daemon_workspace,
    run_scheduler_tick,
)
from run import Row, write_json

from orchestration.services.hooks.registry import Hooks
from orchestration.services.hooks.vocabulary import AFTER_TASK_CREATE, BEFORE_TASK_CREATE
from orchestration.task_defs import task_jobs_and_schedules
from orchestration.task_spec import TaskSpec, build_views
from orchestration.timetable import EverySlots
from resources.core import tags as t
from resources.ledger import RunLedger

VARIANTS = ("plain", "dueledger")
SLOT_MINUTES = 15
DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
BEFORE_DUE = DUE - timedelta(minutes=1)  # the daemon was already up: records each start
AT_DUE = DUE + timedelta(seconds=1)
TARGET_RATIO = 1.10
#: Small N gets more repeats, so each side's figure rests on at least this many due
#: schedules: one iteration at N=1 lasts a fraction of a second, where a hiccup of the
#: machine is a large share.
MIN_DUES_PER_SIDE = 10
MAX_SIZE = 2000


# --- the two code locations -----------------------------------------------------------------


def task_key(i: int) -> str:
    return f"bench_task_{i:04d}"


def _trivial_asset(name: str) -> dg.AssetsDefinition:
    @dg.asset(name=name)
    def _asset() -> None:
        return None

    return _asset


def build_definitions(variant: str, n: int) -> dg.Definitions:
    """The ``variant`` code location with ``n`` schedules, all due at every 15-minute mark."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; use one of {VARIANTS}")
    specs = [
        TaskSpec(key=task_key(i), rule=EverySlots(1), declared_cadence="every slot")
        for i in range(n)
        for key in [task_key(i)]
    ]
    views = build_views(specs, SLOT_MINUTES, "UTC")
    assets = [_trivial_asset(s.asset) for s in specs]
    if variant == "dueledger":
        # Whatever plugin listeners this environment installs, as a code location loads them.
        jobs, schedules = task_jobs_and_schedules(views, hooks=Hooks.from_environment())
        # Each tick reads the task's open pauses from the ledger: part of the cost.
        return dg.Definitions(
            assets=assets,
            jobs=jobs,
            schedules=schedules,
            executor=dg.in_process_executor,
            resources={"ledger": RunLedger()},
        )
    return plain_definitions(views, assets)


def plain_definitions(views: list[Any], assets: list[dg.AssetsDefinition]) -> dg.Definitions:
    """The baseline: a plain Dagster cron schedule and asset job per task, without dueledger."""
    plain_jobs, plain_schedules = [], []
    for view in views:
        job = dg.define_asset_job(
            name=view.spec.job_name, selection=dg.AssetSelection.assets(view.spec.asset)
        )
        plain_jobs.append(job)
        plain_schedules.append(
            dg.ScheduleDefinition(
                name=view.spec.schedule_name,
                cron_schedule=view.plan.cron,  # the very cron the dueledger schedule uses
                execution_timezone=view.plan.timezone,
                job=job,
                default_status=dg.DefaultScheduleStatus.RUNNING,
            )
        )
    return dg.Definitions(
        assets=assets, jobs=plain_jobs, schedules=plain_schedules, executor=dg.in_process_executor
    )


LOCATION_TEMPLATE = """\
# Generated by bench/scheduling.py: the {variant!r} code location with {n} schedules.
import sys

if {root!r} not in sys.path:
    sys.path.insert(0, {root!r})
if {bench!r} not in sys.path:
    sys.path.append({bench!r})  # after the root: bench/assets.py must not shadow `assets`

from scheduling import build_definitions

defs = build_definitions({variant!r}, {n})
"""


def write_location(directory: Path, variant: str, n: int) -> CodeTarget:
    """A Python file loading the ``variant`` location with ``n`` schedules; its target."""
    path = directory / f"bench_location_{variant}_{n}.py"
    path.write_text(
        LOCATION_TEMPLATE.format(variant=variant, n=n, root=str(ROOT), bench=str(BENCH_DIR)),
        encoding="utf-8",
    )
    return CodeTarget.from_file(path, "defs", location_name=f"bench_{variant}")


# --- one measurement -------------------------------------------------------------------------


def check_runs(instance: dg.DagsterInstance, variant: str, n: int) -> list[str]:
    """Problems with the runs one due made: exactly one launched run per schedule."""
    runs = list(instance.get_runs())
    problems = []
    if len(runs) != n:
        problems.append(f"{variant} N={n}: {len(runs)} runs, expected {n}")
    names = {r.tags.get(t.DAGSTER_SCHEDULE_NAME) for r in runs}
    if len(names) != len(runs):
        problems.append(f"{variant} N={n}: {len(runs)} runs for {len(names)} schedules")
    not_launched = [r.run_id for r in runs if r.status == dg.DagsterRunStatus.NOT_STARTED]
    if not_launched:
        problems.append(f"{variant} N={n}: {len(not_launched)} runs created but not launched")
    due = DUE.strftime("%Y-%m-%dT%H:%M:%SZ")
    if variant == "dueledger":
        wrong = [r.run_id for r in runs if r.tags.get(t.DAGSTER_RUN_KEY) != due]
        if wrong:
            problems.append(f"dueledger N={n}: {len(wrong)} runs not keyed by the due {due}")
    return problems


@dataclass(frozen=True)
class Timing:
    """One daemon iteration: wall seconds and this process's CPU seconds."""

    wall: float
    cpu: float


def measure_once(
    target: CodeTarget, variant: str, n: int, instance_dir: Path, storage: dict[str, Any] | None
) -> tuple[Timing, list[str]]:
    """The daemon iteration at the due (fresh instance), and any problems."""
    with (
        daemon_instance("mocked", temp_dir=instance_dir, overrides=storage) as instance,
        daemon_workspace(instance, target) as ctx,
    ):
        iteration_times: dict[str, Any] = {}  # one long-lived daemon across both ticks
        run_scheduler_tick(ctx, BEFORE_DUE, iteration_times=iteration_times)
        if instance.get_runs_count():
            problem = f"{variant} N={n}: the tick before the due already created runs"
            return Timing(0.0, 0.0), [problem]
        started, cpu_started = time.perf_counter(), time.process_time()
        run_scheduler_tick(ctx, AT_DUE, iteration_times=iteration_times)
        timing = Timing(time.perf_counter() - started, time.process_time() - cpu_started)
        return timing, check_runs(instance, variant, n)


# --- driver ----------------------------------------------------------------------------------


def repeats_for(n: int, repeat: int) -> int:
    """``repeat``, or more for small N (at least MIN_DUES_PER_SIDE due schedules)."""
    return max(repeat, -(-MIN_DUES_PER_SIDE // n))


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or any(not 1 <= s <= MAX_SIZE for s in sizes):
        raise ValueError(f"--sizes must be between 1 and {MAX_SIZE}, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="1,20,200", help="schedules due at once, e.g. 1,20")
    parser.add_argument("--repeat", type=int, default=3, help="fresh-instance repeats (median)")
    parser.add_argument("--backend", default="sqlite", choices=("sqlite", "postgres"))
    parser.add_argument("--json", help="write the result rows here (for bench/run.py)")
    args = parser.parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes)
    except ValueError as exc:
        parser.error(str(exc))
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    registry = Hooks.from_environment().registry
    events = (BEFORE_TASK_CREATE, AFTER_TASK_CREATE)
    listeners = sum(len(registry.for_event(e)) for e in events)
    print(
        f"scheduler daemon iteration at a due, {args.backend} instance storage, "
        f"MockedRunLauncher, {args.repeat} repeat(s); creation-hook listeners installed: "
        f"{listeners}",
        flush=True,
    )
    server = watchdog = None
    problems: list[str] = []
    results: dict[int, dict[str, list[Timing]]] = {}
    with tempfile.TemporaryDirectory(prefix="dueledger-bench-sched-") as tmp:
        base = Path(tmp)
        try:
            make_storage: Callable[[str], dict[str, Any] | None] = lambda name: None  # noqa: E731
            if args.backend == "postgres":
                import pg_server  # tests/pg_server.py

                print("starting a throwaway PostgreSQL ...", flush=True)
                server = pg_server.start_server()
                watchdog = pg_server.start_watchdog(server)
                pg = server

                def make_storage(name: str) -> dict[str, Any] | None:
                    return {"storage": {"postgres": {"postgres_url": pg.create_database(name)}}}

            # Warm-up, untimed: first-use imports and caches of both paths.
            for variant in VARIANTS:
                target = write_location(base, variant, 1)
                measure_once(
                    target, variant, 1, base / f"warm-{variant}", make_storage(f"w_{variant}")
                )
            for n in sizes:
                targets = {v: write_location(base, v, n) for v in VARIANTS}
                times: dict[str, list[Timing]] = {v: [] for v in VARIANTS}
                for r in range(repeats_for(n, args.repeat)):
                    order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
                    for variant in order:
                        timing, found = measure_once(
                            targets[variant],
                            variant,
                            n,
                            base / f"inst-{variant}-{n}-{r}",
                            make_storage(f"s_{variant}_{n}_{r}"),
                        )
                        problems += found
                        times[variant].append(timing)
                    p, d = times["plain"][-1], times["dueledger"][-1]
                    print(
                        f"  N={n} repeat {r + 1}: plain {p.wall:.3f} s (CPU {p.cpu:.3f}), "
                        f"dueledger {d.wall:.3f} s (CPU {d.cpu:.3f}) per iteration",
                        flush=True,
                    )
                results[n] = times
        finally:
            if server is not None:
                server.stop(remove=True)
            if watchdog is not None:
                watchdog.kill()
                watchdog.wait()

    rows: list[Row] = []
    print()
    print(f"one scheduler iteration with N schedules due at once ({args.backend} storage)")
    print(
        f"{'N':>5}  {'clock':<5}  {'plain s/due':>11}  {'dueledger s/due':>15}  {'ratio':>6}  "
        "paired ratios"
    )
    for n, times in results.items():
        for clock in ("wall", "cpu"):
            plain_s = [getattr(x, clock) for x in times["plain"]]
            led_s = [getattr(x, clock) for x in times["dueledger"]]
            plain, led = statistics.median(plain_s) / n, statistics.median(led_s) / n
            # Each repeat measures both sides back to back, so their ratio shares the
            # machine's load at that moment; the median of those paired ratios is steadier
            # than the ratio of the two medians when the load drifts.
            pairs = [d / p for d, p in zip(led_s, plain_s, strict=True)]
            ratio = statistics.median(pairs)
            print(
                f"{n:>5}  {clock:<5}  {plain:>11.4f}  {led:>15.4f}  {ratio:>6.2f}  "
                + ", ".join(f"{x:.2f}" for x in pairs)
            )
            wall = clock == "wall"
            rows.append(
                Row(
                    area="scheduling",
                    measurement=(
                        "scheduler daemon iteration at a due, "
                        + ("wall" if wall else "CPU (this process)")
                        + f" s per due schedule (medians of {len(pairs)} repeats; "
                        "ratio: median of paired repeats)"
                    ),
                    backend=f"{args.backend} instance",
                    size=f"N={n} due at once",
                    value=led,
                    unit="s/due",
                    baseline=plain,
                    baseline_label="plain cron schedule",
                    ratio=ratio,
                    # The target is on the wall clock; CPU time is the same work
                    # seen without other processes' load (supporting evidence, no target).
                    target=f"ratio <= {TARGET_RATIO:.2f}" if wall else "",
                    met=ratio <= TARGET_RATIO if wall else None,
                )
            )
    rows.append(
        Row(
            area="scheduling",
            measurement="one launched run per schedule per due, both variants",
            backend=f"{args.backend} instance",
            size=f"N={','.join(map(str, sizes))}",
            value=float(len(problems)),
            unit="problems",
            target="0",
            met=not problems,
            kind="check",
        )
    )
    for problem in problems:
        print(f"PROBLEM: {problem}")
    if args.json:
        write_json(args.json, "scheduling", rows)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
