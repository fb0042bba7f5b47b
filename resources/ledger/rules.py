"""The ledger rules as pure functions over an entry's state.

Each state change is a function from the entry as it is (and the caller's inputs) to a
:class:`Decision`: the columns to write, or why nothing may change. No database, no clock,
no Dagster: tests can walk every state through every operation in memory.

The store (``resources/ledger/transitions.py``) applies a decision as one compare-and-set
``UPDATE ... WHERE id = :id AND status IN (<the rule's from-statuses>) [AND lease_owner =
:run]``, so a write that lost a race changes nothing. Its hot path (claim, heartbeat,
succeed, fail) goes straight to that UPDATE; when the UPDATE matches no row it loads the
entry and asks the rule here for the reason it records.
``tests/resources/test_ledger_properties.py`` drives random interleavings of operations
through the store on a real database and holds every answer against a model of these
rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Protocol

from resources.core.entry import CLAIMABLE_STATUSES, DISPATCHABLE_STATUSES, FailureKind, Status
from resources.core.fence import Fence
from resources.core.instants import iso

#: From-statuses of each operation: the WHERE clause of its compare-and-set.
CLAIM_FROM: Final = CLAIMABLE_STATUSES
OWNER_FROM: Final = (Status.RUNNING,)  # heartbeat, succeed, fail (and the owner's lease)
DISPATCH_FAILURE_FROM: Final = DISPATCHABLE_STATUSES
REDISPATCH_FROM: Final = (Status.DISPATCH_FAILED,)
SETTLE_FROM: Final = (Status.RUNNING, Status.RETRYING)
#: An entry not run (overlap, pause) ends ``skipped`` from a state no run has claimed yet.
SKIP_FROM: Final = (Status.QUEUED,)


class EntryState(Protocol):
    """What the rules read of an entry (``resources.ledger.Entry`` is one)."""

    @property
    def id(self) -> int: ...
    @property
    def label(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def run_ids(self) -> Sequence[str]: ...
    @property
    def lease_owner(self) -> str | None: ...
    @property
    def lease_expires_at(self) -> datetime | None: ...
    @property
    def heartbeat_at(self) -> datetime | None: ...
    @property
    def failure_kind(self) -> str | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def manual_retry_at(self) -> datetime | None: ...
    @property
    def claim_generation(self) -> int: ...


@dataclass(frozen=True)
class Decision:
    """A rule's answer: ``changes`` to write (possibly none: already so), or ``refusal``."""

    changes: Mapping[str, Any] = field(default_factory=dict)
    refusal: str | None = None

    @property
    def allowed(self) -> bool:
        return self.refusal is None


def _refused(reason: str) -> Decision:
    return Decision(refusal=reason)


def format_duration(delta: timedelta) -> str:
    """A short human duration such as ``2h 05m 13s`` (negative values read as ``0s``)."""
    total = max(0, int(delta.total_seconds()))
    hours, rest = divmod(total, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {seconds:02d}s"
    if minutes:
        return f"{minutes}m {seconds:02d}s"
    return f"{seconds}s"


# --- wording -------------------------------------------------------------------------------


def who(entry: EntryState) -> str:
    return f"entry {entry.id} {entry.label}"


def state_words(entry: EntryState) -> str:
    """The entry's state in words, for rejection reasons."""
    if entry.status == Status.RUNNING:
        until = iso(entry.lease_expires_at, micro=True)
        return f"running under run {entry.lease_owner} (lease until {until})"
    if entry.status == Status.FAILED and entry.failure_kind:
        return f"failed ({entry.failure_kind})"
    return entry.status


def claim_refusal(entry: EntryState) -> str:
    """Why ``entry`` cannot be claimed, as one sentence."""
    subject = who(entry)
    if entry.status == Status.SUCCESS:
        return f"{subject} is already success: duplicate run, nothing done"
    if entry.status == Status.FAILED:
        return (
            f"{subject} is already {state_words(entry)}: late run, nothing done; another "
            f"attempt needs a manual retry (dueledger runs retry {entry.id})"
        )
    if entry.status == Status.RUNNING:
        return f"{subject} is already {state_words(entry)}: duplicate run, nothing done"
    if entry.status == Status.DISPATCH_FAILED:
        return f"{subject} is dispatch_failed: it must be re-dispatched before a run may claim it"
    if entry.status == Status.SKIPPED:
        return f"{subject} was skipped ({entry.error or 'no reason recorded'}): nothing done"
    if entry.status in CLAIMABLE_STATUSES:
        return (
            f"{subject} is {entry.status} but its attempts are exhausted "
            f"({entry.attempt} of {entry.max_attempts} used): nothing done"
        )
    return f"{subject} has unknown status {entry.status!r}: nothing done"


def _owns(entry: EntryState, run_id: str) -> bool:
    return entry.status in OWNER_FROM and entry.lease_owner == run_id


# --- the rules -----------------------------------------------------------------------------


def claim(entry: EntryState, run_id: str, *, now: datetime, lease_ttl: timedelta) -> Decision:
    """Rule 1: ``queued|retrying -> running`` with a lease, counting the attempt.

    Re-entrant for the lease owner (allowed, nothing to change). Refused for anything else,
    including a claimable entry whose attempts are used up.
    """
    if _owns(entry, run_id):
        return Decision()
    if entry.status in CLAIM_FROM and entry.attempt < entry.max_attempts:
        return Decision(
            {
                "status": Status.RUNNING,
                "attempt": entry.attempt + 1,
                "claim_generation": entry.claim_generation + 1,
                "lease_owner": run_id,
                "lease_expires_at": now + lease_ttl,
                "heartbeat_at": now,
                "started_at": now,
                "updated_at": now,
                "run_ids": (*entry.run_ids, run_id),
            }
        )
    return _refused(claim_refusal(entry))


def heartbeat(entry: EntryState, run_id: str, *, now: datetime, lease_ttl: timedelta) -> Decision:
    """Only the owner of a running entry extends its lease, to ``now + lease_ttl``."""
    if not _owns(entry, run_id):
        return _refused(
            f"heartbeat from run {run_id}: {who(entry)} is {state_words(entry)}; "
            f"the run no longer owns the entry and must stop its side effects"
        )
    return Decision({"lease_expires_at": now + lease_ttl, "heartbeat_at": now, "updated_at": now})


def succeed(entry: EntryState, run_id: str, *, now: datetime) -> Decision:
    """``running -> success`` for the lease owner, lease cleared; a late completion is refused."""
    if not _owns(entry, run_id):
        return _refused(
            f"late completion from run {run_id}: {who(entry)} is {state_words(entry)}; "
            f"nothing changed"
        )
    return Decision(
        {
            "status": Status.SUCCESS,
            "lease_owner": None,
            "lease_expires_at": None,
            "finished_at": now,
            "updated_at": now,
        }
    )


def holds(entry: EntryState, fence: Fence, *, effect: str) -> Decision:
    """Rule 1's fence: may the run behind ``fence`` commit side effect ``effect`` now?

    Only while the entry is still ``running`` under the fence's run and claim generation;
    a paused run that was reclaimed, overtaken or finished is refused (nothing to change
    either way: the refusal is traced by the store).
    """
    if _owns(entry, fence.run_id) and entry.claim_generation == fence.token:
        return Decision()
    return _refused(
        f"side effect {effect!r} of run {fence.run_id} (claim {fence.token}) refused: "
        f"{who(entry)} is {state_words(entry)} (claim {entry.claim_generation}); the run lost "
        f"its lease, so nothing of the effect was committed"
    )


def will_retry(entry: EntryState, kind: str, *, retry_coming: bool = True) -> bool:
    """A failed attempt is retried while attempts are left and a retry will really come
    (``retry_coming``: Dagster will launch one), never for an unsupported task."""
    return (
        retry_coming and entry.attempt < entry.max_attempts and kind != FailureKind.UNSUPPORTED_TASK
    )


def fail(
    entry: EntryState,
    run_id: str,
    *,
    kind: str,
    error: str,
    now: datetime,
    retry_coming: bool = True,
) -> Decision:
    """The owner's run failed: ``running -> retrying`` with attempts left and a retry coming
    (``retrying`` only while a retry will really come), else ``failed``.

    A retrying entry is not finished: only the last attempt stamps ``finished_at``.
    """
    if not _owns(entry, run_id):
        text = error.strip()
        first_line = text.splitlines()[0][:200] if text else ""
        return _refused(
            f"late failure report from run {run_id} ({kind}: {first_line}): "
            f"{who(entry)} is {state_words(entry)}; nothing changed"
        )
    retry = will_retry(entry, kind, retry_coming=retry_coming)
    changes: dict[str, Any] = {
        "status": Status.RETRYING if retry else Status.FAILED,
        "failure_kind": kind,
        "error": error,
        "lease_owner": None,
        "lease_expires_at": None,
        "updated_at": now,
    }
    if not retry:
        changes["finished_at"] = now
    return Decision(changes)


def dispatch_failure(entry: EntryState, *, error: str, now: datetime) -> Decision:
    """Rule 5: a failed launch moves ``queued|retrying|dispatch_failed -> dispatch_failed``.

    Not a business failure (kind ``dispatch``). A running or terminal entry is refused: the
    failed launch was a duplicate, and the entry's own run decides its outcome.
    """
    if entry.status not in DISPATCH_FAILURE_FROM:
        return _refused(f"{who(entry)} is {state_words(entry)}: the failed launch was a duplicate")
    return Decision(
        {
            "status": Status.DISPATCH_FAILED,
            "failure_kind": FailureKind.DISPATCH,
            "error": error,
            "updated_at": now,
        }
    )


def redispatch(entry: EntryState, *, now: datetime) -> Decision:
    """``dispatch_failed -> queued`` with the attempt count reset; refused once a manual retry
    has been made of the entry (its child runs instead)."""
    if entry.status not in REDISPATCH_FROM:
        return _refused(f"{who(entry)} is {state_words(entry)}, not dispatch_failed")
    if entry.manual_retry_at is not None:
        return _refused(f"{who(entry)} has a manual retry; its child runs instead")
    return Decision({"status": Status.QUEUED, "attempt": 0, "updated_at": now})


def settle_unretried(
    entry: EntryState, run_id: str, *, kind: str, error: str, now: datetime
) -> Decision:
    """Dagster ended ``run_id`` and will not retry it: its entry becomes ``failed``.

    Two cases: ``running`` with ``run_id`` as lease owner (the run died without recording
    its outcome; ``kind``/``error`` are set even with attempts left, because no retry run
    will come to use them), and ``retrying`` whose latest run is ``run_id`` (the retry it
    waits for will never be launched; the run's own error and kind are kept, unless it has
    none). Anything else -- terminal, another run's lease, a run that never claimed -- is
    refused.
    """
    owned = _owns(entry, run_id)
    waiting = (
        entry.status == Status.RETRYING and bool(entry.run_ids) and entry.run_ids[-1] == run_id
    )
    if not (owned or waiting):
        return _refused(f"{who(entry)} is {state_words(entry)}: not waiting on run {run_id}")
    changes: dict[str, Any] = {
        "status": Status.FAILED,
        "lease_owner": None,
        "lease_expires_at": None,
        "finished_at": now,
        "updated_at": now,
    }
    if owned or not entry.error:
        changes.update(failure_kind=kind, error=error)
    return Decision(changes)


def skip(entry: EntryState, *, reason: str, now: datetime) -> Decision:
    """``queued -> skipped``: the entry is not run, on purpose (overlap, a pause), and its
    ``error`` text says why (``overlap: entry 12 running``). Terminal: nothing claims it."""
    if entry.status not in SKIP_FROM:
        return _refused(f"{who(entry)} is {state_words(entry)}: only a queued entry is skipped")
    return Decision(
        {
            "status": Status.SKIPPED,
            "error": reason,
            "finished_at": now,
            "updated_at": now,
        }
    )
