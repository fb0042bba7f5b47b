"""Ticket auto-close: the pure rule on named instants, the compare-and-set write-back,
and the daily task end to end."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa
from fence_support import lost_guard, refusals
from hook_support import build

from assets.domain_config import DomainRules
from assets.tickets.auto_close import close_tickets, select_tickets_to_close
from assets.tunables import TicketAutoClosePolicy
from resources.core import tags as t
from resources.core.due import format_due
from resources.core.entry import Trigger
from resources.core.fence import FenceLost
from resources.ledger import RunLedger
from resources.source_store import SourceStore, create_schema, make_engine

# The code location's assets, built with this environment's plugin hooks.
ticket_auto_close = build("ticket_auto_close")

MIDNIGHT = datetime(2026, 12, 1, 0, 0, tzinfo=UTC)
NAIVE = MIDNIGHT.replace(tzinfo=None)
POLICY = TicketAutoClosePolicy()  # 7 days
WAIT = timedelta(days=7)


def ticket(id_, status, waited: timedelta):
    return {
        "id": id_,
        "customer_id": 1,
        "subject": "Website is down",
        "status": status,
        "updated_at": NAIVE - waited,
        "closed_at": None,
    }


INSTANTS = [
    ("waited_exactly_seven_days", "waiting_customer", WAIT, True),
    ("one_second_short", "waiting_customer", WAIT - timedelta(seconds=1), False),
    ("waited_a_month", "waiting_customer", 30 * timedelta(days=1), True),
    ("open_for_a_month", "open", 30 * timedelta(days=1), False),
    ("already_closed", "closed", 30 * timedelta(days=1), False),
]


@pytest.mark.parametrize(
    ("name", "status", "waited", "closes"), INSTANTS, ids=[i[0] for i in INSTANTS]
)
def test_only_tickets_waiting_on_the_customer_long_enough_close(name, status, waited, closes):
    frame = pd.DataFrame([ticket(1, status, waited)])
    assert len(select_tickets_to_close(frame, MIDNIGHT, POLICY)) == int(closes)


def test_bad_ticket_configuration_fails_at_load():
    with pytest.raises(ValueError, match="ticket_auto_close_days"):
        DomainRules(ticket_auto_close_days=0)


@pytest.fixture
def engine(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'source.sqlite'}")
    create_schema(engine)
    yield engine
    engine.dispose()


def test_a_ticket_answered_after_selection_is_not_closed_and_reruns_close_nothing(engine):
    pd.DataFrame(
        [
            ticket(1, "waiting_customer", 8 * timedelta(days=1)),
            ticket(2, "waiting_customer", 9 * timedelta(days=1)),
        ]
    ).to_sql("tickets", engine, if_exists="append", index=False)
    with engine.begin() as conn:  # the customer answers ticket 2 after the scan
        conn.execute(sa.text("UPDATE tickets SET status = 'open' WHERE id = 2"))
    closed = close_tickets(
        engine, [1, 2], MIDNIGHT, POLICY, task_key="ticket_auto_close", entry_key="e1", guard=None
    )
    assert closed == [1]
    assert (
        close_tickets(
            engine,
            [1, 2],
            MIDNIGHT,
            POLICY,
            task_key="ticket_auto_close",
            entry_key="e2",
            guard=None,
        )
        == []
    )
    state = pd.read_sql("SELECT id, status, closed_at FROM tickets ORDER BY id", engine)
    assert state["status"].tolist() == ["closed", "open"]
    assert pd.Timestamp(state["closed_at"][0]) == pd.Timestamp(NAIVE)
    log = pd.read_sql("SELECT action, object_id, entry_key FROM automation_log", engine)
    assert log.values.tolist() == [["auto_close", 1, "e1"]]


def test_the_daily_task_closes_as_of_its_due(tmp_path):
    source = SourceStore(url=f"sqlite:///{tmp_path / 'source.sqlite'}")
    ledger = RunLedger(database_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    create_schema(source.engine())
    pd.DataFrame(
        [ticket(1, "waiting_customer", WAIT), ticket(2, "waiting_customer", timedelta(days=6))]
    ).to_sql("tickets", source.engine(), if_exists="append", index=False)
    tags = {
        t.TAG_TASK: "ticket_auto_close",
        t.TAG_TRIGGER: Trigger.SCHEDULE.value,
        t.TAG_DUE: format_due(MIDNIGHT),
    }
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [ticket_auto_close],
            instance=instance,
            tags=tags,
            resources={"source": source, "ledger": ledger, "rules": DomainRules()},
        )
    (mat,) = result.asset_materializations_for_node("ticket_auto_close")
    assert (mat.metadata["due_for_close"].value, mat.metadata["closed"].value) == (1, 1)
    state = pd.read_sql("SELECT status FROM tickets ORDER BY id", source.engine())
    assert state["status"].tolist() == ["closed", "waiting_customer"]
    source.engine().dispose()


def test_a_run_that_lost_its_lease_closes_nothing(engine, tmp_path):
    # A worker paused past its lease used to commit after the reclaim.
    pd.DataFrame([ticket(1, "waiting_customer", 8 * timedelta(days=1))]).to_sql(
        "tickets", engine, if_exists="append", index=False
    )
    guard, ledger = lost_guard(tmp_path, "ticket_auto_close")
    with pytest.raises(FenceLost):
        close_tickets(engine, [1], MIDNIGHT, POLICY, task_key="t", entry_key="e", guard=guard)
    state = pd.read_sql("SELECT status FROM tickets", engine)
    assert state["status"].tolist() == ["waiting_customer"]
    assert pd.read_sql("SELECT * FROM automation_log", engine).empty
    assert ["close tickets" in reason for reason in refusals(ledger, guard)] == [True]
