"""Run every benchmark and print ONE table headed by the machine and the UTC date.

    uv run --frozen python bench/run.py [--full] [--markdown] [--only a,b] [--out DIR]
                                        [--fail-on-miss] [--verbose] [--dry-run]

Each bench runs in its own process (most start their own throwaway PostgreSQL from
``tests/pg_server.py``) with ``--json PATH``; it writes its result rows there and this
script merges them:

- ``scheduling``: ``bench/scheduling.py`` -- one scheduler-daemon iteration per due,
  dueledger schedules vs plain Dagster cron schedules (target ratio <= 1.10);
- ``claims``: ``bench/ledger_claims.py`` -- claim/heartbeat/succeed cycles/s vs raw UPDATEs;
- ``commits``: ``bench/pg_commits.py`` -- PostgreSQL's single-row commit rate (pgbench), the
  physical ceiling for claims;
- ``reclaim``: ``bench/reclaim_scan.py`` -- the lease-reclaim scan (target <= 50 ms);
- ``queries``: ``bench/ledger_queries.py`` -- ``runs list`` pages (target p95 <= 20 ms);
- ``assets``: ``bench/assets.py`` -- each domain rule in pandas vs SQL;
- ``idle``: ``bench/idle.py`` -- CPU of an idle ``dagster dev`` vs a one-asset location
  (target ratio <= 1.5);
- ``drain``: ``bench/drain.py`` -- queued runs drained per minute by ``dagster-daemon``,
  dueledger task jobs vs one-asset jobs (target ratio >= 0.85).
- ``run_cost``: ``bench/run_cost.py`` -- CPU and peak memory of loading the code location
  and of one run of a task's job, vs a one-asset Dagster location (targets 1.30, 1.15).
- ``scale``: ``bench/scale.py`` -- N = 10, 100, 500 generated tasks against plain Dagster
  with as many jobs and cron schedules: load, scheduling per due, ``dagster dev`` CPU over
  slot boundaries, due -> start latency, stored rows per day, drain, the ledger sensors'
  tick on 10,000 and 100,000 entries (the target sizes).
- ``run_parts``: ``bench/run_parts.py`` -- a task run's CPU part by part (import Dagster,
  open the instance, load the location, resolve the job, execute) vs a one-asset run.
- ``metrics``: ``bench/metrics_scrape.py`` -- one Prometheus scrape of `dueledger metrics
  serve` vs ``SELECT count(*)`` on the same ledger, before and after migration 0005 (target
  <= 200 ms at 1,000,000 entries).
- ``reads``: ``bench/reads.py`` -- the CLI's read commands cold (CPU) vs ``python -c pass``
  and ``sqlite3``, none importing Dagster (target: each read <= 0.4 s CPU), and
  ``ledger_health`` materialized in process (target <= 5 s at 100,000 entries), and a zoned
  rule's dues against the same in UTC (target <= 2x).
- ``skipped_dues``: ``bench/skipped_dues.py`` -- dues the ledger skips (overlap ``skip``, the
  task busy) or holds as the task's waiter (``buffer_one``) through the real scheduler:
  Dagster runs created per due (target 0, against a plain schedule's 1), the dues recorded
  once each, and the tick's CPU per due.

Default sizes are small (a few minutes); ``--full`` uses the target sizes (1,000,000
entries and rows, N = 200 schedules due at once: about half an hour on 2 cores). The table
goes to stdout (``--markdown``: as Markdown, as pasted into docs/performance.md); progress
goes to stderr, and each bench's own output (with its detailed tables and plans) to a log
file in ``--out`` (default: a new temporary directory, kept and named at the end).

Exit status: 0 when every bench ran and its correctness checks held (double claims,
exactly the expired leases reclaimed, one run per due, ...); 1 when a bench failed to run
or a check failed; 2 bad arguments. A missed *speed* target is shown in the table (``MISS``)
but does not change the exit status -- timings on a shared machine are noisy and this
script records them rather than gating on them -- unless ``--fail-on-miss`` is given
(then exit 3).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent

EXIT_OK, EXIT_FAILED, EXIT_MISSED = 0, 1, 3
KIND_SPEED, KIND_CHECK = "speed", "check"
KINDS = (KIND_SPEED, KIND_CHECK)


# --- result rows (written by every bench with --json, merged here) ----------------------------


@dataclass(frozen=True)
class Row:
    """One line of the merged table.

    ``value`` is in ``unit``; ``baseline`` is measured in the same run, in the same unit,
    and ``ratio`` is the bench's own ratio (it says which way round in ``measurement`` or
    ``baseline_label``). ``met`` is None when there is no target. ``kind`` ``check`` marks
    a correctness check (its miss is a failure, not noise).
    """

    area: str
    measurement: str
    size: str
    value: float
    unit: str
    backend: str = ""
    baseline: float | None = None
    baseline_label: str = ""
    ratio: float | None = None
    target: str = ""
    met: bool | None = None
    kind: str = KIND_SPEED

    @classmethod
    def from_json(cls, data: Any, where: str) -> Row:
        """A row from its JSON object; a ValueError naming ``where`` and the field."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: a row must be a JSON object, got {data!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown row field(s) {unknown}; known: {sorted(known)}")
        missing = [k for k in ("area", "measurement", "size", "value", "unit") if k not in data]
        if missing:
            raise ValueError(f"{where}: row {data!r} lacks {missing}")
        for name in ("area", "measurement", "size", "unit", "backend", "baseline_label", "target"):
            if name in data and not isinstance(data[name], str):
                raise ValueError(
                    f"{where}: row field {name!r} must be a string, got {data[name]!r}"
                )
        for name in ("value", "baseline", "ratio"):
            value = data.get(name)
            if name != "value" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{where}: row field {name!r} must be a number, got {value!r}")
        if data.get("met") is not None and not isinstance(data["met"], bool):  # 1 == True
            raise ValueError(f"{where}: row field 'met' must be true, false or null")
        if data.get("kind", KIND_SPEED) not in KINDS:
            raise ValueError(f"{where}: row field 'kind' must be one of {KINDS}")
        return cls(**data)


def write_json(path: str | os.PathLike[str], bench: str, rows: Iterable[Row]) -> None:
    """Write a bench's rows for ``bench/run.py`` (the ``--json PATH`` option of each bench)."""
    payload = {"bench": bench, "rows": [asdict(r) for r in rows]}
    Path(path).write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")


def read_json(path: str | os.PathLike[str]) -> tuple[str, list[Row]]:
    """A bench's name and rows from its ``--json`` file (ValueError when malformed)."""
    try:
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read bench results: {exc}") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("rows"), list):
        raise ValueError(f"{path}: expected {{'bench': name, 'rows': [...]}}")
    bench = str(payload.get("bench", "?"))
    rows = [Row.from_json(r, f"{path} row {i}") for i, r in enumerate(payload["rows"])]
    return bench, rows


# --- derived rows ------------------------------------------------------------------------------

CLAIMS_AREA = "ledger claims"
COMMITS_AREA = "PostgreSQL commits"
COMMITS_PER_CYCLE = 3  # claim, heartbeat, succeed: three autocommit UPDATEs


def ceiling_rows(rows: Sequence[Row]) -> list[Row]:
    """Ledger claim cycles/s as a fraction of PostgreSQL's own commit rate at the same
    concurrency (both benches report ``size`` as ``<n> worker(s)``/``<n> client(s)``)."""
    ceilings = {
        _count(r.size): r
        for r in rows
        if r.area == COMMITS_AREA and r.measurement.startswith("single-row UPDATE commits/s")
    }
    out = []
    for r in rows:
        if r.area != CLAIMS_AREA or r.unit != "cycles/s":
            continue
        ceiling = ceilings.get(_count(r.size))
        if ceiling is None or not ceiling.value:
            continue
        out.append(
            Row(
                area="claims vs ceiling",
                measurement=(
                    f"RunLedger cycles/s / commit ceiling ({COMMITS_PER_CYCLE} commits per "
                    f"cycle: at most {1 / COMMITS_PER_CYCLE:.2f})"
                ),
                size=r.size,
                backend=r.backend,
                value=r.value,
                unit="cycles/s",
                baseline=ceiling.value,
                baseline_label=ceiling.measurement,
                ratio=r.value / ceiling.value,
            )
        )
    return out


def merge(row_lists: Iterable[Sequence[Row]]) -> list[Row]:
    """The benches' rows in order, with the derived claims-vs-ceiling rows after the last
    claims or commits row."""
    rows = [r for rows in row_lists for r in rows]
    derived = ceiling_rows(rows)
    at = max(
        (i + 1 for i, r in enumerate(rows) if r.area in (CLAIMS_AREA, COMMITS_AREA)),
        default=len(rows),
    )
    return [*rows[:at], *derived, *rows[at:]]


def _count(size: str) -> int | None:
    head = size.split()[0] if size.split() else ""
    return int(head) if head.isdigit() else None


# --- machine ------------------------------------------------------------------------------------


def _first_line_with(path: str, prefix: str) -> str | None:
    try:
        for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip() if ":" in line else line[len(prefix) :]
    except OSError:
        return None
    return None


def postgres_version() -> str:
    """``postgres --version`` of the binaries the benches use (tests/pg_server.py)."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import pg_server  # tests/pg_server.py (standard library only)

        bindir = pg_server.find_bindir()
    finally:
        sys.path.remove(str(ROOT / "tests"))
    if bindir is None:
        return "not installed"
    try:
        done = subprocess.run(
            [str(bindir / "postgres"), "--version"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    return done.stdout.strip() or "unknown"


def _package_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, str]:
    """What the numbers were measured on (the table's heading)."""
    mem_kb = _first_line_with("/proc/meminfo", "MemTotal")
    ram = f"{int(mem_kb.split()[0]) / 1024 / 1024:.1f} GiB" if mem_kb else "unknown"
    os_name = _first_line_with("/etc/os-release", "PRETTY_NAME=")
    return {
        "cpu": _first_line_with("/proc/cpuinfo", "model name") or platform.processor() or "?",
        "cores": str(os.cpu_count()),
        "ram": ram,
        "os": f"{(os_name or platform.system()).strip(chr(34))} ({platform.release()}, "
        f"{platform.machine()})",
        "python": platform.python_version(),
        "dagster": _package_version("dagster"),
        "postgresql": postgres_version(),
    }


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


# --- the table ------------------------------------------------------------------------------------

COLUMNS = ("area", "measurement", "backend", "size", "value", "baseline", "ratio", "target", "met?")


def fmt_number(x: float) -> str:
    """Readable at any magnitude: 12,345 / 123.4 / 12.35 / 1.235 / 0.0123."""
    if math.isnan(x):
        return "nan"
    ax = abs(x)
    if ax >= 1000:
        return f"{x:,.0f}"
    if ax >= 100:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    if ax == 0:
        return "0"
    return f"{x:.3g}"


def fmt_ratio(x: float) -> str:
    """Two decimals; three significant digits below 0.1 (0.0443, not 0.04)."""
    return f"{x:.3g}" if 0 < abs(x) < 0.1 else f"{x:.2f}"


def verdict(row: Row) -> str:
    if row.met is None:
        return "-"
    if row.met:
        return "yes"
    return "FAILED" if row.kind == KIND_CHECK else "MISS"


def cells(row: Row) -> list[str]:
    value = f"{fmt_number(row.value)} {row.unit}".strip()
    if row.baseline is None:
        baseline = "-"
    else:
        baseline = f"{fmt_number(row.baseline)} ({row.baseline_label})".strip()
    ratio = "-" if row.ratio is None else fmt_ratio(row.ratio)
    return [
        row.area,
        row.measurement,
        row.backend or "-",
        row.size,
        value,
        baseline,
        ratio,
        row.target or "-",
        verdict(row),
    ]


@dataclass
class Report:
    """Everything one run of this script prints."""

    started_at: datetime
    finished_at: datetime
    machine: dict[str, str]
    rows: list[Row]
    outcomes: list[Outcome] = field(default_factory=list)
    load: tuple[str, str] = ("?", "?")
    full: bool = False

    def heading(self) -> list[str]:
        m = self.machine
        return [
            f"dueledger benchmarks, {'full' if self.full else 'small'} sizes, "
            f"{self.started_at:%Y-%m-%d %H:%M}-{self.finished_at:%H:%M} UTC",
            f"machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, {m.get('ram', '?')} "
            f"RAM, {m.get('os', '?')}",
            f"software: Python {m.get('python', '?')}, Dagster {m.get('dagster', '?')}, "
            f"{m.get('postgresql', '?')}",
            f"load average (1/5/15 min) at start {self.load[0]}, at end {self.load[1]}",
        ]

    def bench_lines(self) -> list[str]:
        return [
            f"{o.name}: {o.seconds:.0f} s, exit {o.exit_code}"
            + (f", {o.error}" if o.error else "")
            + f" ({' '.join(o.args) or 'bench defaults'})"
            for o in self.outcomes
        ]


def text_table(rows: Sequence[Row]) -> list[str]:
    body = [cells(r) for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(COLUMNS)]
    line = " | ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True))
    out = [line, "-+-".join("-" * w for w in widths)]
    out += [" | ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)) for b in body]
    return out


def markdown_table(rows: Sequence[Row]) -> list[str]:
    def esc(text: str) -> str:
        return text.replace("|", "\\|")

    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    out += ["| " + " | ".join(esc(c) for c in cells(r)) + " |" for r in rows]
    return out


def render(report: Report, markdown: bool) -> str:
    rows = report.rows
    if markdown:
        lines = [f"**{report.heading()[0]}**", ""]
        lines += [f"- {h}" for h in report.heading()[1:]]
        lines += [f"- bench {b}" for b in report.bench_lines()]
        lines += ["", *markdown_table(rows)]
    else:
        lines = [*report.heading(), *(f"bench {b}" for b in report.bench_lines()), ""]
        lines += text_table(rows)
    missed = [r for r in rows if r.met is False and r.kind == KIND_SPEED]
    failed = [r for r in rows if r.met is False and r.kind == KIND_CHECK]
    lines.append("")
    lines.append(
        f"{len(rows)} rows; {len(missed)} speed target(s) missed; {len(failed)} check(s) "
        "failed. ratio: value against baseline, both measured in this run "
        "(docs/performance.md says how each bench forms it)."
    )
    return "\n".join(lines)


# --- running the benches ----------------------------------------------------------------------


@dataclass(frozen=True)
class Bench:
    name: str
    script: str
    small: tuple[str, ...]
    full: tuple[str, ...]


BENCHES: tuple[Bench, ...] = (
    Bench(
        "scheduling",
        "scheduling.py",
        ("--sizes", "1,20", "--repeat", "3"),
        ("--sizes", "1,20,200", "--repeat", "3"),
    ),
    Bench(
        "claims",
        "ledger_claims.py",
        # The target is at 1, 4 and 8 workers; two rounds so each side goes first once.
        ("--seconds", "2", "--workers", "1,4,8", "--rounds", "2"),
        ("--workers", "1,4,8"),
    ),
    Bench(
        "commits",
        "pg_commits.py",
        ("--seconds", "2", "--clients", "1,4"),
        ("--clients", "1,4,8"),
    ),
    Bench(
        "reclaim",
        "reclaim_scan.py",
        ("--entries", "20000", "--repeat", "3"),
        ("--entries", "1000000", "--repeat", "5"),
    ),
    Bench(
        "queries",
        "ledger_queries.py",
        ("--entries", "20000", "--pages", "5", "--repeat", "1", "--no-explain"),
        ("--entries", "1000000", "--no-explain"),
    ),
    Bench(
        "assets",
        "assets.py",
        ("--rows", "20000", "--repeat", "1"),
        ("--rows", "1000000"),
    ),
    # The daemon's own cost: an idle dagster dev, and how fast the real daemon drains a queue.
    Bench("idle", "idle.py", ("--seconds", "60"), ("--seconds", "120", "--pairs", "2")),
    Bench("drain", "drain.py", ("--runs", "10"), ("--runs", "40")),
    Bench(
        "run_cost",
        "run_cost.py",
        ("--repeat", "2", "--tasks", "tick_every_slot,order_cleanup"),
        ("--repeat", "3", "--tasks", "all"),
    ),
    # N generated tasks against plain Dagster at the same N. Small: what CI runs
    # (tests/bench/test_bench_scale.py), a few minutes; full: N = 10, 100, 500, 10-minute
    # dagster dev windows on 5-minute slots, 40-run drains, 10,000/100,000-entry ledgers.
    Bench(
        "scale",
        "scale.py",
        (
            *("--sizes", "2,10", "--session-sizes", "10", "--drain-sizes", "10"),
            *("--slot-minutes", "1", "--window", "30", "--settle", "0", "--drain-runs", "4"),
            *("--ledger-sizes", "1000,5000", "--sensor-rounds", "2", "--sched-repeat", "1"),
        ),
        (
            *("--sizes", "10,100,500", "--slot-minutes", "5", "--window", "600"),
            *("--settle", "30", "--drain-runs", "40", "--ledger-sizes", "10000,100000"),
        ),
    ),
    # Where a task run's CPU goes, part by part, against a one-asset run.
    Bench("run_parts", "run_parts.py", ("--repeat", "3"), ("--repeat", "5")),
    Bench(
        "metrics",
        "metrics_scrape.py",
        ("--entries", "20000", "--repeat", "3"),
        ("--entries", "1000000", "--repeat", "5"),
    ),
    Bench(
        "reads",
        "reads.py",
        ("--entries", "10000", "--rounds", "3"),
        ("--entries", "100000", "--rounds", "5"),
    ),
    # A due the ledger skips, decided at the tick: no run, recorded once, and its tick's CPU.
    Bench(
        "skipped_dues",
        "skipped_dues.py",
        ("--tasks", "5", "--repeat", "2"),
        ("--tasks", "50", "--repeat", "3"),
    ),
)


@dataclass
class Outcome:
    name: str
    args: tuple[str, ...]
    exit_code: int
    seconds: float
    rows: list[Row]
    log: Path
    error: str = ""


def command(bench: Bench, full: bool, json_path: Path) -> list[str]:
    args = bench.full if full else bench.small
    return [sys.executable, str(BENCH_DIR / bench.script), *args, "--json", str(json_path)]


def run_bench(bench: Bench, full: bool, out_dir: Path, verbose: bool) -> Outcome:
    json_path = out_dir / f"{bench.name}.json"
    log = out_dir / f"{bench.name}.log"
    json_path.unlink(missing_ok=True)
    cmd = command(bench, full, json_path)
    args = tuple(cmd[2:-2])
    print(f"== {bench.name}: {' '.join(cmd[1:-2])} (log {log})", file=sys.stderr, flush=True)
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as fh:
        if verbose:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                fh.write(line)
                sys.stderr.write(line)
            code = proc.wait()
        else:
            code = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT).returncode
    seconds = time.monotonic() - started
    rows: list[Row] = []
    error = ""
    if json_path.exists():
        try:
            _, rows = read_json(json_path)
        except ValueError as exc:
            error = str(exc)
    else:
        error = "wrote no results"
    if error:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
        print("\n".join(f"   | {t}" for t in tail), file=sys.stderr)
    print(
        f"   {bench.name}: exit {code}, {len(rows)} rows, {seconds:.0f} s"
        + (f" -- FAILED: {error}" if error else ""),
        file=sys.stderr,
        flush=True,
    )
    return Outcome(bench.name, args, code, seconds, rows, log, error)


def exit_status(outcomes: Sequence[Outcome], rows: Sequence[Row], fail_on_miss: bool) -> int:
    """1: a bench did not run or a check failed; 3: a speed target missed with
    ``fail_on_miss``; else 0. A bench that exits non-zero but wrote its rows ran (e.g.
    ledger_queries exits 1 on a missed target, which its rows show)."""
    if any(o.error for o in outcomes):
        return EXIT_FAILED
    if any(r.met is False and r.kind == KIND_CHECK for r in rows):
        return EXIT_FAILED
    if fail_on_miss and any(r.met is False for r in rows):
        return EXIT_MISSED
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = [b.name for b in BENCHES]
    parser.add_argument("--only", default=",".join(names), help=f"comma-separated: {names}")
    parser.add_argument("--full", action="store_true", help="the full target sizes (long)")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--out", help="directory for each bench's log and JSON (default: new)")
    parser.add_argument("--fail-on-miss", action="store_true", help="exit 3 on a missed target")
    parser.add_argument("--verbose", action="store_true", help="stream each bench's output")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    ns = parser.parse_args(argv)
    wanted = [n.strip() for n in ns.only.split(",") if n.strip()]
    unknown = sorted(set(wanted) - set(names))
    if unknown or not wanted:
        parser.error(f"unknown bench {', '.join(unknown) or '(none)'}; choose from {names}")
    selected = [b for b in BENCHES if b.name in wanted]
    out_dir = Path(ns.out) if ns.out else Path(tempfile.mkdtemp(prefix="dueledger-bench-run-"))
    if ns.dry_run:
        for bench in selected:
            print(" ".join(command(bench, ns.full, out_dir / f"{bench.name}.json")))
        return EXIT_OK
    out_dir.mkdir(parents=True, exist_ok=True)

    started_at, load_start = datetime.now(UTC), load_average()
    outcomes = [run_bench(bench, ns.full, out_dir, ns.verbose) for bench in selected]
    rows = merge([o.rows for o in outcomes])
    report = Report(
        started_at=started_at,
        finished_at=datetime.now(UTC),
        machine=machine(),
        rows=rows,
        outcomes=outcomes,
        load=(load_start, load_average()),
        full=ns.full,
    )
    print(f"logs and JSON: {out_dir}", file=sys.stderr)
    print(render(report, ns.markdown))
    return exit_status(outcomes, rows, ns.fail_on_miss)


if __name__ == "__main__":
    raise SystemExit(main())
