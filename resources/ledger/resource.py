"""``RunLedger``: the run ledger (``ledger.py``) as the code location's Dagster resource.

Its configuration is Dagster config (``database_url``, ``busy_timeout_ms``); it migrates the
schema once per process when Dagster sets the resource up for a run or a sensor tick.
"""

from __future__ import annotations

import dagster as dg
from pydantic import Field, PrivateAttr

from resources.core.settings import ENV_DATABASE_URL
from resources.ledger.engine import Runtime
from resources.ledger.ledger import DEFAULT_BUSY_TIMEOUT_MS, Ledger


class RunLedger(Ledger, dg.ConfigurableResource):
    """The run ledger as a Dagster resource (see :class:`Ledger`).

    No database I/O happens when the resource is defined: the engine is created on first use.
    When Dagster sets the resource up (every run and sensor tick) the schema is brought to
    head once per process and database (:meth:`ensure_migrated`); a ledger built by hand
    calls :meth:`ensure_migrated` or :meth:`migrate` itself.
    """

    database_url: str | None = Field(
        default=None,
        description=(
            "SQLAlchemy URL of the ledger database (sqlite:/// or postgresql+psycopg2://). "
            f"None: resources.core.settings decides ({ENV_DATABASE_URL}, else a SQLite file "
            "under DAGSTER_HOME)."
        ),
    )
    busy_timeout_ms: int = Field(
        default=DEFAULT_BUSY_TIMEOUT_MS,
        description=(
            "How long to wait for a lock: SQLite busy timeout, PostgreSQL lock_timeout "
            "(milliseconds)."
        ),
    )

    # Everything built on first use, in one object: one attribute lookup on the hot path.
    _runtime: Runtime | None = PrivateAttr(default=None)

    def _current_runtime(self) -> Runtime | None:
        # Read through __pydantic_private__ (where pydantic keeps private attributes): plain
        # ``self._runtime`` fails the normal lookup first and lands in BaseModel.__getattr__,
        # about 6 us, paid on every ledger call (bench/ledger_claims.py).
        private = self.__pydantic_private__
        return private.get("_runtime") if private else self._runtime

    def _keep_runtime(self, runtime: Runtime | None) -> None:
        self._runtime = runtime

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self.ensure_migrated()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.dispose()
