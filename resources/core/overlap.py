"""What a run does when its task is already at work: the overlap decision (pure).

DESIGN: overlap ``queue`` | ``skip`` | ``buffer_one`` | ``replace`` | ``allow``. ``queue`` is
Dagster's pool of one slot per task (later runs wait in the run queue) and ``allow`` is no
limit; the other three are decided here, when a run claims its entry, for every launch path
alike (a schedule tick, a sensor, the launchpad, Materialize, a backfill, `dueledger launch`,
a manual retry), because every task run claims through the same wrapper.

The store (``resources/ledger/overlap.py``) calls :func:`decide_overlap` inside one
transaction that holds the task's lock row, with the task's entries in progress (``running``,
or ``retrying``: a retry of it is coming) and its live waiter, and applies the answer in
the same transaction; the service (``orchestration/services/overlap.py``) acts on it.

- ``skip``: a run whose task is in progress is not run: its entry ends ``skipped`` with the
  reason ``overlap: entry N running``.
- ``buffer_one``: the first such run waits (its run polls until the task is free, then
  claims); any further one while it waits ends ``skipped``, ``overlap: entry M already
  waiting``.
- ``replace``: the new run claims, and the entry in progress ends ``failed``, kind
  ``replaced``, naming the new entry.

A run an operator asked to wait for its turn (``dueledger launch --queue``, a manual retry,
``dueledger catch-up``) waits under ``skip`` and ``buffer_one`` instead of being skipped.
An attempt of an entry that already ran once (a retry) claims without asking: it is the same
logical execution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from orchestration.task_spec import OverlapPolicy

#: The summary key of an entry whose run waits for its turn under any overlap policy.
SUMMARY_OVERLAP: Final = "overlap"
OVERLAP_WAIT_TURN: Final = "queue"


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


def decide_overlap(
    policy: str,
    entry_id: int,
    in_progress: Sequence[int],
    waiter: int | None,
    *,
    wait_turn: bool = False,
) -> OverlapDecision:
    """The decision for entry ``entry_id`` of a task with overlap ``policy``.

    ``in_progress``: the task's other entries that are running or retrying, oldest first;
    ``waiter``: the entry whose run waits for its turn now (buffer_one), if any;
    ``wait_turn``: an operator asked this entry to wait for its turn.
    """
    others = [e for e in in_progress if e != entry_id]
    if not others or policy not in (
        OverlapPolicy.SKIP,
        OverlapPolicy.BUFFER_ONE,
        OverlapPolicy.REPLACE,
    ):
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
