"""Overlap: what a run does when its task is already at work -- all five policies, the decision
and the ledger transaction that applies it.

- ``queue`` (the default): one run of the task at a time, whatever launched it. The task's
  asset sits in a Dagster pool named after the task (:func:`pool_of`) with one slot
  (:func:`ensure_task_pools`), so later runs wait in Dagster's run queue.
- ``allow``: runs side by side (a task declared ``concurrent_safe=True`` only); nothing here.
- ``skip``, ``buffer_one``, ``replace``: decided by the ledger when a run claims its entry
  (:func:`claim_with_overlap`), for every launch path alike (a schedule tick, a sensor, the
  launchpad, Materialize, a backfill, `dueledger launch`, a manual retry):

  - ``skip``: a run whose task is in progress is not run: its entry ends ``skipped`` with
    ``overlap: entry N running``;
  - ``buffer_one``: the first such run waits (its run polls until the task is free, then
    claims); any further one while it waits ends ``skipped``, ``overlap: entry M already
    waiting``. A scheduled due waits without a run at all: its tick writes the entry
    ``queued``, held (:func:`decide_at_tick`), and ``ledger_sensor`` launches its run once
    the task is free (:func:`released_waiters`). A held due counts in line: the first held
    one goes next, and a due after it is held behind it, or skipped if one is already;
  - ``replace``: the new run claims, and the entry in progress ends ``failed``, kind
    ``replaced``, naming the new entry; the replacement is audited in the same transaction.

A run an operator asked to wait for its turn (``dueledger launch --queue``, a manual retry,
``dueledger catch-up``: :func:`waits_its_turn`) waits under ``skip`` and ``buffer_one``
instead of being skipped. An attempt of an entry that already ran once (a retry) claims
without asking: it is the same logical execution.

The claim is one write transaction that locks the task's row in ``dueledger_task_locks``
(PostgreSQL ``SELECT ... FOR UPDATE``; SQLite's write lock), then the entry, reads the task's
entries in progress and its waiter, decides (:func:`decide_overlap`, pure) and applies the
answer before it commits: two runs starting at once decide one after the other. Dagster-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Final

import sqlalchemy as sa

from orchestration.task_spec import LEDGER_OVERLAP_POLICIES, OverlapPolicy, TaskSpec, TaskView
from resources.core.due import Due
from resources.core.entry import (
    ACTION_RUN_REPLACED,
    CLAIMABLE_STATUSES,
    IN_PROGRESS,
    Entry,
    FailureKind,
    Origin,
    Status,
    Trigger,
    with_summary_lists,
)
from resources.ledger import ClaimResult, Ledger
from resources.ledger.model import (
    check_id,
    check_run_id,
    check_ttl,
    entry_from_row,
    from_db,
    to_db,
)
from resources.ledger.rules import (
    Decision,
    EntryState,
    claim,
    claim_refusal,
    skip,
    state_words,
    who,
)
from resources.ledger.schema import entries, task_locks
from resources.ledger.statements import statements_for

if TYPE_CHECKING:
    import dagster as dg
    from sqlalchemy.engine import Connection

#: The summary key of an entry whose run waits for its turn under any overlap policy.
SUMMARY_OVERLAP: Final = "overlap"
OVERLAP_WAIT_TURN: Final = "queue"
#: The summary key of a due held at its tick as the task's waiter (``buffer_one``): why.
SUMMARY_OVERLAP_HELD: Final = "overlap_held"
#: How long a waiting run's mark lives unless its run asks again (it asks every 2 s).
WAIT_LEASE: Final = timedelta(seconds=30)
#: A newer run replaces an entry that is running, or waiting for its retry.
REPLACE_FROM: Final = IN_PROGRESS
#: Slots of a task pool when the instance sets no ``concurrency.pools.default_limit``.
TASK_POOL_SLOTS: Final = 1


class OverlapAction(StrEnum):
    CLAIM = "claim"
    SKIP = "skip"
    WAIT = "wait"
    REPLACE = "replace"


@dataclass(frozen=True)
class OverlapDecision:
    """The answer for one run: the action, why, and the other entry it is about."""

    action: OverlapAction
    reason: str = ""
    other: int | None = None


def running_reason(other: int) -> str:
    return f"overlap: entry {other} running"


def waiting_reason(other: int) -> str:
    return f"overlap: entry {other} already waiting"


def next_reason(other: int) -> str:
    return f"overlap: entry {other} runs first"


def decide_overlap(
    policy: str,
    entry_id: int,
    in_progress: Sequence[int],
    waiter: int | None,
    *,
    wait_turn: bool = False,
) -> OverlapDecision:
    """The decision for entry ``entry_id`` of a task with overlap ``policy`` (pure).

    ``in_progress``: the task's other entries that are running or retrying, oldest first;
    ``waiter``: the entry whose run waits for its turn now (buffer_one), if any;
    ``wait_turn``: an operator asked this entry to wait for its turn.
    """
    others = [e for e in in_progress if e != entry_id]
    if not others or policy not in LEDGER_OVERLAP_POLICIES:
        return OverlapDecision(OverlapAction.CLAIM)
    busy = others[0]
    if policy == OverlapPolicy.REPLACE:
        return OverlapDecision(OverlapAction.REPLACE, f"overlap: replaces entry {busy}", busy)
    if wait_turn:
        return OverlapDecision(OverlapAction.WAIT, running_reason(busy), busy)
    if policy == OverlapPolicy.SKIP:
        return OverlapDecision(OverlapAction.SKIP, running_reason(busy), busy)
    if waiter is None or waiter == entry_id:
        return OverlapDecision(OverlapAction.WAIT, running_reason(busy), busy)
    return OverlapDecision(OverlapAction.SKIP, waiting_reason(waiter), waiter)


def launch_refusal(ledger: Ledger, spec: TaskSpec, *, queue: bool) -> str | None:
    """Why a manual launch of ``spec``'s task would only end ``skipped``: under ``skip``, with
    the task running, unless the operator asked to wait for its turn (``queue``). The same
    decision the run's claim makes (:func:`decide_overlap`), asked before anything is
    launched; None: launch."""
    if queue or spec.overlap_policy != OverlapPolicy.SKIP:
        return None
    running = ledger.in_progress(spec.key)
    decision = decide_overlap(spec.overlap_policy, 0, [e.id for e in running], None)
    if decision.action is not OverlapAction.SKIP:
        return None
    busy = running[0]
    return (
        f"task {spec.key!r} is running (entry {busy.id}, {busy.label}, {busy.status}) "
        f"and its overlap policy is skip: this launch would be skipped. Nothing was "
        f"launched; add --queue to wait for its turn"
    )


@dataclass(frozen=True)
class TickHold:
    """Why the schedule's tick of a due requests no run: the due's ``entry``, either
    ``skipped`` (its run would only be skipped at its claim) or ``queued`` as the task's
    waiter (``buffer_one``: ``ledger_sensor`` launches its run once the task is free);
    ``reason`` names the entry it found at work or waiting."""

    entry: Entry
    reason: str

    @property
    def waits(self) -> bool:
        return self.entry.status == Status.QUEUED


def decide_at_tick(
    ledger: Ledger, spec: TaskSpec, due: Due, *, now: datetime | None = None
) -> TickHold | None:
    """At the schedule's tick of ``due``, the claim's own decision (:func:`decide_overlap`)
    asked before any run exists:

    - overlap ``skip`` with the task in progress, ``buffer_one`` with a waiter already there:
      the due's entry is written ``skipped``;
    - ``buffer_one`` with the task in progress and no waiter: the due's entry is written
      ``queued`` and held (``summary.overlap_held`` says why), with no run and no worker;
      :func:`released_waiters` gives it to ``ledger_sensor`` to launch once the task is free.
      A held due whose run is not launched yet stands for the run in progress when the task
      is free: the next due is held behind it (``overlap: entry N runs first``), so held
      dues run in the order of their dues.

    Either way the tick requests no run. None: request the run (its claim decides again,
    for a run that starts after the task became busy). A tick evaluated again (two daemons,
    a retried tick) finds the entry it wrote and answers the same.

    One transaction holding the task's lock row, as a claim does; the entry is written by
    insert-or-ignore, so two daemons ticking the same due record it once."""
    if spec.overlap_policy not in (OverlapPolicy.SKIP, OverlapPolicy.BUFFER_ONE):
        return None
    at = ledger.clock(now)
    with ledger.transaction() as conn:
        lock = _lock_task(conn, spec.key, at)
        existing = (
            conn.execute(
                sa.select(entries).where(
                    entries.c.task_key == spec.key,
                    entries.c.origin == Origin.DUE,
                    entries.c.dedup_key == due.key,
                )
            )
            .mappings()
            .first()
        )
        if existing is not None:
            found = entry_from_row(existing)
            if found.status == Status.SKIPPED:
                return TickHold(found, found.error or "skipped")
            if is_held(found):
                return TickHold(found, str(found.summary[SUMMARY_OVERLAP_HELD]))
            return None
        in_progress, live = _busy(conn, spec.key, lock, at)
        held = _held(conn, spec.key) if spec.overlap_policy == OverlapPolicy.BUFFER_ONE else []
        # A held due not launched yet is next in line: it stands for the run in progress.
        ahead, behind = (in_progress, held) if in_progress else (held[:1], held[1:])
        waiter = live if live is not None else (behind[0] if behind else None)
        decision = decide_overlap(spec.overlap_policy, 0, ahead, waiter)
        if decision.action is OverlapAction.WAIT and not in_progress:
            decision = OverlapDecision(OverlapAction.WAIT, next_reason(ahead[0]), ahead[0])
        if decision.action is OverlapAction.SKIP:
            entry, _ = ledger.record_skipped_due(
                spec.key,
                due,
                reason=decision.reason,
                max_attempts=spec.max_attempts,
                now=at,
                connection=conn,
            )
            return TickHold(entry, decision.reason)
        if decision.action is not OverlapAction.WAIT:
            return None
        entry = ledger.ensure_entry(
            task_key=spec.key,
            trigger=Trigger.SCHEDULE,
            dedup_key=due.key,
            due=due,
            max_attempts=spec.max_attempts,
            now=at,
            connection=conn,
        )
        summary = {**with_summary_lists(entry.summary), SUMMARY_OVERLAP_HELD: decision.reason}
        entry = ledger.set_summary(conn, entry.id, summary, at)
        return TickHold(entry, decision.reason)


def is_held(entry: Entry) -> bool:
    """A due held at its tick (:func:`decide_at_tick`) whose run has not claimed it yet."""
    return (
        entry.status == Status.QUEUED
        and bool(entry.summary.get(SUMMARY_OVERLAP_HELD))
        and not entry.run_ids
    )


def released_waiters(
    ledger: Ledger, task_keys: Sequence[str], *, now: datetime | None = None
) -> list[Entry]:
    """For each of the tasks ``task_keys`` that is free now (no entry running or retrying, no
    run waiting in its worker), its first held due (:func:`decide_at_tick`): the one whose
    run is to be launched. The others wait their turn. Read only, no lock: a run launched
    twice for one held due is refused by the claim like any duplicate run, and the run key
    of the launch is one per due."""
    if not task_keys:
        return []
    at = ledger.clock(now)
    queued = (
        sa.select(entries)
        .where(entries.c.task_key.in_(sorted(set(task_keys))))
        .where(entries.c.status == Status.QUEUED, entries.c.origin == Origin.DUE)
        .order_by(entries.c.due, entries.c.id)
    )
    released: list[Entry] = []
    with ledger.connect("autocommit") as conn:
        first: dict[str, Entry] = {}
        for row in conn.execute(queued).mappings():
            entry = entry_from_row(row)
            if is_held(entry):
                first.setdefault(entry.task_key, entry)
        for task_key, entry in first.items():
            lock = (
                conn.execute(sa.select(task_locks).where(task_locks.c.task_key == task_key))
                .mappings()
                .first()
            )
            in_progress = _in_progress(conn, task_key)
            live = _live_waiter(lock, at) if lock is not None else None
            if not in_progress and live is None:
                released.append(entry)
    return released


def replace(entry: EntryState, *, by_entry: int, by_run: str, now: datetime) -> Decision:
    """Overlap ``replace``: a newer run (``by_run``, claiming entry ``by_entry``) ends the
    entry's run: ``running|retrying -> failed`` (kind ``replaced``), lease cleared, so the old
    run's fence refuses every side effect from here on."""
    if entry.status not in REPLACE_FROM:
        return Decision(refusal=f"{who(entry)} is {state_words(entry)}: nothing to replace")
    owner = f"run {entry.lease_owner}" if entry.lease_owner else "its retry"
    return Decision(
        {
            "status": Status.FAILED,
            "failure_kind": FailureKind.REPLACED,
            "error": (
                f"replaced by entry {by_entry} (run {by_run}): overlap policy 'replace' ended "
                f"{owner}; its side effects commit nothing from the replacement's claim on"
            ),
            "lease_owner": None,
            "lease_expires_at": None,
            "finished_at": now,
            "updated_at": now,
        }
    )


def waits_its_turn(entry: Entry) -> bool:
    """An operator asked this entry to wait for its turn instead of being skipped: a manual
    retry, `dueledger launch --queue`, `dueledger catch-up`."""
    if entry.trigger == Trigger.MANUAL_RETRY:
        return True
    return entry.summary.get(SUMMARY_OVERLAP) == OVERLAP_WAIT_TURN


def pool_of(spec: TaskSpec) -> str | None:
    """The Dagster pool of the task's asset: the task key under ``queue`` (one slot, so later
    runs wait in the run queue); none under the other policies (a second run must start to
    be decided by the ledger, or runs side by side)."""
    return spec.key if spec.uses_task_pool else None


# --- the claim --------------------------------------------------------------------------------


@dataclass(frozen=True)
class OverlapClaim:
    """What :func:`claim_with_overlap` did: the decision, the claim when the run claimed (None
    when it was skipped or must wait), and the entries it replaced."""

    decision: OverlapDecision
    entry: Entry
    claim: ClaimResult | None = None
    replaced: tuple[Entry, ...] = ()


def claim_with_overlap(
    ledger: Ledger,
    entry_id: int,
    run_id: str,
    *,
    policy: str,
    lease_ttl: timedelta,
    wait_turn: bool = False,
    wait_lease: timedelta = WAIT_LEASE,
    now: datetime | None = None,
) -> OverlapClaim:
    """Claim the entry for ``run_id`` under overlap ``policy`` (one transaction; see the module
    docstring). ``wait_turn``: the entry waits instead of being skipped. A run told to wait
    calls again (its waiter mark lives ``wait_lease``, renewed by each call). An entry that is
    not a fresh claim -- another attempt, a duplicate run -- is claimed or refused exactly as
    ``Ledger.claim`` would."""
    if policy not in LEDGER_OVERLAP_POLICIES:
        raise ValueError(f"overlap policy {policy!r} is not decided by the ledger")
    check_run_id(run_id)
    ttl = check_ttl(lease_ttl)
    at = ledger.clock(now)
    entry_id = check_id(entry_id, "entry_id")
    with ledger.connect("autocommit") as conn:
        task_key = ledger.load(conn, entry_id).task_key
    with ledger.transaction() as conn:
        lock = _lock_task(conn, task_key, at)
        entry = ledger.load(conn, entry_id, lock=True)
        if entry.status not in CLAIMABLE_STATUSES or entry.attempt > 0:
            return _plain_claim(ledger, conn, entry, run_id, at, ttl)
        in_progress, live = _busy(conn, task_key, lock, at)
        held = _held(conn, task_key) if policy == OverlapPolicy.BUFFER_ONE else []
        # Held dues ahead of this entry wait their turn before it (after the run in progress).
        before = held[: held.index(entry.id)] if entry.id in held else held
        waiter = live if live is not None else (before[0] if in_progress and before else None)
        decision = decide_overlap(policy, entry.id, in_progress, waiter, wait_turn=wait_turn)
        if decision.action is OverlapAction.WAIT:
            if not wait_turn and (live is None or live == entry.id):
                _set_waiter(conn, task_key, entry.id, run_id, at + wait_lease, at)
            return OverlapClaim(decision, entry)
        if live == entry.id:
            _set_waiter(conn, task_key, None, None, None, at)
        if decision.action is OverlapAction.SKIP:
            skipped = ledger.apply(conn, entry, skip(entry, reason=decision.reason, now=at))
            return OverlapClaim(decision, skipped)
        replaced: list[Entry] = []
        if decision.action is OverlapAction.REPLACE:
            for other in _others_in_progress(conn, task_key, entry.id):
                change = replace(other, by_entry=entry.id, by_run=run_id, now=at)
                if change.allowed:
                    ended = ledger.apply(conn, other, change)
                    replaced.append(ended)
                    _audit_replaced(ledger, conn, ended, entry, run_id, at)
        result = _plain_claim(ledger, conn, entry, run_id, at, ttl)
        return OverlapClaim(decision, result.entry, result.claim, tuple(replaced))


def _audit_replaced(
    ledger: Ledger, conn: Connection, replaced: Entry, by: Entry, run_id: str, at: datetime
) -> None:
    old_run = replaced.run_ids[-1] if replaced.run_ids else None
    ledger.write_audit(
        operator=None,
        action=ACTION_RUN_REPLACED,
        entry_id=replaced.id,
        child_entry_id=by.id,
        reason=None,
        checks={"run_id": old_run, "replaced_by_run": run_id, "task_key": replaced.task_key},
        outcome=f"replaced: entry {replaced.id} ended failed (replaced) by entry {by.id}",
        now=at,
        connection=conn,
    )


def mark_wait_turn(ledger: Ledger, entry_id: int, *, now: datetime | None = None) -> Entry:
    """Mark the entry to wait for its turn under any overlap policy (``summary.overlap`` is
    ``queue``: `dueledger launch --queue`, a catch-up); returns it."""
    at = ledger.clock(now)
    with ledger.transaction() as conn:
        entry = ledger.load(conn, check_id(entry_id, "entry_id"), lock=True)
        summary = {**with_summary_lists(entry.summary), SUMMARY_OVERLAP: OVERLAP_WAIT_TURN}
        return ledger.set_summary(conn, entry.id, summary, at)


def _lock_task(conn: Connection, task_key: str, at: datetime) -> sa.RowMapping:
    insert = statements_for(conn.dialect.name).insert_task_lock
    conn.execute(insert, {"task_key": task_key, "updated_at": to_db(at, "now")})
    query = sa.select(task_locks).where(task_locks.c.task_key == task_key).with_for_update()
    return conn.execute(query).mappings().one()


def _busy(
    conn: Connection, task_key: str, lock: sa.RowMapping, at: datetime
) -> tuple[list[int], int | None]:
    """The task's entries in progress (oldest first) and its live waiter, read under its lock
    row: what :func:`decide_overlap` is asked with, at the claim and at the tick."""
    return _in_progress(conn, task_key), _live_waiter(lock, at)


def _in_progress(conn: Connection, task_key: str) -> list[int]:
    query = (
        sa.select(entries.c.id)
        .where(entries.c.task_key == task_key, entries.c.status.in_(IN_PROGRESS))
        .order_by(entries.c.id)
    )
    return [int(i) for i in conn.execute(query).scalars()]


def _live_waiter(lock: sa.RowMapping, at: datetime) -> int | None:
    """The run that waits for its turn in its worker, while it renews its mark."""
    waiter = lock["waiting_entry_id"]
    until = from_db(lock["waiting_until"])
    return int(waiter) if waiter is not None and until is not None and until > at else None


def _held(conn: Connection, task_key: str) -> list[int]:
    """The task's dues held at their tick without a run yet, in the order of their dues."""
    query = (
        sa.select(entries)
        .where(entries.c.task_key == task_key, entries.c.status == Status.QUEUED)
        .where(entries.c.origin == Origin.DUE)
        .order_by(entries.c.due, entries.c.id)
    )
    found = (entry_from_row(r) for r in conn.execute(query).mappings())
    return [e.id for e in found if is_held(e)]


def _set_waiter(
    conn: Connection,
    task_key: str,
    entry_id: int | None,
    run_id: str | None,
    until: datetime | None,
    at: datetime,
) -> None:
    conn.execute(
        sa.update(task_locks)
        .where(task_locks.c.task_key == task_key)
        .values(
            waiting_entry_id=entry_id,
            waiting_run_id=run_id,
            waiting_until=to_db(until, "waiting_until") if until else None,
            updated_at=to_db(at, "now"),
        )
    )


def _others_in_progress(conn: Connection, task_key: str, entry_id: int) -> list[Entry]:
    query = (
        sa.select(entries)
        .where(entries.c.task_key == task_key, entries.c.status.in_(IN_PROGRESS))
        .where(entries.c.id != entry_id)
        .order_by(entries.c.id)
        .with_for_update()
    )
    return [entry_from_row(r) for r in conn.execute(query).mappings()]


def _plain_claim(
    ledger: Ledger, conn: Connection, entry: Entry, run_id: str, at: datetime, ttl: timedelta
) -> OverlapClaim:
    """``Ledger.claim``'s decision on the locked entry, in the caller's transaction."""
    decision = claim(entry, run_id, now=at, lease_ttl=ttl)
    claimed = OverlapDecision(OverlapAction.CLAIM)
    if decision.allowed and not decision.changes:  # re-entrant: the owner again
        return OverlapClaim(claimed, entry, ClaimResult(True, entry, None, reentrant=True))
    if decision.allowed:
        after = ledger.apply(conn, entry, decision)
        return OverlapClaim(claimed, after, ClaimResult(True, after, None))
    reason = decision.refusal or claim_refusal(entry)
    after = ledger.record_rejection(conn, entry, run_id, at, "claim", reason)
    return OverlapClaim(claimed, after, ClaimResult(False, after, reason))


# --- the queue policy's pools -------------------------------------------------------------------


def ensure_task_pools(instance: dg.DagsterInstance, views: Sequence[TaskView]) -> list[str]:
    """Create the pool of every ``queue`` task that has none yet; returns the pools created.

    Dagster creates a pool's limit the first time its run queue sees a run of it, and in that
    same pass it does not hold the pool's runs back yet: two runs of a task queued before the
    pool existed (a Catalog "Materialize" next to a scheduled run right after a fresh start)
    would both start. The policy sensor calls this on each evaluation (a set lookup once the
    pools exist). A pool that exists is left as it is (an operator's `dagster instance
    concurrency set` wins); a new one gets the instance's default limit, or TASK_POOL_SLOTS.
    """
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return []
    existing = storage.get_concurrency_keys()
    created = []
    for pool in sorted({p for v in views if (p := pool_of(v.spec))} - existing):
        if instance.global_op_concurrency_default_limit:
            storage.initialize_concurrency_limit_to_default(pool)
        else:
            storage.set_concurrency_slots(pool, TASK_POOL_SLOTS)
        created.append(pool)
    return created
