"""Benchmark: RunLedger claim -> heartbeat -> succeed cycles/s against raw psycopg2 UPDATEs.

    uv run python bench/ledger_claims.py [--seconds N] [--workers 1,4,8] [--rounds R] [--url URL]
                                         [--json PATH]

What it does, in one run and on one server:

1. Starts a throwaway PostgreSQL (``tests/pg_server.py``; fsync off, so this measures
   round trips and CPU, not disks) unless ``--url`` names an existing database, and applies
   the ledger migrations.
2. For each worker count, alternately (``--rounds`` times each, to even out noise from other
   load on the machine; which side goes first alternates from round to round) runs
   - **ledger**: ``RunLedger.claim`` -> ``heartbeat`` -> ``succeed``;
   - **baseline**: the same three compare-and-set UPDATEs written as raw SQL on a plain
     psycopg2 autocommit connection (the claim also appends the run id and returns the row,
     as ``claim`` must). Same table, same server, same number of round trips per cycle (3).
   Each worker process works on **its own entries, created with ensure_entry beforehand**
   (not timed): it first runs a one-second warm-up at the same concurrency to learn its
   rate, creates three times the entries that rate needs for the window, waits at a barrier,
   then cycles for ``--seconds``. Should it still run out, it makes more with its clock
   stopped (the table says so). Rate = completed cycles / timed seconds, summed over the
   workers.
3. A race phase: pairs of workers go through the *same* entries (2 workers per entry), so
   every entry is claimed twice at nearly the same moment. Afterwards no entry may show
   more than one successful claim (neither in the callers' answers nor in the table:
   attempt at most 1, at most one run id); anything else is counted as a double claim.

Prints a table with both rates (medians over rounds), the ratio ledger/baseline (the median
of the rounds' paired ratios) and the client CPU time per cycle of each side. ``--json
PATH`` also writes the result rows for ``bench/run.py``. The CPU column explains the ratio
on a small host: when the workers and the server share few cores, throughput follows CPU
per cycle, and the ledger's extra work (validation, pooling, building the returned Entry)
shows; with spare cores or a remote server, round trips dominate and the two converge.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from _paths import ROOT  # first: puts the project and tests/ on sys.path

# isort: split

import psycopg2
import sqlalchemy as sa

from resources.core.entry import Status, Trigger, dedup_key_for_request
from resources.ledger import RunLedger

TTL = timedelta(minutes=5)
TTL_SECONDS = int(TTL.total_seconds())
WARMUP_S = 1.0
BUDGET_MARGIN = 3.0  # warm-up cycles include ensure_entry (about a cycle's cost); timed ones do not
TOP_UP = 100  # entries made with the worker's clock stopped if it runs out
BARRIER_TIMEOUT_S = 600
TASK_KEY = "bench_task"
#: Target: the ledger's cycle within 10 % of the same statements written by hand.
TARGET_RATIO = 0.9

# The baseline: what a careful hand-written implementation sends, one statement per step.
RAW_CLAIM = """
UPDATE dueledger_entries
   SET status = 'running', attempt = attempt + 1, claim_generation = claim_generation + 1,
       lease_owner = %(run)s,
       lease_expires_at = %(expires)s, heartbeat_at = %(now)s, started_at = %(now)s,
       updated_at = %(now)s, run_ids = run_ids || jsonb_build_array(%(run)s::text)
 WHERE id = %(id)s AND status IN ('queued', 'retrying') AND attempt < max_attempts
RETURNING *"""
RAW_HEARTBEAT = """
UPDATE dueledger_entries
   SET lease_expires_at = %(expires)s, heartbeat_at = %(now)s, updated_at = %(now)s
 WHERE id = %(id)s AND status = 'running' AND lease_owner = %(run)s"""
RAW_SUCCEED = """
UPDATE dueledger_entries
   SET status = 'success', lease_owner = NULL, lease_expires_at = NULL,
       finished_at = %(now)s, updated_at = %(now)s
 WHERE id = %(id)s AND status = 'running' AND lease_owner = %(run)s"""


# --- one cycle, two ways ------------------------------------------------------------------


class LedgerCycle:
    def __init__(self, url: str) -> None:
        self.ledger = RunLedger(database_url=url)

    def __call__(self, entry_id: int, run_id: str) -> bool:
        if not self.ledger.claim(entry_id, run_id, lease_ttl=TTL).claimed:
            return False
        if not self.ledger.heartbeat(entry_id, run_id, lease_ttl=TTL):
            raise AssertionError(f"heartbeat refused to the owner of entry {entry_id}")
        if not self.ledger.succeed(entry_id, run_id):
            raise AssertionError(f"succeed refused to the owner of entry {entry_id}")
        return True

    def close(self) -> None:
        self.ledger.dispose()


class RawCycle:
    def __init__(self, url: str) -> None:
        self.conn = psycopg2.connect(**_dsn(url))
        self.conn.autocommit = True
        self.cursor = self.conn.cursor()

    def __call__(self, entry_id: int, run_id: str) -> bool:
        now = datetime.now(UTC).replace(tzinfo=None)
        params = {"id": entry_id, "run": run_id, "now": now, "expires": now + TTL}
        self.cursor.execute(RAW_CLAIM, params)
        if not self.cursor.fetchall():
            return False
        self.cursor.execute(RAW_HEARTBEAT, params)
        if self.cursor.rowcount != 1:
            raise AssertionError(f"raw heartbeat missed entry {entry_id}")
        self.cursor.execute(RAW_SUCCEED, params)
        if self.cursor.rowcount != 1:
            raise AssertionError(f"raw succeed missed entry {entry_id}")
        return True

    def close(self) -> None:
        self.conn.close()


def _dsn(url: str) -> dict[str, Any]:
    parsed = sa.make_url(url)
    return {
        k: v
        for k, v in {
            "host": parsed.host,
            "port": parsed.port,
            "user": parsed.username,
            "password": parsed.password,
            "dbname": parsed.database,
        }.items()
        if v is not None
    }


# --- worker tasks (top level: run in spawned pool processes) ------------------------------


def _warm(barrier: Any) -> None:
    barrier.wait(BARRIER_TIMEOUT_S)


def _throughput_task(mode: str, url: str, seconds: float, tag: str, barrier: Any) -> dict[str, Any]:
    ledger = RunLedger(database_url=url)
    cycle = LedgerCycle(url) if mode == "ledger" else RawCycle(url)

    def new_entries(count: int) -> list[int]:
        return [
            ledger.ensure_entry(
                task_key=TASK_KEY,
                trigger=Trigger.MANUAL,
                dedup_key=dedup_key_for_request(f"{tag}-{uuid.uuid4().hex}"),
            ).id
            for _ in range(count)
        ]

    for k, entry_id in enumerate(new_entries(5)):  # connect and compile before any timing
        cycle(entry_id, f"{tag}-c{k}")
    barrier.wait(BARRIER_TIMEOUT_S)  # warm up together, so at the concurrency measured
    # Warm-up (entries made in the loop, untimed): learn this worker's rate for its budget.
    warm_cycles, started = 0, time.perf_counter()
    while time.perf_counter() - started < WARMUP_S:
        cycle(new_entries(1)[0], f"{tag}-w{warm_cycles}")
        warm_cycles += 1
    rate = warm_cycles / (time.perf_counter() - started)
    pending = new_entries(math.ceil(rate * seconds * BUDGET_MARGIN) + TOP_UP)

    barrier.wait(BARRIER_TIMEOUT_S)
    done, paused, started, cpu_started = 0, 0.0, time.perf_counter(), time.process_time()
    while time.perf_counter() - paused < started + seconds:
        if not pending:
            # Ran out (the machine got faster than in the warm-up): make more with the clock
            # stopped for this worker. Reported, so a large share is visible.
            stop, cpu_stop = time.perf_counter(), time.process_time()
            pending = new_entries(TOP_UP)
            paused += time.perf_counter() - stop
            cpu_started += time.process_time() - cpu_stop
        entry_id = pending.pop()
        if not cycle(entry_id, f"{tag}-{entry_id}"):
            raise AssertionError(f"{mode}: entry {entry_id} of this worker was not claimable")
        done += 1
    elapsed = time.perf_counter() - started - paused
    cpu = time.process_time() - cpu_started
    cycle.close()
    ledger.dispose()
    return {"cycles": done, "elapsed": elapsed, "paused": paused, "cpu": cpu}


def _race_task(url: str, entry_ids: list[int], tag: str, seconds: float, barrier: Any) -> list[int]:
    cycle = LedgerCycle(url)
    cycle.ledger.get(entry_ids[0])
    barrier.wait(BARRIER_TIMEOUT_S)
    won, deadline = [], time.perf_counter() + seconds
    for entry_id in entry_ids:
        if time.perf_counter() >= deadline:
            break
        if cycle(entry_id, f"{tag}-{entry_id}"):
            won.append(entry_id)
    cycle.close()
    return won


# --- driver ---------------------------------------------------------------------------------


def round_order(index: int) -> tuple[str, str]:
    """The sides in the order they run in round ``index``: alternating, so that neither
    always runs second -- on the table the other has just grown and filled with dead row
    versions, possibly while autovacuum cleans up after it."""
    return ("baseline", "ledger") if index % 2 == 0 else ("ledger", "baseline")


def paired_ratio(ledger: list[float], baseline: list[float]) -> float:
    """Median over rounds of ledger / baseline, each pair measured back to back."""
    return statistics.median(led / base for led, base in zip(ledger, baseline, strict=True))


@dataclass
class Pool:
    pool: Any
    manager: Any

    def run(self, target: Any, args_per_task: list[tuple[Any, ...]]) -> list[Any]:
        """One task per worker process, all released together by a shared barrier."""
        barrier = self.manager.Barrier(len(args_per_task))
        tasks = [(*args, barrier) for args in args_per_task]
        return list(self.pool.starmap_async(target, tasks, chunksize=1).get(BARRIER_TIMEOUT_S))


def measure(
    pool: Pool, mode: str, url: str, workers: int, seconds: float
) -> tuple[float, float, float]:
    """Summed cycles/s of ``workers`` processes, the client CPU microseconds per cycle, and
    the largest paused share of a window."""
    tag = f"{mode}{workers}-{uuid.uuid4().hex[:6]}"
    results = pool.run(
        _throughput_task, [(mode, url, seconds, f"{tag}-{w}") for w in range(workers)]
    )
    rate = sum(r["cycles"] / r["elapsed"] for r in results)
    cpu_per_cycle = 1e6 * sum(r["cpu"] for r in results) / max(1, sum(r["cycles"] for r in results))
    return rate, cpu_per_cycle, max(r["paused"] for r in results) / seconds


def race(pool: Pool, url: str, workers: int, seconds: float) -> dict[str, int]:
    ledger = RunLedger(database_url=url)
    pairs = max(1, workers // 2)
    per_pair = 1500
    lists = [
        [
            ledger.ensure_entry(
                task_key=TASK_KEY,
                trigger=Trigger.MANUAL,
                dedup_key=dedup_key_for_request(f"race-{p}-{i}-{uuid.uuid4().hex[:8]}"),
            ).id
            for i in range(per_pair)
        ]
        for p in range(pairs)
    ]
    won_lists = pool.run(
        _race_task,
        [(url, lists[w // 2], f"race{w}", seconds) for w in range(pairs * 2)],
    )
    wins: dict[int, int] = {}
    for won in won_lists:
        for entry_id in won:
            wins[entry_id] = wins.get(entry_id, 0) + 1
    double = sum(1 for n in wins.values() if n > 1)
    refused = 0
    for entry_id in (e for ids in lists for e in ids):
        entry = ledger.get(entry_id)
        assert entry is not None
        if entry.attempt > 1 or len(entry.run_ids) > 1:
            double += 1
        if entry.status == Status.SUCCESS and entry.attempt != 1:
            double += 1
        refused += len(entry.summary["late_job_rejections"])
    ledger.dispose()
    return {"entries_claimed": len(wins), "refused_recorded": refused, "double_claims": double}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="timed window per run")
    parser.add_argument("--workers", default="1,4,8", help="comma-separated worker counts")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side per count")
    parser.add_argument("--url", help="existing PostgreSQL database (default: a throwaway one)")
    parser.add_argument("--json", help="write the result rows here (for bench/run.py)")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.workers.split(",")]

    server = watchdog = None
    url = args.url
    if url is None:
        import pg_server  # tests/pg_server.py

        print("starting a throwaway PostgreSQL ...", flush=True)
        server = pg_server.start_server()
        watchdog = pg_server.start_watchdog(server)
        url = server.create_database("dueledger_bench")
    ctx = multiprocessing.get_context("spawn")
    manager = ctx.Manager()
    process_pool = ctx.Pool(max(counts))
    try:
        RunLedger(database_url=url).migrate()
        pool = Pool(process_pool, manager)
        pool.run(_warm, [()] * max(counts))  # every process imports everything up front
        print(
            f"server: {sa.make_url(url).render_as_string(hide_password=True)}; "
            f"window {args.seconds:g} s, {args.rounds} round(s) per side, medians reported",
            flush=True,
        )
        rows = []
        for n, workers in enumerate(counts):
            rates: dict[str, list[float]] = {"baseline": [], "ledger": []}
            cpus: dict[str, list[float]] = {"baseline": [], "ledger": []}
            paused = 0.0
            for r in range(args.rounds):
                for mode in round_order(r + n):
                    rate, cpu, paused_share = measure(pool, mode, url, workers, args.seconds)
                    rates[mode].append(rate)
                    cpus[mode].append(cpu)
                    paused = max(paused, paused_share)
            base, led = (statistics.median(rates[m]) for m in ("baseline", "ledger"))
            cpu_base, cpu_led = (statistics.median(cpus[m]) for m in ("baseline", "ledger"))
            ratio = paired_ratio(rates["ledger"], rates["baseline"])
            rows.append((workers, base, led, ratio, cpu_base, cpu_led, paused))
            print(
                f"  {workers} worker(s): baseline {[round(r) for r in rates['baseline']]} "
                f"ledger {[round(r) for r in rates['ledger']]}",
                flush=True,
            )
        race_result = race(pool, url, max(counts), args.seconds)
    finally:
        process_pool.terminate()
        process_pool.join()
        manager.shutdown()
        if server is not None:
            server.stop(remove=True)
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()

    print()
    print("claim -> heartbeat -> succeed, 3 round trips per cycle (medians)")
    print(
        f"{'workers':>7}  {'baseline raw/s':>14}  {'RunLedger/s':>11}  {'ratio':>6}  "
        f"{'client CPU us/cycle raw | ledger':>32}"
    )
    for workers, base, led, ratio, cpu_base, cpu_led, paused in rows:
        note = f"  (a worker paused {paused:.0%} of a window to make entries)" if paused else ""
        print(
            f"{workers:>7}  {base:>14.0f}  {led:>11.0f}  {ratio:>6.2f}  "
            f"{cpu_base:>22.0f} | {cpu_led:<7.0f}{note}"
        )
    print()
    pairs = max(1, max(counts) // 2)
    print(
        f"race: {pairs * 2} workers, 2 per entry: {race_result['entries_claimed']} entries "
        f"claimed, {race_result['refused_recorded']} refused claims recorded, "
        f"double claims: {race_result['double_claims']}"
    )
    if args.json:
        write_rows(args.json, rows, race_result, pairs * 2)
    return 1 if race_result["double_claims"] else 0


def write_rows(
    path: str, rows: list[tuple[Any, ...]], race_result: dict[str, int], racers: int
) -> None:
    """The results as ``bench/run.py`` rows (``--json``)."""
    if str(ROOT / "bench") not in sys.path:
        sys.path.append(str(ROOT / "bench"))  # last: bench/assets.py shadows `assets`
    from run import Row, write_json  # bench/run.py owns the row format

    out = [
        Row(
            area="ledger claims",
            measurement="RunLedger claim -> heartbeat -> succeed",
            backend="postgres",
            size=f"{workers} worker{'s' if workers != 1 else ''}",
            value=led,
            unit="cycles/s",
            baseline=base,
            baseline_label="the same 3 UPDATEs as raw psycopg2",
            ratio=ratio,
            target=f"ratio >= {TARGET_RATIO:.2f}",
            met=ratio >= TARGET_RATIO,
        )
        for workers, base, led, ratio, *_ in rows
    ]
    out.append(
        Row(
            area="ledger claims",
            measurement=f"double claims, {racers} workers racing 2 per entry",
            backend="postgres",
            size=f"{race_result['entries_claimed']:,} entries claimed",
            value=float(race_result["double_claims"]),
            unit="double claims",
            target="0",
            met=race_result["double_claims"] == 0,
            kind="check",
        )
    )
    write_json(path, "claims", out)


if __name__ == "__main__":
    sys.exit(main())
