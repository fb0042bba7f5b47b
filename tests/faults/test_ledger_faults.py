"""Ledger faults on PostgreSQL: a killed connection, clock skew, a worker killed at each step.

These drive RunLedger directly (no Dagster): the promises are the ledger's own.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2
import pytest
from pg_server import PgServer
from sqlalchemy.engine import make_url

from orchestration.reclaim import reclaim_expired
from resources.core.entry import Entry, FailureKind, Status, Trigger, dedup_key_for_due
from resources.ledger import LedgerError, RunLedger

pytestmark = pytest.mark.postgres


@pytest.fixture
def ledger_url(postgres_url: str) -> str:
    """This module's faults are PostgreSQL's: its ledger is PostgreSQL only."""
    return postgres_url


ROOT = Path(__file__).resolve().parents[2]
DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
TTL = timedelta(seconds=60)


def _entry(ledger: RunLedger) -> Entry:
    return ledger.ensure_entry(
        task_key="order_cleanup",
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(DUE),
        max_attempts=3,
        now=DUE,
    )


def _get(ledger: RunLedger, entry_id: int) -> Entry:
    found = ledger.get(entry_id)
    assert found is not None
    return found


def _terminate_ledger_backends(pg_server: PgServer, database: str) -> int:
    """pg_terminate_backend every connection to ``database`` but this admin one."""
    conn = psycopg2.connect(pg_server.dsn(), connect_timeout=10)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            )
            row = cur.fetchone()
            assert row is not None
            return int(row[0])
    finally:
        conn.close()


def test_a_connection_killed_mid_claim_is_a_clear_error_and_the_retry_claims_once(
    ledger: RunLedger, pg_server: PgServer, postgres_url: str
) -> None:
    entry = _entry(ledger)
    # Warm the hot path so the ledger holds a pooled connection, then kill it server-side.
    assert ledger.heartbeat(entry.id, "warm-up", lease_ttl=TTL, now=DUE) is False
    database = make_url(postgres_url).database
    assert database is not None
    assert _terminate_ledger_backends(pg_server, database) >= 1

    with pytest.raises(LedgerError) as caught:
        ledger.claim(entry.id, "run-a", lease_ttl=TTL, now=DUE)
    message = str(caught.value)
    assert "cannot use the ledger database" in message and "DUELEDGER_DATABASE_URL" in message
    assert _get(ledger, entry.id).status == Status.QUEUED, "a failed claim changed nothing"

    retried = ledger.claim(entry.id, "run-a", lease_ttl=TTL, now=DUE)
    assert retried.claimed
    again = ledger.claim(entry.id, "run-a", lease_ttl=TTL, now=DUE)  # re-entrant, no 2nd attempt
    assert again.claimed
    other = ledger.claim(entry.id, "run-b", lease_ttl=TTL, now=DUE)
    assert not other.claimed
    after = _get(ledger, entry.id)
    assert after.status == Status.RUNNING
    assert after.run_ids == ("run-a",)
    assert after.attempt == 1
    assert [r["run_id"] for r in after.summary["late_job_rejections"]] == ["run-b"]


def test_a_connection_killed_inside_the_slow_path_transaction_is_safe_to_retry(
    ledger: RunLedger, pg_server: PgServer, postgres_url: str
) -> None:
    entry = _entry(ledger)
    assert ledger.claim(entry.id, "run-a", lease_ttl=TTL, now=DUE).claimed
    database = make_url(postgres_url).database
    assert database is not None
    _terminate_ledger_backends(pg_server, database)
    # run-b is refused: its first statement fails on the dead connection, or the refusal is
    # recorded; either way run-a keeps the entry and a retry records exactly one rejection.
    with contextlib.suppress(LedgerError):
        ledger.claim(entry.id, "run-b", lease_ttl=TTL, now=DUE)
    result = ledger.claim(entry.id, "run-b", lease_ttl=TTL, now=DUE)
    assert not result.claimed
    after = _get(ledger, entry.id)
    assert after.lease_owner == "run-a" and after.run_ids == ("run-a",)
    assert after.summary["late_job_rejections"][-1]["run_id"] == "run-b"


@pytest.mark.parametrize("skew_seconds", [1, 30, 59])
def test_clock_skew_inside_the_lease_never_gives_two_owners(
    ledger: RunLedger, skew_seconds: int
) -> None:
    entry = _entry(ledger)
    skew = timedelta(seconds=skew_seconds)
    a_clock = DUE + timedelta(seconds=5)
    b_clock = a_clock + skew  # worker B's clock runs ahead of A's, less than the lease TTL

    assert ledger.claim(entry.id, "run-a", lease_ttl=TTL, now=a_clock).claimed
    # B (ahead) and a reclaim sensor on B's clock: lease still live -> refused, nothing reclaimed.
    assert not ledger.claim(entry.id, "run-b", lease_ttl=TTL, now=b_clock).claimed
    assert reclaim_expired(ledger, now=b_clock) == []
    # A renews on its own (slow) clock; B's view still sees the lease live.
    assert ledger.heartbeat(entry.id, "run-a", lease_ttl=TTL, now=a_clock + timedelta(seconds=50))
    assert reclaim_expired(ledger, now=b_clock + timedelta(seconds=50)) == []
    late = ledger.claim(entry.id, "run-b", lease_ttl=TTL, now=b_clock + timedelta(seconds=50))
    assert not late.claimed
    assert _get(ledger, entry.id).lease_owner == "run-a"

    # A goes silent. After the lease expired (by B's clock) only reclaim acts: failed.
    expired = a_clock + timedelta(seconds=50) + TTL + skew + timedelta(seconds=1)
    assert not ledger.claim(entry.id, "run-b", lease_ttl=TTL, now=expired).claimed
    reclaimed = reclaim_expired(ledger, now=expired)
    assert [e.id for e in reclaimed] == [entry.id]
    assert not ledger.claim(entry.id, "run-b", lease_ttl=TTL, now=expired).claimed
    # A's late completion does not overwrite the reclaim.
    assert not ledger.succeed(entry.id, "run-a", now=expired)

    final = _get(ledger, entry.id)
    assert final.status == Status.FAILED
    assert final.failure_kind == FailureKind.LEASE_RECLAIMED
    assert final.run_ids == ("run-a",), "never a second owner"
    assert final.attempt == 1
    rejected = [r["run_id"] for r in final.summary["late_job_rejections"]]
    assert rejected.count("run-b") == 4 and "run-a" in rejected


# --- a worker killed (SIGKILL) at each ledger step -----------------------------------------

_WORKER = """
import os, signal, sys
from datetime import datetime, timedelta
from pathlib import Path
from resources.core.entry import dedup_key_for_due
from resources.ledger import RunLedger
url, step, effects, due = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
now = datetime.fromisoformat(due)
ledger = RunLedger(database_url=url)
entry = ledger.ensure_entry(
    task_key="order_cleanup", trigger="schedule", dedup_key=dedup_key_for_due(now), now=now
)
if step == "inserted":
    os.kill(os.getpid(), signal.SIGKILL)
claim = ledger.claim(entry.id, "run-killed", lease_ttl=timedelta(seconds=60), now=now)
assert claim.claimed, claim.reason
if step == "claimed":
    os.kill(os.getpid(), signal.SIGKILL)
with effects.open("a") as fh:  # the side effect, then death before completion is recorded
    fh.write("run-killed\\n")
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("step", ["inserted", "claimed", "side_effect"])
def test_a_worker_killed_at_each_ledger_step_loses_no_due_and_never_runs_it_twice(
    ledger: RunLedger, postgres_url: str, tmp_path: Path, step: str
) -> None:

    effects = tmp_path / "effects.txt"
    effects.touch()
    killed = subprocess.run(
        [sys.executable, "-c", _WORKER, postgres_url, step, str(effects), DUE.isoformat()],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    entry = ledger.find("order_cleanup", dedup_key_for_due(DUE))
    assert entry is not None, "the due was lost"

    # What happens next: the reclaim sensor runs after the lease TTL, and a second run for
    # the same due (a resumed tick, a Dagster retry) tries to claim.
    later = DUE + TTL + timedelta(seconds=1)
    reclaimed = reclaim_expired(ledger, now=later)
    retry = ledger.claim(entry.id, "run-next", lease_ttl=TTL, now=later)
    if retry.claimed:
        with effects.open("a") as fh:
            fh.write("run-next\n")
        assert ledger.succeed(entry.id, "run-next", now=later)
    final = _get(ledger, entry.id)
    done = effects.read_text().split()

    if step == "inserted":  # nothing happened yet: the next run does it, once
        assert reclaimed == [] and retry.claimed
        assert final.status == Status.SUCCESS and final.run_ids == ("run-next",)
        assert done == ["run-next"]
    else:  # claimed (side effect maybe done): reclaimed as failed, never re-run
        assert [e.id for e in reclaimed] == [entry.id] and not retry.claimed
        assert final.status == Status.FAILED
        assert final.failure_kind == FailureKind.LEASE_RECLAIMED
        assert final.run_ids == ("run-killed",)
        assert done == ([] if step == "claimed" else ["run-killed"])
        assert final.summary["late_job_rejections"][-1]["run_id"] == "run-next"
