"""Benchmark: how dueledger's cost grows with the number of tasks, against plain Dagster with
as many jobs and cron schedules at the same crons, measured in the same run, alternating.

    uv run --frozen python bench/scale.py [--sizes 10,100,500] [--slot-minutes 5]
        [--window 600] [--settle 30] [--session-sizes ...] [--drain-runs 40]
        [--drain-sizes ...] [--ledger-sizes 10000,100000] [--repeat R]
        [--parts load,scheduling,session,drain,sensors] [--work DIR] [--json PATH]

The two code locations (``bench/scale_location.py``): dueledger's, over N generated tasks
registered through a task plugin (entry point ``dueledger.tasks``), and plain Dagster's, N
one-asset jobs with N cron schedules at the same crons. The crons (``bench/scale_grid.py``)
are spread over the slot grid as a platform's are: 1 % every slot, 9 % hourly, 90 % daily,
each slot of the day with as many dues as the next (within one).

Parts, each side measured in turn, the side that goes first alternating:

- ``load``: ``dagster definitions validate`` on the location (Dagster loads it in process as
  a code server does: import, every job resolved, the snapshot built): CPU s and peak MiB
  of the process; target <= 1.30x at every N;
- ``scheduling``: one iteration of Dagster's real scheduler daemon at a slot boundary, with
  every N schedule in the location and those due at that boundary launching
  (``MockedRunLauncher``): wall and CPU s per due schedule; target (wall) <= 1.10x;
- ``session``: ``dagster dev`` on the location (fresh SQLite home, ``dagster.yaml.local``),
  then a window of ``--window`` seconds starting 20 s before a slot boundary: CPU of the
  whole process tree (% of a core; target <= 1.30x at N >= 100), the due -> ``RUN_START``
  latency of the window's scheduled runs (p50, p95; target p95 <= 1.20x), and the rows
  stored during the window, per day: ticks, event rows, runs, ledger rows;
- ``drain``: ``bench/drain.py``'s queue drain (the real ``dagster-daemon`` on
  ``deploy/dagster.yaml``) with ``--drain-runs`` manual runs of the generated tasks against
  as many runs of the plain location's one-asset jobs; target >= 0.85x;
- ``sensors``: one tick of each ledger sensor on a ledger of each ``--ledger-sizes`` with the
  same few changes (``bench/scale_sensors.py``): target <= 1.25x from the smallest to the
  largest ledger (they read what changed, not the ledger);
- growth rows: each side's cost at the largest N over its cost at the smallest (load CPU,
  idle CPU, scheduling CPU per due); target: dueledger's growth <= plain Dagster's (1.00x).

Ratios are dueledger / plain (or largest / smallest ledger), medians of the pairs' ratios.
Check rows (exit 1 when one fails): one run per due schedule and the same number of dues on
both sides; every scheduled run of a window started and none failed; every drained run
succeeded; every sensor change was handled. Small sizes (``bench/run.py --only scale``):
see ``bench/run.py``; ``--full`` there: N = 10, 100, 500, 10-minute windows on 5-minute slots.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import _paths

# isort: split

from run import KIND_CHECK, Row, load_average, write_json
from scale_grid import SLOT_CHOICES
from scale_location import DUELEDGER, PLAIN, SIDES, Location, use_in_process, write_locations
from scale_measure import Cost, Iteration, Session, load_location, scheduler_iteration, session

AREA = "scale"
PARTS = ("load", "scheduling", "session", "drain", "sensors")
LOAD_TARGET, IDLE_TARGET, SCHED_TARGET, LATENCY_TARGET = 1.30, 1.30, 1.10, 1.20
DRAIN_TARGET, SENSOR_TARGET, GROWTH_TARGET = 0.85, 1.25, 1.00
IDLE_TARGET_FROM = 100  # the idle target is at N = 100 and 500
#: The boundary the scheduler iteration is timed at (a weekday, mid-morning UTC).
BOUNDARY = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def paired(
    repeat: int, first: int, measure: Callable[[str], object]
) -> dict[str, list]:  # side -> results, in pair order
    out: dict[str, list] = {side: [] for side in SIDES}
    for i in range(repeat):
        order = SIDES if (i + first) % 2 == 0 else SIDES[::-1]
        for side in order:
            out[side].append(measure(side))
    return out


def ratio_of(led: Sequence[float], plain: Sequence[float]) -> float:
    """The median of the paired ratios dueledger / plain."""
    return statistics.median(d / p if p else float("inf") for d, p in zip(led, plain, strict=True))


def ratio_row(
    measurement: str,
    size: str,
    unit: str,
    led: Sequence[float],
    plain: Sequence[float],
    *,
    target: float | None = None,
    at_least: bool = False,
    baseline_label: str = "plain Dagster, same N",
    backend: str = "sqlite",
) -> Row:
    ratio = ratio_of(led, plain)
    met = None
    if target is not None:
        met = ratio >= target if at_least else ratio <= target
    return Row(
        area=AREA,
        measurement=measurement,
        size=size,
        value=statistics.median(led),
        unit=unit,
        backend=backend,
        baseline=statistics.median(plain),
        baseline_label=baseline_label,
        ratio=ratio,
        target="" if target is None else f"ratio {'>=' if at_least else '<='} {target:.2f}",
        met=met,
    )


def check_row(measurement: str, size: str, problems: Sequence[str]) -> Row:
    for problem in problems:
        log(f"PROBLEM: {problem}")
    return Row(
        area=AREA,
        measurement=measurement,
        size=size,
        value=float(len(problems)),
        unit="problems",
        target="0",
        met=not problems,
        kind=KIND_CHECK,
    )


def pct(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


# --- the parts --------------------------------------------------------------------------------


def load_rows(locs: dict[int, dict[str, Location]], repeat: int, work: Path) -> list[Row]:
    rows: list[Row] = []
    costs: dict[int, dict[str, list[Cost]]] = {}
    for i, (n, pair) in enumerate(locs.items()):
        log(f"load, N={n}")

        def start(side: str, pair: dict[str, Location] = pair) -> Cost:
            return load_location(pair[side], work)

        costs[n] = paired(repeat, i, start)
        for side in SIDES:
            log(
                f"  {side}: "
                + ", ".join(f"{c.cpu:.2f} CPU-s {c.peak_mib:.0f} MiB" for c in costs[n][side])
            )
        led, plain = costs[n][DUELEDGER], costs[n][PLAIN]
        what = "loading the code location as a code server does (`dagster definitions validate`)"
        rows.append(
            ratio_row(
                f"{what}, CPU s",
                f"N={n}",
                "s",
                [c.cpu for c in led],
                [c.cpu for c in plain],
                target=LOAD_TARGET,
            )
        )
        rows.append(
            ratio_row(
                f"{what}, peak MiB",
                f"N={n}",
                "MiB",
                [c.peak_mib for c in led],
                [c.peak_mib for c in plain],
                target=LOAD_TARGET,
            )
        )
    rows += growth_rows(
        "the code location's load CPU",
        {n: {s: [c.cpu for c in v[s]] for s in SIDES} for n, v in costs.items()},
    )
    failed = [
        f"{side} N={n}: `dagster definitions validate` failed or refused a task (log in {work})"
        for n, by_side in costs.items()
        for side, found in by_side.items()
        if not all(c.ok for c in found)
    ]
    sizes = ",".join(str(n) for n in costs)
    rows.append(check_row("every load of both locations succeeded", f"N={sizes}", failed))
    return rows


def growth_rows(what: str, values: dict[int, dict[str, list[float]]]) -> list[Row]:
    """Each side's median at the largest N over its median at the smallest."""
    sizes = sorted(values)
    if len(sizes) < 2:
        return []
    low, high = sizes[0], sizes[-1]
    growth = {
        side: statistics.median(values[high][side])
        / max(statistics.median(values[low][side]), 1e-12)
        for side in SIDES
    }
    ratio = growth[DUELEDGER] / growth[PLAIN]
    return [
        Row(
            area=AREA,
            measurement=f"growth of {what} from N={low} to N={high} (cost at {high} / at {low})",
            size=f"N={low}->{high}",
            value=growth[DUELEDGER],
            unit="x",
            backend="sqlite",
            baseline=growth[PLAIN],
            baseline_label="plain Dagster's growth",
            ratio=ratio,
            target=f"ratio <= {GROWTH_TARGET:.2f}",
            met=ratio <= GROWTH_TARGET,
        )
    ]


def scheduling_rows(locs: dict[int, dict[str, Location]], repeat: int, work: Path) -> list[Row]:
    rows: list[Row] = []
    problems: list[str] = []
    per_due: dict[int, dict[str, list[float]]] = {}
    for i, (n, pair) in enumerate(locs.items()):
        log(f"scheduling, N={n}")

        def measure(side: str, pair: dict[str, Location] = pair) -> Iteration:
            use_in_process(pair[side])
            where = work / f"sched-{side}-{pair[side].n}-{uuid.uuid4().hex[:6]}"
            return scheduler_iteration(pair[side], BOUNDARY, where)

        measure(DUELEDGER), measure(PLAIN)  # untimed: first-use imports and caches
        found = paired(repeat, i, measure)
        for side in SIDES:
            for it in found[side]:
                problems += it.problems
        dues = {side: {it.dues for it in found[side]} for side in SIDES}
        if dues[DUELEDGER] != dues[PLAIN] or len(dues[PLAIN]) != 1:
            problems.append(f"N={n}: dues at the boundary differ: {dues}")
        due_count = max(max(d) for d in dues.values()) or 1
        for side in SIDES:
            log(
                f"  {side}: "
                + ", ".join(
                    f"{it.wall:.2f} s (CPU {it.cpu:.2f}) for {it.dues} dues" for it in found[side]
                )
            )
        per_due[n] = {s: [it.cpu / max(it.dues, 1) for it in found[s]] for s in SIDES}
        for clock in ("wall", "cpu"):
            led = [getattr(it, clock) / max(it.dues, 1) for it in found[DUELEDGER]]
            plain = [getattr(it, clock) / max(it.dues, 1) for it in found[PLAIN]]
            rows.append(
                ratio_row(
                    "scheduler daemon iteration at a slot boundary, "
                    + ("wall" if clock == "wall" else "CPU (this process)")
                    + f" s per due schedule (N schedules, {due_count} due)",
                    f"N={n}",
                    "s/due",
                    led,
                    plain,
                    target=SCHED_TARGET if clock == "wall" else None,
                )
            )
    rows += growth_rows("scheduler CPU per due schedule", per_due)
    sizes = ",".join(str(n) for n in locs)
    rows.append(
        check_row("one run per due schedule, the same dues on both sides", f"N={sizes}", problems)
    )
    return rows


def session_rows(
    locs: dict[int, dict[str, Location]], repeat: int, work: Path, window: float, settle: float
) -> list[Row]:
    rows: list[Row] = []
    problems: list[str] = []
    idle: dict[int, dict[str, list[float]]] = {}
    for i, (n, pair) in enumerate(locs.items()):
        log(f"session, N={n}")

        def run(side: str, pair: dict[str, Location] = pair) -> Session:
            return session(pair[side], work, window=window, settle=settle)

        found: dict[str, list[Session]] = paired(repeat, i, run)
        slot = pair[PLAIN].slot_minutes
        size = f"N={n}, {window:.0f} s x {repeat}, {slot}-min slots"
        for side in SIDES:
            for s in found[side]:
                if s.not_started:
                    problems.append(f"{side} N={n}: {s.not_started} scheduled runs never started")
                if s.failed:
                    problems.append(f"{side} N={n}: {s.failed} scheduled runs failed")
        led, plain = found[DUELEDGER], found[PLAIN]
        idle[n] = {side: [s.percent for s in found[side]] for side in SIDES}
        rows.append(
            ratio_row(
                "dagster dev start-up until the location is loaded, CPU s (whole process tree)",
                size,
                "s",
                [s.startup_cpu for s in led],
                [s.startup_cpu for s in plain],
            )
        )
        rows.append(
            ratio_row(
                f"dagster dev CPU over a window with {led[0].boundaries} slot boundaries and "
                f"their runs, % of a core",
                size,
                "% of a core",
                idle[n][DUELEDGER],
                idle[n][PLAIN],
                target=IDLE_TARGET if n >= IDLE_TARGET_FROM else None,
            )
        )
        for p, target in ((50, None), (95, LATENCY_TARGET)):
            lat = {side: [pct(s.latencies, p) for s in found[side]] for side in SIDES}
            runs = sum(len(s.latencies) for s in led)
            rows.append(
                ratio_row(
                    f"due -> RUN_START latency p{p}, scheduled runs through the daemon and "
                    f"queue ({runs} dueledger runs)",
                    size,
                    "s",
                    lat[DUELEDGER],
                    lat[PLAIN],
                    target=target,
                )
            )
        for kind, label in (
            ("ticks", "schedule and sensor ticks stored"),
            ("events", "event log rows stored"),
            ("runs", "runs created"),
        ):
            rows.append(
                ratio_row(
                    f"{label} per day (window's count x 86,400 s / window)",
                    size,
                    "/day",
                    [s.per_day(kind) for s in led],
                    [s.per_day(kind) for s in plain],
                )
            )
        rows.append(
            Row(
                area=AREA,
                measurement="ledger rows written per day (window's count x 86,400 s / window)",
                size=size,
                value=statistics.median(s.per_day("ledger") for s in led),
                unit="/day",
                backend="sqlite",
            )
        )
    rows += growth_rows("dagster dev window CPU", idle)
    sizes = ",".join(str(n) for n in locs)
    rows.append(
        check_row("every scheduled run of a window started, none failed", f"N={sizes}", problems)
    )
    return rows


def drain_rows(sizes: Sequence[int], runs: int, work: Path) -> list[Row]:
    """bench/drain.py's measurement, on the generated tasks (manual launches, as drain.py's
    dueledger runs are) against as many runs of one-asset jobs in a location of N jobs."""
    import drain  # bench/drain.py: imported here, only this part starts its daemons

    from orchestration.manual_launch import manual_tags
    from orchestration.task_spec import Cron, TaskSpec

    rows: list[Row] = []
    results: list[list[drain.Drain]] = []
    for n in sizes:
        log(f"drain, N={n}")
        # Day-long slots, as drain.py runs its processes with: no schedule fires meanwhile.
        loc = write_locations(work / "drain", n, 1440)[DUELEDGER]
        used = loc.tasks[: min(n, runs)]
        dist = loc.env["DUELEDGER_PLUGIN_TASKS"]
        specs = [
            TaskSpec(
                key=g.key,
                rule=Cron(g.cron),
                declared_cadence=g.cadence,
                source=f"plugin:{dist}",
            )
            for g in used
        ]

        def tags(k: int, specs: list[TaskSpec] = specs) -> dict[str, str]:
            spec = specs[k % len(specs)]
            return manual_tags(spec, f"scale-{uuid.uuid4().hex}", "bench", "scale drain bench")

        site = loc.env["PYTHONPATH"].split(":")[-1]
        ours = drain.Workload(
            DUELEDGER,
            _paths.ROOT,
            loc.workspace(),
            loc.location_name,
            [(f"{g.key}_job", {}) for g in used],
            tags,
            paths=(site,),
        )
        (work / "drain" / f"bare{n}").mkdir(parents=True, exist_ok=True)
        bare = drain.bare_workload(work / "drain" / f"bare{n}", n, "in_process")
        bare = replace(bare, jobs=bare.jobs[: len(used)])
        extra = {"DUELEDGER_PLUGIN_TASKS": dist, "PYTHONWARNINGS": "ignore"}
        pair = []
        for workload in (bare, ours):
            pair.append(
                drain.measure(
                    workload,
                    runs,
                    work / "drain",
                    None,
                    extra,
                    allowance=600 + 30 * runs,
                    timeout=1800 + 30 * runs,
                )
            )
        results.append(pair)
        bare_rate, our_rate = pair[0].per_minute, pair[1].per_minute
        rows.append(
            ratio_row(
                "queued runs completed/min by dagster-daemon (deploy/dagster.yaml), generated "
                f"task jobs (manual launches; median run: start-up {pair[1].startup:.1f} s, "
                f"execution {pair[1].execution:.1f} s; one-asset: {pair[0].startup:.1f} s, "
                f"{pair[0].execution:.1f} s)",
                f"N={n}, {runs} runs",
                "runs/min",
                [our_rate],
                [bare_rate],
                target=DRAIN_TARGET,
                at_least=True,
                baseline_label="one-asset jobs, location of N jobs",
            )
        )
    failed = [
        f"{d.label}: {d.runs - d.succeeded} of {d.runs} drained runs did not succeed"
        for pair in results
        for d in pair
        if d.succeeded != d.runs
    ]
    rows.append(check_row("every drained run succeeded", ",".join(map(str, sizes)), failed))
    return rows


def sensor_rows(ledger_sizes: Sequence[int], rounds: int, work: Path) -> list[Row]:
    import scale_sensors  # imported here: only this part builds large ledgers

    by_size = {}
    for n in ledger_sizes:
        log(f"sensors, {n:,} ledger entries")
        by_size[n] = scale_sensors.measure_size(scale_sensors.sqlite_url(work, n), n, rounds, log)
    low, high = min(by_size), max(by_size)
    size = f"{scale_sensors.CHANGES} changes/tick; {high:,} vs {low:,} entries"
    rows = []
    for name, values in by_size[high].ms.items():
        reference = name == scale_sensors.SCAN
        target = None if reference else SENSOR_TARGET
        what = name if reference else f"one tick of {name}, ms"
        rows.append(
            Row(
                area=AREA,
                measurement=what,
                size=size,
                value=statistics.median(values),
                unit="ms",
                backend="sqlite",
                baseline=statistics.median(by_size[low].ms[name]),
                baseline_label=f"same, {low:,} entries",
                ratio=statistics.median(values) / statistics.median(by_size[low].ms[name]),
                target="" if target is None else f"ratio <= {target:.2f}",
                met=None
                if target is None
                else (
                    statistics.median(values) / statistics.median(by_size[low].ms[name]) <= target
                ),
            )
        )
    problems = [p for result in by_size.values() for p in result.problems]
    rows.append(check_row("every change handled by its sensor's tick", size, problems))
    return rows


# --- driver -------------------------------------------------------------------------------------


def parse_sizes(text: str, what: str, low: int = 1, high: int = 2000) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be comma-separated integers") from None
    if not sizes or any(not low <= s <= high for s in sizes):
        raise argparse.ArgumentTypeError(f"{what} must be between {low} and {high}, got {text!r}")
    return sorted(set(sizes))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,100,500", help="N tasks, e.g. 10,100,500")
    parser.add_argument("--session-sizes", help="N for the dagster dev sessions (default --sizes)")
    parser.add_argument("--drain-sizes", help="N for the drain (default --sizes)")
    parser.add_argument("--slot-minutes", type=int, default=5, choices=SLOT_CHOICES[:-1])
    parser.add_argument("--window", type=float, default=600.0, help="session window, seconds")
    parser.add_argument("--settle", type=float, default=30.0, help="after the location loads")
    parser.add_argument("--repeat", type=int, default=1, help="pairs per measurement")
    parser.add_argument(
        "--sched-repeat", type=int, default=3, help="pairs of scheduler iterations per N"
    )
    parser.add_argument("--drain-runs", type=int, default=40)
    parser.add_argument("--ledger-sizes", default="10000,100000")
    parser.add_argument("--sensor-rounds", type=int, default=5)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated: {PARTS}")
    parser.add_argument("--work", help="keep homes, locations and logs here")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes, "--sizes")
        session_sizes = parse_sizes(args.session_sizes or args.sizes, "--session-sizes")
        drain_sizes = parse_sizes(args.drain_sizes or args.sizes, "--drain-sizes")
        ledger_sizes = parse_sizes(args.ledger_sizes, "--ledger-sizes", 100, 10_000_000)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        parser.error(f"unknown part {', '.join(unknown) or '(none)'}; choose from {PARTS}")
    counts = (args.repeat, args.sched_repeat, args.drain_runs, args.sensor_rounds)
    if min(counts) < 1 or args.window <= 0:
        parser.error("--repeat, --sched-repeat, --drain-runs, --sensor-rounds >= 1")
    if "session" in parts and args.window < 30:
        parser.error("--window must be at least 30 s (it starts 10-20 s before a boundary)")

    with tempfile.TemporaryDirectory(prefix="dueledger-scale-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        log(f"load average at start: {load_average()}; work in {work}")
        wanted = sorted(set(sizes) | set(session_sizes))
        locs = {n: write_locations(work, n, args.slot_minutes) for n in wanted}
        rows: list[Row] = []
        if "load" in parts:
            rows += load_rows({n: locs[n] for n in sizes}, args.repeat, work)
        if "scheduling" in parts:
            rows += scheduling_rows({n: locs[n] for n in sizes}, args.sched_repeat, work)
        if "sensors" in parts:
            rows += sensor_rows(ledger_sizes, args.sensor_rounds, work)
        if "session" in parts:
            rows += session_rows(
                {n: locs[n] for n in session_sizes}, args.repeat, work, args.window, args.settle
            )
        if "drain" in parts:
            rows += drain_rows(drain_sizes, args.drain_runs, work)
        log(f"load average at end: {load_average()}")
    for row in rows:
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}"
        verdict = "" if row.met is None else (" met" if row.met else " MISSED")
        print(f"{row.measurement} [{row.size}]: {row.value:.4g} {row.unit}; ratio {ratio}{verdict}")
    if args.json:
        write_json(args.json, "scale", rows)
    return 1 if any(r.kind == KIND_CHECK and r.met is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
