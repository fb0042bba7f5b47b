"""Benchmark: one Prometheus scrape of a big ledger, against a plain COUNT of the same table.

    uv run --frozen python bench/metrics_scrape.py [--entries N] [--repeat R]
                                                   [--backend sqlite,postgres] [--url URL]
                                                   [--json PATH]

What it does, in one run, per backend (SQLite file, throwaway PostgreSQL):

1. Builds a ledger of ``--entries`` rows (default 1,000,000) for the registered tasks, each at
   its effective cadence, going back from "now" (about four years at a million): mostly
   scheduled successes; failures (error, timeout, lease_reclaimed), manual launches and
   manual retries; a refused duplicate on 0.5 % of entries and a failed plugin listener on
   1 %; in the last hour some queued and running entries; 5,000 alert deliveries. Then
   ``ANALYZE`` (PostgreSQL: ``VACUUM ANALYZE``), as autovacuum keeps a long-lived ledger.
   Untimed.
2. **before**: with migration 0005's indexes dropped (the ledger as of 0004), the scrape is
   timed once per repeat.
3. The indexes are built (timed: what migration 0005 costs on this ledger), then **after**,
   per repeat, two scrapes: one that runs the missed-due gap audit (what the first scrape of
   each slot does) and one between two audits (the exporter keeps the audit's answer for at
   most 5 minutes within a slot: ``MissedDuesMemo``). A scrape is exactly what `dueledger
   metrics serve` does on a request: ``generate_latest`` over the CLI's collector, which
   reads the ledger (``orchestration/services/metrics.py``) and a Dagster instance (a real
   SQLite instance in a temporary directory, no runs).
4. The **baseline**, measured in the same run, between the scrapes: ``SELECT count(*) FROM
   dueledger_entries`` through SQLAlchemy Core -- the cheapest question about every row.
5. Checks the scrape against what was generated (entries per status, refused runs, hook
   failures, deliveries): exit 1 when a number is off.

Target: a scrape of 1,000,000 entries in under 200 ms (median of the repeats).
The gap audit costs about the same at any ledger size (the tasks' crons over 24 hours, two
Dagster run queries per task), so it is timed apart.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import _paths  # noqa: F401  first: puts the project and tests/ on sys.path

# isort: split

import dagster as dg
import sqlalchemy as sa
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from run import KIND_CHECK, Row, write_json

from orchestration.cli.exposition import LedgerCollector
from orchestration.declarations import task_views
from orchestration.services.metrics import MissedDuesMemo, scrape
from resources.core.entry import TERMINAL_STATUSES, FailureKind, Status, Trigger
from resources.ledger import RunLedger
from resources.ledger.schema import alert_deliveries, entries

TARGET_MS = 200.0
INSERT_CHUNK = 20_000
DELIVERIES = 5_000
NEW_INDEXES = (
    "ix_dueledger_entries_task_status_trigger_kind",
    "ix_dueledger_entries_task_status_finished",
    "ix_dueledger_entries_rejected",
    "ix_dueledger_entries_hook_failed",
)
#: "Now" of the generated ledger: a slot boundary (dues before it, none after).
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@dataclass
class Generated:
    """What the builder wrote, to check the scrape against."""

    statuses: Counter[str] = field(default_factory=Counter)
    refused: int = 0
    hook_failures: int = 0
    deliveries: Counter[str] = field(default_factory=Counter)


def _summary(rng: random.Random, gen: Generated, at: str) -> dict[str, Any]:
    summary: dict[str, Any] = {"late_job_rejections": [], "dispatch_failures": [], "hooks": []}
    roll = rng.random()
    if roll < 0.005:
        summary["late_job_rejections"] = [
            {"run_id": "dup", "at": at, "status": "success", "action": "claim", "reason": "x"}
        ]
        gen.refused += 1
    elif roll < 0.015:
        summary["hooks"] = [
            {"event": "task_before", "listener": "p", "outcome": "error", "at": at},
            {"event": "task_after", "listener": "p", "outcome": "allow", "at": at},
        ]
        gen.hook_failures += 1
    return summary


def _row(
    task: str, due: datetime, serial: int, rng: random.Random, gen: Generated
) -> dict[str, Any]:
    recent = NOW - due <= timedelta(hours=1)
    roll = rng.random()
    trigger, origin, dedup = Trigger.SCHEDULE, "due", f"due:{due:%Y-%m-%dT%H:%M:%SZ}"
    if roll < 0.01:
        trigger, origin, dedup = Trigger.MANUAL, "manual", f"manual:req-{serial}"
    elif roll < 0.015:
        trigger, origin, dedup = Trigger.MANUAL_RETRY, "retry", f"retry:{serial}"
    status, kind = Status.SUCCESS, None
    roll = rng.random()
    if recent and roll < 0.3:
        status = rng.choice([Status.QUEUED, Status.RUNNING])
    elif roll < 0.03:
        status = Status.FAILED
        kind = rng.choice([FailureKind.ERROR] * 8 + [FailureKind.TIMEOUT, "lease_reclaimed"])
    elif roll < 0.032:
        status, kind = Status.DISPATCH_FAILED, FailureKind.DISPATCH
    gen.statuses[status] += 1
    created = (due + timedelta(seconds=rng.randint(1, 20))).replace(tzinfo=None)
    started = None if status == Status.QUEUED else created + timedelta(seconds=2)
    done = status in TERMINAL_STATUSES
    finished = started + timedelta(seconds=rng.randint(5, 90)) if done and started else None
    running = status == Status.RUNNING
    manual = origin != "due"
    return {
        "task_key": task,
        "trigger": trigger,
        "origin": origin,
        "dedup_key": dedup,
        "due": None if manual else due.replace(tzinfo=None),
        "status": status,
        "attempt": 0 if status == Status.QUEUED else 1,
        "max_attempts": 3,
        "parent_id": None,
        "run_ids": [] if status == Status.QUEUED else [f"run-{serial}"],
        "lease_owner": f"run-{serial}" if running else None,
        "lease_expires_at": NOW.replace(tzinfo=None) + timedelta(minutes=10) if running else None,
        "heartbeat_at": created if running else None,
        "created_at": created,
        "started_at": started,
        "finished_at": finished,
        "updated_at": finished or created,
        "operator": "bench" if manual else None,
        "reason": "benchmark" if manual else None,
        "failure_kind": kind,
        "error": "boom" if kind else None,
        "summary": _summary(rng, gen, f"{created:%Y-%m-%dT%H:%M:%SZ}"),
        "manual_retry_at": None,
        "manual_retry_by": None,
    }


def build(url: str, n: int, seed: int = 7) -> tuple[Generated, float]:
    """Migrate and bulk-load ``n`` entries of the registered tasks, newest dues just before
    NOW; returns what was written and the seconds it took."""
    t0 = time.perf_counter()
    RunLedger(database_url=url).migrate()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        views = task_views()
    cadences = [(v.spec.key, timedelta(minutes=v.effective.minutes)) for v in views]
    rng, gen = random.Random(seed), Generated()
    engine = sa.create_engine(url)
    rows: list[dict[str, Any]] = []
    written, slot = 0, timedelta(minutes=15)
    due = NOW - slot
    with engine.begin() as conn:
        while written < n:
            for task, every in cadences:
                minutes = int((due - datetime(2000, 1, 1, tzinfo=UTC)).total_seconds() // 60)
                if written < n and minutes % int(every.total_seconds() // 60) == 0:
                    rows.append(_row(task, due, written, rng, gen))
                    written += 1
            due -= slot
            if len(rows) >= INSERT_CHUNK or written >= n:
                conn.execute(sa.insert(entries), rows)
                rows = []
                print(f"\r  inserted {written:>9,} / {n:,}", end="", flush=True)
        for i in range(DELIVERIES):
            status = "delivered" if i % 50 else "failed"
            gen.deliveries[status] += 1
            at = (NOW - timedelta(minutes=i)).replace(tzinfo=None)
            conn.execute(
                sa.insert(alert_deliveries),
                {
                    "channel": "webhook",
                    "kind": "lease_reclaimed",
                    "subject": f"entry:{i}",
                    "status": status,
                    "attempts": 1,
                    "payload": {},
                    "last_error": None if status == "delivered" else "HTTP 500",
                    "created_at": at,
                    "updated_at": at,
                    "next_attempt_at": None,
                    "delivered_at": at if status == "delivered" else None,
                },
            )
    # Fresh statistics and (PostgreSQL) a visibility map, as autovacuum keeps them on a
    # long-lived ledger: without it an index-only scan still reads the table.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        postgres = engine.dialect.name == "postgresql"
        conn.execute(sa.text("VACUUM ANALYZE" if postgres else "ANALYZE"))
    engine.dispose()
    print()
    return gen, time.perf_counter() - t0


def drop_new_indexes(url: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for name in NEW_INDEXES:
            conn.execute(sa.text(f"DROP INDEX {name}"))
    engine.dispose()


def create_new_indexes(url: str) -> float:
    """The indexes of migration 0005, as it creates them (one transaction); seconds."""
    engine = sa.create_engine(url)
    t0 = time.perf_counter()
    with engine.begin() as conn:
        for index in entries.indexes:
            if index.name in NEW_INDEXES:
                index.create(conn)
        if engine.dialect.name == "postgresql":
            conn.execute(sa.text("ANALYZE dueledger_entries"))
    seconds = time.perf_counter() - t0
    engine.dispose()
    return seconds


def baseline(url: str) -> float:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        t0 = time.perf_counter()
        conn.execute(sa.select(sa.func.count()).select_from(entries)).scalar_one()
        seconds = time.perf_counter() - t0
    engine.dispose()
    return seconds * 1000


def timed(fn: Callable[[], bytes]) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000, out


def check(text: bytes, gen: Generated) -> list[str]:
    """What the scrape says against what was generated: the problems (none: it is right)."""
    totals: Counter[str] = Counter()
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if s.name in ("dueledger_entries_total", "dueledger_open_entries"):
                totals[s.labels["status"]] += int(s.value)
            elif s.name == "dueledger_refused_runs_total":
                totals["refused"] += int(s.value)
            elif s.name == "dueledger_hook_failures_total":
                totals["hook_failures"] += int(s.value)
            elif s.name == "dueledger_alert_deliveries_total":
                totals[f"delivery_{s.labels['status']}"] += int(s.value)
    want: Counter[str] = Counter(gen.statuses)
    want["refused"] = gen.refused
    want["hook_failures"] = gen.hook_failures
    want["delivery_delivered"] = gen.deliveries["delivered"]
    want["delivery_given_up"] = gen.deliveries["failed"]
    return [f"{k}: scraped {totals[k]}, generated {v}" for k, v in want.items() if totals[k] != v]


def bench_backend(label: str, url: str, n: int, repeat: int) -> tuple[list[Row], list[str]]:
    print(f"\n== {label}: building {n:,} entries")
    gen, seconds = build(url, n)
    print(f"   built in {seconds:.1f} s: {dict(gen.statuses)}")
    ledger = RunLedger(database_url=url)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        views = task_views()
    with tempfile.TemporaryDirectory() as home, dg.instance_for_test(temp_dir=home) as instance:

        def exporter(memo: MissedDuesMemo | None) -> CollectorRegistry:
            registry = CollectorRegistry(auto_describe=False)
            source = partial(scrape, ledger, views, NOW, instance=instance, memo=memo)
            registry.register(LedgerCollector(source))
            return registry

        # Every scrape audits (no memo), and scrapes between two audits (memo primed; the
        # exporter audits at most once per slot and per MissedDuesMemo.ttl).
        cold, warm = exporter(None), exporter(MissedDuesMemo(ttl=timedelta(days=1)))
        drop_new_indexes(url)
        ledger.dispose()
        before = [timed(lambda: generate_latest(cold))[0] for _ in range(repeat)]
        index_s = create_new_indexes(url)
        ledger.dispose()  # reconnect: the planner sees the new indexes
        generate_latest(warm)  # the first audit, and a warm connection pool
        after: list[float] = []
        between: list[float] = []
        base: list[float] = []
        text = b""
        for _ in range(repeat):
            base.append(baseline(url))
            ms, text = timed(lambda: generate_latest(cold))
            after.append(ms)
            between.append(timed(lambda: generate_latest(warm))[0])
    problems = check(text, gen)
    b, a, bb = statistics.median(before), statistics.median(after), statistics.median(base)
    w = statistics.median(between)
    print(f"   before (no 0005 indexes): median {b:.1f} ms over {repeat}")
    print(f"   migration 0005 indexes built in {index_s:.1f} s")
    print(f"   after, auditing: median {a:.1f} ms (min {min(after):.1f}, max {max(after):.1f})")
    print(f"   after, between audits: median {w:.1f} ms (min {min(between):.1f})")
    print(f"   baseline SELECT count(*): median {bb:.2f} ms")
    print(f"   exposition: {len(text):,} bytes; check: {'; '.join(problems) or 'ok'}")
    backend = "sqlite" if label == "SQLite" else "postgres"
    size = f"{n:,} entries"
    common: dict[str, Any] = {"area": "metrics scrape", "backend": backend, "size": size}
    rows = [
        Row(
            measurement="`metrics serve` scrape between two gap audits (the exporter audits "
            "once per slot and at most every 5 min), median",
            value=w,
            unit="ms",
            baseline=bb,
            baseline_label="SELECT count(*) FROM dueledger_entries",
            ratio=w / bb if bb else None,
            target=f"<= {TARGET_MS:g} ms",
            met=w <= TARGET_MS,
            **common,
        ),
        Row(
            measurement="the same scrape with the gap audit (first scrape of a slot), median",
            value=a,
            unit="ms",
            baseline=bb,
            baseline_label="SELECT count(*) FROM dueledger_entries",
            ratio=a / bb if bb else None,
            **common,
        ),
        Row(
            measurement="the scrape with the audit before migration 0005 (its indexes dropped)",
            value=b,
            unit="ms",
            baseline=a,
            baseline_label="after",
            ratio=b / a if a else None,
            **common,
        ),
        Row(
            measurement="migration 0005: building its four indexes",
            value=index_s,
            unit="s",
            **common,
        ),
        Row(
            measurement="scrape numbers equal what was generated",
            value=float(len(problems)),
            unit="problems",
            met=not problems,
            kind=KIND_CHECK,
            **common,
        ),
    ]
    return rows, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--entries", type=int, default=1_000_000, help="ledger size to build")
    parser.add_argument("--repeat", type=int, default=5, help="scrapes timed per phase")
    parser.add_argument("--backend", default="sqlite,postgres", help="sqlite, postgres or both")
    parser.add_argument("--url", help="existing, EMPTY PostgreSQL database (default: throwaway)")
    parser.add_argument("--json", help="write the result rows here (for bench/run.py)")
    args = parser.parse_args(argv)
    if args.entries < 100 or args.repeat < 1:
        parser.error("--entries must be at least 100 and --repeat at least 1")
    backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    unknown = set(backends) - {"sqlite", "postgres"}
    if unknown or not backends:
        parser.error(f"unknown backend(s) {sorted(unknown)}; use sqlite and/or postgres")
    rows: list[Row] = []
    failed = False
    with tempfile.TemporaryDirectory(prefix="dueledger-bench-") as tmp:
        server = watchdog = None
        try:
            runs: list[tuple[str, Callable[[], str]]] = []
            if "sqlite" in backends:
                runs.append(("SQLite", lambda: f"sqlite:///{tmp}/ledger.sqlite"))
            if "postgres" in backends:
                if args.url:
                    runs.append(("PostgreSQL", lambda: args.url))
                else:
                    import pg_server  # tests/pg_server.py

                    print("starting a throwaway PostgreSQL ...", flush=True)
                    server = pg_server.start_server()
                    watchdog = pg_server.start_watchdog(server)
                    pg = server
                    runs.append(("PostgreSQL", lambda: pg.create_database("dueledger_bench")))
            for label, make_url in runs:
                found, problems = bench_backend(label, make_url(), args.entries, args.repeat)
                rows += found
                failed = failed or bool(problems)
        finally:
            if server is not None:
                server.stop(remove=True)
            if watchdog is not None:
                watchdog.kill()
                watchdog.wait()
    if args.json:
        write_json(args.json, "metrics", rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
