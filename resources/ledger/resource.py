"""``RunLedger``: the run ledger as a Dagster resource.

It joins the read side (``queries.py``), the compare-and-set write side
(``transitions.py``), the alert delivery records (``deliveries.py``), the metrics scrape's
queries (``metrics.py``), schedules and pauses (``scheduling.py``) and the overlap claims and
skipped entries (``overlap.py``) over the shared plumbing (``store.py``), and migrates the schema
once per process when Dagster sets the resource up for a run or a sensor tick.
"""

from __future__ import annotations

import dagster as dg

import resources.ledger.migrate as migrations
from resources.ledger.deliveries import LedgerAlertDeliveries
from resources.ledger.metrics import LedgerMetricsQueries
from resources.ledger.overlap import LedgerOverlap
from resources.ledger.queries import LedgerQueries
from resources.ledger.scheduling import LedgerScheduling
from resources.ledger.transitions import LedgerTransitions


class RunLedger(
    LedgerTransitions,
    LedgerQueries,
    LedgerAlertDeliveries,
    LedgerScheduling,
    LedgerMetricsQueries,
    LedgerOverlap,
):
    """The run ledger (see ``resources/ledger/__init__.py`` and docs/ledger.md).

    No database I/O happens when the resource is defined: the engine is created on first use.
    When Dagster sets the resource up (every run and sensor tick) the schema is brought to
    head once per process and database (:meth:`ensure_migrated`); a ledger built by hand
    calls :meth:`ensure_migrated` or :meth:`migrate` itself.
    """

    def ensure_migrated(self) -> None:
        """Apply the migrations unless this process already did for this database URL.

        Safe from many threads (one migrates, the others wait) and after a fork (the child
        checks once for itself). Use :meth:`migrate` to check again unconditionally.
        """
        migrations.migrate_once(self.url, self.migrate)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self.ensure_migrated()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.dispose()
