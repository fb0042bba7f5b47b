"""Benchmark: PostgreSQL's own commit rate on this machine -- the physical ceiling for claims.

    uv run --frozen python bench/pg_commits.py [--clients 1,4,8] [--seconds S] [--url URL]
                                               [--no-pgbench] [--json PATH]

Starts a throwaway PostgreSQL exactly as ``bench/ledger_claims.py`` does
(``tests/pg_server.py``: fsync, synchronous_commit and full_page_writes off, so this is
round trips and CPU, not disks) unless ``--url`` names a database, creates a table of
100,000 rows and, for each client count, measures transactions of ONE single-row UPDATE
(one commit each, a random row of the 100,000):

1. **pgbench** from the server's own bindir (C client, prepared statements, ``-j`` threads
   up to the core count): the ceiling -- no client can commit faster than this here;
2. **psycopg2**: the same UPDATE in an autocommit loop from ``clients`` Python processes
   (what ``ledger_claims.py``'s raw baseline does three times per cycle), as a ratio to
   pgbench in the same run. Without pgbench (``--no-pgbench`` or not installed) this loop
   is the ceiling.

Each figure is the best of ``--rounds`` windows of ``--seconds``. ``bench/run.py`` divides
the ledger's claim cycles/s by this ceiling at the same concurrency.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _paths  # noqa: F401  first: puts the project and tests/ on sys.path

# isort: split

import psycopg2
import sqlalchemy as sa
from run import Row, write_json

TABLE_ROWS = 100_000
UPDATE = "UPDATE commit_probe SET n = n + 1 WHERE id = %s"
PGBENCH_SCRIPT = (
    f"\\set id random(1, {TABLE_ROWS})\nUPDATE commit_probe SET n = n + 1 WHERE id = :id;\n"
)
BARRIER_TIMEOUT_S = 120
TPS_LINE = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)


def libpq_params(url: str) -> dict[str, Any]:
    parsed = sa.make_url(url)
    params = {
        "host": parsed.host,
        "port": parsed.port,
        "user": parsed.username,
        "password": parsed.password,
        "dbname": parsed.database,
    }
    return {k: v for k, v in params.items() if v is not None}


def prepare(url: str) -> None:
    conn = psycopg2.connect(**libpq_params(url))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS commit_probe")
        cur.execute("CREATE TABLE commit_probe (id integer PRIMARY KEY, n bigint NOT NULL)")
        cur.execute(f"INSERT INTO commit_probe SELECT g, 0 FROM generate_series(1, {TABLE_ROWS}) g")
        cur.execute("VACUUM ANALYZE commit_probe")
        cur.execute("SHOW server_version")
        version = cur.fetchone()
        cur.execute("SHOW synchronous_commit")
        sync = cur.fetchone()
    conn.close()
    print(f"server {version[0] if version else '?'}, synchronous_commit={sync[0] if sync else '?'}")


# --- pgbench ----------------------------------------------------------------------------------


def find_pgbench() -> Path | None:
    """pgbench from the same bindir as the throwaway server's initdb (else on PATH)."""
    import pg_server  # tests/pg_server.py

    bindir = pg_server.find_bindir()
    if bindir is not None and (bindir / "pgbench").is_file():
        return bindir / "pgbench"
    found = shutil.which("pgbench")
    return Path(found) if found else None


def pgbench_tps(pgbench: Path, url: str, clients: int, seconds: float, script: Path) -> float:
    p = libpq_params(url)
    threads = max(1, min(clients, multiprocessing.cpu_count()))
    cmd = [
        str(pgbench),
        "-n",  # no vacuum of pgbench's own tables (we use ours)
        "-M",
        "prepared",
        "-f",
        str(script),
        "-c",
        str(clients),
        "-j",
        str(threads),
        "-T",
        str(max(1, round(seconds))),
        "-h",
        str(p.get("host", "127.0.0.1")),
        "-p",
        str(p.get("port", 5432)),
        "-U",
        str(p.get("user", "postgres")),
        str(p["dbname"]),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    match = TPS_LINE.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"pgbench failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return float(match.group(1))


# --- the psycopg2 loop ---------------------------------------------------------------------------


def _loop_worker(url: str, seconds: float, seed: int, barrier: Any) -> tuple[int, float]:
    conn = psycopg2.connect(**libpq_params(url))
    conn.autocommit = True
    cur = conn.cursor()
    rng = random.Random(seed)
    cur.execute(UPDATE, (1,))  # connected and warm before the clock starts
    barrier.wait(BARRIER_TIMEOUT_S)
    done, started = 0, time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        cur.execute(UPDATE, (rng.randint(1, TABLE_ROWS),))
        done += 1
    elapsed = time.perf_counter() - started
    conn.close()
    return done, elapsed


def loop_tps(pool: Any, manager: Any, url: str, clients: int, seconds: float) -> float:
    barrier = manager.Barrier(clients)
    tasks = [(url, seconds, k, barrier) for k in range(clients)]
    results = pool.starmap_async(_loop_worker, tasks, chunksize=1).get(BARRIER_TIMEOUT_S + seconds)
    return sum(done / elapsed for done, elapsed in results)


# --- driver -------------------------------------------------------------------------------------


def parse_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--clients must be comma-separated integers, got {text!r}") from None
    if not counts or any(not 1 <= c <= 64 for c in counts):
        raise ValueError(f"--clients must be between 1 and 64, got {text!r}")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--clients", default="1,4,8", help="comma-separated client counts")
    parser.add_argument("--seconds", type=float, default=5.0, help="window per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="windows per figure (best kept)")
    parser.add_argument("--url", help="existing PostgreSQL database (default: a throwaway one)")
    parser.add_argument("--no-pgbench", action="store_true", help="measure the Python loop only")
    parser.add_argument("--json", help="write the result rows here (for bench/run.py)")
    args = parser.parse_args(argv)
    try:
        counts = parse_counts(args.clients)
    except ValueError as exc:
        parser.error(str(exc))
    if args.seconds <= 0 or args.rounds < 1:
        parser.error("--seconds must be positive and --rounds at least 1")
    pgbench = None if args.no_pgbench else find_pgbench()
    if pgbench is None:
        print("pgbench not used: the psycopg2 loop is the ceiling", flush=True)

    server = watchdog = None
    url = args.url
    ctx = multiprocessing.get_context("spawn")
    manager = ctx.Manager()
    pool = ctx.Pool(max(counts))
    results: dict[int, dict[str, float]] = {}
    try:
        if url is None:
            import pg_server  # tests/pg_server.py

            print("starting a throwaway PostgreSQL ...", flush=True)
            server = pg_server.start_server()
            watchdog = pg_server.start_watchdog(server)
            url = server.create_database("pg_commits")
        prepare(url)
        with tempfile.TemporaryDirectory(prefix="dueledger-pgbench-") as tmp:
            script = Path(tmp) / "update.sql"
            script.write_text(PGBENCH_SCRIPT, encoding="utf-8")
            for clients in counts:
                best: dict[str, float] = {}
                for _ in range(args.rounds):
                    if pgbench is not None:
                        tps = pgbench_tps(pgbench, url, clients, args.seconds, script)
                        best["pgbench"] = max(best.get("pgbench", 0.0), tps)
                    tps = loop_tps(pool, manager, url, clients, args.seconds)
                    best["psycopg2"] = max(best.get("psycopg2", 0.0), tps)
                results[clients] = best
                print(
                    f"  {clients} client(s): "
                    + ", ".join(f"{k} {v:,.0f} commits/s" for k, v in best.items()),
                    flush=True,
                )
    finally:
        pool.terminate()
        pool.join()
        manager.shutdown()
        if server is not None:
            server.stop(remove=True)
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()

    ceiling_name = "pgbench" if pgbench is not None else "psycopg2"
    print()
    print(
        "single-row UPDATE, one commit per transaction "
        f"(best of {args.rounds} x {args.seconds:g} s)"
    )
    print(f"{'clients':>7}  {'pgbench/s':>10}  {'psycopg2/s':>10}  {'ratio':>6}")
    rows: list[Row] = []
    for clients, best in results.items():
        ceiling = best[ceiling_name]
        loop = best["psycopg2"]
        ratio = loop / best["pgbench"] if "pgbench" in best else None
        print(
            f"{clients:>7}  {best.get('pgbench', float('nan')):>10,.0f}  {loop:>10,.0f}  "
            f"{'-' if ratio is None else f'{ratio:.2f}':>6}"
        )
        rows.append(
            Row(
                area="PostgreSQL commits",
                measurement=f"single-row UPDATE commits/s ({ceiling_name})",
                backend="postgres",
                size=f"{clients} client{'s' if clients != 1 else ''}",
                value=ceiling,
                unit="commits/s",
            )
        )
        if ratio is not None:
            rows.append(
                Row(
                    area="PostgreSQL commits",
                    measurement="the same UPDATE from Python (psycopg2 autocommit loop)",
                    backend="postgres",
                    size=f"{clients} client{'s' if clients != 1 else ''}",
                    value=loop,
                    unit="commits/s",
                    baseline=best["pgbench"],
                    baseline_label="pgbench",
                    ratio=ratio,
                )
            )
    if args.json:
        write_json(args.json, "commits", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
