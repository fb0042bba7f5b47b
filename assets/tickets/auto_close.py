"""Ticket auto-close: close tickets that waited on the customer for too long.

Pure rule (`select_tickets_to_close`) plus its compare-and-set write-back
(`close_tickets`). Nothing here imports Dagster.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Final

import pandas as pd
import sqlalchemy as sa

from assets.tunables import TicketAutoClosePolicy
from resources.core.fence import EffectGuard
from resources.effects import effect_transaction
from resources.source_schema import (
    TICKET_CLOSED,
    TICKET_WAITING_CUSTOMER,
    naive_utc,
    naive_utc_series,
    tickets,
)
from resources.source_store import update_and_log

ACTION_AUTO_CLOSE: Final = "auto_close"
OBJECT_TICKET: Final = "ticket"


def select_tickets_to_close(
    tickets_frame: pd.DataFrame, as_of: datetime, policy: TicketAutoClosePolicy
) -> pd.DataFrame:
    """Tickets `waiting_customer` whose last update is at least `policy.waiting` before
    `as_of` (inclusive boundary), in input order. "Last update" is `updated_at`: any
    activity on the ticket restarts the wait."""
    for column in ("id", "status", "updated_at"):
        if column not in tickets_frame.columns:
            raise ValueError(f"tickets frame is missing column {column!r}")
    cutoff = pd.Timestamp(naive_utc(as_of) - policy.waiting)
    updated_at = naive_utc_series(tickets_frame["updated_at"])
    mask = (tickets_frame["status"] == TICKET_WAITING_CUSTOMER) & (updated_at <= cutoff)
    return tickets_frame.loc[mask].copy()


def candidate_tickets_query(as_of: datetime, policy: TicketAutoClosePolicy) -> sa.Select[Any]:
    """Tickets `select_tickets_to_close` can pick (the pure rule stays the authority)."""
    cutoff = naive_utc(as_of) - policy.waiting
    return (
        sa.select(tickets.c.id, tickets.c.status, tickets.c.updated_at)
        .where(tickets.c.status == TICKET_WAITING_CUSTOMER, tickets.c.updated_at <= cutoff)
        .order_by(tickets.c.id)
    )


def close_tickets(
    engine: sa.Engine,
    ticket_ids: Iterable[Any],
    as_of: datetime,
    policy: TicketAutoClosePolicy,
    *,
    task_key: str,
    entry_key: str,
    guard: EffectGuard | None,
) -> list[int]:
    """Close the given tickets that still qualify; return the ids closed.

    Compare-and-set (`status = 'waiting_customer' AND updated_at <= cutoff`): a ticket
    the customer answered meanwhile is left open, and a rerun closes nothing twice. Each
    closed ticket gets one automation_log row, in the same transaction.
    """
    at = naive_utc(as_of)
    cutoff = at - policy.waiting
    with effect_transaction(engine, guard, "close tickets") as conn:
        return update_and_log(
            conn,
            tickets,
            ticket_ids,
            condition=sa.and_(
                tickets.c.status == TICKET_WAITING_CUSTOMER, tickets.c.updated_at <= cutoff
            ),
            values={"status": TICKET_CLOSED, "closed_at": at, "updated_at": at},
            at=at,
            task_key=task_key,
            entry_key=entry_key,
            action=ACTION_AUTO_CLOSE,
            object_type=OBJECT_TICKET,
            detail={
                "from": TICKET_WAITING_CUSTOMER,
                "to": TICKET_CLOSED,
                "waiting_days": policy.waiting.total_seconds() / 86400,
            },
        )
