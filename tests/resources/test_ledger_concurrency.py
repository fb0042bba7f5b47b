"""Real processes racing on one ledger (SQLite file and PostgreSQL): exactly one winner.

One pool of worker processes (``spawn``: no inherited connections or locks) serves the
whole module, because starting a process that imports Dagster costs seconds. In every race
each worker runs exactly one task and all of them meet at a barrier after connecting, so the
race is on the ledger operation itself, not on process start-up.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory

from orchestration.reclaim import reclaim_expired
from resources.core.entry import Status, Trigger, dedup_key_for_due, dedup_key_for_request
from resources.ledger import RunLedger
from resources.ledger.migrate import MIGRATIONS_DIR
from resources.ledger.schema import VERSION_TABLE, entries

DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
TTL = timedelta(minutes=5)
PROCESSES = 8
TIMEOUT_S = 120
#: The warm-up imports Dagster in 8 fresh processes at once: on 2 busy cores that alone took
#: over 120 s. Only the warm-up waits this long; every race keeps TIMEOUT_S.
WARM_UP_TIMEOUT_S = 900

SPAWN = multiprocessing.get_context("spawn")


# --- worker bodies (top level: spawn pickles them by name) ------------------------------------


def _warm_worker(barrier: Any) -> int:
    """Makes every pool process import this module (and Dagster) before any race."""
    barrier.wait(WARM_UP_TIMEOUT_S)
    return os.getpid()


def _claim_worker(url: str, entry_id: int, run_id: str, barrier: Any) -> tuple[str, bool, str]:
    ledger = RunLedger(database_url=url)
    ledger.get(entry_id)  # connect before the barrier
    barrier.wait(TIMEOUT_S)
    result = ledger.claim(entry_id, run_id, lease_ttl=TTL)
    ledger.dispose()
    return run_id, result.claimed, result.reason or ""


def _ensure_worker(url: str, key: str, barrier: Any) -> int:
    ledger = RunLedger(database_url=url)
    ledger.find("race_task", key)
    barrier.wait(TIMEOUT_S)
    entry = ledger.ensure_entry(task_key="race_task", trigger=Trigger.MANUAL, dedup_key=key)
    ledger.dispose()
    return entry.id


def _migrate_worker(url: str, barrier: Any) -> str:
    barrier.wait(TIMEOUT_S)
    ledger = RunLedger(database_url=url)
    try:
        ledger.migrate()
        return "ok"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        ledger.dispose()


def _cycle_worker(url: str, entry_ids: list[int], run_prefix: str, barrier: Any) -> list[int]:
    """Claim -> heartbeat -> succeed over entries that other workers race for too."""
    ledger = RunLedger(database_url=url)
    ledger.get(entry_ids[0])
    barrier.wait(TIMEOUT_S)
    won = []
    for entry_id in entry_ids:
        run_id = f"{run_prefix}-{entry_id}"
        if ledger.claim(entry_id, run_id, lease_ttl=TTL).claimed:
            assert ledger.heartbeat(entry_id, run_id, lease_ttl=TTL)
            assert ledger.succeed(entry_id, run_id)
            won.append(entry_id)
    ledger.dispose()
    return won


def _lease_worker(
    url: str, entry_id: int, role: str, at: datetime, barrier: Any
) -> tuple[str, bool]:
    ledger = RunLedger(database_url=url)
    ledger.get(entry_id)
    barrier.wait(TIMEOUT_S)
    if role == "beat":
        won = ledger.heartbeat(entry_id, "owner", lease_ttl=TTL, now=at)
    else:
        won = [e.id for e in reclaim_expired(ledger, now=at)] == [entry_id]
    ledger.dispose()
    return role, won


def _hook_worker(url: str, entry_id: int, worker: int, barrier: Any) -> int:
    ledger = RunLedger(database_url=url)
    ledger.get(entry_id)
    barrier.wait(TIMEOUT_S)
    for n in range(2):
        ledger.record_hook_result(entry_id, {"worker": worker, "n": n})
    ledger.dispose()
    return worker


@dataclass
class Workers:
    """A pool of PROCESSES spawned workers and a manager for barriers they can share."""

    pool: Any
    manager: Any

    def race(
        self, target: Any, args_per_task: list[tuple[Any, ...]], timeout: float = TIMEOUT_S
    ) -> list[Any]:
        """Run one task per worker; each gets a shared barrier as its last argument."""
        assert len(args_per_task) <= PROCESSES  # more tasks than workers would deadlock
        barrier = self.manager.Barrier(len(args_per_task))
        tasks = [(*args, barrier) for args in args_per_task]
        return list(self.pool.starmap_async(target, tasks, chunksize=1).get(timeout))


@pytest.fixture(scope="module")
def workers() -> Iterator[Workers]:
    manager = SPAWN.Manager()
    pool = SPAWN.Pool(PROCESSES)
    try:
        warm = Workers(pool, manager)
        # A worker blocked at the barrier cannot take a second task, so all PROCESSES run one.
        pids = warm.race(_warm_worker, [()] * PROCESSES, timeout=WARM_UP_TIMEOUT_S)
        assert len(set(pids)) == PROCESSES
        yield warm
    finally:
        pool.terminate()
        pool.join()
        manager.shutdown()


# --- tests ------------------------------------------------------------------------------------


def test_racing_claims_have_exactly_one_winner(ledger_url: str, workers: Workers) -> None:
    ledger = RunLedger(database_url=ledger_url)
    ledger.migrate()
    entry = ledger.ensure_entry(
        task_key="race_task", trigger=Trigger.SCHEDULE, dedup_key=dedup_key_for_due(DUE)
    )
    outcomes = workers.race(
        _claim_worker, [(ledger_url, entry.id, f"run-{i}") for i in range(PROCESSES)]
    )

    winners = [run_id for run_id, claimed, _ in outcomes if claimed]
    losers = [run_id for run_id, claimed, _ in outcomes if not claimed]
    assert len(winners) == 1
    assert len(losers) == PROCESSES - 1
    assert all(
        "duplicate run, nothing done" in reason for _, claimed, reason in outcomes if not claimed
    )

    after = ledger.get(entry.id)
    assert after is not None
    assert after.status == Status.RUNNING
    assert after.attempt == 1
    assert after.run_ids == (winners[0],)
    assert after.lease_owner == winners[0]
    rejections = after.summary["late_job_rejections"]
    # Only the newest five are kept; every one of them is a loser.
    assert len(rejections) == min(PROCESSES - 1, 5)
    assert {r["run_id"] for r in rejections} <= set(losers)
    ledger.dispose()


def test_concurrent_ensure_entry_makes_one_row(ledger_url: str, workers: Workers) -> None:
    ledger = RunLedger(database_url=ledger_url)
    ledger.migrate()
    key = dedup_key_for_request("same-request")
    ids = workers.race(_ensure_worker, [(ledger_url, key)] * PROCESSES)
    assert len(set(ids)) == 1
    with ledger._get_engine().connect() as conn:
        count = conn.execute(sa.select(sa.func.count()).select_from(entries)).scalar_one()
    assert count == 1
    ledger.dispose()


def test_concurrent_summary_updates_are_never_lost(ledger_url: str, workers: Workers) -> None:
    # Pins the row lock around the summary's read-modify-write: without it two writers
    # read the same list and the later write drops the earlier one's item.
    ledger = RunLedger(database_url=ledger_url)
    ledger.migrate()
    entry = ledger.ensure_entry(
        task_key="race_task", trigger=Trigger.SCHEDULE, dedup_key=dedup_key_for_due(DUE)
    )
    workers.race(_hook_worker, [(ledger_url, entry.id, w) for w in range(PROCESSES)])
    after = ledger.get(entry.id)
    assert after is not None
    recorded = {(h["worker"], h["n"]) for h in after.summary["hooks"]}
    assert recorded == {(w, n) for w in range(PROCESSES) for n in range(2)}  # 16 <= 20 kept
    ledger.dispose()


def test_concurrent_migrations_all_succeed_once(ledger_url: str, workers: Workers) -> None:
    outcomes = workers.race(_migrate_worker, [(ledger_url,)] * PROCESSES)
    assert outcomes == ["ok"] * PROCESSES
    engine = sa.create_engine(ledger_url)
    with engine.connect() as conn:
        versions = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    engine.dispose()
    assert versions == [(ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head(),)]


def test_many_workers_racing_over_many_entries_never_double_claim(
    ledger_url: str, workers: Workers
) -> None:
    ledger = RunLedger(database_url=ledger_url)
    ledger.migrate()
    ids = [
        ledger.ensure_entry(
            task_key="race_task",
            trigger=Trigger.SCHEDULE,
            dedup_key=dedup_key_for_due(DUE + timedelta(minutes=15 * k)),
        ).id
        for k in range(40)
    ]
    won_lists = workers.race(
        _cycle_worker,
        [(ledger_url, ids if w % 2 else ids[::-1], f"w{w}") for w in range(PROCESSES)],
    )
    wins = Counter(entry_id for won in won_lists for entry_id in won)
    assert sorted(wins) == sorted(ids)
    assert set(wins.values()) == {1}
    for entry_id in ids:
        after = ledger.get(entry_id)
        assert after is not None
        assert (after.status, after.attempt, len(after.run_ids)) == (Status.SUCCESS, 1, 1)
    ledger.dispose()


def test_heartbeat_racing_reclaim_has_exactly_one_winner(ledger_url: str, workers: Workers) -> None:
    """Heartbeat and reclaim at the same (injected) instant after expiry: one of them wins.

    Heartbeat first: the lease moves past that instant and reclaim finds nothing. Reclaim
    first: the entry is failed and the heartbeat is refused. Never both, never neither.
    """
    ledger = RunLedger(database_url=ledger_url)
    ledger.migrate()
    start = DUE + timedelta(seconds=1)
    late = start + TTL + timedelta(seconds=1)
    for k in range(4):
        entry = ledger.ensure_entry(
            task_key="race_task",
            trigger=Trigger.SCHEDULE,
            dedup_key=dedup_key_for_due(DUE + timedelta(minutes=15 * k)),
        )
        assert ledger.claim(entry.id, "owner", lease_ttl=TTL, now=start).claimed
        outcomes = dict(
            workers.race(
                _lease_worker, [(ledger_url, entry.id, role, late) for role in ("beat", "reap")]
            )
        )
        assert outcomes["beat"] != outcomes["reap"]
        after = ledger.get(entry.id)
        assert after is not None
        expected = Status.RUNNING if outcomes["beat"] else Status.FAILED
        assert after.status == expected
    ledger.dispose()
