"""The ledger's :class:`~resources.core.fence.EffectGuard`: a run's fence checked against the
real ledger, inside the side effect's own transaction.

Two ways, chosen per effect transaction by where the effect is written:

- **Same database** as the ledger (the production layout: ledger and source data on one
  PostgreSQL database, or one SQLite file): the check is a statement of the effect's own
  transaction -- ``SELECT ... FOR SHARE`` on PostgreSQL, which makes a concurrent reclaim wait
  until the effect has committed or rolled back; on SQLite the effect's transaction already
  holds the database write lock. Either the effect commits while the run holds its entry, or
  nothing of it commits: atomic.
- **Another database**: the ledger is asked on its own connection immediately before the
  effect's commit. A reclaim that lands between that answer and the commit is not caught;
  the window is one round trip (docs/operations.md, "Fenced side effects").

A refused effect is traced on the entry (``summary.late_job_rejections``, action
``side_effect``) after its transaction rolled back, so the trace never waits on the lock the
effect held.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

from sqlalchemy.engine import URL, Connection, Engine, make_url

from resources.core.entry import Status
from resources.core.fence import Fence, FenceLost
from resources.ledger.ledger import Ledger

# In-memory SQLite databases are private to their connection: never "the same" as another.
_PRIVATE = itertools.count()


def database_identity(url: URL | str) -> tuple[str, ...]:
    """What names one database whatever the URL's spelling: the backend, and the resolved
    file of a SQLite database or the host, port and name of a server database."""
    parsed = make_url(url) if isinstance(url, str) else url
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        path = parsed.database or ""
        if path in ("", ":memory:") or path.startswith("file:"):
            return (backend, f"memory:{next(_PRIVATE)}")  # never the same as anything else
        return (backend, os.path.realpath(path))
    return (backend, parsed.host or "", str(parsed.port or ""), parsed.database or "")


class LedgerGuard:
    """Checks ``fence`` against ``ledger`` (see the module docstring)."""

    def __init__(self, ledger: Ledger, fence: Fence) -> None:
        self.ledger, self.fence = ledger, fence
        self._ledger_db = database_identity(ledger.url)

    def shares_database_with(self, bind: Connection | Engine) -> bool:
        """Is ``bind`` (a connection or an engine) on the ledger's own database?"""
        engine = bind.engine if isinstance(bind, Connection) else bind
        return database_identity(engine.url) == self._ledger_db

    def verify(self, conn: Any, effect: str) -> None:
        if isinstance(conn, Connection) and self.shares_database_with(conn):
            held = self.ledger.holds(self.fence, connection=conn)
        else:
            held = self.ledger.holds(self.fence)
        if not held:
            raise FenceLost(self.fence, effect, self._state())

    def refused(self, lost: FenceLost) -> None:
        self.ledger.record_fenced_effect(lost.fence, effect=lost.effect)

    def _state(self) -> str:
        entry = self.ledger.get(self.fence.entry_id)
        if entry is None:
            return "gone"
        if entry.status == Status.RUNNING:
            return f"running under run {entry.lease_owner} (claim {entry.claim_generation})"
        if entry.failure_kind:
            return f"{entry.status} ({entry.failure_kind})"
        return entry.status


__all__ = ["LedgerGuard", "database_identity"]
