"""Benchmark: what a run costs -- loading the code location, and one run of each task's job,
against a one-asset Dagster code location (``bench/bare_location.py``).

    uv run --frozen python bench/run_cost.py [--repeat R] [--tasks a,b | --tasks all]
                                             [--json PATH]

Every figure is a whole process, measured by this script with ``os.wait4`` (CPU = user +
system seconds of the process and the children it waited for; peak memory = its largest
resident set, ``ru_maxrss``):

- **load**: ``import orchestration.definitions`` and building its ``defs()`` (what every code
  server, run worker and step process pays first; the location is built when Dagster loads
  it, not at import) against ``import bare_location`` (its Definitions built at import);
- **load into a Dagster process**: the same imports in a process that has first opened its
  Dagster instance (``DagsterInstance.get()`` and one run-storage read), as a code server and
  a run worker have before they execute anything. Dagster's storage imports SQLAlchemy
  (which ``import dagster`` alone does not), so these rows show what the location adds to
  a real process; the plain load rows also charge the location for it;
- **one run**: ``dagster job execute -m orchestration.definitions -j <task>_job`` against
  ``dagster job execute -m bare_location -j bare_job``, both on the in-process executor, each
  side on its own throwaway SQLite ``DAGSTER_HOME``; dueledger's runs claim their entries in a
  throwaway SQLite ledger and work on generated sample data (``dueledger sample-data``,
  ``--services``) in a throwaway SQLite source store. One untimed run per side first creates
  the storages (and migrates the ledger), so the timed runs are those of a running
  installation. A run without trigger tags is a manual launch: each
  claims a new entry, and later runs find less work left (orders already cancelled, ...).

Each repeat measures both sides back to back, alternating which goes first. Reported: the
medians of each side and the ratio dueledger / bare -- the median of the paired ratios.
Targets: load <= 1.30 (both kinds), one run <= 1.15; a miss shows as
``met: false`` and does not change the exit status. Check: every run ended RUN_SUCCESS
(exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

from _paths import BENCH_DIR, ROOT  # first: puts the project and tests/ on sys.path

# isort: split

from run import KIND_CHECK, Row, write_json

from orchestration.declarations import registered_tasks

AREA = "run cost"
LOAD_TARGET, RUN_TARGET = 1.30, 1.15
#: The default tasks: a plain one (no source data) and a domain rule (pandas, source store).
DEFAULT_TASKS = ("tick_every_slot", "order_cleanup")
BIN = Path(sys.executable).parent
BARE_MODULE, BARE_JOB = "bare_location", "bare_job"
TASK_JOBS = {spec.key: spec.job_name for spec in registered_tasks()}
#: What a code server or run worker has done before it loads a code location.
OPEN_INSTANCE = "import dagster as dg; dg.DagsterInstance.get().get_runs(limit=1)"


def load_snippet(module: str) -> str:
    """Import the location and build its definitions, as Dagster does when it loads it:
    dueledger's ``defs`` is a ``@dg.definitions`` function, the bare location's a
    Definitions built at import."""
    return f"import {module} as location; callable(location.defs) and location.defs()"


@dataclass(frozen=True)
class Cost:
    """One process: CPU seconds (user + system, with its waited-for children), peak MiB."""

    cpu: float
    peak_mib: float
    ok: bool


def measure(cmd: Sequence[str], *, cwd: Path, env: dict[str, str], log: Path) -> Cost:
    """Run ``cmd`` to completion and return its own resource usage (``os.wait4``)."""
    with log.open("ab") as out:
        out.write(f"$ {' '.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    return Cost(usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, proc.returncode == 0)


@dataclass
class Side:
    """One code location under test: how to load it and how to run a job of it."""

    name: str
    cwd: Path
    module: str
    env: dict[str, str]
    log: Path

    def load(self) -> Cost:
        cmd = [sys.executable, "-W", "ignore", "-c", load_snippet(self.module)]
        return measure(cmd, cwd=self.cwd, env=self.env, log=self.log)

    def load_in_dagster(self) -> Cost:
        """The location's import in a process that has its Dagster instance open first."""
        cmd = [
            sys.executable,
            "-W",
            "ignore",
            "-c",
            f"{OPEN_INSTANCE}; {load_snippet(self.module)}",
        ]
        return measure(cmd, cwd=self.cwd, env=self.env, log=self.log)

    def run(self, job: str, tags: str | None = None) -> Cost:
        cmd = [str(BIN / "dagster"), "job", "execute", "-m", self.module, "-j", job]
        if tags:
            cmd += ["--tags", tags]
        mark = self.log.stat().st_size if self.log.exists() else 0
        cost = measure(cmd, cwd=self.cwd, env=self.env, log=self.log)
        with self.log.open("rb") as fh:
            fh.seek(mark)
            succeeded = b"RUN_SUCCESS" in fh.read()
        return Cost(cost.cpu, cost.peak_mib, cost.ok and succeeded)


def make_sides(work: Path, services: int) -> tuple[Side, Side]:
    """dueledger and the bare location, each with its own throwaway storage."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "DUELEDGER_"))}
    base["PYTHONWARNINGS"] = "ignore"
    led_home, bare_home = work / "dueledger_home", work / "bare_home"
    for home in (led_home, bare_home):
        home.mkdir(parents=True)
    led_env = {
        **base,
        "DAGSTER_HOME": str(led_home),
        "DUELEDGER_DATABASE_URL": f"sqlite:///{work / 'ledger.sqlite'}",
        "DUELEDGER_SOURCE_URL": f"sqlite:///{work / 'source.sqlite'}",
    }
    bare_env = {**base, "DAGSTER_HOME": str(bare_home)}
    dueledger = Side(
        "dueledger", ROOT, "orchestration.definitions", led_env, work / "dueledger.log"
    )
    bare = Side("bare", BENCH_DIR, BARE_MODULE, bare_env, work / "bare.log")
    seed = [str(BIN / "dueledger"), "sample-data", "--services", str(services)]
    if not measure(seed, cwd=ROOT, env=led_env, log=dueledger.log).ok:
        raise RuntimeError(f"dueledger sample-data failed; see {dueledger.log}")
    return dueledger, bare


_SCHEDULED_DUES = itertools.count()


def job_tags(task_key: str) -> str | None:
    """A daily-partitioned task's run names its partition (today, UTC). A task that is not
    manually triggerable runs only as its schedule launches it: such a run gets
    the tags its schedule gives, each with a due of its own (an older one each time)."""
    spec = next(s for s in registered_tasks() if s.key == task_key)
    tags: dict[str, str] = {}
    if spec.partitions is not None:
        tags["dagster/partition"] = datetime.now(UTC).strftime("%Y-%m-%d")
    if not spec.manual_trigger:
        due = datetime(2026, 1, 1, tzinfo=UTC) - next(_SCHEDULED_DUES) * timedelta(days=1)
        tags |= {
            "dueledger/trigger": "schedule",
            "dueledger/due": due.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "dagster/schedule_name": spec.schedule_name,
        }
    return json.dumps(tags) if tags else None


def paired(
    repeat: int, first: int, measure_a: Callable[[], Cost], measure_b: Callable[[], Cost]
) -> tuple[list[Cost], list[Cost]]:
    """``repeat`` back-to-back pairs, alternating which side goes first."""
    a: list[Cost] = []
    b: list[Cost] = []
    for i in range(repeat):
        if (i + first) % 2 == 0:
            a.append(measure_a())
            b.append(measure_b())
        else:
            b.append(measure_b())
            a.append(measure_a())
    return a, b


def ratio_rows(
    what: str, size: str, baseline_label: str, target: float, led: list[Cost], bare: list[Cost]
) -> list[Row]:
    """A CPU row and a peak-memory row: medians, and the median of the paired ratios."""
    rows = []
    for unit, get in (("CPU s", lambda c: c.cpu), ("peak MiB", lambda c: c.peak_mib)):
        values, baselines = [get(c) for c in led], [get(c) for c in bare]
        ratio = statistics.median(v / b for v, b in zip(values, baselines, strict=True))
        rows.append(
            Row(
                area=AREA,
                measurement=(
                    f"{what}, {unit} (medians of {len(values)} repeats; ratio: median of "
                    "paired repeats)"
                ),
                backend="sqlite",
                size=size,
                value=statistics.median(values),
                unit="s" if unit == "CPU s" else "MiB",
                baseline=statistics.median(baselines),
                baseline_label=baseline_label,
                ratio=ratio,
                target=f"ratio <= {target:.2f}",
                met=ratio <= target,
            )
        )
    return rows


def parse_tasks(text: str) -> list[str]:
    keys = [s.key for s in registered_tasks()]
    if text.strip() == "all":
        return keys
    wanted = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in wanted if t not in keys]
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(
            f"unknown task(s) {unknown or '(none)'}; choose from {keys} or 'all'"
        )
    return wanted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2, help="pairs per measurement (median)")
    parser.add_argument(
        "--tasks",
        type=parse_tasks,
        default=list(DEFAULT_TASKS),
        help=f"comma-separated task keys, or 'all' (default {','.join(DEFAULT_TASKS)})",
    )
    parser.add_argument("--services", type=int, default=200, help="sample-data size")
    parser.add_argument("--no-runs", action="store_true", help="measure the load only")
    parser.add_argument("--out", help="directory for the runs' storage and logs (default: new)")
    parser.add_argument("--json", help="write the result rows here (for bench/run.py)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="dueledger-run-cost-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"storage and logs: {work}", flush=True)
    dueledger, bare = make_sides(work, args.services)

    rows: list[Row] = []
    failures: list[str] = []
    led, base = paired(args.repeat, 0, dueledger.load, bare.load)
    failures += [
        f"a load of {side.name} failed"
        for side, costs in ((dueledger, led), (bare, base))
        if not all(c.ok for c in costs)
    ]
    rows += ratio_rows(
        "loading the code location (`import orchestration.definitions`, then `defs()` built)",
        f"{len(registered_tasks())} tasks",
        "one-asset Dagster location",
        LOAD_TARGET,
        led,
        base,
    )
    # Untimed: the first instance opened on each throwaway home creates its storage: the
    # warm-up runs (they also migrate the ledger), or with --no-runs an instance opened.
    if args.no_runs:
        for side in (dueledger, bare):
            if not side.load_in_dagster().ok:
                failures.append(f"opening the Dagster instance of {side.name} failed")
    else:
        for side, job, tags in (
            (dueledger, TASK_JOBS[args.tasks[0]], job_tags(args.tasks[0])),
            (bare, BARE_JOB, None),
        ):
            if not side.run(job, tags).ok:
                failures.append(f"warm-up run {job} of {side.name} failed")
    led, base = paired(args.repeat, 1, dueledger.load_in_dagster, bare.load_in_dagster)
    failures += [
        f"a load of {side.name} into a Dagster process failed"
        for side, costs in ((dueledger, led), (bare, base))
        if not all(c.ok for c in costs)
    ]
    rows += ratio_rows(
        "loading the code location into a Dagster process (after `DagsterInstance.get()`, as "
        "a code server or run worker has it)",
        f"{len(registered_tasks())} tasks",
        "one-asset Dagster location, same process",
        LOAD_TARGET,
        led,
        base,
    )
    runs = 0
    if not args.no_runs:
        for i, key in enumerate(args.tasks):
            spec = next(s for s in registered_tasks() if s.key == key)
            led, base = paired(
                args.repeat,
                i,
                # New tags for every run: a scheduled run's due is used once.
                lambda job=spec.job_name, key=key: dueledger.run(job, job_tags(key)),
                partial(bare.run, BARE_JOB),
            )
            runs += len(led) + len(base)
            failures += [
                f"a run of {name} failed"
                for name, costs in ((spec.job_name, led), (BARE_JOB, base))
                if not all(c.ok for c in costs)
            ]
            rows += ratio_rows(
                f"one run of {spec.job_name} (`dagster job execute`, in-process executor)",
                "1 run",
                "one-asset Dagster job, same executor",
                RUN_TARGET,
                led,
                base,
            )
    rows.append(
        Row(
            area=AREA,
            measurement="every load and run succeeded (RUN_SUCCESS), both locations",
            backend="sqlite",
            size=f"{runs} timed runs",
            value=float(len(failures)),
            unit="failures",
            target="0",
            met=not failures,
            kind=KIND_CHECK,
        )
    )
    for row in rows:
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}"
        print(
            f"{row.measurement} [{row.size}]: {row.value:.3g} {row.unit}; "
            f"baseline {row.baseline}; ratio {ratio}"
        )
    for failure in failures:
        print(f"FAILED: {failure} (logs in {work})")
    if args.json:
        write_json(args.json, "run_cost", rows)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
