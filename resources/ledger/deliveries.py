"""Alert delivery records in the ledger database: each alert reaches each channel once.

One row per ``(channel, kind, subject)`` (table ``dueledger_alert_deliveries``, migration
0003). The protocol, every step one autocommit statement:

1. :meth:`record_alert` inserts a ``pending`` row per channel, insert-or-ignore: emitting the
   same alert again (a re-evaluated tick, the CLI and the sensor both) adds nothing.
2. :meth:`claim_alert_attempt` takes one attempt by compare-and-set: only a row that is not
   delivered and is due (``next_attempt_at <= now``) is claimed; ``attempts`` goes up and
   ``next_attempt_at`` moves past the attempt's lease, so no other process attempts it
   meanwhile. A process that dies mid-attempt leaves it to be retried after the lease.
3. :meth:`finish_alert_attempt` settles it: ``delivered`` (never overwritten), or ``failed``
   with the error and the next attempt's time (None once the attempts are used up).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from resources.core.alerting import (
    DELIVERY_DELIVERED,
    DELIVERY_FAILED,
    DELIVERY_PENDING,
    MAX_SUBJECT_CHARS,
)
from resources.core.instants import iso
from resources.ledger.model import check_id, from_db, to_db, truncate_error
from resources.ledger.schema import alert_deliveries
from resources.ledger.store import LedgerStore

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

#: Rows one listing or one retry sweep reads at most.
MAX_DELIVERY_ROWS: Final = 500
_OPEN = (DELIVERY_PENDING, DELIVERY_FAILED)


@dataclass(frozen=True)
class DeliveryRecord:
    """One alert's delivery to one channel, as stored (times timezone-aware UTC)."""

    id: int
    channel: str
    kind: str
    subject: str
    status: str
    attempts: int
    payload: dict[str, Any] = field(hash=False)
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    last_attempt_at: datetime | None
    next_attempt_at: datetime | None
    delivered_at: datetime | None

    @property
    def gave_up(self) -> bool:
        """Failed with no attempt left: nothing will retry it."""
        return self.status == DELIVERY_FAILED and self.next_attempt_at is None

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "channel": self.channel,
            "kind": self.kind,
            "subject": self.subject,
            "status": self.status,
            "attempts": self.attempts,
            "gave_up": self.gave_up,
            "last_error": self.last_error,
            "created_at": iso(self.created_at, micro=True),
            "updated_at": iso(self.updated_at, micro=True),
            "last_attempt_at": iso(self.last_attempt_at, micro=True),
            "next_attempt_at": iso(self.next_attempt_at, micro=True),
            "delivered_at": iso(self.delivered_at, micro=True),
            "payload": self.payload,
        }


def _record(row: Mapping[Any, Any]) -> DeliveryRecord:
    payload = row["payload"]
    if isinstance(payload, str):  # SQLite JSON read back by a plain TEXT path
        payload = json.loads(payload)
    created = from_db(row["created_at"])
    updated = from_db(row["updated_at"])
    assert created is not None and updated is not None  # NOT NULL columns
    return DeliveryRecord(
        id=int(row["id"]),
        channel=row["channel"],
        kind=row["kind"],
        subject=row["subject"],
        status=row["status"],
        attempts=int(row["attempts"]),
        payload=dict(payload) if isinstance(payload, Mapping) else {},
        last_error=row["last_error"],
        created_at=created,
        updated_at=updated,
        last_attempt_at=from_db(row["last_attempt_at"]),
        next_attempt_at=from_db(row["next_attempt_at"]),
        delivered_at=from_db(row["delivered_at"]),
    )


def _plain_json(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The alert's fields as stored: what json.dumps makes of them (datetimes as text)."""
    data = json.loads(json.dumps(dict(fields), default=str))
    assert isinstance(data, dict)
    return data


class LedgerAlertDeliveries(LedgerStore):
    """The alert delivery records of :class:`RunLedger` (see the module docstring)."""

    def record_alert(
        self,
        *,
        channels: Sequence[str],
        kind: str,
        subject: str,
        payload: Mapping[str, Any],
        now: datetime | None = None,
        connection: Connection | None = None,
    ) -> list[DeliveryRecord]:
        """Insert a ``pending`` delivery of alert ``(kind, subject)`` for each channel, unless
        one exists already; returns the rows this call inserted (each due at once). With
        ``connection``, in that transaction."""
        if not subject or len(subject) > MAX_SUBJECT_CHARS:
            raise ValueError(f"alert subject must be 1-{MAX_SUBJECT_CHARS} characters: {subject!r}")
        at = to_db(self.clock(now), "now")
        body = _plain_json(payload)
        inserted: list[DeliveryRecord] = []
        with self.maybe(connection) as conn:
            insert: Any = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
            for channel in channels:
                statement = (
                    insert(alert_deliveries)
                    .values(
                        channel=channel,
                        kind=kind,
                        subject=subject,
                        status=DELIVERY_PENDING,
                        attempts=0,
                        payload=body,
                        created_at=at,
                        updated_at=at,
                        next_attempt_at=at,
                    )
                    .on_conflict_do_nothing(index_elements=["channel", "kind", "subject"])
                    .returning(*alert_deliveries.c)
                )
                row = conn.execute(statement).mappings().first()
                if row is not None:
                    inserted.append(_record(row))
        return inserted

    def claim_alert_attempt(
        self, delivery_id: int, *, lease: timedelta, now: datetime | None = None
    ) -> DeliveryRecord | None:
        """Take the next attempt of a due, undelivered delivery (None: not due, delivered, or
        another process is attempting it). The row then counts the attempt and is not due
        again until ``now + lease``."""
        at = self.clock(now)
        c = alert_deliveries.c
        statement = (
            sa.update(alert_deliveries)
            .where(
                c.id == check_id(delivery_id, "delivery_id"),
                c.status.in_(_OPEN),
                c.next_attempt_at.is_not(None),
                c.next_attempt_at <= to_db(at, "now"),
            )
            .values(
                attempts=c.attempts + 1,
                last_attempt_at=to_db(at, "now"),
                next_attempt_at=to_db(at + lease, "now"),
                updated_at=to_db(at, "now"),
            )
            .returning(*alert_deliveries.c)
        )
        with self.connect("autocommit") as conn:
            row = conn.execute(statement).mappings().first()
        return None if row is None else _record(row)

    def finish_alert_attempt(
        self,
        delivery_id: int,
        *,
        attempt: int,
        error: str | None,
        next_attempt_at: datetime | None = None,
        note: str | None = None,
        now: datetime | None = None,
    ) -> DeliveryRecord | None:
        """Settle attempt number ``attempt``: ``delivered`` when ``error`` is None (``note``,
        if any, kept as ``last_error``), else ``failed`` with the error, due again at
        ``next_attempt_at`` (None: no attempt left).

        A success is recorded whatever happened meanwhile (the channel has the alert); a
        failure only while no later attempt was claimed and nothing delivered it. Returns the
        row as settled, or None when the failure was not recorded.
        """
        at = to_db(self.clock(now), "now")
        c = alert_deliveries.c
        where = [c.id == check_id(delivery_id, "delivery_id"), c.status != DELIVERY_DELIVERED]
        if error is None:
            values: dict[str, Any] = {
                "status": DELIVERY_DELIVERED,
                "delivered_at": at,
                "next_attempt_at": None,
                "updated_at": at,
            }
            if note is not None:
                values["last_error"] = truncate_error(note)
        else:
            where.append(c.attempts == attempt)
            values = {
                "status": DELIVERY_FAILED,
                "last_error": truncate_error(error),
                "next_attempt_at": to_db(next_attempt_at, "next_attempt_at"),
                "updated_at": at,
            }
        statement = (
            sa.update(alert_deliveries)
            .where(*where)
            .values(**values)
            .returning(*alert_deliveries.c)
        )
        with self.connect("autocommit") as conn:
            row = conn.execute(statement).mappings().first()
        return None if row is None else _record(row)

    def due_alert_deliveries(
        self, *, channels: Sequence[str], now: datetime | None = None, limit: int = 50
    ) -> list[DeliveryRecord]:
        """Undelivered deliveries to ``channels`` that are due as of ``now``, longest waiting
        first (at most ``limit``)."""
        if not channels:
            return []
        c = alert_deliveries.c
        query = (
            sa.select(alert_deliveries)
            .where(
                c.next_attempt_at.is_not(None),
                c.next_attempt_at <= to_db(self.clock(now), "now"),
                c.status.in_(_OPEN),
                c.channel.in_(list(channels)),
            )
            .order_by(c.next_attempt_at, c.id)
            .limit(max(1, min(limit, MAX_DELIVERY_ROWS)))
        )
        with self.connect("autocommit") as conn:
            return [_record(r) for r in conn.execute(query).mappings()]

    def list_alert_deliveries(
        self,
        *,
        statuses: Sequence[str] | None = None,
        kind: str | None = None,
        limit: int = 50,
    ) -> list[DeliveryRecord]:
        """Delivery records newest first, optionally of some statuses / one kind."""
        c = alert_deliveries.c
        query = sa.select(alert_deliveries)
        if statuses:
            query = query.where(c.status.in_(list(statuses)))
        if kind is not None:
            query = query.where(c.kind == kind)
        query = query.order_by(c.id.desc()).limit(max(1, min(limit, MAX_DELIVERY_ROWS)))
        with self.connect("autocommit") as conn:
            return [_record(r) for r in conn.execute(query).mappings()]

    def alert_delivery_counts(self) -> dict[str, int]:
        """How many delivery records are in each status (every status present, 0 if none)."""
        c = alert_deliveries.c
        query = sa.select(c.status, sa.func.count()).group_by(c.status)
        with self.connect("autocommit") as conn:
            found = {status: int(n) for status, n in conn.execute(query).all()}
        return {s: found.get(s, 0) for s in (DELIVERY_PENDING, DELIVERY_DELIVERED, DELIVERY_FAILED)}
