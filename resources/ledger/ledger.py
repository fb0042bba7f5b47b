"""``Ledger``: the run ledger's operations, one type, no Dagster.

It joins the read side (``queries.py``), the compare-and-set write side
(``transitions.py``), the alert delivery records (``deliveries.py``) and the metrics scrape's
queries (``scrape_queries.py``) over the shared plumbing (``store.py``): four groups of methods
over one connection pool, each in the module of its own tables and tests. A rule whose
transaction spans more than these (a pause and its audit, an overlap claim) writes it in its
own module through the store's public ``connect``/``apply``, so the rule and its transaction
read together. The services take a ``Ledger``. Two kinds are made: :meth:`Ledger.open` for a
command or a script (`dueledger runs list` loads no Dagster), and ``RunLedger``
(``resource.py``), the same ledger as the code location's Dagster resource.
"""

from __future__ import annotations

import resources.ledger.memo as memo
from resources.ledger.deliveries import LedgerAlertDeliveries
from resources.ledger.engine import Runtime
from resources.ledger.queries import LedgerQueries
from resources.ledger.scrape_queries import LedgerMetricsQueries
from resources.ledger.transitions import LedgerTransitions

#: How long a statement waits for a lock, by default (milliseconds).
DEFAULT_BUSY_TIMEOUT_MS = 30_000


class Ledger(
    LedgerTransitions,
    LedgerQueries,
    LedgerAlertDeliveries,
    LedgerMetricsQueries,
):
    """The run ledger (see ``resources/ledger/__init__.py`` and docs/ledger.md).

    No database I/O happens when a ledger is made: the engine is created on first use.
    """

    @staticmethod
    def open(
        database_url: str | None = None, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS
    ) -> Ledger:
        """The ledger at ``database_url`` (None: the settings decide, as for the resource)."""
        return _OpenedLedger(database_url, busy_timeout_ms)

    def ensure_migrated(self) -> None:
        """Apply the migrations unless this process already did for this database URL.

        Safe from many threads (one migrates, the others wait) and after a fork (the child
        checks once for itself). Use :meth:`migrate` to check again unconditionally.
        """
        memo.migrate_once(self.url, self.migrate)


class _OpenedLedger(Ledger):
    """A ledger made by :meth:`Ledger.open`: its configuration in plain attributes."""

    def __init__(self, database_url: str | None, busy_timeout_ms: int) -> None:
        self.database_url = database_url
        self.busy_timeout_ms = busy_timeout_ms
        self._runtime: Runtime | None = None

    def _current_runtime(self) -> Runtime | None:
        return self._runtime

    def _keep_runtime(self, runtime: Runtime | None) -> None:
        self._runtime = runtime
