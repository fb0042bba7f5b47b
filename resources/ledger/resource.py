"""``RunLedger``: the run ledger as a Dagster resource.

It joins the read side (``queries.py``) and the compare-and-set write side
(``transitions.py``) over the shared plumbing (``store.py``).
"""

from __future__ import annotations

import dagster as dg

from resources.ledger.queries import LedgerQueries
from resources.ledger.transitions import LedgerTransitions


class RunLedger(LedgerTransitions, LedgerQueries):
    """The run ledger (see ``resources/ledger/__init__.py`` and docs/ledger.md).

    No database I/O happens when the resource is defined: the engine is created on first use
    and the schema is applied by :meth:`migrate`.
    """

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.dispose()
