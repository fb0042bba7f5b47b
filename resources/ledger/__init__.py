"""The run ledger: one row per logical execution request, with leases, retries and lineage.

``RunLedger`` is a Dagster resource over SQLAlchemy Core that behaves the same on SQLite
(local default) and PostgreSQL (production). It enforces the ledger rules:

- an entry is created insert-or-ignore on ``(task_key, origin, dedup_key)``, so a due, a
  manual request or a retry can exist once only;
- a run *claims* its entry (``queued|retrying -> running``) by one conditional UPDATE, with a
  lease it renews by heartbeat; everything else is a late or duplicate run, recorded in the
  entry's ``summary.late_job_rejections`` and otherwise ignored;
- terminal states (``success``, ``failed``) are never overwritten; rows are never deleted.

Where each part lives:

- ``resources/core/entry.py`` — the entry as a value, its vocabulary (statuses, triggers,
  failure kinds, origins as enums; claimable statuses, limits) and the dedup-key helpers;
- ``rules.py`` — the state changes as pure functions over an entry (what a compare-and-set
  writes, or why it may not);
- ``schema.py`` — the tables; ``migrations/`` — the Alembic revisions that create them;
- ``model.py`` — ``Entry``, ``ClaimResult``, the errors, time and summary helpers;
- ``statements.py`` — the prebuilt SQL per dialect;
- ``engine.py`` — engine creation, connections, the raw-DBAPI hot path on psycopg2, errors;
- ``migrate.py`` — the Alembic runner; ``memo.py`` — the once-per-process memo of migrated
  databases;
- ``store.py`` — configuration and per-process plumbing (fork handling);
- ``queries.py`` — the read side; ``transitions.py`` — the compare-and-set state changes;
- ``deliveries.py`` — the alert delivery records (each alert reaches each channel once);
  ``scrape_queries.py`` — the indexed reads of a metrics scrape; ``guard.py`` — the fence
  check every side effect's transaction ends with;
- ``ledger.py`` — ``Ledger``, all of the above as one type (``Ledger.open(url)`` for a
  command or script: no Dagster); ``resource.py`` — ``RunLedger``, the same ledger as a
  Dagster resource, which migrates once per process at set-up.

Times: the API takes and returns timezone-aware UTC datetimes; the database stores them
timezone-naive in UTC. Every operation takes ``now=`` so tests and callers inject the clock.
"""

from typing import TYPE_CHECKING, Any

from resources.ledger.deliveries import DeliveryRecord
from resources.ledger.ledger import Ledger
from resources.ledger.model import (
    ClaimResult,
    LedgerConfigError,
    LedgerConflict,
    LedgerError,
    UnknownEntryError,
)

if TYPE_CHECKING:
    from resources.ledger.resource import RunLedger


def __getattr__(name: str) -> Any:
    if name == "RunLedger":
        # The Dagster resource, imported on first use (PEP 562): a command that only reads
        # the ledger (`dueledger runs list`) must not pay for importing Dagster.
        from resources.ledger.resource import RunLedger

        return RunLedger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ClaimResult",
    "DeliveryRecord",
    "Ledger",
    "LedgerConfigError",
    "LedgerConflict",
    "LedgerError",
    "RunLedger",
    "UnknownEntryError",
]
