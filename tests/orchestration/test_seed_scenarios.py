"""The seed's three failure scenarios, through real Dagster runs of a real task.

Each run is `order_cleanup` materialized on a real instance with a real ledger (SQLite
and PostgreSQL) and a real source store; the side effect counted is the orders it
cancels (each change writes one automation_log row naming the ledger entry).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
import pandas as pd
import pytest
from hook_support import build
from run_support import refused, scheduled

from resources.core import tags as t
from resources.core.due import format_due
from resources.core.entry import Status, Trigger, dedup_key_for_due, dedup_key_for_request
from resources.ledger import RunLedger
from resources.source_store import SourceStore, create_schema, make_engine

# The code location's assets, built with this environment's plugin hooks.
order_cleanup = build("order_cleanup")

DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
SCHEDULED = scheduled(
    {t.TAG_TASK: "order_cleanup", t.TAG_TRIGGER: Trigger.SCHEDULE.value, t.TAG_DUE: format_due(DUE)}
)


@pytest.fixture
def world(ledger_url, tmp_path):
    ledger = RunLedger(database_url=ledger_url)
    ledger.migrate()
    source = SourceStore(url=f"sqlite:///{tmp_path / 'source.sqlite'}")
    engine = make_engine(source.url)
    create_schema(engine)
    old = (DUE - timedelta(days=2)).replace(tzinfo=None)
    pd.DataFrame(
        [
            {
                "id": 1,
                "name": "Ada",
                "email": "a@x",
                "phone": "1",
                "balance_cents": 0,
                "channels": "email",
            }
        ]
    ).to_sql("customers", engine, if_exists="append", index=False)
    pd.DataFrame(
        [
            {"id": i, "customer_id": 1, "product": "vps", "status": "pending", "created_at": old}
            for i in (1, 2, 3)
        ]
    ).to_sql("orders", engine, if_exists="append", index=False)
    with dg.instance_for_test() as instance:
        yield instance, ledger, source, engine
    engine.dispose()
    ledger.dispose()


def run(world, tags: dict[str, str]) -> dg.ExecuteInProcessResult:
    instance, ledger, source, _ = world
    return dg.materialize(
        [order_cleanup],
        resources={"ledger": ledger, "source": source},
        instance=instance,
        tags=tags,
        # A run the ledger refuses ends CANCELED; the tests read how each run ended.
        raise_on_error=False,
    )


def effects(engine) -> pd.DataFrame:
    return pd.read_sql("SELECT object_id, entry_key FROM automation_log ORDER BY id", engine)


def test_a_the_same_run_request_submitted_twice_executes_once(world):
    _, ledger, _, engine = world
    first, second = run(world, SCHEDULED), run(world, SCHEDULED)
    assert first.success and refused(world[0], second.run_id)
    assert len(effects(engine)) == 3  # three orders cancelled once, not six
    entry = ledger.find("order_cleanup", dedup_key_for_due(DUE))
    assert entry is not None and entry.status == Status.SUCCESS
    assert entry.run_ids == (first.run_id,)
    assert [r["run_id"] for r in entry.summary["late_job_rejections"]] == [second.run_id]


def test_b_a_due_fired_again_while_the_first_run_still_holds_it_is_rejected_and_traced(world):
    # The seed's bug: the state write after the enqueue failed and the lock expired, so
    # the scheduler fired the same due again while the first run was still working.
    _, ledger, _, engine = world
    entry = ledger.ensure_entry(
        task_key="order_cleanup", trigger="schedule", dedup_key=dedup_key_for_due(DUE), due=DUE
    )
    assert ledger.claim(entry.id, "first-run", lease_ttl=timedelta(minutes=10)).claimed
    second = run(world, SCHEDULED)
    assert refused(world[0], second.run_id)
    assert second.asset_materializations_for_node("order_cleanup") == []
    assert effects(engine).empty  # the duplicate did no side effect
    after = ledger.get(entry.id)
    assert after is not None and after.status == Status.RUNNING
    assert after.lease_owner == "first-run"  # the first run keeps its lease
    (rejection,) = after.summary["late_job_rejections"]
    assert rejection["run_id"] == second.run_id and "running" in rejection["reason"]


def test_c_a_due_and_a_manual_launch_in_the_same_second_both_execute(world):
    _, ledger, _, _ = world
    manual_tags = {
        t.TAG_TASK: "order_cleanup",
        t.TAG_TRIGGER: Trigger.MANUAL.value,
        t.TAG_REQUEST_ID: "run-now-1",
        t.TAG_OPERATOR: "ops",
        t.TAG_REASON: "customer asked",
    }
    scheduled, manual = run(world, SCHEDULED), run(world, manual_tags)
    assert scheduled.success and manual.success
    due_entry = ledger.find("order_cleanup", dedup_key_for_due(DUE))
    manual_entry = ledger.find("order_cleanup", dedup_key_for_request("run-now-1"))
    assert due_entry is not None and manual_entry is not None
    assert due_entry.id != manual_entry.id
    assert (due_entry.status, manual_entry.status) == (Status.SUCCESS, Status.SUCCESS)
    # Neither was swallowed: both materialized (the manual one found nothing left to cancel).
    assert len(scheduled.asset_materializations_for_node("order_cleanup")) == 1
    assert len(manual.asset_materializations_for_node("order_cleanup")) == 1
    assert manual_entry.summary["late_job_rejections"] == []
