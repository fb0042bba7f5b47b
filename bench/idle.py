"""Benchmark: the CPU an idle ``dagster dev`` uses on dueledger's code location, against the
same ``dagster dev`` on a one-asset location (``bench/idle_bare_location.py``).

    uv run --frozen python bench/idle.py [--seconds S] [--settle S] [--pairs N]
                                         [--project LABEL=DIR ...] [--json PATH]

Per pair, one after the other (A/B alternating, the baseline first): a fresh
``DAGSTER_HOME`` seeded from the project's ``dagster.yaml.local``, ``dagster dev`` started
in its own session, GraphQL polled until the location is loaded, then ``--settle`` seconds
(the first evaluation of every sensor, the schedules' start), then the CPU time
(user + system, children reaped included) of the whole process tree -- webserver, daemon,
code server -- over ``--seconds`` wall seconds, read from ``/proc``. The figure is % of one
core; the ratio is dueledger's against the baseline's of the same pair (median over pairs).
Target: <= 1.3x.

"Idle" means no due in the window: the processes run with ``DUELEDGER_SLOT_MINUTES=1440``,
so every dueledger schedule fires at 00:00 UTC only (the sensors evaluate exactly as on
15-minute slots: each looks at the current slot), and a measurement that would reach
midnight waits for it to pass first (a fresh instance fires no due that passed before it
started).

``--project LABEL=DIR`` (repeatable) measures another checkout's location with this venv,
e.g. ``--project main=/tmp/main`` next to ``--project branch=.``: each pair then measures
the baseline and every project in turn. The default is this checkout, labelled
``dueledger``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import _paths  # first: puts the project and tests/ on sys.path

# isort: split

from pg_server import free_port  # tests/pg_server.py
from processes import start_group, stop_group  # tests/processes.py
from run import Row, write_json

AREA = "idle daemon"
BARE = "bare"
TARGET_RATIO = 1.3
SLOT_MINUTES = 1440
STARTUP_ALLOWANCE = timedelta(seconds=300)  # start-up before the settle, with room to spare
BARE_LOCATION = _paths.BENCH_DIR / "idle_bare_location.py"
QUERY = "{ repositoriesOrError { ... on RepositoryConnection { nodes { name } } } }"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Target:
    label: str
    root: Path  # the checkout (cwd, PYTHONPATH, dagster.yaml.local)
    workspace: dict  # workspace.yaml contents


@dataclass(frozen=True)
class Sample:
    label: str
    cpu_seconds: float
    wall_seconds: float
    processes: int

    @property
    def percent(self) -> float:
        return 100.0 * self.cpu_seconds / self.wall_seconds


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def tree_pids(leader: int) -> set[int]:
    """The leader, its session and every descendant (by parent pid) still alive."""
    parents: dict[int, int] = {}
    session: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is None:
            continue
        parents[int(entry)] = int(fields[1])
        if int(fields[3]) == leader:
            session.add(int(entry))
    found = {leader} | session
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in found and pid not in found:
                found.add(pid)
                changed = True
    return found


def tree_cpu(leader: int) -> tuple[float, int]:
    """CPU seconds (utime + stime + cutime + cstime) of the tree, and its process count.

    A child that ended and was reaped counts in its parent's cutime/cstime, so a short-lived
    process between two readings is not lost (unless its parent is gone too)."""
    total, count = 0, 0
    for pid in tree_pids(leader):
        fields = _stat_fields(pid)
        if fields is None:
            continue
        total += sum(int(fields[i]) for i in (11, 12, 13, 14))
        count += 1
    return total / CLOCK_TICKS, count


def location_loaded(port: int) -> bool:
    """Whether the webserver on ``port`` lists a loaded repository."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": QUERY}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            payload = json.loads(response.read())
    except (OSError, ValueError):
        return False
    nodes = (payload.get("data") or {}).get("repositoriesOrError", {}).get("nodes") or []
    return bool(nodes)


def wait_out_slot_boundary(need: timedelta, *, now: datetime | None = None) -> float:
    """Seconds to wait so ``need`` from now does not reach a slot boundary (0: none)."""
    now = now or datetime.now(UTC)
    boundary = now.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    if now + need < boundary:
        return 0.0
    return (boundary - now).total_seconds() + 5.0


def measure(target: Target, seconds: float, settle: float, work: Path) -> Sample:
    """One idle measurement of ``dagster dev`` on ``target`` (fresh DAGSTER_HOME)."""
    wait = wait_out_slot_boundary(STARTUP_ALLOWANCE + timedelta(seconds=settle + seconds))
    if wait:
        print(f"  waiting {wait:.0f} s for the slot boundary to pass", file=sys.stderr)
        time.sleep(wait)
    run_dir = Path(tempfile.mkdtemp(prefix=f"idle-{target.label}-", dir=work))
    home = run_dir / "home"
    home.mkdir()
    shutil.copyfile(target.root / "dagster.yaml.local", home / "dagster.yaml")
    workspace = run_dir / "workspace.yaml"
    workspace.write_text(json.dumps(target.workspace))  # JSON is YAML
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(target.root)}
    env["DUELEDGER_SLOT_MINUTES"] = str(SLOT_MINUTES)
    cmd = [sys.executable, "-m", "dagster", "dev", "-w", str(workspace)]
    cmd += ["-h", "127.0.0.1", "-p", str(port)]
    log_path = run_dir / "dagster-dev.log"
    with log_path.open("wb") as log:
        proc = start_group(cmd, cwd=target.root, env=env, log=log)
        try:
            deadline = time.monotonic() + 600
            while not location_loaded(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"dagster dev on {target.label} did not load: "
                        + log_path.read_text(errors="replace")[-3000:]
                    )
                time.sleep(1)
            time.sleep(settle)
            cpu0, _ = tree_cpu(proc.pid)
            wall0 = time.monotonic()
            time.sleep(seconds)
            cpu1, count = tree_cpu(proc.pid)
            wall = time.monotonic() - wall0
        finally:
            stop_group(proc)
    sample = Sample(target.label, cpu1 - cpu0, wall, count)
    print(
        f"  {target.label}: {sample.percent:.2f} % of a core ({sample.cpu_seconds:.1f} s CPU "
        f"in {wall:.0f} s, {count} processes)",
        file=sys.stderr,
        flush=True,
    )
    return sample


def targets(projects: Sequence[str]) -> list[Target]:
    bare = Target(
        BARE,
        _paths.ROOT,
        {
            "load_from": [
                {
                    "python_file": {
                        "relative_path": str(BARE_LOCATION),
                        "working_directory": str(BARE_LOCATION.parent),
                        "location_name": "bare",
                    }
                }
            ]
        },
    )
    out = [bare]
    for spec in projects or [f"dueledger={_paths.ROOT}"]:
        label, _, directory = spec.partition("=")
        root = Path(directory or ".").resolve()
        if not label or label == BARE or not (root / "workspace.yaml").is_file():
            raise SystemExit(f"--project {spec!r}: want LABEL=DIR with DIR/workspace.yaml")
        module = {
            "module_name": "orchestration.definitions",
            "attribute": "defs",
            "location_name": "dueledger",
            "working_directory": str(root),
        }
        out.append(Target(label, root, {"load_from": [{"python_module": module}]}))
    return out


def run_pairs(
    chosen: Sequence[Target], pairs: int, seconds: float, settle: float, work: Path
) -> Iterator[list[Sample]]:
    for n in range(pairs):
        print(f"pair {n + 1}/{pairs}", file=sys.stderr, flush=True)
        yield [measure(target, seconds, settle, work) for target in chosen]


def rows(results: Sequence[Sequence[Sample]], seconds: float) -> list[Row]:
    labels = [s.label for s in results[0]]
    out: list[Row] = []
    bare = statistics.median(r[0].percent for r in results)
    size = f"{seconds:.0f} s x {len(results)} pairs"
    out.append(
        Row(
            area=AREA,
            measurement="dagster dev CPU at idle, one-asset location",
            size=size,
            value=round(bare, 3),
            unit="% of a core",
            backend="sqlite",
        )
    )
    for i, label in enumerate(labels[1:], start=1):
        value = statistics.median(r[i].percent for r in results)
        ratio = statistics.median(r[i].percent / max(r[0].percent, 1e-9) for r in results)
        name = "" if label == "dueledger" else f" ({label})"
        out.append(
            Row(
                area=AREA,
                measurement=f"dagster dev CPU at idle, dueledger location{name}",
                size=size,
                value=round(value, 3),
                unit="% of a core",
                backend="sqlite",
                baseline=round(bare, 3),
                baseline_label="one-asset location",
                ratio=round(ratio, 3),
                target=f"<= {TARGET_RATIO}x",
                met=ratio <= TARGET_RATIO,
            )
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="measured window")
    parser.add_argument("--settle", type=float, default=30.0, help="wait after loading")
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--project", action="append", default=[], metavar="LABEL=DIR")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.seconds <= 0 or args.settle < 0:
        parser.error("--pairs >= 1, --seconds > 0, --settle >= 0")
    chosen = targets(args.project)
    with tempfile.TemporaryDirectory(prefix="dueledger-idle-") as work:
        results = list(run_pairs(chosen, args.pairs, args.seconds, args.settle, Path(work)))
    table = rows(results, args.seconds)
    for row in table:
        ratio = f", {row.ratio:.2f}x the one-asset location" if row.ratio is not None else ""
        print(f"{row.measurement}: {row.value:.2f} {row.unit}{ratio}")
    if args.json:
        write_json(args.json, "idle", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
