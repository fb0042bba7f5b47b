"""Fencing tokens: a side effect commits only while its run still holds its ledger entry.

A claim hands the run a :class:`Fence` -- its entry, itself as the lease owner, and the
entry's claim generation (a counter every successful claim increments, so the token of an
earlier claim never matches a later one). A run that lost its lease (paused past the TTL and
reclaimed, or overtaken) may still be executing; the fence is how its side effects are
stopped after the ledger said the run was over.

A store that writes a side effect asks an :class:`EffectGuard` to verify the fence as the
last statement of the effect's own transaction; the guard raises :class:`FenceLost` (the
transaction then rolls back) and traces the refusal on the entry. The guard that checks the
real ledger is ``resources/ledger/guard.py``; the transaction helper is
``resources/effects.py``. Dagster-free, database-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Fence:
    """What a run holds while it may act: ``entry_id``, owned by ``run_id`` under ``token``.

    ``token`` is the entry's claim generation at this run's claim.
    """

    entry_id: int
    run_id: str
    token: int

    def describe(self) -> str:
        return f"entry {self.entry_id} (run {self.run_id}, claim {self.token})"


class FenceLost(RuntimeError):
    """A side effect was refused because its run no longer holds its ledger entry.

    Raised inside the effect's transaction, so nothing of the effect is committed.
    ``state`` says what holds the entry now (for the message and the trace).
    """

    def __init__(self, fence: Fence, effect: str, state: str) -> None:
        self.fence, self.effect, self.state = fence, effect, state
        super().__init__(
            f"side effect {effect!r} refused: run {fence.run_id} no longer holds ledger "
            f"entry {fence.entry_id} (claim {fence.token}); the entry is {state}. Nothing of "
            f"this effect was committed. Inspect with `dueledger runs show {fence.entry_id}`."
        )


class EffectGuard(Protocol):
    """Checks a run's fence inside a side effect's transaction (see the module docstring)."""

    def verify(self, conn: Any, effect: str) -> None:
        """Raise :class:`FenceLost` unless the run still holds its entry.

        ``conn`` is the effect's open transaction (a SQLAlchemy connection); when the ledger
        lives in the same database the check runs on it, atomically with the effect.
        """
        ...

    def refused(self, lost: FenceLost) -> None:
        """Trace a refused effect on the entry; called after the effect rolled back."""
        ...
