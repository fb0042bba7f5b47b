"""Run the project's benchmarks in one go and print one summary table with machine and date.

    uv run python bench/run.py [--only claims,queries,assets] [--full] [--dry-run]

Runs, one after the other, each in its own process (each starts its own throwaway
PostgreSQL from ``tests/pg_server.py``):

- ``claims``:  ``bench/ledger_claims.py`` -- ledger claim cycles/s vs raw UPDATEs;
- ``queries``: ``bench/ledger_queries.py --entries N`` -- ``runs list`` pages vs a SELECT;
- ``assets``:  ``bench/assets.py --rows N`` -- each domain rule in pandas vs SQL.

By default with small sizes (a few minutes on a small machine); ``--full`` uses each
bench's own defaults (1,000,000 rows/entries: much longer). Each bench's own table is
printed as it runs (those hold the results and their same-run ratios); the summary at the
end says what ran, with which arguments, whether it succeeded and how long it took.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Bench:
    name: str
    script: str
    small: tuple[str, ...]
    what: str


BENCHES: tuple[Bench, ...] = (
    Bench(
        "claims",
        "ledger_claims.py",
        ("--seconds", "2", "--workers", "1,4", "--rounds", "1"),
        "ledger claim/heartbeat/succeed cycles/s vs raw UPDATEs (PostgreSQL)",
    ),
    Bench(
        "queries",
        "ledger_queries.py",
        ("--entries", "20000", "--pages", "5", "--repeat", "1", "--no-explain"),
        "runs list pages vs an indexed SELECT (SQLite + PostgreSQL)",
    ),
    Bench(
        "assets",
        "assets.py",
        ("--rows", "20000", "--repeat", "1"),
        "domain rules in pandas vs SQL (SQLite + PostgreSQL)",
    ),
)


@dataclass(frozen=True)
class Outcome:
    bench: Bench
    args: tuple[str, ...]
    exit_code: int
    seconds: float


def machine() -> str:
    """One line naming the machine the numbers come from."""
    return (
        f"{platform.node()} | {platform.platform()} | {platform.machine()} | "
        f"cpus={os.cpu_count()} | python {platform.python_version()}"
    )


def command(bench: Bench, full: bool) -> list[str]:
    args = [] if full else list(bench.small)
    return [sys.executable, str(BENCH_DIR / bench.script), *args]


def run(bench: Bench, full: bool) -> Outcome:
    cmd = command(bench, full)
    print(f"\n===== {bench.name}: {' '.join(cmd[1:])}", flush=True)
    started = time.monotonic()
    # Output goes straight to the terminal: each bench prints its own results table.
    done = subprocess.run(cmd, cwd=BENCH_DIR.parent, check=False)
    return Outcome(bench, tuple(cmd[2:]), done.returncode, time.monotonic() - started)


def summary(outcomes: list[Outcome], started_at: datetime) -> str:
    lines = [
        "",
        f"benchmarks run {started_at.strftime('%Y-%m-%dT%H:%M:%SZ')}",
        f"machine: {machine()}",
        "",
        f"| {'bench':<8} | {'arguments':<52} | {'exit':>4} | {'wall s':>7} | measures",
        f"|{'-' * 10}|{'-' * 54}|{'-' * 6}|{'-' * 9}|{'-' * 10}",
    ]
    for o in outcomes:
        args = " ".join(o.args) or "(bench defaults)"
        lines.append(
            f"| {o.bench.name:<8} | {args:<52} | {o.exit_code:>4} | {o.seconds:>7.1f} | "
            f"{o.bench.what}"
        )
    lines.append("")
    lines.append("exit != 0: the bench failed or reported a missed target (see its output above)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = [b.name for b in BENCHES]
    parser.add_argument("--only", default=",".join(names), help="comma-separated benches")
    parser.add_argument("--full", action="store_true", help="each bench's full-size defaults")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    ns = parser.parse_args(argv)
    wanted = [n.strip() for n in ns.only.split(",") if n.strip()]
    unknown = sorted(set(wanted) - set(names))
    if unknown or not wanted:
        parser.error(f"unknown bench {', '.join(unknown) or '(none)'}; choose from {names}")
    selected = [b for b in BENCHES if b.name in wanted]
    started_at = datetime.now(UTC)
    if ns.dry_run:
        print(f"machine: {machine()}")
        for bench in selected:
            print(" ".join(command(bench, ns.full)))
        return 0
    outcomes = [run(bench, ns.full) for bench in selected]
    print(summary(outcomes, started_at))
    return 0 if all(o.exit_code == 0 for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
