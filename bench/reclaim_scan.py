"""Benchmark: the lease-reclaim scan on a big ledger, against a plain indexed SELECT.

    uv run --frozen python bench/reclaim_scan.py [--entries N] [--expired K] [--repeat R]
                                                 [--backend sqlite,postgres] [--url URL]
                                                 [--json PATH]

What it does, in one run, per backend (SQLite file, throwaway PostgreSQL):

1. Builds a ledger of ``--entries`` rows (default 1,000,000) with ``bench/ledger_queries.py``'s
   bulk builder (untimed). Every ``running`` entry the builder made gets a LIVE lease (expiring
   after "now"); then ``--expired`` (default 1,000) other entries, spread over the ledger, are
   turned into ``running`` entries whose lease expired up to an hour before "now". "Now" is a
   fixed instant just after the newest generated entry.
2. Per repeat, with the expired entries reset to ``running`` first (untimed):
   - **scan**: ``reclaim_expired(ledger, now=..., dry_run=True)`` -- the listing behind
     ``dueledger reclaim --dry-run`` and the first step of ``ledger_sensor`` (reclaim) -- against
     the **baseline**: a plain SELECT of the same rows on the same index
     (``status = 'running' AND lease_expires_at < now ORDER BY lease_expires_at, id``),
     through SQLAlchemy Core, fetched as tuples. Target: scan <= 50 ms.
   - **reclaim**: ``reclaim_expired(ledger, now=...)`` (the scan plus one compare-and-set
     UPDATE per entry, as ``dueledger reclaim`` and the sensor run it) against one set-based
     UPDATE of the same rows (informational: what the per-entry guarantee costs).
   After each reclaim it checks that exactly the expired entries were reclaimed
   (``failed`` / ``lease_reclaimed``) and every live lease is untouched (exit 1 otherwise).
3. Prints medians over the repeats, the ratios, and the plan of the exact scan statement the
   ledger sent (``EXPLAIN QUERY PLAN`` / ``EXPLAIN (ANALYZE, BUFFERS)``): the
   ``(status, lease_expires_at)`` index must be used; a full scan or a full sort is flagged.

``reclaim_expired`` takes at most 1,000 entries per call (its ``limit``), which is why
``--expired`` is capped there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import _paths  # noqa: F401  first: puts the project and tests/ on sys.path

# isort: split

import sqlalchemy as sa
from ledger_queries import SLOT, START, TASKS, build, capture_sql, explain, plan_problems
from run import Row, write_json

from orchestration.reclaim import reclaim_expired
from resources.core.entry import FailureKind, Status
from resources.ledger import RunLedger
from resources.ledger.schema import entries

TARGET_SCAN_MS = 50.0
RECLAIM_LIMIT = 1000  # RunLedger.reclaim_expired's default limit
LIVE_FOR = timedelta(minutes=10)
EXPIRED_SPREAD_S = 3600


def bench_now(n: int) -> datetime:
    """A fixed "now" just after the newest entry the builder makes for ``n`` entries."""
    return START + (n // len(TASKS) + 1) * SLOT


def _naive(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(tzinfo=None)


@dataclass
class Ledger:
    """The prepared ledger: which entries hold expired leases and which live ones."""

    url: str
    now: datetime
    expired: dict[int, datetime]  # entry id -> its (past) lease expiry, naive UTC
    live: set[int]
    scan_sql: list[tuple[str, Any]] = field(default_factory=list)


def prepare(url: str, n: int, expired: int) -> Ledger:
    """Build ``n`` entries, give the builder's running entries live leases and make
    ``expired`` other entries running with expired leases."""
    seconds = build(url, n)
    print(f"   built {n:,} entries in {seconds:.1f} s", flush=True)
    now = bench_now(n)
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.update(entries)
                .where(entries.c.status == Status.RUNNING)
                .values(lease_expires_at=_naive(now + LIVE_FOR))
            )
            live = set(
                conn.execute(
                    sa.select(entries.c.id).where(entries.c.status == Status.RUNNING)
                ).scalars()
            )
            # Spread the expired entries evenly over the ledger (old and new rows alike).
            step = max(1, n // (2 * expired))
            candidates = list(
                conn.execute(
                    sa.select(entries.c.id)
                    .where(entries.c.status == Status.SUCCESS, entries.c.id % step == 0)
                    .order_by(entries.c.id)
                ).scalars()
            )
            ids = candidates[:: max(1, len(candidates) // expired)][:expired]
            if len(ids) < expired:
                raise SystemExit(
                    f"only {len(ids)} entries can be made expired in a ledger of {n:,}; "
                    "use a larger --entries or a smaller --expired"
                )
            lease = {
                entry_id: _naive(now - timedelta(seconds=1 + (k * 37) % EXPIRED_SPREAD_S))
                for k, entry_id in enumerate(ids)
            }
        ledger = Ledger(url, now, lease, live)
        reset(ledger, engine)
        with engine.connect() as conn:
            conn.execute(sa.text("ANALYZE"))
            conn.commit()
    finally:
        engine.dispose()
    return ledger


def reset(ledger: Ledger, engine: sa.Engine) -> None:
    """Put every expired entry back to ``running`` with its expired lease."""
    stmt = (
        sa.update(entries)
        .where(entries.c.id == sa.bindparam("b_id"))
        .values(
            status=Status.RUNNING,
            lease_owner=sa.bindparam("b_owner"),
            lease_expires_at=sa.bindparam("b_expires"),
            heartbeat_at=sa.bindparam("b_heartbeat"),
            finished_at=None,
            failure_kind=None,
            error=None,
        )
    )
    params = [
        {
            "b_id": entry_id,
            "b_owner": f"run-{entry_id}",
            "b_expires": expires,
            "b_heartbeat": expires - timedelta(minutes=5),
        }
        for entry_id, expires in ledger.expired.items()
    ]
    with engine.begin() as conn:
        conn.execute(stmt, params)


def baseline_select(conn: sa.Connection, now: datetime, limit: int) -> list[Any]:
    stmt = (
        sa.select(entries)
        .where(
            entries.c.status == Status.RUNNING,
            entries.c.lease_expires_at < _naive(now),
        )
        .order_by(entries.c.lease_expires_at, entries.c.id)
        .limit(limit)
    )
    return list(conn.execute(stmt).all())


def baseline_update(conn: sa.Connection, now: datetime) -> int:
    stmt = (
        sa.update(entries)
        .where(
            entries.c.status == Status.RUNNING,
            entries.c.lease_expires_at < _naive(now),
        )
        .values(
            status=Status.FAILED,
            failure_kind=FailureKind.LEASE_RECLAIMED,
            lease_owner=None,
            lease_expires_at=None,
            finished_at=_naive(now),
            updated_at=_naive(now),
        )
    )
    return conn.execute(stmt).rowcount


def check(ledger: Ledger, engine: sa.Engine, reclaimed_ids: set[int]) -> list[str]:
    """Exactly the expired entries reclaimed; every live lease untouched."""
    problems = []
    if reclaimed_ids != set(ledger.expired):
        missing = len(set(ledger.expired) - reclaimed_ids)
        extra = len(reclaimed_ids - set(ledger.expired))
        problems.append(f"reclaimed {len(reclaimed_ids)}: {missing} expired missed, {extra} extra")
    with engine.connect() as conn:
        running = set(
            conn.execute(
                sa.select(entries.c.id).where(entries.c.status == Status.RUNNING)
            ).scalars()
        )
        reclaimed = set(
            conn.execute(
                sa.select(entries.c.id).where(
                    entries.c.failure_kind == FailureKind.LEASE_RECLAIMED,
                    entries.c.status == Status.FAILED,
                )
            ).scalars()
        )
    if running != ledger.live:
        problems.append(
            f"{len(ledger.live - running)} live leases lost, {len(running - ledger.live)} "
            "unexpected running entries"
        )
    if reclaimed != set(ledger.expired):
        problems.append(
            f"{len(reclaimed)} entries are lease_reclaimed, {len(ledger.expired)} expected"
        )
    return problems


@dataclass
class Timings:
    scan: list[float] = field(default_factory=list)
    select: list[float] = field(default_factory=list)
    reclaim: list[float] = field(default_factory=list)
    update: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _ms(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return (time.perf_counter() - started) * 1000, result


def measure(ledger: Ledger, repeat: int) -> Timings:
    engine = sa.create_engine(ledger.url)
    led = RunLedger(database_url=ledger.url)
    out = Timings()
    limit = RECLAIM_LIMIT
    try:
        with capture_sql(ledger.scan_sql):
            reclaim_expired(led, now=ledger.now, dry_run=True)  # connect + warm, and the SQL
        ledger.scan_sql[:] = [s for s in ledger.scan_sql if "FROM dueledger_entries" in s[0]]
        with engine.connect() as conn:
            baseline_select(conn, ledger.now, limit)
        for r in range(repeat):
            reset(ledger, engine)
            # Alternate which goes first, so neither always meets the colder cache.
            pair: list[tuple[str, Callable[[], Any]]] = [
                ("scan", lambda: reclaim_expired(led, now=ledger.now, dry_run=True)),
                ("select", lambda: _select(engine, ledger.now, limit)),
            ]
            for name, fn in pair if r % 2 == 0 else pair[::-1]:
                ms, rows = _ms(fn)
                getattr(out, name).append(ms)
                if len(rows) != len(ledger.expired):
                    out.problems.append(f"{name} returned {len(rows)} rows")
            ms, reclaimed = _ms(lambda: reclaim_expired(led, now=ledger.now))
            out.reclaim.append(ms)
            out.problems += check(ledger, engine, {e.id for e in reclaimed})
            reset(ledger, engine)
            ms, count = _ms(lambda: _update(engine, ledger.now))
            out.update.append(ms)
            if count != len(ledger.expired):
                out.problems.append(f"set-based UPDATE changed {count} rows")
        reset(ledger, engine)
    finally:
        led.dispose()
        engine.dispose()
    return out


def _update(engine: sa.Engine, now: datetime) -> int:
    with engine.begin() as conn:  # committed inside the timing, as reclaim_expired commits
        return baseline_update(conn, now)


def _select(engine: sa.Engine, now: datetime, limit: int) -> list[Any]:
    with engine.connect() as conn:
        return baseline_select(conn, now, limit)


def bench_backend(
    label: str, backend: str, url: str, n: int, expired: int, repeat: int
) -> tuple[list[Row], list[str]]:
    print(f"\n== {label}: {n:,} entries, {expired:,} expired leases", flush=True)
    ledger = prepare(url, n, expired)
    print(f"   {len(ledger.live):,} running entries with live leases", flush=True)
    timings = measure(ledger, repeat)
    dialect = sa.make_url(url).get_backend_name()
    problems: list[str] = []
    for statement, params in ledger.scan_sql[:1]:
        lines = explain(url, statement, params, dialect)
        kind = "EXPLAIN (ANALYZE, BUFFERS)" if dialect == "postgresql" else "EXPLAIN QUERY PLAN"
        print(f"   {kind} of the reclaim scan:")
        for line in lines:
            print(f"     {line}")
        problems += plan_problems(lines, dialect)
        if "ix_dueledger_entries_status_lease" not in "\n".join(lines):
            problems.append("index ix_dueledger_entries_status_lease not used")
    scan, select = statistics.median(timings.scan), statistics.median(timings.select)
    reclaim, update = statistics.median(timings.reclaim), statistics.median(timings.update)
    print(
        f"   medians of {repeat}: scan {scan:.2f} ms (baseline SELECT {select:.2f} ms); "
        f"reclaim {reclaim:.1f} ms (set-based UPDATE {update:.1f} ms)"
    )
    size = f"{n:,} entries, {expired:,} expired"
    scan_met = scan <= TARGET_SCAN_MS and not problems
    rows = [
        Row(
            area="reclaim",
            measurement="reclaim scan: reclaim_expired dry run (`reclaim --dry-run`)",
            backend=backend,
            size=size,
            value=scan,
            unit="ms",
            baseline=select,
            baseline_label="plain indexed SELECT of the same rows",
            ratio=scan / select,
            target=f"<= {TARGET_SCAN_MS:g} ms, index scan",
            met=scan_met,
        ),
        Row(
            area="reclaim",
            measurement="reclaim (scan + one compare-and-set UPDATE per entry)",
            backend=backend,
            size=size,
            value=reclaim,
            unit="ms",
            baseline=update,
            baseline_label="one set-based UPDATE",
            ratio=reclaim / update,
        ),
    ]
    if problems:
        print(f"   plan problems (the scan's target is missed): {', '.join(problems)}")
    return rows, timings.problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--entries", type=int, default=1_000_000, help="ledger size to build")
    parser.add_argument("--expired", type=int, default=1000, help="entries with expired leases")
    parser.add_argument("--repeat", type=int, default=5, help="repeats (medians reported)")
    parser.add_argument("--backend", default="sqlite,postgres", help="sqlite, postgres or both")
    parser.add_argument("--url", help="existing, EMPTY PostgreSQL database (default: throwaway)")
    parser.add_argument("--json", help="write the result rows here (for bench/run.py)")
    args = parser.parse_args(argv)
    if not 1 <= args.expired <= RECLAIM_LIMIT:
        parser.error(
            f"--expired must be between 1 and {RECLAIM_LIMIT} (reclaim_expired's per-call limit)"
        )
    if args.entries < 4 * args.expired:
        parser.error(f"--entries must be at least 4 x --expired ({4 * args.expired})")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    unknown = set(backends) - {"sqlite", "postgres"}
    if unknown or not backends:
        parser.error(f"unknown backend(s) {sorted(unknown)}; use sqlite and/or postgres")

    rows: list[Row] = []
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dueledger-bench-reclaim-") as tmp:
        server = watchdog = None
        try:
            for backend in backends:
                if backend == "sqlite":
                    url, label = f"sqlite:///{tmp}/ledger.sqlite", "SQLite"
                elif args.url:
                    url, label = args.url, "PostgreSQL"
                else:
                    import pg_server  # tests/pg_server.py

                    print("starting a throwaway PostgreSQL ...", flush=True)
                    server = pg_server.start_server()
                    watchdog = pg_server.start_watchdog(server)
                    url, label = server.create_database("dueledger_reclaim"), "PostgreSQL"
                found_rows, found = bench_backend(
                    label, backend, url, args.entries, args.expired, args.repeat
                )
                rows += found_rows
                problems += [f"{label}: {p}" for p in found]
        finally:
            if server is not None:
                server.stop(remove=True)
            if watchdog is not None:
                watchdog.kill()
                watchdog.wait()
    rows.append(
        Row(
            area="reclaim",
            measurement="reclaims exactly the expired leases, live leases untouched",
            backend=",".join(backends),
            size=f"{args.entries:,} entries x {args.repeat} repeats",
            value=float(len(problems)),
            unit="problems",
            target="0",
            met=not problems,
            kind="check",
        )
    )
    print()
    print(f"{'backend':<10} {'measurement':<58} {'median ms':>9} {'baseline ms':>11} {'ratio':>6}")
    for row in rows[:-1]:
        assert row.baseline is not None and row.ratio is not None
        print(
            f"{row.backend:<10} {row.measurement[:58]:<58} {row.value:>9.2f} "
            f"{row.baseline:>11.2f} {row.ratio:>6.2f}"
            + ("" if row.met is None else f"  target {row.target}: {'ok' if row.met else 'MISS'}")
        )
    for problem in problems:
        print(f"PROBLEM: {problem}")
    if args.json:
        write_json(args.json, "reclaim", rows)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
