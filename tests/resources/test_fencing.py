"""Fencing tokens: a claim hands the run a fence, and a side effect commits
only while the run still holds its entry -- same owner, same claim generation, ``running``.

Real SQLite and real PostgreSQL (``ledger_url``). Two layouts of the source data:
- in the ledger's own database (the production layout on PostgreSQL; one SQLite file): the
  check is a statement of the effect's transaction, so a reclaim cannot slip in between;
- in another database (the local default: two SQLite files): the ledger is asked right
  before the commit.
A real zombie worker (SIGSTOP past its lease, reclaimed, SIGCONT) is in
tests/sensors/test_fencing_worker.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from orchestration.reclaim import reclaim_expired
from resources.core.entry import FailureKind, Trigger, dedup_key_for_due
from resources.core.fence import Fence, FenceLost
from resources.effects import effect_transaction, verify_fence
from resources.ledger import RunLedger, rules
from resources.ledger.guard import LedgerGuard, database_identity

DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
CLAIMED_AT = DUE + timedelta(seconds=2)
TTL = timedelta(minutes=5)
AFTER_THE_LEASE = CLAIMED_AT + TTL + timedelta(minutes=1)
OWNER = "run-a"

effects_log = sa.Table(
    "fence_test_effects",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("what", sa.String(50), nullable=False),
)


@pytest.fixture(params=["same_database", "other_database"])
def source(
    request: pytest.FixtureRequest, ledger: RunLedger, tmp_path: Path
) -> Iterator[sa.Engine]:
    """Where the side effects are written: the ledger's database, or a SQLite file of its own."""
    url = ledger.url if request.param == "same_database" else f"sqlite:///{tmp_path / 'src.db'}"
    engine = sa.create_engine(url)
    effects_log.create(engine, checkfirst=True)
    yield engine
    engine.dispose()


def claimed(ledger: RunLedger, run_id: str = OWNER) -> Fence:
    entry = ledger.ensure_entry(
        task_key="order_cleanup",
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(DUE),
        now=DUE,
    )
    result = ledger.claim(entry.id, run_id, lease_ttl=TTL, now=CLAIMED_AT)
    assert result.claimed and result.fence is not None
    return result.fence


def written(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return [row.what for row in conn.execute(sa.select(effects_log.c.what))]


def write_effect(engine: sa.Engine, guard: LedgerGuard, what: str) -> None:
    with effect_transaction(engine, guard, what) as conn:
        conn.execute(sa.insert(effects_log).values(what=what))


# --- the token ------------------------------------------------------------------------------


def test_every_claim_gets_a_new_token_and_a_reentrant_claim_keeps_it(ledger: RunLedger) -> None:
    first = claimed(ledger)
    assert first.token == 1
    again = ledger.claim(first.entry_id, OWNER, lease_ttl=TTL, now=CLAIMED_AT)
    assert again.fence == first  # the owner claiming again holds the same claim
    ledger.fail(first.entry_id, OWNER, error="boom", now=CLAIMED_AT)  # -> retrying
    second = ledger.claim(first.entry_id, "run-b", lease_ttl=TTL, now=CLAIMED_AT)
    assert second.fence == Fence(first.entry_id, "run-b", 2)
    assert ledger.claim(first.entry_id, "run-c", lease_ttl=TTL, now=CLAIMED_AT).fence is None


def test_the_claim_rule_and_the_store_agree_on_the_token(ledger: RunLedger) -> None:
    entry = ledger.ensure_entry(
        task_key="order_cleanup", trigger=Trigger.SCHEDULE, dedup_key=dedup_key_for_due(DUE)
    )
    decision = rules.claim(entry, OWNER, now=CLAIMED_AT, lease_ttl=TTL)
    stored = ledger.claim(entry.id, OWNER, lease_ttl=TTL, now=CLAIMED_AT).entry
    assert decision.changes["claim_generation"] == stored.claim_generation == 1


@pytest.mark.parametrize(
    ("what_happens", "holds"),
    [
        ("nothing", True),
        ("reclaimed", False),
        ("succeeded", False),
        ("failed_and_reclaimed_by_a_retry", False),
    ],
)
def test_the_fence_holds_only_while_the_run_owns_its_claim(
    ledger: RunLedger, what_happens: str, holds: bool
) -> None:
    fence = claimed(ledger)
    if what_happens == "reclaimed":
        assert reclaim_expired(ledger, now=AFTER_THE_LEASE)
    elif what_happens == "succeeded":
        assert ledger.succeed(fence.entry_id, OWNER, now=CLAIMED_AT)
    elif what_happens == "failed_and_reclaimed_by_a_retry":
        ledger.fail(fence.entry_id, OWNER, error="boom", now=CLAIMED_AT)
        assert ledger.claim(fence.entry_id, "run-b", lease_ttl=TTL, now=CLAIMED_AT).claimed
    assert ledger.holds(fence) is holds
    entry = ledger.get(fence.entry_id)
    assert entry is not None
    assert rules.holds(entry, fence, effect="x").allowed is holds


def test_an_older_claim_of_the_same_owner_does_not_hold(ledger: RunLedger) -> None:
    fence = claimed(ledger)
    assert not ledger.holds(Fence(fence.entry_id, fence.run_id, fence.token - 1))
    assert not ledger.holds(Fence(fence.entry_id, "run-z", fence.token))


# --- effects in a fenced transaction --------------------------------------------------------


def test_an_effect_commits_while_the_run_holds_its_entry(
    ledger: RunLedger, source: sa.Engine
) -> None:
    guard = LedgerGuard(ledger, claimed(ledger))
    write_effect(source, guard, "cancel order 1")
    assert written(source) == ["cancel order 1"]


def test_an_effect_after_the_reclaim_is_rolled_back_and_traced_on_the_entry(
    ledger: RunLedger, source: sa.Engine
) -> None:
    fence = claimed(ledger)
    guard = LedgerGuard(ledger, fence)
    assert guard.shares_database_with(source) is (source.url == ledger._get_engine().url)
    (reclaimed,) = reclaim_expired(ledger, now=AFTER_THE_LEASE)

    with pytest.raises(FenceLost, match="failed \\(lease_reclaimed\\)") as lost:
        write_effect(source, guard, "cancel order 1")

    assert written(source) == []
    assert lost.value.fence == fence
    entry = ledger.get(fence.entry_id)
    assert entry is not None
    # The entry's state is untouched; the refusal is a late-run rejection of this run.
    assert (entry.status, entry.failure_kind, entry.error) == (
        reclaimed.status,
        reclaimed.failure_kind,
        reclaimed.error,
    )
    (rejection,) = entry.summary["late_job_rejections"]
    assert (rejection["run_id"], rejection["action"]) == (OWNER, "side_effect")
    assert "cancel order 1" in rejection["reason"] and "lost its lease" in rejection["reason"]


def test_an_error_inside_the_effect_rolls_back_without_a_trace(
    ledger: RunLedger, source: sa.Engine
) -> None:
    fence = claimed(ledger)
    with (
        pytest.raises(RuntimeError, match="the effect's own error"),
        effect_transaction(source, LedgerGuard(ledger, fence), "x") as conn,
    ):
        conn.execute(sa.insert(effects_log).values(what="x"))
        raise RuntimeError("the effect's own error")
    assert written(source) == []
    entry = ledger.get(fence.entry_id)
    assert entry is not None and entry.summary["late_job_rejections"] == []


def test_a_check_outside_any_transaction_refuses_an_external_delivery(ledger: RunLedger) -> None:
    fence = claimed(ledger)
    guard = LedgerGuard(ledger, fence)
    verify_fence(guard, "deliver email")  # held: nothing happens
    reclaim_expired(ledger, now=AFTER_THE_LEASE)
    with pytest.raises(FenceLost):
        verify_fence(guard, "deliver email")
    entry = ledger.get(fence.entry_id)
    assert entry is not None
    assert [r["action"] for r in entry.summary["late_job_rejections"]] == ["side_effect"]


def test_without_a_guard_the_effect_is_written_unfenced(source: sa.Engine) -> None:
    with effect_transaction(source, None, "seed") as conn:
        conn.execute(sa.insert(effects_log).values(what="seed"))
    verify_fence(None, "seed")
    assert written(source) == ["seed"]


def test_the_same_database_is_recognised_whatever_the_url_spelling(tmp_path: Path) -> None:
    path = tmp_path / "one.db"
    (tmp_path / "sub").mkdir()
    assert database_identity(f"sqlite:///{path}") == database_identity(
        f"sqlite:///{tmp_path / 'sub' / '..' / 'one.db'}"
    )
    assert database_identity(f"sqlite:///{path}") != database_identity(
        f"sqlite:///{tmp_path / 'two.db'}"
    )
    assert database_identity("sqlite://") != database_identity("sqlite://")
    assert database_identity(
        "postgresql+psycopg2://a:secret@127.0.0.1:5433/db"
    ) == database_identity("postgresql://other@127.0.0.1:5433/db")
    assert database_identity("postgresql+psycopg2://127.0.0.1:5433/db") != database_identity(
        "postgresql+psycopg2://127.0.0.1:5433/other"
    )


# --- atomic in the shared database ----------------------------------------------------------


def test_in_the_shared_database_a_reclaim_waits_for_a_checked_effect_to_commit(
    ledger: RunLedger,
) -> None:
    """The race the check-then-commit order leaves open elsewhere: the fence is checked, then
    a reclaim comes before the commit. In the ledger's database the check holds the row (FOR
    SHARE on PostgreSQL, the write lock on SQLite): the reclaim lands after the commit, so the
    effect was committed while the run still held its entry."""
    engine = sa.create_engine(ledger.url)
    effects_log.create(engine, checkfirst=True)
    fence = claimed(ledger)
    guard = LedgerGuard(ledger, fence)
    checked, order = threading.Event(), []

    class Recording(LedgerGuard):
        def verify(self, conn: object, effect: str) -> None:
            super().verify(conn, effect)
            checked.set()
            time.sleep(1.0)  # the window a reclaim would use if nothing held the row
            order.append("effect committed")

    def reclaim() -> None:
        checked.wait(timeout=30)
        reclaim_expired(ledger, now=AFTER_THE_LEASE)
        order.append("reclaimed")

    reclaimer = threading.Thread(target=reclaim)
    reclaimer.start()
    write_effect(engine, Recording(ledger, fence), "cancel order 1")
    reclaimer.join(timeout=60)
    engine.dispose()

    assert guard.shares_database_with(engine)
    assert order == ["effect committed", "reclaimed"]
    entry = ledger.get(fence.entry_id)
    assert entry is not None and entry.failure_kind == FailureKind.LEASE_RECLAIMED
