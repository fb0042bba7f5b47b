"""The transaction every domain side effect is written in: fenced by its run's claim.

``effect_transaction(engine, guard, "cancel orders")`` is ``engine.begin()`` whose last
statement, right before the commit, is the guard's fence check
(``resources/core/fence.py``): when the run no longer holds its ledger entry -- paused past
its lease and reclaimed, say -- the check raises :class:`FenceLost`, the transaction rolls
back (nothing of the effect is committed) and the refusal is traced on the entry.

``guard=None`` writes unfenced. Only callers that act outside a claimed run pass it (the
domain rules' own tests, benchmarks); every task asset passes its run's guard.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import sqlalchemy as sa

from resources.core.fence import EffectGuard, FenceLost


@contextlib.contextmanager
def effect_transaction(
    engine: sa.Engine, guard: EffectGuard | None, effect: str
) -> Iterator[sa.Connection]:
    """A transaction on ``engine`` for side effect ``effect``, committed only while ``guard``'s
    run still holds its entry (see the module docstring); raises FenceLost otherwise."""
    if guard is None:
        with engine.begin() as conn:
            yield conn
        return
    try:
        with engine.begin() as conn:
            yield conn
            guard.verify(conn, effect)
    except FenceLost as lost:
        # After the rollback: on a shared SQLite file the trace needs the write lock that the
        # effect's transaction held.
        guard.refused(lost)
        raise


def verify_fence(guard: EffectGuard | None, effect: str) -> None:
    """Check the fence outside any transaction, for an effect no transaction can contain (a
    delivery to an external channel): right before it starts. Raises FenceLost, traced."""
    if guard is None:
        return
    try:
        guard.verify(None, effect)
    except FenceLost as lost:
        guard.refused(lost)
        raise
