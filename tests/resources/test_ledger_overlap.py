"""The ledger's side of the overlap policies, pauses and skipped dues, on SQLite and
PostgreSQL: ``claim_with_overlap`` under skip / buffer_one / replace, two claims racing, a
paused due written once, and one open pause per task and source."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from orchestration.overlap import (
    OverlapAction,
    TickHold,
    claim_with_overlap,
    decide_at_tick,
    released_waiters,
)
from orchestration.pause import (
    PAUSE_AFTER_FAILURES,
    PAUSE_CLI,
    close_pauses,
    open_pause,
    open_pauses,
)
from orchestration.task_spec import OverlapPolicy, TaskSpec
from orchestration.timetable import EverySlots
from resources.core.due import Due
from resources.core.entry import Entry, FailureKind, Status, Trigger
from resources.core.fence import Fence
from resources.ledger import RunLedger
from resources.ledger.schema import pauses

TASK = "order_cleanup"
DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
TTL = timedelta(minutes=5)
SLOT = timedelta(minutes=15)


def due_entry(ledger: RunLedger, slots_later: int = 0) -> Entry:
    due = Due(DUE + slots_later * SLOT)
    return ledger.ensure_entry(task_key=TASK, trigger=Trigger.SCHEDULE, dedup_key=due.key)


def running(ledger: RunLedger, run_id: str = "run-a") -> Entry:
    entry = due_entry(ledger)
    result = ledger.claim(entry.id, run_id, lease_ttl=TTL)
    assert result.claimed
    return result.entry


def test_skip_ends_the_new_entry_skipped_naming_the_running_one(ledger: RunLedger) -> None:
    busy = running(ledger)
    fresh = due_entry(ledger, 1)
    found = claim_with_overlap(ledger, fresh.id, "run-b", policy="skip", lease_ttl=TTL)
    assert found.decision.action is OverlapAction.SKIP
    assert found.claim is None
    after = ledger.get(fresh.id)
    assert after is not None and after.status == Status.SKIPPED and after.is_terminal
    assert after.error == f"overlap: entry {busy.id} running"
    assert after.finished_at is not None
    # A skipped entry is terminal: a late run of its due is refused, saying why.
    late = ledger.claim(fresh.id, "run-c", lease_ttl=TTL)
    assert not late.claimed and late.reason and "was skipped (overlap" in late.reason


def test_a_retrying_entry_is_still_in_progress(ledger: RunLedger) -> None:
    busy = running(ledger)
    ledger.fail(busy.id, "run-a", error="boom")  # retrying: a retry of it is coming
    fresh = due_entry(ledger, 1)
    found = claim_with_overlap(ledger, fresh.id, "run-b", policy="skip", lease_ttl=TTL)
    assert found.decision.action is OverlapAction.SKIP


def test_buffer_one_keeps_one_waiter_and_skips_the_rest(ledger: RunLedger) -> None:
    busy = running(ledger)
    second, third = due_entry(ledger, 1), due_entry(ledger, 2)
    waits = claim_with_overlap(ledger, second.id, "run-b", policy="buffer_one", lease_ttl=TTL)
    assert waits.decision.action is OverlapAction.WAIT
    # The waiter asks again: still waiting, still the waiter.
    again = claim_with_overlap(ledger, second.id, "run-b", policy="buffer_one", lease_ttl=TTL)
    assert again.decision.action is OverlapAction.WAIT
    skipped = claim_with_overlap(ledger, third.id, "run-c", policy="buffer_one", lease_ttl=TTL)
    assert skipped.decision.action is OverlapAction.SKIP
    assert skipped.entry.error == f"overlap: entry {second.id} already waiting"
    assert ledger.succeed(busy.id, "run-a")
    claims = claim_with_overlap(ledger, second.id, "run-b", policy="buffer_one", lease_ttl=TTL)
    assert claims.claim is not None and claims.claim.claimed
    assert claims.entry.status == Status.RUNNING


def test_a_dead_waiter_frees_the_buffer(ledger: RunLedger) -> None:
    running(ledger)
    second, third = due_entry(ledger, 1), due_entry(ledger, 2)
    claim_with_overlap(
        ledger,
        second.id,
        "run-b",
        policy="buffer_one",
        lease_ttl=TTL,
        wait_lease=timedelta(seconds=1),
    )
    later = datetime.now(UTC) + timedelta(seconds=5)
    found = claim_with_overlap(
        ledger, third.id, "run-c", policy="buffer_one", lease_ttl=TTL, now=later
    )
    assert found.decision.action is OverlapAction.WAIT  # the first waiter stopped asking


def test_replace_fails_the_running_entry_and_fences_its_run(ledger: RunLedger) -> None:
    busy = running(ledger)
    fresh = due_entry(ledger, 1)
    found = claim_with_overlap(ledger, fresh.id, "run-b", policy="replace", lease_ttl=TTL)
    assert found.decision.action is OverlapAction.REPLACE
    assert found.claim is not None and found.claim.claimed
    (old,) = found.replaced
    assert old.id == busy.id and old.status == Status.FAILED
    assert old.failure_kind == FailureKind.REPLACED
    assert f"replaced by entry {fresh.id} (run run-b)" in (old.error or "")
    # The replaced run commits nothing from here on, and cannot finish its entry.
    assert not ledger.holds(Fence(busy.id, "run-a", busy.claim_generation))
    assert not ledger.succeed(busy.id, "run-a")
    assert (ledger.get(busy.id) or busy).status == Status.FAILED


def test_waiting_its_turn_never_skips(ledger: RunLedger) -> None:
    running(ledger)
    fresh = due_entry(ledger, 1)
    found = claim_with_overlap(
        ledger, fresh.id, "run-b", policy="skip", lease_ttl=TTL, wait_turn=True
    )
    assert found.decision.action is OverlapAction.WAIT
    assert (ledger.get(fresh.id) or fresh).status == Status.QUEUED


def test_an_attempt_of_an_entry_that_ran_claims_without_asking(ledger: RunLedger) -> None:
    other = running(ledger, "run-x")
    again = due_entry(ledger, 1)
    assert ledger.claim(again.id, "run-a", lease_ttl=TTL).claimed
    ledger.fail(again.id, "run-a", error="boom")  # retrying, attempt 1 used
    retry = claim_with_overlap(ledger, again.id, "run-a2", policy="skip", lease_ttl=TTL)
    assert retry.claim is not None and retry.claim.claimed, other


def test_two_runs_starting_at_once_decide_one_after_the_other(ledger: RunLedger) -> None:
    # Nothing runs; two fresh dues claim together under skip: one claims, one is skipped.
    first, second = due_entry(ledger, 1), due_entry(ledger, 2)
    barrier = threading.Barrier(2)
    outcomes: dict[int, OverlapAction] = {}

    def claim(entry: Entry, run_id: str) -> None:
        barrier.wait()
        found = claim_with_overlap(ledger, entry.id, run_id, policy="skip", lease_ttl=TTL)
        outcomes[entry.id] = found.decision.action

    threads = [
        threading.Thread(target=claim, args=(first, "run-1")),
        threading.Thread(target=claim, args=(second, "run-2")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes.values()) == [OverlapAction.CLAIM, OverlapAction.SKIP]
    assert [e.status for e in ledger.in_progress(TASK)] == [Status.RUNNING]


def test_two_daemons_ticking_a_due_the_ledger_skips_record_it_once(ledger: RunLedger) -> None:
    # The tick's decision (decide_at_tick): both ticks of the same due request no run and
    # find one skipped entry, whichever wrote it.
    spec = _spec(OverlapPolicy.SKIP)
    busy = running(ledger)
    due = Due(DUE + SLOT)
    barrier = threading.Barrier(4)
    found: list[Entry | None] = []

    def tick() -> None:
        barrier.wait()
        held = decide_at_tick(ledger, spec, due)
        found.append(held.entry if held else None)

    threads = [threading.Thread(target=tick) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    skipped = ledger.find(TASK, due.key)
    assert skipped is not None and skipped.status == Status.SKIPPED
    assert len(found) == 4 and {e.id if e else None for e in found} == {skipped.id}
    assert skipped.error == f"overlap: entry {busy.id} running"
    # The task free again, the next due is left to its run.
    ledger.succeed(busy.id, busy.lease_owner or "run-a")
    assert decide_at_tick(ledger, spec, Due(DUE + 2 * SLOT)) is None
    assert ledger.find(TASK, Due(DUE + 2 * SLOT).key) is None


def test_buffer_one_holds_one_due_at_its_tick_without_a_run_until_the_task_is_free(
    ledger: RunLedger,
) -> None:
    spec = _spec(OverlapPolicy.BUFFER_ONE)
    busy = running(ledger)
    assert released_waiters(ledger, [TASK]) == []
    # Two daemons tick the next due: one waiter, queued, held by no run.
    barrier = threading.Barrier(3)
    held: list[TickHold | None] = []

    def tick() -> None:
        barrier.wait()
        held.append(decide_at_tick(ledger, spec, Due(DUE + SLOT)))

    threads = [threading.Thread(target=tick) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    waiter = ledger.find(TASK, Due(DUE + SLOT).key)
    assert waiter is not None and waiter.status == Status.QUEUED and not waiter.run_ids
    assert [(h.entry.id, h.waits, h.reason) for h in held if h] == 3 * [
        (waiter.id, True, f"overlap: entry {busy.id} running")
    ]
    # The due after is skipped at its tick, and so is a run that claims meanwhile.
    later = decide_at_tick(ledger, spec, Due(DUE + 2 * SLOT))
    assert later is not None and later.entry.status == Status.SKIPPED
    assert later.entry.error == f"overlap: entry {waiter.id} already waiting"
    other = due_entry(ledger, 3)
    found = claim_with_overlap(ledger, other.id, "run-x", policy="buffer_one", lease_ttl=TTL)
    assert found.decision.action is OverlapAction.SKIP
    # Still busy: nothing to launch. Free: the waiter is released; its run claims it.
    assert released_waiters(ledger, [TASK, "other_task"]) == []
    ledger.succeed(busy.id, "run-a")
    assert [e.id for e in released_waiters(ledger, [TASK])] == [waiter.id]
    assert released_waiters(ledger, ["other_task"]) == []
    claimed = claim_with_overlap(ledger, waiter.id, "run-w", policy="buffer_one", lease_ttl=TTL)
    assert claimed.decision.action is OverlapAction.CLAIM and claimed.claim is not None
    assert released_waiters(ledger, [TASK]) == []  # claimed: no longer a waiter


def test_held_dues_run_in_the_order_of_their_dues(ledger: RunLedger) -> None:
    # The task ends before the held due's run is launched (ledger_sensor's next tick), and
    # the next due ticks meanwhile: it is held behind the first, not run ahead of it.
    spec = _spec(OverlapPolicy.BUFFER_ONE)
    busy = running(ledger)
    first = decide_at_tick(ledger, spec, Due(DUE + SLOT))
    assert first is not None and first.waits
    ledger.succeed(busy.id, "run-a")
    second = decide_at_tick(ledger, spec, Due(DUE + 2 * SLOT))
    assert second is not None and second.waits
    assert second.reason == f"overlap: entry {first.entry.id} runs first"
    third = decide_at_tick(ledger, spec, Due(DUE + 3 * SLOT))
    assert third is not None and third.entry.status == Status.SKIPPED
    assert third.entry.error == f"overlap: entry {second.entry.id} already waiting"
    # A UI run meanwhile, with the task free, runs; the held dues wait for it.
    ui = ledger.ensure_entry(task_key=TASK, trigger=Trigger.MANUAL, dedup_key="manual:r1")
    found = claim_with_overlap(ledger, ui.id, "run-ui", policy="buffer_one", lease_ttl=TTL)
    assert found.decision.action is OverlapAction.CLAIM
    assert released_waiters(ledger, [TASK]) == []
    ledger.succeed(ui.id, "run-ui")
    # Released one at a time, first due first.
    assert [e.id for e in released_waiters(ledger, [TASK])] == [first.entry.id]
    claimed = claim_with_overlap(
        ledger, first.entry.id, "run-1", policy="buffer_one", lease_ttl=TTL
    )
    assert claimed.decision.action is OverlapAction.CLAIM
    # While it runs, a UI run is skipped for the due held behind it.
    ui2 = ledger.ensure_entry(task_key=TASK, trigger=Trigger.MANUAL, dedup_key="manual:r2")
    skipped = claim_with_overlap(ledger, ui2.id, "run-ui2", policy="buffer_one", lease_ttl=TTL)
    assert skipped.decision.action is OverlapAction.SKIP
    assert skipped.decision.reason == f"overlap: entry {second.entry.id} already waiting"
    assert released_waiters(ledger, [TASK]) == []
    ledger.succeed(first.entry.id, "run-1")
    assert [e.id for e in released_waiters(ledger, [TASK])] == [second.entry.id]


def test_a_held_waiter_ended_otherwise_no_longer_holds_the_task(ledger: RunLedger) -> None:
    # A waiter skipped by a pause (or ended by an operator) is no waiter: the next due that
    # finds the task busy becomes the waiter, instead of every due being skipped for good.
    spec = _spec(OverlapPolicy.BUFFER_ONE)
    running(ledger)
    first = decide_at_tick(ledger, spec, Due(DUE + SLOT))
    assert first is not None and first.waits
    ledger.skip_entry(first.entry.id, reason="paused by alice: migration")
    second = decide_at_tick(ledger, spec, Due(DUE + 2 * SLOT))
    assert second is not None and second.waits and second.entry.id != first.entry.id
    # The skipped due, ticked again, still answers as it was written.
    again = decide_at_tick(ledger, spec, Due(DUE + SLOT))
    assert again is not None and not again.waits and again.entry.id == first.entry.id


def _spec(policy: OverlapPolicy) -> TaskSpec:
    return TaskSpec(key=TASK, rule=EverySlots(1), declared_cadence="x", overlap_policy=policy)


def test_a_paused_due_is_written_once(ledger: RunLedger) -> None:
    entry, wrote = ledger.record_skipped_due(TASK, DUE, reason="paused by alice: migration")
    again, wrote_again = ledger.record_skipped_due(TASK, DUE, reason="paused by bob: other")
    assert (wrote, wrote_again) == (True, False)
    assert again.id == entry.id and again.error == "paused by alice: migration"
    assert entry.status == Status.SKIPPED
    # A run of that due finds it skipped: refused, the entry unchanged.
    result = ledger.claim(entry.id, "run-a", lease_ttl=TTL)
    assert not result.claimed and result.entry.status == Status.SKIPPED
    # A queued entry is skipped by compare-and-set; a running one is left alone.
    queued = due_entry(ledger, 1)
    assert ledger.skip_entry(queued.id, reason="paused by alice: x").status == Status.SKIPPED
    busy = due_entry(ledger, 2)
    ledger.claim(busy.id, "run-b", lease_ttl=TTL)
    assert ledger.skip_entry(busy.id, reason="paused by alice: x").status == Status.RUNNING


def test_due_entries_reads_a_range_of_dues(ledger: RunLedger) -> None:
    made = [due_entry(ledger, i) for i in range(4)]
    ledger.ensure_entry(task_key=TASK, trigger=Trigger.MANUAL, dedup_key="manual:r1")
    found = ledger.due_entries(TASK, DUE + SLOT, DUE + 3 * SLOT)
    assert sorted(e.id for e in found.values()) == [made[1].id, made[2].id]


def test_one_open_pause_per_task_and_source(ledger: RunLedger) -> None:
    first = open_pause(ledger, TASK, by="alice", reason="migration", source=PAUSE_CLI)
    assert first is not None and first.task_key == TASK
    assert open_pause(ledger, TASK, by="bob", reason="again", source=PAUSE_CLI) is None
    other = open_pause(ledger, TASK, by="dueledger", reason="3 fail", source=PAUSE_AFTER_FAILURES)
    assert other is not None
    # The unique index holds even against a writer that does not read first.
    with ledger._get_engine().begin() as conn, pytest.raises(sa.exc.IntegrityError):
        conn.execute(
            sa.insert(pauses).values(
                task_key=TASK,
                source=PAUSE_CLI,
                paused_at=DUE.replace(tzinfo=None),
                paused_by="mallory",
                reason="twice",
            )
        )
    closed, _ = close_pauses(ledger, TASK, by="alice", reason="done", sources=(PAUSE_CLI,))
    assert [p.id for p in closed] == [first.id] and closed[0].end is not None
    assert [p.source for p in open_pauses(ledger, TASK)] == [PAUSE_AFTER_FAILURES]
    assert open_pause(ledger, TASK, by="bob", reason="next", source=PAUSE_CLI) is not None


def test_latest_finished_is_newest_first(ledger: RunLedger) -> None:
    a, b = due_entry(ledger, 0), due_entry(ledger, 1)
    now = datetime.now(UTC)
    ledger.claim(a.id, "run-a", lease_ttl=TTL, now=now)
    ledger.fail(a.id, "run-a", error="x", retry_coming=False, now=now + timedelta(seconds=1))
    ledger.claim(b.id, "run-b", lease_ttl=TTL, now=now)
    ledger.succeed(b.id, "run-b", now=now + timedelta(seconds=2))
    assert [e.id for e in ledger.latest_finished(TASK, limit=5)] == [b.id, a.id]
