"""Property tests: random interleavings of ledger operations by several runs, injected clock.

Each example drives one fresh entry through a random sequence of claims, heartbeats,
completions, failures, settlements of unretried runs, launch failures, re-dispatches,
reclaims and clock ticks by three fake run ids, and checks after every step

- the ledger's invariants: a terminal state never changes; the attempt never decreases
  (except the documented reset by re-dispatch) and never exceeds max_attempts; run ids are
  only appended; only a running entry has a lease, held by its latest run; summaries stay
  bounded;
- that every answer and resulting state equals a small reference model of the rules,
  so no interleaving reaches a state the rules do not allow;
- and that the core's pure rules (resources/core/rules.py), asked about the entry as it was
  before the step, predict the store's answer and every column it wrote: the rules the
  docs point to are the rules the SQL enforces.

Examples share one migrated database (a fresh entry each), which keeps them fast.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestration.reclaim import decide_reclaim, reclaim_expired
from resources.core.entry import (
    MAX_DISPATCH_FAILURES,
    MAX_LATE_JOB_REJECTIONS,
    RUN_FAILURE_KINDS,
    Entry,
    FailureKind,
    Status,
    Trigger,
    dedup_key_for_request,
)
from resources.ledger import RunLedger, rules

START = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
TTL = timedelta(minutes=5)
RUNS = ("run-a", "run-b", "run-c")
_examples = itertools.count()

runs = st.sampled_from(RUNS)
operations = st.one_of(
    st.tuples(st.just("claim"), runs),
    st.tuples(st.just("heartbeat"), runs),
    st.tuples(st.just("succeed"), runs),
    # The last item: will a retry come (Dagster will relaunch the run)? Without one the
    # attempt is final whatever attempts are left.
    st.tuples(st.just("fail"), runs, st.sampled_from(RUN_FAILURE_KINDS), st.booleans()),
    st.tuples(st.just("reject"), runs),
    st.tuples(st.just("settle"), runs, st.sampled_from(RUN_FAILURE_KINDS)),
    st.tuples(st.just("reclaim")),
    st.tuples(st.just("reclaim_dry_run")),
    st.tuples(st.just("dispatch_failure")),
    st.tuples(st.just("redispatch")),
    st.tuples(st.just("tick"), st.integers(min_value=0, max_value=400)),
)
scenarios = {
    "max_attempts": st.integers(min_value=1, max_value=3),
    "ops": st.lists(operations, min_size=4, max_size=40),
}


@dataclass
class Model:
    """The ledger rules for one entry, as plainly as they can be written."""

    max_attempts: int
    status: str = Status.QUEUED
    attempt: int = 0
    owner: str | None = None
    expires: datetime | None = None
    last_run: str | None = None

    def owns(self, run: str) -> bool:
        return self.status == Status.RUNNING and self.owner == run

    def apply(self, op: tuple[Any, ...], now: datetime) -> Any:
        name = op[0]
        if name == "claim":
            if self.owns(op[1]):
                return True
            claimable = self.status in (Status.QUEUED, Status.RETRYING)
            if not claimable or self.attempt >= self.max_attempts:
                return False
            self.status, self.owner, self.expires = Status.RUNNING, op[1], now + TTL
            self.attempt += 1
            self.last_run = op[1]
            return True
        if name == "heartbeat":
            if self.owns(op[1]):
                self.expires = now + TTL
                return True
            return False
        if name in ("succeed", "fail"):
            if not self.owns(op[1]):
                return False
            if name == "succeed":
                self.status = Status.SUCCESS
            elif (
                self.attempt < self.max_attempts and op[2] != FailureKind.UNSUPPORTED_TASK and op[3]
            ):
                # An unsupported task is failed for good, whatever attempts are left; so is
                # an attempt that no retry will follow.
                self.status = Status.RETRYING
            else:
                self.status = Status.FAILED
            self.owner = self.expires = None
            return True
        if name == "settle":  # Dagster ended the run and will not retry it
            waiting = self.status == Status.RETRYING and self.last_run == op[1]
            if self.owns(op[1]) or waiting:
                self.status, self.owner, self.expires = Status.FAILED, None, None
                return True
            return False
        if name in ("reclaim", "reclaim_dry_run"):
            expired = self.status == Status.RUNNING and self.expires is not None
            expired = expired and self.expires < now  # type: ignore[operator]
            if expired and name == "reclaim":
                self.status, self.owner, self.expires = Status.FAILED, None, None
            return expired
        if name == "dispatch_failure":
            if self.status in (
                Status.QUEUED,
                Status.RETRYING,
                Status.DISPATCH_FAILED,
            ):
                self.status = Status.DISPATCH_FAILED
                return True
            return False
        if name == "redispatch":
            if self.status == Status.DISPATCH_FAILED:
                self.status, self.attempt = Status.QUEUED, 0
                return True
            return False
        return None  # reject, tick: no state change


def perform(ledger: RunLedger, entry: Entry, op: tuple[Any, ...], now: datetime) -> Any:
    """Run ``op`` against the real ledger; answer in the model's terms."""
    name = op[0]
    if name == "claim":
        return ledger.claim(entry.id, op[1], lease_ttl=TTL, now=now).claimed
    if name == "heartbeat":
        return ledger.heartbeat(entry.id, op[1], lease_ttl=TTL, now=now)
    if name == "succeed":
        return ledger.succeed(entry.id, op[1], now=now)
    if name == "fail":
        before = ledger.get(entry.id)
        after = ledger.fail(
            entry.id, op[1], error=f"{op[2]} at {now}", kind=op[2], now=now, retry_coming=op[3]
        )
        assert before is not None
        # Accepted exactly when it ended a running attempt (a refusal changes no status).
        return before.status == Status.RUNNING and after.status != Status.RUNNING
    if name == "settle":
        settled = ledger.settle_unretried_run(
            entry.id, op[1], error=f"{op[2]} at {now}", kind=op[2], now=now
        )
        return settled is not None
    if name == "reject":
        ledger.reject(entry.id, op[1], reason="duplicate launch", now=now)
        return None
    if name in ("reclaim", "reclaim_dry_run"):
        found = reclaim_expired(ledger, now=now, dry_run=name == "reclaim_dry_run")
        return entry.id in {e.id for e in found}
    if name == "dispatch_failure":
        after = ledger.record_dispatch_failure(entry.id, error="launcher down", now=now)
        return after.status == Status.DISPATCH_FAILED
    if name == "redispatch":
        return ledger.redispatch(entry.id, now=now)
    return None


def decide(before: Entry, op: tuple[Any, ...], now: datetime) -> rules.Decision | None:
    """The pure rule's decision for ``op`` on ``before`` (None: no rule, e.g. reject)."""
    name = op[0]
    if name == "claim":
        return rules.claim(before, op[1], now=now, lease_ttl=TTL)
    if name == "heartbeat":
        return rules.heartbeat(before, op[1], now=now, lease_ttl=TTL)
    if name == "succeed":
        return rules.succeed(before, op[1], now=now)
    if name == "fail":
        return rules.fail(
            before, op[1], kind=op[2], error=f"{op[2]} at {now}", now=now, retry_coming=op[3]
        )
    if name == "settle":
        return rules.settle_unretried(before, op[1], kind=op[2], error=f"{op[2]} at {now}", now=now)
    if name in ("reclaim", "reclaim_dry_run"):
        return decide_reclaim(before, now=now)
    if name == "dispatch_failure":
        return rules.dispatch_failure(before, error="launcher down", now=now)
    if name == "redispatch":
        return rules.redispatch(before, now=now)
    return None


def check_rule_agrees(
    op: tuple[Any, ...], before: Entry, after: Entry, answer: Any, now: datetime
) -> None:
    decision = decide(before, op, now)
    if decision is None:
        return
    assert decision.allowed == answer, (op, before.status, decision.refusal)
    if not decision.allowed or op[0] == "reclaim_dry_run":
        return
    written = {name: getattr(after, name) for name in decision.changes}
    expected = {k: tuple(v) if isinstance(v, tuple) else v for k, v in decision.changes.items()}
    assert written == expected, op


def terminal_state(entry: Entry) -> tuple[Any, ...]:
    return (
        entry.status,
        entry.attempt,
        entry.run_ids,
        entry.failure_kind,
        entry.error,
        entry.finished_at,
        entry.lease_owner,
        entry.lease_expires_at,
    )


def check_invariants(before: Entry, after: Entry) -> None:
    if before.is_terminal:
        assert terminal_state(after) == terminal_state(before), "terminal state changed"
    if before.status == Status.DISPATCH_FAILED and after.status == Status.QUEUED:
        assert after.attempt == 0  # re-dispatch: the one documented reset
    else:
        assert after.attempt >= before.attempt, "attempt decreased"
    assert 0 <= after.attempt <= after.max_attempts
    assert after.run_ids[: len(before.run_ids)] == before.run_ids, "run ids rewritten"
    if after.status == Status.RUNNING:
        assert after.lease_owner == after.run_ids[-1]
        assert after.lease_expires_at is not None
    else:
        assert after.lease_owner is None and after.lease_expires_at is None, "stale lease"
    assert len(after.summary["late_job_rejections"]) <= MAX_LATE_JOB_REJECTIONS
    assert len(after.summary["dispatch_failures"]) <= MAX_DISPATCH_FAILURES


def run_scenario(ledger: RunLedger, max_attempts: int, ops: list[tuple[Any, ...]]) -> None:
    entry = ledger.ensure_entry(
        task_key="prop_task",
        trigger=Trigger.MANUAL,
        dedup_key=dedup_key_for_request(f"example-{next(_examples)}"),
        max_attempts=max_attempts,
        now=START,
    )
    model = Model(max_attempts=max_attempts)
    now = START
    before = entry
    for op in ops:
        if op[0] == "tick":
            now += timedelta(seconds=op[1])
            continue
        answer = perform(ledger, entry, op, now)
        expected = model.apply(op, now)
        after = ledger.get(entry.id)
        assert after is not None
        assert answer == expected, (op, before.status, after.status)
        check_rule_agrees(op, before, after, answer, now)
        assert (after.status, after.attempt, after.lease_owner, after.lease_expires_at) == (
            model.status,
            model.attempt,
            model.owner,
            model.expires,
        ), op
        check_invariants(before, after)
        before = after


PROPERTY_SETTINGS = {
    "deadline": None,
    # One database for all examples (a fresh entry per example), on purpose.
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}


@pytest.fixture
def sqlite_ledger(sqlite_url: str) -> Iterator[RunLedger]:
    yield from _migrated(sqlite_url)


@pytest.fixture
def postgres_ledger(postgres_url: str) -> Iterator[RunLedger]:
    yield from _migrated(postgres_url)


def _migrated(url: str) -> Iterator[RunLedger]:
    ledger = RunLedger(database_url=url)
    ledger.migrate()
    yield ledger
    ledger.dispose()


@settings(max_examples=300, **PROPERTY_SETTINGS)  # type: ignore[arg-type]
@given(**scenarios)
def test_random_interleavings_keep_the_rules_sqlite(
    sqlite_ledger: RunLedger, max_attempts: int, ops: list[tuple[Any, ...]]
) -> None:
    run_scenario(sqlite_ledger, max_attempts, ops)


@settings(max_examples=60, **PROPERTY_SETTINGS)  # type: ignore[arg-type]
@given(**scenarios)
def test_random_interleavings_keep_the_rules_postgres(
    postgres_ledger: RunLedger, max_attempts: int, ops: list[tuple[Any, ...]]
) -> None:
    run_scenario(postgres_ledger, max_attempts, ops)
