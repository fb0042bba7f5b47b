"""What a person waits for when they look: the CLI's read commands cold, and ``ledger_health``.

    uv run --frozen python bench/reads.py [--entries N] [--rounds R] [--json PATH]

Targets: the read commands of the CLI (`runs list`, `runs show`, `summary`,
`tasks`, `dues`, `alerts`) load only the core and the store, not Dagster -- each of `runs
list`, `runs show`, `summary`, `tasks` and `dues` cold in at most 0.4 s of CPU on this
machine -- and ``ledger_health`` materializes in at most 5 s with 100,000 ledger entries.

1. A SQLite ledger of ``--entries`` entries (default 10,000; the target's size is 100,000):
   every registered task's scheduled dues, slot after slot back from now, as the scheduler
   would have left them (mostly success, some failed).
2. **Cold commands**: each read command as a new process (the console script), its CPU (user
   + system, of the process and its children) against two baselines measured in the same run,
   alternating round by round: ``python -c pass`` (the interpreter alone) and the ``sqlite3``
   command-line tool running the same page query on the same file. Median of ``--rounds``.
   Each command is also checked: exit 0, valid JSON, and the process never imported Dagster
   (``-X importtime`` of the same command, read for a ``dagster`` line).
3. **ledger_health**: the real asset materialized in process (``dg.materialize``, the code
   location's ledger_health task asset: claim, summary, the latest-dues page, the
   materialization) against a one-asset materialization in the same instance, alternating.

4. **Zoned dues**: `dues tick_every_minute` over 10 days with the rules read in Europe/Berlin
   against the same in UTC, alternating (target: at most 2x).

Rows go to ``--json`` for bench/run.py; targets: each read <= 0.4 s CPU, ledger_health <= 5 s,
zoned dues <= 2x UTC.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from unittest import mock

import _paths  # noqa: F401  first: puts the project and tests/ on sys.path
import sqlalchemy as sa
from run import KIND_CHECK, Row, write_json

from resources.core.entry import Trigger

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
RUNS_LIST_TARGET_S = 0.4
HEALTH_TARGET_S = 5.0
COMMANDS: tuple[tuple[str, ...], ...] = (
    ("runs", "list", "--json"),
    ("runs", "show", "1", "--json"),
    ("summary", "--json"),
    ("tasks", "--json"),
    ("dues", "order_cleanup", "--json"),
    ("alerts", "--json"),
)
#: The commands held to the CPU target (each imports only what it uses).
TARGETED = {("runs", "list"), ("runs", "show"), ("summary",), ("tasks",), ("dues",)}
PAGE_SQL = "SELECT * FROM dueledger_entries ORDER BY created_at DESC, id DESC LIMIT 50;"


def make_ledger(url: str, entries: int, now: datetime) -> None:
    """``entries`` scheduled entries of the registered tasks, newest slot first, in bulk."""
    from orchestration.declarations import task_views
    from resources.core.due import floor_to_slot
    from resources.core.entry import dedup_key_for_due
    from resources.ledger import Ledger
    from resources.ledger.schema import entries as table

    ledger = Ledger.open(url)
    ledger.migrate()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # cadence warnings: see `tasks`
        views = task_views()
    rows: list[dict[str, object]] = []
    # Every due up to the last finished slot ran: a healthy ledger, nothing missed.
    due = floor_to_slot(now, 15) - timedelta(minutes=15)
    n = 0
    while n < entries:
        for view in views:
            if n >= entries:
                break
            at = due.replace(tzinfo=None)
            failed = n % 97 == 0
            rows.append(
                {
                    "task_key": view.spec.key,
                    "trigger": "schedule",
                    "origin": "due",
                    "dedup_key": dedup_key_for_due(due),
                    "due": at,
                    "status": "failed" if failed else "success",
                    "attempt": 1,
                    "max_attempts": view.spec.max_attempts,
                    "run_ids": [f"run-{n}"],
                    "created_at": at,
                    "started_at": at,
                    "finished_at": at + timedelta(seconds=30),
                    "updated_at": at + timedelta(seconds=30),
                    "failure_kind": "error" if failed else None,
                    "error": "ValueError: generated" if failed else None,
                    "summary": {"late_job_rejections": [], "dispatch_failures": [], "hooks": []},
                    "claim_generation": 1,
                }
            )
            n += 1
        due -= timedelta(minutes=15)
    engine = ledger._get_engine()
    with engine.begin() as conn:
        for start in range(0, len(rows), 5000):
            conn.execute(sa.insert(table), rows[start : start + 5000])
    ledger.dispose()


def cpu_of(
    argv: Sequence[str], env: dict[str, str]
) -> tuple[float, subprocess.CompletedProcess[str]]:
    """CPU seconds (user + system) of one process and its children, and its result."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, done


def imports_dagster(command: Sequence[str], env: dict[str, str]) -> bool:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "orchestration.cli", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return any(line.rstrip().endswith("| dagster") for line in done.stderr.splitlines())


def cold_commands(db: Path, env: dict[str, str], rounds: int) -> list[Row]:
    """Each read command cold vs ``python -c pass`` and ``sqlite3``, alternating."""
    python_pass = [sys.executable, "-c", "pass"]
    sqlite = ["sqlite3", str(db), PAGE_SQL]
    base: dict[str, list[float]] = {"python": [], "sqlite3": []}
    timings: dict[tuple[str, ...], list[float]] = {c: [] for c in COMMANDS}
    for _ in range(rounds):
        base["python"].append(cpu_of(python_pass, env)[0])
        base["sqlite3"].append(cpu_of(sqlite, env)[0])
        for command in COMMANDS:
            cpu, done = cpu_of([str(BIN / "dueledger"), *command], env)
            if done.returncode != 0:
                raise SystemExit(f"dueledger {' '.join(command)} failed: {done.stderr[-2000:]}")
            json.loads(done.stdout)
            timings[command].append(cpu)
    python_s = statistics.median(base["python"])
    sqlite_s = statistics.median(base["sqlite3"])
    rows = []
    for command, values in timings.items():
        value = statistics.median(values)
        targeted = command[:2] in TARGETED or command[:1] in TARGETED
        rows.append(
            Row(
                area="CLI reads",
                measurement=f"`dueledger {' '.join(command)}` cold, CPU (user + system)",
                size=f"{rounds} rounds",
                value=round(value, 3),
                unit="s CPU",
                backend="sqlite",
                baseline=round(python_s, 3),
                baseline_label=(
                    f"`python -c pass` (sqlite3 page query: {sqlite_s:.3f} s, "
                    f"{value / sqlite_s:.1f}x)"
                    if sqlite_s
                    else "`python -c pass`"
                ),
                ratio=round(value / python_s, 2) if python_s else None,
                target=f"<= {RUNS_LIST_TARGET_S} s" if targeted else "",
                met=(value <= RUNS_LIST_TARGET_S) if targeted else None,
            )
        )
    loaded = [c for c in COMMANDS if c[:2] != ("runs", "show") and imports_dagster(c, env)]
    rows.append(
        Row(
            area="CLI reads",
            measurement=(
                "read commands that imported Dagster (runs list, summary, tasks, dues, alerts)"
            ),
            size=f"{len(COMMANDS) - 1} commands",
            value=float(len(loaded)),
            unit="commands",
            target="0",
            met=not loaded,
            kind=KIND_CHECK,
        )
    )
    return rows


#: A zoned rule's dues over a month cost at most this times the same rule's in UTC.
ZONED_TARGET_RATIO = 2.0


def zoned_dues(env: dict[str, str], rounds: int, now: datetime) -> list[Row]:
    """`dueledger dues tick_every_minute` over 10 days (960 dues: a listing holds at most
    1,000) with the rules read in Europe/Berlin against the same in UTC, alternating: the DST
    rule's cost on top of the plain fires."""
    end = now.replace(hour=0, minute=0, second=0, microsecond=0)
    span = ["--from", (end - timedelta(days=10)).isoformat(), "--to", end.isoformat()]
    argv = [str(BIN / "dueledger"), "dues", "tick_every_minute", *span, "--json"]
    timings: dict[str, list[float]] = {"UTC": [], "Europe/Berlin": []}
    for _ in range(rounds):
        for zone, values in timings.items():
            cpu, done = cpu_of(argv, {**env, "DUELEDGER_TIMEZONE": zone})
            if done.returncode != 0:
                raise SystemExit(f"dues in {zone} failed: {done.stderr[-2000:]}")
            values.append(cpu)
    value = statistics.median(timings["Europe/Berlin"])
    base = statistics.median(timings["UTC"])
    ratio = value / base if base else None
    return [
        Row(
            area="zoned dues",
            measurement="`dues tick_every_minute` over 10 days, rules in Europe/Berlin, CPU",
            size=f"{rounds} rounds",
            value=round(value, 3),
            unit="s CPU",
            baseline=round(base, 3),
            baseline_label="the same in UTC",
            ratio=round(ratio, 2) if ratio else None,
            target=f"ratio <= {ZONED_TARGET_RATIO:g}",
            met=ratio is not None and ratio <= ZONED_TARGET_RATIO,
        )
    ]


def health_materialization(url: str, entries: int, rounds: int, now: datetime) -> list[Row]:
    """ledger_health materialized in process vs a one-asset materialization, alternating."""
    import dagster as dg
    from hook_support import build

    from orchestration.services.hooks.registry import Hooks
    from orchestration.services.hooks.vocabulary import HookRegistry
    from resources.core import tags as t
    from resources.core.due import floor_to_slot, format_due
    from resources.ledger import RunLedger

    @dg.asset
    def one_asset() -> None:
        return None

    asset = build("ledger_health", Hooks.of(HookRegistry()))
    ledger = RunLedger(database_url=url)
    health, plain = [], []
    slot = timedelta(minutes=15)
    with dg.instance_for_test() as instance:
        for n in range(rounds):
            due = floor_to_slot(now, 15) + n * slot  # dues the ledger does not have yet
            tags = {
                t.TAG_TASK: "ledger_health",
                t.TAG_TRIGGER: Trigger.SCHEDULE.value,
                t.TAG_DUE: format_due(due),
                t.DAGSTER_SCHEDULE_NAME: "ledger_health_schedule",
            }
            started = time.perf_counter()
            result = dg.materialize(
                [asset], resources={"ledger": ledger}, instance=instance, tags=tags
            )
            health.append(time.perf_counter() - started)
            if not result.success:
                raise SystemExit("ledger_health did not materialize")
            started = time.perf_counter()
            dg.materialize([one_asset], instance=instance)
            plain.append(time.perf_counter() - started)
    value, base = statistics.median(health), statistics.median(plain)
    return [
        Row(
            area="ledger_health",
            measurement="ledger_health materialized in process (claim, summary, page)",
            size=f"{entries:,} entries",
            value=round(value, 3),
            unit="s",
            backend="sqlite",
            baseline=round(base, 3),
            baseline_label="a one-asset materialization, same instance",
            ratio=round(value / base, 2) if base else None,
            target=f"<= {HEALTH_TARGET_S:g} s",
            met=value <= HEALTH_TARGET_S,
        )
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    now = datetime.now(UTC)
    with tempfile.TemporaryDirectory(prefix="bench-reads-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        db = Path(tmp) / "ledger.sqlite"
        url = f"sqlite:///{db}"
        make_ledger(url, args.entries, now)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DUELEDGER_")} | {
            "DAGSTER_HOME": str(home),
            "DUELEDGER_DATABASE_URL": url,
        }
        rows = cold_commands(db, env, args.rounds)
        rows += zoned_dues(env, args.rounds, now)
        # The in-process materialization reads its settings from the environment; the
        # previous values come back afterwards so a caller (a test) keeps its own.
        with mock.patch.dict(
            os.environ, {"DAGSTER_HOME": str(home), "DUELEDGER_DATABASE_URL": url}
        ):
            rows += health_materialization(url, args.entries, args.rounds, now)
    for row in rows:
        print(
            f"{row.area:14} {row.measurement[:70]:70} {row.value:>8} {row.unit:9} "
            f"base {row.baseline} ratio {row.ratio} {row.target} met={row.met}",
            file=sys.stderr,
        )
    if args.json_path:
        write_json(args.json_path, "reads", rows)
    return 0 if all(r.met is not False for r in rows if r.kind == KIND_CHECK) else 1


if __name__ == "__main__":
    sys.exit(main())
