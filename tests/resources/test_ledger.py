"""RunLedger against real SQLite and real PostgreSQL (``ledger_url`` runs each test on both).

Transitions are table-driven: every (starting status, operation) pair says what the entry
must look like afterwards and whether the call reported success. Times are injected.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from contract import ENTRY_KEYS

from orchestration.reclaim import reclaim_expired
from resources.core.due import format_due
from resources.core.entry import (
    MAX_ERROR_CHARS,
    Entry,
    FailureKind,
    Status,
    Trigger,
    dedup_key_for_backfill,
    dedup_key_for_due,
    dedup_key_for_request,
    dedup_key_for_retry,
    origin_of,
)
from resources.ledger import ClaimResult, LedgerError, RunLedger, UnknownEntryError
from resources.ledger.migrate import MIGRATIONS_DIR
from resources.ledger.schema import ENTRIES_TABLE, VERSION_TABLE, entries, metadata

# --- named instants --------------------------------------------------------------------------
DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
JUST_AFTER_DUE = DUE + timedelta(seconds=2)
TTL = timedelta(minutes=5)
LEASE_END = JUST_AFTER_DUE + TTL
JUST_BEFORE_LEASE_END = LEASE_END - timedelta(seconds=1)
TWO_MINUTES_OVERDUE = LEASE_END + timedelta(minutes=2)
NEXT_DAY = DUE + timedelta(days=1)

TASK = "order_cleanup"
OWNER = "run-a"
OTHER = "run-b"


def new_entry(ledger: RunLedger, *, max_attempts: int = 3, due: datetime = DUE) -> Entry:
    return ledger.ensure_entry(
        task_key=TASK,
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(due),
        max_attempts=max_attempts,
        now=due,
    )


def state(entry: Entry) -> tuple[Any, ...]:
    """The columns no refused operation may change."""
    return (
        entry.status,
        entry.attempt,
        entry.lease_owner,
        entry.lease_expires_at,
        entry.run_ids,
        entry.failure_kind,
        entry.error,
        entry.finished_at,
    )


def fresh(ledger: RunLedger, entry: Entry) -> Entry:
    found = ledger.get(entry.id)
    assert found is not None
    return found


# --- starting states, reached only through the public API --------------------------------


# Each takes the due so that one test can hold several entries (one per due).


def start_queued(ledger: RunLedger, due: datetime = DUE) -> Entry:
    return new_entry(ledger, due=due)


def start_running(ledger: RunLedger, due: datetime = DUE) -> Entry:
    entry = new_entry(ledger, due=due)
    assert ledger.claim(entry.id, OWNER, lease_ttl=TTL, now=JUST_AFTER_DUE).claimed
    return fresh(ledger, entry)


def start_retrying(ledger: RunLedger, due: datetime = DUE) -> Entry:
    entry = start_running(ledger, due)
    ledger.fail(entry.id, OWNER, error="boom", now=JUST_AFTER_DUE)
    return fresh(ledger, entry)


def start_success(ledger: RunLedger, due: datetime = DUE) -> Entry:
    entry = start_running(ledger, due)
    assert ledger.succeed(entry.id, OWNER, now=JUST_AFTER_DUE)
    return fresh(ledger, entry)


def start_failed(ledger: RunLedger, due: datetime = DUE) -> Entry:
    entry = new_entry(ledger, max_attempts=1, due=due)
    assert ledger.claim(entry.id, OWNER, lease_ttl=TTL, now=JUST_AFTER_DUE).claimed
    ledger.fail(entry.id, OWNER, error="boom", now=JUST_AFTER_DUE)
    return fresh(ledger, entry)


def start_dispatch_failed(ledger: RunLedger, due: datetime = DUE) -> Entry:
    entry = new_entry(ledger, due=due)
    ledger.record_dispatch_failure(entry.id, error="launcher down", now=JUST_AFTER_DUE)
    return fresh(ledger, entry)


STARTS: dict[str, Callable[..., Entry]] = {
    Status.QUEUED: start_queued,
    Status.RUNNING: start_running,
    Status.RETRYING: start_retrying,
    Status.SUCCESS: start_success,
    Status.FAILED: start_failed,
    Status.DISPATCH_FAILED: start_dispatch_failed,
}


def test_starting_states_are_what_they_say(ledger: RunLedger) -> None:
    for k, (status, make) in enumerate(STARTS.items()):
        assert make(ledger, DUE + timedelta(minutes=15 * k)).status == status


# --- the transition table ------------------------------------------------------------------


def op_claim(run: str) -> Callable[[RunLedger, Entry], Any]:
    def run_op(ledger: RunLedger, entry: Entry) -> Any:
        result = ledger.claim(entry.id, run, lease_ttl=TTL, now=JUST_BEFORE_LEASE_END)
        return result.claimed

    return run_op


def op_heartbeat(run: str) -> Callable[[RunLedger, Entry], Any]:
    return lambda ledger, entry: ledger.heartbeat(
        entry.id, run, lease_ttl=TTL, now=JUST_BEFORE_LEASE_END
    )


def op_succeed(run: str) -> Callable[[RunLedger, Entry], Any]:
    return lambda ledger, entry: ledger.succeed(entry.id, run, now=JUST_BEFORE_LEASE_END)


def op_fail(run: str) -> Callable[[RunLedger, Entry], Any]:
    def run_op(ledger: RunLedger, entry: Entry) -> Any:
        after = ledger.fail(entry.id, run, error="late boom", now=JUST_BEFORE_LEASE_END)
        return after.status != entry.status or after.attempt != entry.attempt

    return run_op


def op_dispatch_failure(ledger: RunLedger, entry: Entry) -> Any:
    after = ledger.record_dispatch_failure(entry.id, error="launch refused", now=JUST_AFTER_DUE)
    return after.status == Status.DISPATCH_FAILED


def op_redispatch(ledger: RunLedger, entry: Entry) -> Any:
    return ledger.redispatch(entry.id, now=JUST_AFTER_DUE)


def op_reclaim(ledger: RunLedger, entry: Entry) -> Any:
    return [e.id for e in reclaim_expired(ledger, now=TWO_MINUTES_OVERDUE)] == [entry.id]


OPS: dict[str, Callable[[RunLedger, Entry], Any]] = {
    "claim_by_other": op_claim(OTHER),
    "claim_by_owner": op_claim(OWNER),
    "heartbeat_by_owner": op_heartbeat(OWNER),
    "heartbeat_by_other": op_heartbeat(OTHER),
    "succeed_by_owner": op_succeed(OWNER),
    "succeed_by_other": op_succeed(OTHER),
    "fail_by_owner": op_fail(OWNER),
    "fail_by_other": op_fail(OTHER),
    "dispatch_failure": op_dispatch_failure,
    "redispatch": op_redispatch,
    "reclaim_expired": op_reclaim,
}

# Operations that, when refused, must leave a late_job_rejections record.
RECORDS_REJECTION = {
    "claim_by_other",
    "claim_by_owner",
    "succeed_by_owner",
    "succeed_by_other",
    "fail_by_owner",
    "fail_by_other",
}

Q, RUN, RETRY, OK, FAIL, DF = (
    Status.QUEUED,
    Status.RUNNING,
    Status.RETRYING,
    Status.SUCCESS,
    Status.FAILED,
    Status.DISPATCH_FAILED,
)


@dataclass(frozen=True)
class Case:
    start: str
    op: str
    allowed: bool
    after: str


# (start, operation) -> allowed?, status after. Anything not allowed leaves the state alone.
TABLE = [
    # claim: queued|retrying -> running; re-entrant for the owner; everything else refused
    Case(Q, "claim_by_other", True, RUN),
    Case(RETRY, "claim_by_other", True, RUN),
    Case(RETRY, "claim_by_owner", True, RUN),  # a Dagster retry may reuse nothing but the entry
    Case(RUN, "claim_by_other", False, RUN),
    Case(RUN, "claim_by_owner", True, RUN),  # re-entrant: nothing changes
    Case(OK, "claim_by_other", False, OK),
    Case(OK, "claim_by_owner", False, OK),
    Case(FAIL, "claim_by_other", False, FAIL),
    Case(DF, "claim_by_other", False, DF),
    # heartbeat: only the owner of a running entry
    Case(RUN, "heartbeat_by_owner", True, RUN),
    Case(RUN, "heartbeat_by_other", False, RUN),
    *[Case(s, "heartbeat_by_owner", False, s) for s in (Q, RETRY, OK, FAIL, DF)],
    # succeed: only the owner of a running entry
    Case(RUN, "succeed_by_owner", True, OK),
    Case(RUN, "succeed_by_other", False, RUN),
    *[Case(s, "succeed_by_owner", False, s) for s in (Q, RETRY, OK, FAIL, DF)],
    # fail: only the owner of a running entry; attempts left -> retrying
    Case(RUN, "fail_by_owner", True, RETRY),
    Case(RUN, "fail_by_other", False, RUN),
    *[Case(s, "fail_by_owner", False, s) for s in (Q, RETRY, OK, FAIL, DF)],
    # launch failure: only before a run started
    Case(Q, "dispatch_failure", True, DF),
    Case(RETRY, "dispatch_failure", True, DF),
    Case(DF, "dispatch_failure", True, DF),
    *[Case(s, "dispatch_failure", False, s) for s in (RUN, OK, FAIL)],
    # re-dispatch: only dispatch_failed
    Case(DF, "redispatch", True, Q),
    *[Case(s, "redispatch", False, s) for s in (Q, RUN, RETRY, OK, FAIL)],
    # reclaim: only a running entry whose lease expired
    Case(RUN, "reclaim_expired", True, FAIL),
    *[Case(s, "reclaim_expired", False, s) for s in (Q, RETRY, OK, FAIL, DF)],
]


@pytest.mark.parametrize("case", TABLE, ids=[f"{c.start}-{c.op}" for c in TABLE])
def test_transition_table(ledger: RunLedger, case: Case) -> None:
    before = STARTS[case.start](ledger)
    result = OPS[case.op](ledger, before)
    after = fresh(ledger, before)

    assert bool(result) is case.allowed
    assert after.status == case.after
    rejections = after.summary["late_job_rejections"]
    if not case.allowed or (case.op == "claim_by_owner" and case.start == RUN):
        # Refused (or re-entrant): the state columns are exactly as before.
        assert state(after) == state(before)
    if not case.allowed and case.op in RECORDS_REJECTION:
        assert len(rejections) == len(before.summary["late_job_rejections"]) + 1
        assert rejections[-1]["status"] == before.status
    else:
        assert rejections == before.summary["late_job_rejections"]
    # Invariants that hold after every operation.
    assert (after.lease_owner is None) == (after.status != RUN)
    assert (after.lease_expires_at is None) == (after.status != RUN)
    assert after.attempt <= after.max_attempts


def test_claim_takes_the_lease_counts_the_attempt_and_appends_the_run(ledger: RunLedger) -> None:
    entry = new_entry(ledger)
    result = ledger.claim(entry.id, OWNER, lease_ttl=TTL, now=JUST_AFTER_DUE)
    assert result == ClaimResult(claimed=True, entry=result.entry, reason=None)
    claimed = result.entry
    assert claimed.status == RUN
    assert claimed.attempt == 1
    assert claimed.run_ids == (OWNER,)
    assert claimed.lease_owner == OWNER
    assert claimed.lease_expires_at == LEASE_END
    assert claimed.heartbeat_at == JUST_AFTER_DUE
    assert claimed.started_at == JUST_AFTER_DUE
    assert claimed == fresh(ledger, entry)


def test_refused_claim_explains_itself(ledger: RunLedger) -> None:
    entry = start_success(ledger)
    result = ledger.claim(entry.id, OTHER, lease_ttl=TTL, now=NEXT_DAY)
    assert not result.claimed
    assert result.reason == (
        f"entry {entry.id} order_cleanup@2026-11-30T22:45:00Z is already success: "
        "duplicate run, nothing done"
    )
    record = result.entry.summary["late_job_rejections"][-1]
    assert record == {
        "run_id": OTHER,
        "at": "2026-12-01T22:45:00.000000Z",
        "status": OK,
        "action": "claim",
        "reason": result.reason,
    }


def test_rejections_keep_the_newest_five(ledger: RunLedger) -> None:
    entry = start_success(ledger)
    for i in range(8):
        result = ledger.claim(
            entry.id, f"late-{i}", lease_ttl=TTL, now=NEXT_DAY + timedelta(seconds=i)
        )
        assert not result.claimed
    rejections = fresh(ledger, entry).summary["late_job_rejections"]
    assert [r["run_id"] for r in rejections] == [f"late-{i}" for i in range(3, 8)]
    assert state(fresh(ledger, entry)) == state(entry)


def test_reject_records_a_duplicate_run_and_changes_nothing(ledger: RunLedger) -> None:
    entry = start_running(ledger)
    after = ledger.reject(entry.id, OTHER, reason="second daemon launched it", now=NEXT_DAY)
    assert state(after) == state(entry)
    assert after.summary["late_job_rejections"][-1]["reason"] == "second daemon launched it"


def test_attempts_exhausted_after_max_attempts_failures(ledger: RunLedger) -> None:
    entry = new_entry(ledger, max_attempts=2)
    for attempt, expected in ((1, RETRY), (2, FAIL)):
        run = f"run-{attempt}"
        assert ledger.claim(entry.id, run, lease_ttl=TTL, now=JUST_AFTER_DUE).claimed
        after = ledger.fail(entry.id, run, error=f"boom {attempt}", now=JUST_AFTER_DUE)
        assert (after.status, after.attempt) == (expected, attempt)
    assert after == fresh(ledger, entry)
    assert after.failure_kind == FailureKind.ERROR
    assert after.error == "boom 2"
    assert after.finished_at == JUST_AFTER_DUE
    assert after.run_ids == ("run-1", "run-2")
    refused = ledger.claim(entry.id, "run-3", lease_ttl=TTL, now=NEXT_DAY)
    assert not refused.claimed and refused.entry.attempt == 2


def test_an_unsupported_task_fails_for_good_with_attempts_left(ledger: RunLedger) -> None:
    # A task whose plugin vanished must not wait in `retrying` for a retry
    # that can never run it.
    entry = new_entry(ledger, max_attempts=3)
    assert ledger.claim(entry.id, "run-1", lease_ttl=TTL, now=JUST_AFTER_DUE).claimed
    after = ledger.fail(
        entry.id, "run-1", error="gone", kind=FailureKind.UNSUPPORTED_TASK, now=JUST_AFTER_DUE
    )
    assert (after.status, after.attempt, after.failure_kind) == (
        FAIL,
        1,
        FailureKind.UNSUPPORTED_TASK,
    )
    assert after.finished_at == JUST_AFTER_DUE


def test_retrying_with_attempts_used_up_is_not_claimable(ledger: RunLedger) -> None:
    # Pins the guard in the claim UPDATE itself: even a row that says "retrying" (e.g. written
    # by an older version or by hand) must never be claimed past max_attempts.
    entry = start_retrying(ledger)
    with ledger._get_engine().begin() as conn:
        conn.execute(sa.update(entries).where(entries.c.id == entry.id).values(attempt=3))
    result = ledger.claim(entry.id, OTHER, lease_ttl=TTL, now=NEXT_DAY)
    assert not result.claimed
    assert result.entry.attempt == 3 and result.entry.status == RETRY
    assert result.reason is not None and "attempts are exhausted (3 of 3 used)" in result.reason


def test_success_is_never_overwritten_by_a_late_failure(ledger: RunLedger) -> None:
    entry = start_success(ledger)
    after = ledger.fail(entry.id, OWNER, error="late failure", kind="timeout", now=NEXT_DAY)
    assert state(after) == state(entry)
    assert after.status == OK and after.error is None
    assert (
        "late failure report from run run-a (timeout: late failure)"
        in (after.summary["late_job_rejections"][-1]["reason"])
    )


def test_terminal_states_never_change_whatever_is_called(ledger: RunLedger) -> None:
    for k, make in enumerate((start_success, start_failed)):
        entry = make(ledger, DUE + timedelta(minutes=15 * k))
        for op in OPS.values():
            op(ledger, entry)
        assert state(fresh(ledger, entry)) == state(entry)


def test_fail_truncates_long_errors_to_4000_characters(ledger: RunLedger) -> None:
    entry = start_running(ledger)
    after = ledger.fail(entry.id, OWNER, error="x" * 10_000, now=JUST_AFTER_DUE)
    assert after.error is not None
    assert len(after.error) == MAX_ERROR_CHARS
    assert after.error.endswith("[truncated: 10000 characters in total]")


# --- dispatch failures ------------------------------------------------------------------------


def test_dispatch_failures_keep_newest_five_and_redispatch_resets_attempt(
    ledger: RunLedger,
) -> None:
    entry = start_retrying(ledger)
    assert entry.attempt == 1
    for i in range(7):
        after = ledger.record_dispatch_failure(
            entry.id, error=f"launcher error {i}", run_id=f"lost-{i}", now=NEXT_DAY
        )
        assert after.status == DF and after.failure_kind == FailureKind.DISPATCH
    failures = after.summary["dispatch_failures"]
    assert [f["error"] for f in failures] == [f"launcher error {i}" for i in range(2, 7)]
    assert failures[-1] == {
        "at": "2026-12-01T22:45:00.000000Z",
        "error": "launcher error 6",
        "run_id": "lost-6",
    }
    assert after.attempt == 1  # a launch failure is not an attempt

    assert ledger.redispatch(entry.id, now=NEXT_DAY)
    queued = fresh(ledger, entry)
    assert (queued.status, queued.attempt) == (Q, 0)
    assert queued.summary["dispatch_failures"] == failures  # earlier errors kept
    assert not ledger.redispatch(entry.id, now=NEXT_DAY)  # compare-and-set: once

    claimed = ledger.claim(entry.id, "run-c", lease_ttl=TTL, now=NEXT_DAY)
    assert claimed.claimed and claimed.entry.attempt == 1
    assert claimed.entry.run_ids == (OWNER, "run-c")


def test_dispatch_failure_leaves_running_and_terminal_entries_alone(ledger: RunLedger) -> None:
    entry = start_running(ledger)
    after = ledger.record_dispatch_failure(entry.id, error="duplicate launch failed")
    assert state(after) == state(entry)
    assert after.summary["dispatch_failures"] == []


# --- leases and reclaim -----------------------------------------------------------------------


def test_reclaim_fails_expired_leases_and_says_how_long_overdue(ledger: RunLedger) -> None:
    entry = start_running(ledger)
    assert reclaim_expired(ledger, now=LEASE_END) == []  # expiry is not yet overdue
    [reclaimed] = reclaim_expired(ledger, now=TWO_MINUTES_OVERDUE)
    assert reclaimed.id == entry.id
    assert reclaimed.status == FAIL
    assert reclaimed.failure_kind == FailureKind.LEASE_RECLAIMED
    assert reclaimed.lease_owner is None and reclaimed.lease_expires_at is None
    assert reclaimed.attempt == 1
    assert reclaimed.error is not None
    assert "lease of run run-a expired at 2026-11-30T22:50:02.000000Z, 2m 00s overdue" in (
        reclaimed.error
    )
    assert "--acknowledge-side-effects" in reclaimed.error
    assert reclaimed == fresh(ledger, entry)
    assert reclaim_expired(ledger, now=TWO_MINUTES_OVERDUE) == []


def test_reclaim_dry_run_changes_nothing(ledger: RunLedger) -> None:
    entry = start_running(ledger)
    candidates = reclaim_expired(ledger, now=TWO_MINUTES_OVERDUE, dry_run=True)
    assert [c.id for c in candidates] == [entry.id]
    assert fresh(ledger, entry) == entry


def test_heartbeat_keeps_the_lease_from_being_reclaimed(ledger: RunLedger) -> None:
    entry = start_running(ledger)
    assert ledger.heartbeat(entry.id, OWNER, lease_ttl=TTL, now=JUST_BEFORE_LEASE_END)
    after = fresh(ledger, entry)
    assert after.lease_expires_at == JUST_BEFORE_LEASE_END + TTL
    assert after.heartbeat_at == JUST_BEFORE_LEASE_END
    assert reclaim_expired(ledger, now=TWO_MINUTES_OVERDUE) == []


def test_late_completion_after_reclaim_is_rejected(ledger: RunLedger) -> None:
    entry = start_running(ledger)
    [reclaimed] = reclaim_expired(ledger, now=TWO_MINUTES_OVERDUE)
    assert not ledger.heartbeat(entry.id, OWNER, lease_ttl=TTL, now=NEXT_DAY)
    assert not ledger.succeed(entry.id, OWNER, now=NEXT_DAY)
    after = fresh(ledger, entry)
    assert state(after) == state(reclaimed)
    record = after.summary["late_job_rejections"][-1]
    assert record["action"] == "succeed" and record["status"] == FAIL
    assert record["reason"].startswith("late completion from run run-a:")
    assert "failed (lease_reclaimed)" in record["reason"]


def test_reclaim_respects_its_limit(ledger: RunLedger) -> None:
    made = []
    for k in range(3):
        entry = new_entry(ledger, due=DUE + timedelta(minutes=15 * k))
        ledger.claim(entry.id, f"run-{k}", lease_ttl=TTL, now=JUST_AFTER_DUE)
        made.append(entry.id)
    assert len(reclaim_expired(ledger, now=NEXT_DAY, limit=2)) == 2
    assert len(reclaim_expired(ledger, now=NEXT_DAY, limit=2)) == 1


# --- Dagster ended a run it will not retry (outcome reconciliation) ---------------------------


def test_settling_an_unretried_run_fails_its_entry_even_with_attempts_left(
    ledger: RunLedger,
) -> None:
    entry = start_running(ledger)
    after = ledger.settle_unretried_run(
        entry.id, OWNER, error="worker killed", kind="timeout", now=NEXT_DAY
    )
    assert after is not None and after == fresh(ledger, entry)
    assert (after.status, after.attempt, after.failure_kind) == (FAIL, 1, "timeout")
    assert after.lease_owner is None and after.finished_at == NEXT_DAY


def test_settling_a_retrying_entry_keeps_the_runs_own_error(ledger: RunLedger) -> None:
    entry = start_retrying(ledger)
    assert ledger.settle_unretried_run(entry.id, OTHER, error="x", now=NEXT_DAY) is None
    after = ledger.settle_unretried_run(entry.id, OWNER, error="no retry", now=NEXT_DAY)
    assert after is not None
    assert (after.status, after.error, after.failure_kind) == (FAIL, "boom", "error")


def test_settling_leaves_terminal_and_foreign_entries_alone(ledger: RunLedger) -> None:
    for k, make in enumerate((start_success, start_failed, start_queued)):
        entry = make(ledger, DUE + timedelta(minutes=15 * k))
        assert ledger.settle_unretried_run(entry.id, OWNER, error="x", now=NEXT_DAY) is None
        assert state(fresh(ledger, entry)) == state(entry)
    running = start_running(ledger, DUE + timedelta(hours=3))
    assert ledger.settle_unretried_run(running.id, OTHER, error="x", now=NEXT_DAY) is None


def test_summary_counts_count_each_state_once(ledger: RunLedger) -> None:
    made = {
        status: make(ledger, DUE + timedelta(minutes=15 * k))
        for k, (status, make) in enumerate(STARTS.items())
    }
    stale = start_running(ledger, DUE + timedelta(hours=5))
    ledger.heartbeat(made[RUN].id, OWNER, lease_ttl=timedelta(days=2), now=JUST_BEFORE_LEASE_END)
    counts = ledger.summary_counts(now=TWO_MINUTES_OVERDUE)
    assert counts["active"] == 1 and counts["stale"] == 1
    assert counts["queued"] == 1 and counts["retrying"] == 1
    assert counts["success_window"] == 1 and counts["failed_window"] == 1
    assert counts["dispatch_failed_window"] == 1
    assert reclaim_expired(ledger, now=TWO_MINUTES_OVERDUE)[0].id == stale.id
    later = ledger.summary_counts(now=TWO_MINUTES_OVERDUE)
    assert (later["stale"], later["lease_reclaimed_window"]) == (0, 1)


# --- as a Dagster resource -------------------------------------------------------------------


def test_works_as_a_dagster_resource_without_io_at_definition(ledger_url: str) -> None:
    import dagster as dg

    RunLedger(database_url=ledger_url).migrate()

    @dg.asset
    def claims_its_entry(ledger: RunLedger) -> int:
        entry = ledger.ensure_entry(
            task_key=TASK, trigger=Trigger.MANUAL, dedup_key="manual:from-an-asset"
        )
        assert ledger.claim(entry.id, "dagster-run", lease_ttl=TTL).claimed
        assert ledger.succeed(entry.id, "dagster-run")
        return entry.id

    # Defining with an unreachable URL must not touch the network.
    dg.Definitions(
        assets=[claims_its_entry],
        resources={"ledger": RunLedger(database_url="postgresql+psycopg2://u@127.0.0.1:1/x")},
    )
    result = dg.materialize(
        [claims_its_entry], resources={"ledger": RunLedger(database_url=ledger_url)}
    )
    assert result.success
    entry_id = result.output_for_node("claims_its_entry")
    done = RunLedger(database_url=ledger_url).get(entry_id)
    assert done is not None and done.status == OK


# --- creating entries ------------------------------------------------------------------------


def test_ensure_entry_is_insert_or_ignore(ledger: RunLedger) -> None:
    first = new_entry(ledger)
    again = ledger.ensure_entry(
        task_key=TASK,
        trigger=Trigger.SENSOR,
        dedup_key=dedup_key_for_due(DUE),
        max_attempts=9,
        now=NEXT_DAY,
    )
    assert again == first
    assert ledger.find(TASK, dedup_key_for_due(DUE)) == first


def test_manual_and_scheduled_keys_never_collide(ledger: RunLedger) -> None:
    scheduled = new_entry(ledger)
    manual = ledger.ensure_entry(
        task_key=TASK,
        trigger=Trigger.MANUAL,
        dedup_key=dedup_key_for_request("2026-11-30T22:45:00Z"),
        operator="alice",
        reason="customer asked",
        now=DUE,
    )
    assert manual.id != scheduled.id
    assert (manual.origin, manual.due, manual.operator) == ("manual", None, "alice")
    other_task = ledger.ensure_entry(
        task_key="other_task", trigger=Trigger.SCHEDULE, dedup_key=dedup_key_for_due(DUE)
    )
    assert other_task.id not in (manual.id, scheduled.id)


def test_due_key_carries_the_due(ledger: RunLedger) -> None:
    entry = ledger.ensure_entry(
        task_key=TASK, trigger=Trigger.SCHEDULE, dedup_key="due:2026-11-30T22:45:00Z"
    )
    assert entry.due == DUE
    assert entry.to_json()["due"] == "2026-11-30T22:45:00Z"
    with pytest.raises(ValueError, match="does not match dedup_key"):
        ledger.ensure_entry(
            task_key=TASK,
            trigger=Trigger.SCHEDULE,
            dedup_key="due:2026-11-30T22:45:00Z",
            due=DUE + timedelta(minutes=15),
        )


def test_entry_json_has_the_contract_shape(ledger: RunLedger) -> None:
    entry = start_running(ledger)
    data = entry.to_json()
    assert set(ENTRY_KEYS) <= set(data)
    assert data["due"] == "2026-11-30T22:45:00Z"
    assert data["lease_expires_at"] == "2026-11-30T22:50:02.000000Z"
    assert data["created_at"].endswith("Z") and data["updated_at"].endswith("Z")
    assert data["run_ids"] == [OWNER]
    assert set(data["summary"]) == {"late_job_rejections", "dispatch_failures", "hooks"}
    json.dumps(data)  # serialisable as is


def test_ids_are_never_reused_and_parent_must_exist(ledger: RunLedger) -> None:
    parent = start_failed(ledger)
    child = ledger.ensure_entry(
        task_key=TASK,
        trigger=Trigger.MANUAL_RETRY,
        dedup_key=dedup_key_for_retry(parent.id),
        parent_id=parent.id,
        operator="alice",
        reason="fixed the upstream file",
    )
    assert child.parent_id == parent.id and child.origin == "retry"
    assert ledger.children(parent.id) == [child]
    with pytest.raises(ValueError, match="parent_id 999999 is not an existing ledger entry"):
        ledger.ensure_entry(
            task_key=TASK,
            trigger=Trigger.MANUAL_RETRY,
            dedup_key=dedup_key_for_retry(999_999),
            parent_id=999_999,
        )


# --- manual retry support: transaction, stamp, audit ----------------------------------------


def manual_retry(
    ledger: RunLedger, parent: Entry, operator: str, *, explode: bool = False
) -> int | None:
    """What the lead's manual retry does, in one transaction."""
    with ledger.transaction() as conn:
        locked = ledger.get(parent.id, connection=conn, for_update=True)
        assert locked is not None
        stamped = ledger.mark_manual_retry(
            parent.id, operator=operator, now=NEXT_DAY, connection=conn
        )
        if not stamped:
            ledger.write_audit(
                operator=operator,
                action="manual_retry",
                entry_id=parent.id,
                reason="again",
                outcome="refused: already retried",
                now=NEXT_DAY,
                connection=conn,
            )
            return None
        child = ledger.ensure_entry(
            task_key=parent.task_key,
            trigger=Trigger.MANUAL_RETRY,
            dedup_key=dedup_key_for_retry(parent.id),
            parent_id=parent.id,
            operator=operator,
            reason="upstream fixed",
            now=NEXT_DAY,
            connection=conn,
        )
        ledger.write_audit(
            operator=operator,
            action="manual_retry",
            entry_id=parent.id,
            child_entry_id=child.id,
            reason="upstream fixed",
            checks={"parent_failed": True, "task_registered": True},
            outcome="created",
            now=NEXT_DAY,
            connection=conn,
        )
        if explode:
            raise RuntimeError("crash before commit")
        return child.id


def test_manual_retry_writes_stamp_child_and_audit_together_once(ledger: RunLedger) -> None:
    parent = start_failed(ledger)
    child_id = manual_retry(ledger, parent, "alice")
    assert child_id is not None
    assert manual_retry(ledger, parent, "bob") is None  # at most once

    after = fresh(ledger, parent)
    assert (after.manual_retry_by, after.manual_retry_at) == ("alice", NEXT_DAY)
    assert after.error == parent.error and after.status == FAIL  # the parent keeps its error
    audit = ledger.audit_for(parent.id)
    assert [a["outcome"] for a in audit] == ["created", "refused: already retried"]
    assert audit[0]["child_entry_id"] == child_id
    assert audit[0]["checks"] == {"parent_failed": True, "task_registered": True}
    assert audit[0]["at"] == "2026-12-01T22:45:00.000000Z"
    assert ledger.audit_for(child_id) == [audit[0]]


def test_a_crash_inside_the_transaction_leaves_nothing_half_written(ledger: RunLedger) -> None:
    parent = start_failed(ledger)
    with pytest.raises(RuntimeError, match="crash before commit"):
        manual_retry(ledger, parent, "alice", explode=True)
    assert fresh(ledger, parent).manual_retry_at is None
    assert ledger.children(parent.id) == []
    assert ledger.audit_for(parent.id) == []
    assert manual_retry(ledger, parent, "alice") is not None


def test_hook_results_keep_the_newest_twenty(ledger: RunLedger) -> None:
    entry = start_success(ledger)
    for i in range(25):
        ledger.record_hook_result(entry.id, {"hook": "notify", "n": i})
    hooks = fresh(ledger, entry).summary["hooks"]
    assert [h["n"] for h in hooks] == list(range(5, 25))
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        ledger.record_hook_result(entry.id, {"at": object()})


def test_list_entries_pages_newest_first(ledger: RunLedger) -> None:
    made = [new_entry(ledger, due=DUE + timedelta(minutes=15 * k)) for k in range(5)]
    seen: list[int] = []
    cursor = None
    while True:
        page, cursor = ledger.list_entries(limit=2, cursor=cursor)
        seen += [e.id for e in page]
        if cursor is None:
            break
    assert seen == [e.id for e in reversed(made)]
    queued, _ = ledger.list_entries(statuses=[Q], task_key=TASK, trigger="schedule")
    assert len(queued) == 5
    with pytest.raises(ValueError, match="unknown status 'lost'"):
        ledger.list_entries(statuses=["lost"])


# --- bad input and unusable databases ----------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda lg, e: lg.claim(e.id, OWNER, lease_ttl=timedelta(0)), "lease_ttl"),
        (lambda lg, e: lg.claim(e.id, OWNER, lease_ttl=TTL, now=datetime(2026, 1, 1)), "naive"),
        (lambda lg, e: lg.claim(e.id, "", lease_ttl=TTL), "run_id"),
        (lambda lg, e: lg.fail(e.id, OWNER, error="x", kind="oops"), "'oops'"),
        (lambda lg, e: lg.fail(e.id, OWNER, error="x", kind="lease_reclaimed"), "reclaim"),
        (lambda lg, e: lg.heartbeat(e.id, OWNER, lease_ttl=-TTL), "lease_ttl"),
        (
            lambda lg, e: lg.ensure_entry(task_key=TASK, trigger="cron", dedup_key="manual:x"),
            "'cron'",
        ),
        (
            lambda lg, e: lg.ensure_entry(task_key=TASK, trigger="manual", dedup_key="now:x"),
            "'now:x'",
        ),
        (
            lambda lg, e: lg.ensure_entry(
                task_key=TASK, trigger="manual", dedup_key="manual:x", max_attempts=0
            ),
            "max_attempts",
        ),
        (lambda lg, e: lg.claim(10**9, OWNER, lease_ttl=TTL), "does not exist"),
    ],
)
def test_bad_input_is_a_value_error_naming_the_value(
    ledger: RunLedger, call: Callable[[RunLedger, Entry], Any], message: str
) -> None:
    entry = start_running(ledger)
    with pytest.raises(ValueError, match=message):
        call(ledger, entry)
    assert state(fresh(ledger, entry)) == state(entry)


def test_unknown_entry_is_none_for_reads_and_an_error_for_writes(ledger: RunLedger) -> None:
    assert ledger.get(123456) is None
    assert ledger.find(TASK, "manual:nope") is None
    with pytest.raises(UnknownEntryError):
        ledger.reject(123456, OWNER, reason="x")


def test_unreachable_postgres_is_a_ledger_error_with_the_fix() -> None:
    url = "postgresql+psycopg2://dueledger:s3cret@127.0.0.1:1/ledger"
    with pytest.raises(LedgerError) as info:
        RunLedger(database_url=url).get(1)
    message = str(info.value)
    assert "postgresql+psycopg2://dueledger:***@127.0.0.1:1/ledger" in message
    assert "s3cret" not in message
    assert "DUELEDGER_DATABASE_URL" in message


def test_a_sqlite_ledger_under_a_regular_file_is_a_ledger_error_with_the_fix(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file, not a folder")
    url = f"sqlite:///{blocker / 'ledger.sqlite'}"
    with pytest.raises(LedgerError) as info:
        RunLedger(database_url=url).migrate()
    message = str(info.value)
    assert url in message and "DUELEDGER_DATABASE_URL" in message
    assert blocker.read_text() == "a file, not a folder"


def test_a_dropped_connection_is_a_ledger_error_then_the_ledger_recovers(
    postgres_url: str,
) -> None:
    # Pins the pooled-connection handling of the hot path: a server-side disconnect must
    # surface as LedgerError (not a raw driver error) and must not poison the pool.
    ledger = RunLedger(database_url=postgres_url)
    ledger.migrate()
    entry = start_running(ledger)
    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(
            sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
    admin.dispose()
    with pytest.raises(LedgerError, match="cannot use the ledger database"):
        ledger.heartbeat(entry.id, OWNER, lease_ttl=TTL, now=JUST_BEFORE_LEASE_END)
    assert ledger.heartbeat(entry.id, OWNER, lease_ttl=TTL, now=JUST_BEFORE_LEASE_END)
    assert fresh(ledger, entry).heartbeat_at == JUST_BEFORE_LEASE_END
    ledger.dispose()


def test_unmigrated_database_says_to_migrate(sqlite_url: str) -> None:
    with pytest.raises(LedgerError, match=r"never migrated.*migrate\(\) first"):
        RunLedger(database_url=sqlite_url).get(1)


def test_unsupported_backend_is_refused() -> None:
    with pytest.raises(LedgerError, match="sqlite and postgresql only"):
        RunLedger(database_url="mysql://u:p@localhost/x").get(1)


def test_default_url_comes_from_the_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    ledger = RunLedger()
    assert ledger.url == f"sqlite:///{tmp_path / 'home' / 'dueledger_ledger.sqlite'}"
    ledger.migrate()  # creates the missing DAGSTER_HOME directory
    assert ledger.get(1) is None
    ledger.dispose()


# --- keys -------------------------------------------------------------------------------------


def test_dedup_keys_follow_the_contract() -> None:
    assert dedup_key_for_due(DUE) == "due:2026-11-30T22:45:00Z"
    assert dedup_key_for_request("req-1") == "manual:req-1"
    assert dedup_key_for_retry(42) == "retry:42"
    assert dedup_key_for_backfill("bf1", "2026-11-30") == "backfill:bf1:2026-11-30"
    assert [origin_of(k) for k in ("due:x", "manual:x", "retry:1", "backfill:b:p")] == [
        "due",
        "manual",
        "retry",
        "backfill",
    ]
    assert format_due(datetime(2026, 12, 1, 0, 45, tzinfo=UTC)) == "2026-12-01T00:45:00Z"
    with pytest.raises(ValueError, match="never the current time"):
        dedup_key_for_due(DUE + timedelta(seconds=7))
    with pytest.raises(ValueError, match="naive"):
        dedup_key_for_due(datetime(2026, 11, 30, 22, 45))


# --- migrations ------------------------------------------------------------------------------


HEAD = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()


def alembic_config(conn: sa.Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = conn
    return config


def test_upgrading_twice_is_a_no_op(ledger: RunLedger) -> None:
    engine = ledger._get_engine()
    before = sa.inspect(engine).get_table_names()
    entry = new_entry(ledger)
    ledger.migrate()
    assert sa.inspect(engine).get_table_names() == before
    with engine.connect() as conn:
        versions = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    assert versions == [(HEAD,)]
    assert fresh(ledger, entry) == entry


def test_a_schema_from_a_newer_version_is_left_alone(ledger: RunLedger) -> None:
    # A rolling upgrade: a newer release migrated further, and migrations only add,
    # so this code goes on using it (tests/resources/test_ledger_rolling_upgrade.py).
    with ledger._get_engine().begin() as conn:
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '9999_future'"))
    ledger.migrate()
    with ledger._get_engine().connect() as conn:
        versions = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    assert versions == [("9999_future",)]


def test_an_unknown_older_schema_is_a_ledger_error(ledger: RunLedger) -> None:
    with ledger._get_engine().begin() as conn:
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '0000_unknown'"))
    with pytest.raises(LedgerError, match=f"knows revisions up to '{HEAD}'"):
        ledger.migrate()


def test_migrations_produce_exactly_the_schema_the_code_uses(ledger: RunLedger) -> None:
    with ledger._get_engine().connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE, "compare_type": True}
        )
        diff = compare_metadata(context, metadata)
    assert diff == []


def test_unique_constraint_exists(ledger: RunLedger) -> None:
    inspector = sa.inspect(ledger._get_engine())
    uniques = {tuple(u["column_names"]) for u in inspector.get_unique_constraints(ENTRIES_TABLE)}
    assert ("task_key", "origin", "dedup_key") in uniques
    with ledger._get_engine().connect() as conn, pytest.raises(sa.exc.IntegrityError):
        row: dict[str, Any] = {c.name: None for c in entries.c if c.name != "id"}
        row.update(
            task_key=TASK,
            trigger="manual",
            origin="manual",
            dedup_key="manual:dup",
            status=Q,
            attempt=0,
            max_attempts=1,
            run_ids=[],
            summary={},
            created_at=DUE.replace(tzinfo=None),
            updated_at=DUE.replace(tzinfo=None),
        )
        conn.execute(sa.insert(entries), [row, row])


def test_downgrade_refuses_and_keeps_the_data(ledger: RunLedger) -> None:
    entry = new_entry(ledger)
    # In one transaction, as migrate() runs upgrades: whatever a later revision's downgrade
    # undid before the initial one refused is rolled back with it.
    with pytest.raises(RuntimeError, match="refusing to downgrade"), ledger.transaction() as conn:
        command.downgrade(alembic_config(conn), "base")
    assert fresh(ledger, entry) == entry
    test_migrations_produce_exactly_the_schema_the_code_uses(ledger)
