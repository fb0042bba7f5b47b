"""What every task run does around its work, whoever launched it: find the ledger entry its
tags name, claim it under the rules, keep the lease, record the outcome.

The path reads top-down, each rule asked once, by its own module:

1. which entry the run's tags name, and, for a re-execution from the UI, its parent's
   (``manual_launch.attribute_run``: the namespaces);
2. a task the code location does not register ends the run unsupported (:class:`Unsupported`);
3. the entry it is an attempt of (``retry.entry_of_run``): "Re-execute" in the UI and
   ``manual_retry`` runs under the manual-retry rule, a task that is not manually triggerable
   running only what dueledger issued, the entry itself (insert-or-ignore), a dead chain
   member's attempt settled and a dispatch failure resumed by Dagster's automatic retry;
4. a due inside a pause ends ``skipped`` (``pause.skip_paused_due``);
5. the claim under the task's overlap policy (``overlap.claim_with_overlap``), or the plain
   compare-and-set claim with a lease (``Ledger.claim``).

:func:`prepare` does 1-4, :func:`claim` does 5 and may answer :class:`Waiting` (the caller
asks again); a run that may not act gets :class:`Unclaimed`, already audited. A claimed run
works under a :class:`Heartbeat`, every side effect fenced (``TaskRun.guard``), and ends with
:func:`succeed` or :func:`fail`. Dagster-free: the task asset (``orchestration/task_defs.py``)
gives it what Dagster knows of the run (:class:`RunFacts`) and acts on Dagster with what it
answers; the history harness (``tests/history``) drives the very same path on a simulated
Dagster.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final, Protocol

from orchestration.manual_launch import EntryRequest, attribute_run
from orchestration.overlap import OverlapAction, claim_with_overlap, waits_its_turn
from orchestration.pause import skip_paused_due
from orchestration.retry import entry_of_run, resume_dispatch_failed_entry, retry_backoff_wait
from orchestration.task_spec import LEDGER_OVERLAP_POLICIES, TaskSpec, find_task
from resources.core import tags as t
from resources.core.entry import (
    ACTION_RUN_REFUSED,
    ACTION_RUN_SKIPPED,
    Entry,
    Status,
)
from resources.core.fence import EffectGuard, Fence, FenceLost
from resources.ledger import Ledger
from resources.ledger.guard import LedgerGuard

#: How often a run waiting for its turn asks again (its waiter mark lives 30 s).
WAIT_POLL_SECONDS: Final = 2.0
_ACTIONS: Final = {t.OUTCOME_REFUSED: ACTION_RUN_REFUSED, t.OUTCOME_SKIPPED: ACTION_RUN_SKIPPED}


class RunFacts(Protocol):
    """What Dagster knows of the run a task path serves (read lazily, only where a rule asks)."""

    @property
    def run_id(self) -> str: ...

    @property
    def tags(self) -> Mapping[str, str]: ...

    def parent_tags(self, run_id: str) -> Mapping[str, str] | None:
        """The tags of run ``run_id`` (None: Dagster no longer has it)."""

    def ended_ancestor(self, run_id: str) -> str | None:
        """The failure kind when ``run_id`` is an ancestor of this run that Dagster ended
        FAILURE (``timeout`` or ``error``); else None."""

    def as_of_without_due(self) -> datetime:
        """When a run without a due computes "as of" (see :func:`run_as_of`)."""

    def now(self) -> datetime:
        """The run's clock (the wall clock; the history harness's simulated one)."""


@dataclass(frozen=True)
class TaskRun:
    """What the task body gets: the entry its run claimed, its "as of" instant, and the key of
    the task whose asset runs (the key its side effects are written under)."""

    entry: Entry
    as_of: datetime
    task_key: str
    #: Checks the run's fence in every side effect's transaction: pass it to the domain's
    #: write functions (resources/effects.py).
    guard: EffectGuard

    @property
    def entry_key(self) -> str:
        """A short, stable name for the entry (used in automation logs)."""
        return f"{self.entry.id}:{self.entry.dedup_key}"


@dataclass(frozen=True)
class Prepared:
    """A run that may claim ``entry`` (the claim itself is :func:`claim`'s)."""

    request: EntryRequest
    entry: Entry
    as_of: datetime
    #: The root of the entry's manual-retry lineage (``dueledger/lineage``).
    lineage: int
    #: Tags for the Dagster run (a UI re-execution turned manual retry).
    run_tags: Mapping[str, str] = field(default_factory=dict)
    #: What the path did that the run's log should say.
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Unclaimed:
    """A run the ledger does not let act (``outcome`` refused or skipped): it does nothing,
    its refusal is audited, and the caller ends it (CANCELED, never a silent green) with
    ``run_tags`` on it."""

    outcome: str
    message: str
    entry: Entry | None
    request: EntryRequest
    run_tags: Mapping[str, str]


@dataclass(frozen=True)
class Unsupported:
    """A run of a task the code location does not register (its entry ends unsupported)."""

    request: EntryRequest


@dataclass(frozen=True)
class Fatal:
    """A run that names what does not exist (a retry of a missing entry): it fails, unretried."""

    message: str


@dataclass(frozen=True)
class Waiting:
    """Not yet: the task is busy and its overlap policy says wait, or a retry's backoff has
    not passed. Ask :func:`claim` again; ``reason`` says why, as the run's log shows it."""

    reason: str
    entry: Entry


@dataclass(frozen=True)
class SecondWorker:
    """A second process of one Dagster run (two daemons dequeued it at once, or its worker was
    restarted): the claim is the other process's; acting under it would do the work twice.
    Not canceled: canceling the run would cancel the process that does the work."""

    message: str


@dataclass(frozen=True)
class Claimed:
    """The run holds its entry: work under the heartbeat, every side effect fenced."""

    run: TaskRun
    fence: Fence
    request: EntryRequest
    #: Entries a ``replace`` claim ended (their Dagster runs are the caller's to stop).
    replaced: tuple[Entry, ...]
    #: Tags for the Dagster run: its entry, lineage and source (the Runs filters).
    run_tags: Mapping[str, str]
    message: str


def run_as_of(request: EntryRequest, facts: RunFacts) -> datetime:
    """The instant a run computes "as of": its due, else ``facts.as_of_without_due()`` (when
    its root run was created, or the end of its partition's window when that is earlier).
    Never the wall clock at execution time, so a late or retried run sees the same world."""
    return request.due.at if request.due is not None else facts.as_of_without_due()


def prepare(
    ledger: Ledger, spec: TaskSpec, tasks: Sequence[TaskSpec], facts: RunFacts
) -> Prepared | Unclaimed | Unsupported | Fatal:
    """Steps 1-4 of the module docstring: the entry this run may claim, or why it may not."""
    run = attribute_run(spec, facts.tags, facts.run_id, facts.parent_tags)
    request = run.request
    # A run of another registered task may run here (a renamed asset); a key the code location
    # no longer declares (its plugin removed) may not: the run is unsupported.
    if request.task_key != spec.key and find_task(tasks, request.task_key) is None:
        return Unsupported(request)
    found = entry_of_run(
        ledger,
        spec,
        run,
        run_id=facts.run_id,
        ended_ancestor=facts.ended_ancestor,
        now=facts.now(),
    )
    if found.fatal:
        assert found.refusal is not None
        return Fatal(found.refusal)
    if found.refusal is not None:
        return unclaimed(ledger, found.refusal, found.entry, found.request, facts, found.lineage)
    assert found.entry is not None and found.lineage is not None
    skipped = skip_paused_due(ledger, found.entry, facts.now())
    if skipped is not None and skipped.status == Status.SKIPPED:
        reason = skipped.error or "paused"
        return unclaimed(
            ledger, reason, skipped, found.request, facts, found.lineage, t.OUTCOME_SKIPPED
        )
    as_of = run_as_of(found.request, facts)
    return Prepared(found.request, found.entry, as_of, found.lineage, found.retry_tags, found.notes)


def claim(
    ledger: Ledger, spec: TaskSpec, prepared: Prepared, facts: RunFacts
) -> Claimed | Unclaimed | Waiting | SecondWorker:
    """Step 5: claim the entry under the task's overlap policy (see the module docstring)."""
    run_id, entry, request = facts.run_id, prepared.entry, prepared.request
    if entry.status == Status.RETRYING:
        current = ledger.get(entry.id) or entry
        backoff = retry_backoff_wait(spec, current, facts.tags, facts.now())
        if backoff is not None:
            return Waiting(backoff, current)
    replaced: tuple[Entry, ...] = ()
    if spec.overlap_policy in LEDGER_OVERLAP_POLICIES:
        found = claim_with_overlap(
            ledger,
            entry.id,
            run_id,
            policy=spec.overlap_policy,
            lease_ttl=spec.lease_ttl,
            wait_turn=waits_its_turn(entry),
            now=facts.now(),
        )
        action = found.decision.action
        if action is OverlapAction.WAIT:
            policy = spec.overlap_policy
            reason = f"waits for its turn ({found.decision.reason}; overlap policy {policy})"
            return Waiting(reason, found.entry)
        if action is OverlapAction.SKIP:
            return unclaimed(
                ledger,
                found.decision.reason,
                found.entry,
                request,
                facts,
                prepared.lineage,
                t.OUTCOME_SKIPPED,
            )
        assert found.claim is not None  # CLAIM and REPLACE claim (or refuse, as a claim does)
        result, replaced = found.claim, found.replaced
    else:
        result = ledger.claim(entry.id, run_id, lease_ttl=spec.lease_ttl, now=facts.now())
    if not result.claimed and result.entry.status == Status.DISPATCH_FAILED:
        # The outcome sensor recorded the parent's dispatch failure between our read and
        # the claim: resume once more.
        resumed, _ = resume_dispatch_failed_entry(ledger, result.entry, facts.tags, facts.now())
        if resumed.status == Status.QUEUED:
            result = ledger.claim(resumed.id, run_id, lease_ttl=spec.lease_ttl, now=facts.now())
    if not result.claimed:
        reason = result.reason or f"entry {entry.id}: claim refused, nothing done"
        outcome = t.OUTCOME_SKIPPED if result.entry.status == Status.SKIPPED else None
        return unclaimed(
            ledger,
            reason,
            result.entry,
            request,
            facts,
            prepared.lineage,
            outcome or t.OUTCOME_REFUSED,
        )
    if result.reentrant:
        message = (
            f"entry {entry.id} {spec.key} {request.dedup_key}: run {run_id} already holds it "
            f"in another process; this process does nothing (a second worker of one run)"
        )
        ledger.reject(entry.id, run_id, reason=message, now=facts.now())
        return SecondWorker(message)
    fence = result.fence
    assert fence is not None  # a claimed result names its owner
    claimed = result.entry
    run_tags = {**prepared.run_tags, **_entry_tags(claimed, prepared.lineage)}
    if spec.from_plugin and facts.tags.get(t.TAG_SOURCE) != spec.source:
        run_tags[t.TAG_SOURCE] = spec.source
    message = (
        f"entry {entry.id} {spec.key} {request.dedup_key}: claimed by run {run_id}, "
        f"attempt {claimed.attempt}/{claimed.max_attempts}"
    )
    run = TaskRun(claimed, prepared.as_of, spec.key, LedgerGuard(ledger, fence))
    return Claimed(run, fence, request, replaced, run_tags, message)


def _entry_tags(entry: Entry, lineage: int) -> dict[str, str]:
    """The run's entry and the entry's lineage: the Runs page finds every run of either."""
    return {t.TAG_ENTRY: str(entry.id), t.TAG_LINEAGE: str(lineage)}


def unclaimed(
    ledger: Ledger,
    message: str,
    entry: Entry | None,
    request: EntryRequest,
    facts: RunFacts,
    lineage: int | None,
    outcome: str = t.OUTCOME_REFUSED,
) -> Unclaimed:
    """A run the ledger does not let act: audited once (action ``run_refused`` or
    ``run_skipped``; `dueledger summary` counts refused runs as ``refused_24h`` and skipped
    entries as ``skipped_24h``, apart from failures), with the tags that make it findable."""
    ledger.write_audit(
        operator=request.operator,
        action=_ACTIONS[outcome],
        entry_id=entry.id if entry is not None else None,
        reason=None,
        checks={
            "run_id": facts.run_id,
            "task_key": request.task_key,
            "dedup_key": request.dedup_key,
        },
        outcome=f"{outcome}: {message}",
        now=facts.now(),
    )
    run_tags = {t.TAG_OUTCOME: outcome}
    if entry is not None and lineage is not None:
        run_tags |= _entry_tags(entry, lineage)
    return Unclaimed(outcome, message, entry, request, run_tags)


# --- the end of a claimed run --------------------------------------------------------------------


@dataclass(frozen=True)
class Failed:
    """What a failed attempt came to: the error recorded, the entry's state and failure kind
    after it, and whether the entry is settled (no retry may claim it: turn Dagster's off)."""

    error: str
    status: str
    kind: str | None
    settled: bool


def fail(
    ledger: Ledger,
    claimed: Claimed,
    exc: BaseException,
    *,
    retry_coming: bool,
    now: datetime | None = None,
) -> Failed:
    """The body raised: record the attempt (``retrying`` only while a retry will really come,
    else ``failed``). A :class:`FenceLost` is not this run's failure to record: the entry moved
    on without it (reclaimed while it was paused), and no retry could claim it."""
    entry, run_id = claimed.run.entry, claimed.fence.run_id
    if isinstance(exc, FenceLost):
        return Failed(str(exc), exc.state, None, settled=True)
    error = f"{type(exc).__name__}: {exc}"
    after = ledger.fail(entry.id, run_id, error=error, retry_coming=retry_coming, now=now)
    return Failed(error, after.status, after.failure_kind, settled=after.is_terminal)


def succeed(
    ledger: Ledger, claimed: Claimed, *, lease_lost: bool, now: datetime | None = None
) -> str | None:
    """Record the success; None when recorded, else why the completion was rejected (the work
    was done, but the entry moved on: nothing will re-run it)."""
    entry, request = claimed.run.entry, claimed.request
    if ledger.succeed(entry.id, claimed.fence.run_id, now=now):
        return None
    after = ledger.get(entry.id)
    state = after.status if after else "unknown"
    return (
        f"entry {entry.id} {entry.task_key} {request.dedup_key}: completion rejected, the entry "
        f"is {state} (lease lost: {lease_lost}); the work was done but is not recorded as "
        f"success. Inspect with `dueledger runs show {entry.id}`; nothing will re-run it."
    )


class Heartbeat:
    """Renews the lease from a background thread while the task body works."""

    def __init__(self, ledger: Ledger, entry_id: int, run_id: str, ttl: timedelta) -> None:
        self._ledger, self._entry_id, self._run_id, self._ttl = ledger, entry_id, run_id, ttl
        # Well under the TTL: three missed beats still leave the lease alive.
        self._interval = max(ttl.total_seconds() / 4, 0.5)
        self._stop = threading.Event()
        self.lost = False
        self._thread = threading.Thread(target=self._run, name="dueledger-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                if not self._ledger.heartbeat(self._entry_id, self._run_id, lease_ttl=self._ttl):
                    self.lost = True
                    return
            except Exception:  # a blip must not kill the run; the next beat retries
                continue

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
