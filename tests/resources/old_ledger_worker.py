"""A run worker of an OLD dueledger, for tests/resources/test_ledger_rolling_upgrade.py.

Run with an old commit's code first on ``PYTHONPATH`` (``git archive``), against a ledger
today's code already migrated: ``python old_ledger_worker.py URL``. It does what a run
worker does through the old code's own ``RunLedger`` -- claim, heartbeat, a fenced side
effect (when that code has fencing), succeed; a duplicate refused; a failed attempt left
``retrying`` for a newer worker to take; a lease left running for a newer reclaim; a reclaim
of a newer worker's expired lease -- and prints what happened as one JSON object. It also
says what the old code's own ``migrate()`` made of the newer schema.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

D0 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
TTL = timedelta(minutes=5)


def main(url: str) -> dict[str, Any]:
    import resources
    import resources.ledger as L

    code = Path(resources.__file__).resolve().parent.parent
    out: dict[str, Any] = {"code": str(code)}
    ledger = L.RunLedger(database_url=url)
    try:
        ledger.migrate()
        out["migrate"] = "ok"
    except Exception as exc:  # what the old code says about a newer schema, reported
        out["migrate"] = f"{type(exc).__name__}: {exc}"

    def due(minutes: int) -> str:
        return L.dedup_key_for_due(D0 + timedelta(minutes=minutes))

    e1 = ledger.ensure_entry(task_key="order_cleanup", trigger="schedule", dedup_key=due(0), now=D0)
    first = ledger.claim(e1.id, "old-1", lease_ttl=TTL, now=D0)
    out["claimed"] = first.claimed
    out["heartbeat"] = ledger.heartbeat(
        e1.id, "old-1", lease_ttl=TTL, now=D0 + timedelta(minutes=1)
    )
    try:
        from resources.effects import effect_transaction
        from resources.ledger.guard import LedgerGuard
    except ImportError:  # before fencing (revision 0002 and older)
        out["fenced_effect"] = "no fencing in this code"
    else:
        engine = sa.create_engine(url)
        table = sa.Table("rolling_effects", sa.MetaData(), sa.Column("what", sa.String(50)))
        table.create(engine, checkfirst=True)
        with effect_transaction(engine, LedgerGuard(ledger, first.fence), "old effect") as conn:
            conn.execute(sa.insert(table).values(what="by old-1"))
        engine.dispose()
        out["fenced_effect"] = "committed"
    out["duplicate_refused"] = not ledger.claim(e1.id, "old-2", lease_ttl=TTL, now=D0).claimed
    out["succeeded"] = ledger.succeed(e1.id, "old-1", now=D0 + timedelta(minutes=2))

    e2 = ledger.ensure_entry(
        task_key="order_cleanup", trigger="schedule", dedup_key=due(15), max_attempts=2, now=D0
    )
    assert ledger.claim(e2.id, "old-3", lease_ttl=TTL, now=D0).claimed
    out["failed_to"] = ledger.fail(e2.id, "old-3", error="old worker failed", now=D0).status

    e4 = ledger.ensure_entry(
        task_key="order_cleanup", trigger="schedule", dedup_key=due(45), now=D0
    )
    later = D0 + timedelta(minutes=30)  # its lease outlives the reclaim below
    out["left_running"] = ledger.claim(e4.id, "old-4", lease_ttl=TTL, now=later).claimed

    reclaimed = ledger.reclaim_expired(now=D0 + timedelta(minutes=20))
    out["reclaimed"] = sorted(e.dedup_key for e in reclaimed)
    out["entries"] = {e.dedup_key: e.id for e in (e1, e2, e4)}
    ledger.dispose()
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
