"""Benchmark: `runs list` pages (RunLedger.list_entries) against a plain indexed SELECT.

    uv run python bench/ledger_queries.py [--entries N] [--pages P] [--repeat R]
                                          [--backend sqlite,postgres] [--url URL] [--no-explain]
                                          [--json PATH]

What it does, in one run, per backend (SQLite file, throwaway PostgreSQL):

1. Builds a ledger of ``--entries`` rows (default 1,000,000) by bulk INSERT into a freshly
   migrated ledger: 20 tasks, one year of 15-minute dues, mostly ``schedule`` runs and
   ``success``, with the rarer triggers and statuses mixed in (see ``_row``). Timed
   separately; not part of the measurement.
2. For every combination of the four ``runs list`` filters (task, status, trigger, time
   window: 16), plus a two-status filter and a rare-status filter, reads ``--pages`` pages of
   50 in a row by following ``next_cursor`` exactly as `dueledger runs list --cursor` does,
   ``--repeat`` times. Each page is timed around ``RunLedger.list_entries`` (the CLI's
   query, with its Entry decoding).
3. The baseline, measured in the same run and process: a plain SELECT of 50 rows by primary
   key range (``WHERE id > :x ORDER BY id LIMIT 50``) on the same table, through SQLAlchemy
   Core, decoded to tuples -- the floor for reading one page.
4. Prints p50 / p95 per query in ms, the ratio of p95 to the baseline's p95, and the plan
   of the exact statement the ledger sent (captured from SQLAlchemy; first and deepest
   page): ``EXPLAIN (ANALYZE, BUFFERS)`` on PostgreSQL, ``EXPLAIN QUERY PLAN`` on SQLite.
   A plan with a sequential scan or a full ``Sort`` is flagged (PostgreSQL's
   ``Incremental Sort`` of ties on an index order is not); the target is p95 <= 20 ms
   with index scans only.

Exit status 1 when a query misses the target (so it can gate a change), else 0.
``--json PATH`` also writes, per backend, the worst and the median p95 against the baseline
as ``bench/run.py`` rows.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from _paths import ROOT  # first: puts the project and tests/ on sys.path

# isort: split

import sqlalchemy as sa

from resources.core.entry import TERMINAL_STATUSES, Status, Trigger
from resources.ledger import RunLedger
from resources.ledger.schema import entries

TARGET_P95_MS = 20.0
PAGE = 50
TASKS = [f"bench_task_{i:02d}" for i in range(20)]
START = datetime(2025, 12, 1, tzinfo=UTC)
SLOT = timedelta(minutes=15)
INSERT_CHUNK = 20_000

# Mix of the generated ledger (weights): what a year of a busy deployment looks like.
TRIGGER_MIX = [
    (Trigger.SCHEDULE, 900),
    (Trigger.SENSOR, 40),
    (Trigger.BACKFILL, 30),
    (Trigger.MANUAL, 25),
    (Trigger.MANUAL_RETRY, 5),
]
STATUS_MIX = [
    (Status.SUCCESS, 940),
    (Status.FAILED, 40),
    (Status.DISPATCH_FAILED, 8),
    (Status.QUEUED, 6),
    (Status.RETRYING, 3),
    (Status.RUNNING, 3),
]


def _weighted(mix: list[tuple[str, int]]) -> list[str]:
    return [value for value, weight in mix for _ in range(weight)]


# --- building the ledger ---------------------------------------------------------------------


def _row(i: int, rng: random.Random, triggers: list[str], statuses: list[str]) -> dict[str, Any]:
    """Entry ``i``: created in order (id and created_at rise together, as in production)."""
    slot = i // len(TASKS)
    task = TASKS[i % len(TASKS)]
    due = START + slot * SLOT
    created = due + timedelta(seconds=rng.randint(0, 59), microseconds=i % 1_000_000)
    trigger = rng.choice(triggers)
    status = rng.choice(statuses)
    origin = {
        Trigger.SCHEDULE: "due",
        Trigger.SENSOR: "due",
        Trigger.BACKFILL: "backfill",
        Trigger.MANUAL: "manual",
        Trigger.MANUAL_RETRY: "retry",
    }[trigger]
    dedup = {
        "due": f"due:{due.strftime('%Y-%m-%dT%H:%M:%SZ')}",
        "backfill": f"backfill:bf{slot}:{due.date()}",
        "manual": f"manual:req-{i}",
        "retry": f"retry:{max(1, i)}",
    }[origin]
    naive = created.replace(tzinfo=None)
    finished = naive + timedelta(seconds=30) if status in TERMINAL_STATUSES else None
    running = status == Status.RUNNING
    return {
        "task_key": task,
        "trigger": trigger,
        "origin": origin,
        "dedup_key": dedup,
        "due": due.replace(tzinfo=None) if origin in ("due", "backfill") else None,
        "status": status,
        "attempt": 0 if status == Status.QUEUED else 1,
        "max_attempts": 3,
        "parent_id": None,
        "run_ids": [] if status == Status.QUEUED else [f"run-{i}"],
        "lease_owner": f"run-{i}" if running else None,
        "lease_expires_at": naive + timedelta(minutes=15) if running else None,
        "heartbeat_at": naive if running else None,
        "created_at": naive,
        "started_at": naive if status != Status.QUEUED else None,
        "finished_at": finished,
        "updated_at": finished or naive,
        "operator": "bench" if origin in ("manual", "retry") else None,
        "reason": "benchmark" if origin in ("manual", "retry") else None,
        "failure_kind": "error" if status == Status.FAILED else None,
        "error": "boom" if status == Status.FAILED else None,
        "summary": {"late_job_rejections": [], "dispatch_failures": [], "hooks": []},
        "manual_retry_at": None,
        "manual_retry_by": None,
    }


def build(url: str, n: int, seed: int = 7) -> float:
    """Migrate and bulk-load ``n`` entries; returns the seconds it took."""
    t0 = time.perf_counter()
    RunLedger(database_url=url).migrate()
    engine = sa.create_engine(url)
    rng = random.Random(seed)
    triggers, statuses = _weighted(TRIGGER_MIX), _weighted(STATUS_MIX)
    insert = sa.insert(entries)
    with engine.begin() as conn:
        for start in range(0, n, INSERT_CHUNK):
            rows = [
                _row(i, rng, triggers, statuses) for i in range(start, min(n, start + INSERT_CHUNK))
            ]
            conn.execute(insert, rows)
            print(f"\r  inserted {min(n, start + INSERT_CHUNK):>9,} / {n:,}", end="", flush=True)
    with engine.connect() as conn:
        # Fresh statistics, as autovacuum would have them on a long-lived ledger.
        conn.execute(sa.text("ANALYZE"))
        conn.commit()
    engine.dispose()
    print()
    return time.perf_counter() - t0


# --- the queries --------------------------------------------------------------------------------


@dataclass
class Query:
    name: str
    filters: dict[str, Any]
    times_ms: list[float] = field(default_factory=list)
    rows: int = 0
    statements: list[tuple[str, Any]] = field(default_factory=list)
    #: Begin at the cursor of the newest entry created before this instant (a deep page).
    start_at: datetime | None = None


def queries(n: int) -> list[Query]:
    """16 combinations of task / status / trigger / window, plus two status variants."""
    last = START + (n // len(TASKS)) * SLOT
    window = {"since": last - timedelta(days=30), "until": last - timedelta(days=23)}
    parts: dict[str, dict[str, Any]] = {
        "task": {"task_key": TASKS[3]},
        "status": {"statuses": [Status.SUCCESS]},
        "trigger": {"trigger": Trigger.SCHEDULE},
        "window": window,
    }
    out = []
    for k in range(len(parts) + 1):
        for combo in itertools.combinations(parts, k):
            filters: dict[str, Any] = {}
            for name in combo:
                filters.update(parts[name])
            out.append(Query("+".join(combo) or "(none)", filters))
    out.append(Query("status=failed", {"statuses": [Status.FAILED]}))
    out.append(
        Query(
            "status=failed,dispatch_failed",
            {"statuses": [Status.FAILED, Status.DISPATCH_FAILED]},
        )
    )
    out.append(Query("task+status=failed", {"task_key": TASKS[3], "statuses": [Status.FAILED]}))
    out.append(Query("trigger=manual_retry", {"trigger": Trigger.MANUAL_RETRY}))
    # Deep pages: start from a cursor half-way down the ledger (keyset must not pay for it).
    middle = START + (n // len(TASKS) // 2) * SLOT
    out.append(Query("(none), from mid-ledger", {}, start_at=middle))
    out.append(Query("task, from mid-ledger", {"task_key": TASKS[3]}, start_at=middle))
    out.append(
        Query("status=failed, from mid-ledger", {"statuses": [Status.FAILED]}, start_at=middle)
    )
    return out


@contextmanager
def capture_sql(sink: list[tuple[str, Any]]) -> Iterator[None]:
    """Record every statement SQLAlchemy sends (all engines), to EXPLAIN exactly those."""

    def before(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        sink.append((statement, parameters))

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", before)
    try:
        yield
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", before)


def run_pages(ledger: RunLedger, query: Query, pages: int, capture: bool) -> None:
    cursor = None
    if query.start_at is not None:
        # Public API only: the last entry of a one-row page before ``start_at`` is the cursor.
        _, cursor = ledger.list_entries(limit=1, until=query.start_at, **query.filters)
    for page_no in range(pages):
        sink: list[tuple[str, Any]] = []
        t0 = time.perf_counter()
        if capture and page_no in (0, pages - 1):
            with capture_sql(sink):
                page, cursor = ledger.list_entries(limit=PAGE, cursor=cursor, **query.filters)
            query.statements.extend(s for s in sink if "FROM dueledger_entries" in s[0])
        else:
            page, cursor = ledger.list_entries(limit=PAGE, cursor=cursor, **query.filters)
        query.times_ms.append((time.perf_counter() - t0) * 1000)
        query.rows += len(page)
        if cursor is None:
            break


def baseline(url: str, n: int, samples: int) -> list[float]:
    """A plain indexed SELECT of one page: 50 rows by primary-key range, same table."""
    engine = sa.create_engine(url)
    stmt = sa.select(entries).where(entries.c.id > sa.bindparam("x")).order_by(entries.c.id)
    stmt = stmt.limit(PAGE)
    rng = random.Random(11)
    out = []
    with engine.connect() as conn:
        for _ in range(samples):
            t0 = time.perf_counter()
            rows = conn.execute(stmt, {"x": rng.randint(0, max(0, n - PAGE))}).all()
            out.append((time.perf_counter() - t0) * 1000)
            assert len(rows) <= PAGE
    engine.dispose()
    return out


def time_summary(
    ledger: RunLedger, n: int, samples: int
) -> tuple[list[float], list[tuple[str, Any]]]:
    """`dueledger summary`'s counts as of the newest generated entry (informational)."""
    now = START + (n // len(TASKS)) * SLOT
    statements: list[tuple[str, Any]] = []
    with capture_sql(statements):
        ledger.summary_counts(now=now)
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        ledger.summary_counts(now=now)
        out.append((time.perf_counter() - t0) * 1000)
    return out, [s for s in statements if "count(" in s[0].lower()]


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


# --- plans -----------------------------------------------------------------------------------


def explain(url: str, statement: str, parameters: Any, dialect: str) -> list[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            raw = conn.connection.dbapi_connection
            assert raw is not None
            cur = raw.cursor()
            if dialect == "postgresql":
                cur.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + statement, parameters)
            else:
                cur.execute("EXPLAIN QUERY PLAN " + statement, parameters)
            lines = [" ".join(str(c) for c in row) for row in cur.fetchall()]
            cur.close()
            return lines
    finally:
        engine.dispose()


def plan_problems(lines: list[str], dialect: str) -> list[str]:
    text = "\n".join(lines)
    problems = []
    if dialect == "postgresql":
        if "Seq Scan" in text:
            problems.append("Seq Scan")
        if "Sort Key" in text and "Incremental Sort" not in text:
            problems.append("Sort")
    else:
        if "SCAN dueledger_entries" in text and "USING" not in text.split("SCAN", 1)[1][:80]:
            problems.append("full scan")
        if "USE TEMP B-TREE FOR ORDER BY" in text:
            problems.append("Sort")
    return problems


# --- one backend ---------------------------------------------------------------------------------


def bench_backend(
    label: str,
    url: str,
    n: int,
    pages: int,
    repeat: int,
    show_plans: bool,
    baseline_p95: list[float] | None = None,
) -> list[tuple[str, float, float, float, list[str]]]:
    dialect = sa.make_url(url).get_backend_name()
    print(f"\n== {label}: building {n:,} entries")
    seconds = build(url, n)
    print(f"   built in {seconds:.1f} s")
    ledger = RunLedger(database_url=url)
    ledger.list_entries(limit=1)  # connect and warm the caches once
    qs = queries(n)
    base: list[float] = []
    for r in range(repeat):
        base += baseline(url, n, samples=pages * 4)
        for q in qs:
            run_pages(ledger, q, pages, capture=(r == 0))
    summary_ms, summary_sql = time_summary(ledger, n, repeat * 3)
    ledger.dispose()
    b50, b95 = pct(base, 50), pct(base, 95)
    if baseline_p95 is not None:
        baseline_p95.append(b95)
    print(f"   baseline (SELECT 50 rows by id range): p50 {b50:.2f} ms  p95 {b95:.2f} ms")
    summary_problems = sorted(
        {
            p
            for stmt, params in summary_sql
            for p in plan_problems(explain(url, stmt, params, dialect), dialect)
        }
    )
    print(
        f"   summary ({len(summary_sql)} COUNT queries): p50 {pct(summary_ms, 50):.1f} ms  "
        f"p95 {pct(summary_ms, 95):.1f} ms  plans: {', '.join(summary_problems) or 'index only'}"
    )
    results = []
    for q in qs:
        p50, p95 = pct(q.times_ms, 50), pct(q.times_ms, 95)
        problems: list[str] = []
        plans: list[list[str]] = []
        for statement, params in q.statements[:1] + q.statements[-1:]:
            lines = explain(url, statement, params, dialect)
            plans.append(lines)
            problems += [p for p in plan_problems(lines, dialect) if p not in problems]
        if p95 > TARGET_P95_MS:
            problems.append(f"p95 {p95:.1f} ms > {TARGET_P95_MS:g}")
        results.append((q.name, p50, p95, p95 / b95 if b95 else float("nan"), problems))
        if show_plans:
            print(f"\n-- {q.name}: {len(q.times_ms)} pages, {q.rows} rows")
            for which, lines in zip(("first page", "deepest page"), plans, strict=False):
                kind = "EXPLAIN" if dialect == "postgresql" else "EXPLAIN QUERY PLAN"
                print(f"   {kind} ({which}):")
                for line in lines:
                    print(f"     {line}")
    print(f"\n   {label}: runs list pages of {PAGE}, {pages} pages x {repeat} repeats per query")
    print(f"   {'query':<34} {'p50 ms':>8} {'p95 ms':>8} {'p95/base':>9}  plan / target")
    for name, p50, p95, ratio, problems in results:
        verdict = "ok" if not problems else "MISS: " + ", ".join(problems)
        print(f"   {name:<34} {p50:>8.2f} {p95:>8.2f} {ratio:>9.1f}  {verdict}")
    return results


def result_rows(
    label: str,
    n: int,
    pages: int,
    results: list[tuple[str, float, float, float, list[str]]],
    b95: float,
) -> list[Any]:
    """Per backend: the worst and the median p95 of all queries, as ``bench/run.py`` rows."""
    if str(ROOT / "bench") not in sys.path:
        sys.path.append(str(ROOT / "bench"))  # last: bench/assets.py shadows `assets`
    from run import Row  # bench/run.py owns the row format

    worst = max(results, key=lambda r: r[2])
    missed = [f"{name}: {', '.join(problems)}" for name, *_, problems in results if problems]
    common: dict[str, Any] = {
        "area": "ledger queries",
        "backend": "sqlite" if label == "SQLite" else "postgres",
        "size": f"{n:,} entries, {pages} pages",
        "unit": "ms",
        "baseline": b95,
        "baseline_label": "p95, SELECT 50 rows by id range",
    }
    median_p95 = statistics.median(r[2] for r in results)
    return [
        Row(
            measurement=(
                f"`runs list` page of {PAGE}, worst p95 of {len(results)} filter combinations "
                f"({worst[0]})" + (f"; MISSED by {'; '.join(missed)}" if missed else "")
            ),
            value=worst[2],
            ratio=worst[2] / b95 if b95 else None,
            target=f"p95 <= {TARGET_P95_MS:g} ms, index scans",
            met=not missed,
            **common,
        ),
        Row(
            measurement=f"`runs list` page of {PAGE}, median p95 of the same",
            value=median_p95,
            ratio=median_p95 / b95 if b95 else None,
            **common,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--entries", type=int, default=1_000_000, help="ledger size to build")
    parser.add_argument("--pages", type=int, default=20, help="pages followed per query")
    parser.add_argument("--repeat", type=int, default=3, help="passes over all queries")
    parser.add_argument("--backend", default="sqlite,postgres", help="sqlite, postgres or both")
    parser.add_argument("--url", help="existing, EMPTY PostgreSQL database (default: throwaway)")
    parser.add_argument("--no-explain", action="store_true", help="do not print the plans")
    parser.add_argument("--json", help="write the result rows here (for bench/run.py)")
    args = parser.parse_args(argv)
    if args.entries < PAGE:
        parser.error(f"--entries must be at least {PAGE}")
    backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    unknown = set(backends) - {"sqlite", "postgres"}
    if unknown:
        parser.error(f"unknown backend(s) {sorted(unknown)}; use sqlite and/or postgres")

    missed = 0
    json_rows: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="dueledger-bench-") as tmp:
        runs: list[tuple[str, Callable[[], str]]] = []
        if "sqlite" in backends:
            runs.append(("SQLite", lambda: f"sqlite:///{tmp}/ledger.sqlite"))
        server = watchdog = None
        try:
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
                b95: list[float] = []
                results = bench_backend(
                    label,
                    make_url(),
                    args.entries,
                    args.pages,
                    args.repeat,
                    not args.no_explain,
                    b95,
                )
                missed += sum(1 for *_, problems in results if problems)
                json_rows += result_rows(label, args.entries, args.pages, results, b95[0])
        finally:
            if server is not None:
                server.stop(remove=True)
            if watchdog is not None:
                watchdog.kill()
                watchdog.wait()
    target = f"p95 <= {TARGET_P95_MS:g} ms, index scans"
    print(f"\n{missed} query/backend pair(s) missed the target ({target})")
    if args.json:
        from run import write_json  # bench/run.py owns the row format

        write_json(args.json, "queries", json_rows)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
