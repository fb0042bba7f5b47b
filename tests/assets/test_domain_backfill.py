"""Daily partitions of billing_maintenance: a UI backfill over a week computes what was
due each day as of that day, and running the same backfill again sends nothing.

Backfill runs are real Dagster runs with the tags Dagster's backfill daemon gives them
(`dagster/backfill`, `dagster/partition`, and -- for a backfill launched from the asset
graph -- no `dueledger/task`). The schedule side is checked through the real scheduler
daemon code path: a scheduled run targets its due's day.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
import pandas as pd
import pytest
from dagster_internals import CodeTarget, daemon_instance, daemon_workspace, run_scheduler_tick
from hook_support import build

from assets.domain_config import DomainRules
from orchestration.definitions import defs
from orchestration.task_spec import TaskSpec, TaskSpecError, partition_key_for, validate_spec
from orchestration.timetable import Cron
from resources.core import tags as t
from resources.ledger import RunLedger
from resources.notifier import OutboxNotifier
from resources.source_store import SourceStore, create_schema

# The code location's assets, built with this environment's plugin hooks.
billing_maintenance = build("billing_maintenance")

DAYS = [f"2026-11-{d}" for d in range(20, 27)]  # a 7-day backfill


@pytest.fixture
def stores(tmp_path):
    source = SourceStore(url=f"sqlite:///{tmp_path / 'source.sqlite'}")
    ledger = RunLedger(database_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    engine = source.engine()
    create_schema(engine)
    pd.DataFrame(
        {
            "id": [1, 2],
            "name": ["Ada", "Bob"],
            "email": ["ada@example.org", "bob@example.org"],
            "phone": ["+100", "+200"],
            "balance_cents": [0, 0],
            "channels": ["email,sms,in_app", "sms"],
        }
    ).to_sql("customers", engine, if_exists="append", index=False)
    due = datetime(2026, 11, 20, 9, 0)
    pd.DataFrame(
        {
            "id": [1, 2],
            "customer_id": [2, 1],
            "service_id": [None, None],
            "amount_cents": [1299, 499],
            "created_at": [due - timedelta(days=14)] * 2,
            "due_at": [due, due],
            # Invoice 2 is paid on the 23rd: reminders stop from that day on.
            "paid_at": [None, datetime(2026, 11, 23, 12, 0)],
        }
    ).to_sql("invoices", engine, if_exists="append", index=False)
    pd.DataFrame(
        {
            "id": [1],
            "customer_id": [2],
            "product": ["vps-small"],
            "status": ["active"],
            "price_cents": [2499],
            "auto_renew": [False],
            "expires_at": [datetime(2026, 11, 26, 12, 0)],
            "suspended_at": [None],
            "terminated_at": [None],
            "updated_at": [datetime(2026, 1, 1)],
        }
    ).to_sql("services", engine, if_exists="append", index=False)
    yield source, ledger, engine
    engine.dispose()


def backfill(stores, instance, backfill_id: str) -> dict[str, dict]:
    """One run per partition, tagged as the backfill daemon tags asset-backfill runs."""
    source, ledger, _ = stores
    per_day = {}
    for day in DAYS:
        result = dg.materialize(
            [billing_maintenance],
            resources={
                "source": source,
                "ledger": ledger,
                "notifier": OutboxNotifier(),
                "rules": DomainRules(),
            },
            instance=instance,
            partition_key=day,
            tags={t.DAGSTER_BACKFILL: backfill_id, t.DAGSTER_PARTITION: day},
        )
        assert result.success
        (mat,) = result.asset_materializations_for_node("billing_maintenance")
        assert mat.partition == day
        per_day[day] = {k: v.value for k, v in mat.metadata.items()}
    return per_day


def test_a_week_backfill_sends_what_was_due_each_day_and_a_second_one_sends_nothing(stores):
    _, ledger, engine = stores
    with dg.instance_for_test() as instance:
        first = backfill(stores, instance, "bf1")
        second = backfill(stores, instance, "bf2")
    # Each day is computed as of the end of that day (the next midnight UTC).
    assert first["2026-11-20"]["as_of"] == "2026-11-21T00:00:00Z"
    assert first["2026-11-26"]["as_of"] == "2026-11-27T00:00:00Z"
    assert {day: m["sent"] for day, m in first.items()} == {
        "2026-11-20": 1,  # service: 7-day notice (time point the 19th, 12:00)
        "2026-11-21": 4,  # invoice 1 day 1 (sms) + invoice 2 day 1 (3 channels)
        "2026-11-22": 0,
        "2026-11-23": 2,  # invoice 1 day 3; service 3-day notice. Invoice 2 paid: nothing.
        "2026-11-24": 0,
        "2026-11-25": 2,  # invoice 1 day 5; service 1-day notice
        "2026-11-26": 0,  # the service has expired by the end of the day
    }
    assert {day: m["sent"] for day, m in second.items()} == dict.fromkeys(DAYS, 0)
    assert sum(m["sms/skipped_already_sent"] for m in second.values()) > 0
    box = pd.read_sql("SELECT rule, channel, entry_key FROM notification_outbox", engine)
    assert len(box) == 9
    assert box["entry_key"].str.contains(":backfill:bf1:").all()
    # One ledger entry per (backfill, day), each a success, all under the task.
    for backfill_id in ("bf1", "bf2"):
        for day in DAYS:
            entry = ledger.find("billing_maintenance", f"backfill:{backfill_id}:{day}")
            assert entry is not None
            assert (entry.trigger, entry.status) == ("backfill", "success")


def test_a_backfill_of_today_is_not_computed_ahead_of_time(stores):
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    source, ledger, _ = stores
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [billing_maintenance],
            resources={
                "source": source,
                "ledger": ledger,
                "notifier": OutboxNotifier(),
                "rules": DomainRules(),
            },
            instance=instance,
            partition_key=today,
            tags={t.DAGSTER_BACKFILL: "bftoday", t.DAGSTER_PARTITION: today},
        )
    (mat,) = result.asset_materializations_for_node("billing_maintenance")
    end_of_today = datetime.strptime(today, "%Y-%m-%d").replace(tzinfo=UTC) + timedelta(days=1)
    as_of = datetime.strptime(mat.metadata["as_of"].value, "%Y-%m-%dT%H:%M:%SZ")
    assert as_of.replace(tzinfo=UTC) < end_of_today  # capped at when the run was created


def test_the_schedule_requests_the_partition_of_its_dues_day(tmp_path):
    schedule = defs().resolve_schedule_def("billing_maintenance_schedule")
    ledger = RunLedger(database_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    ledger.migrate()  # the tick reads the task's pauses there (none)
    with (
        dg.instance_for_test() as instance,
        dg.build_schedule_context(
            instance=instance,
            scheduled_execution_time=datetime(2026, 11, 30, 23, 0, tzinfo=UTC),
            resources={"ledger": ledger},
        ) as context,
    ):
        (request,) = schedule.evaluate_tick(context).run_requests
    assert request.run_key == "2026-11-30T23:00:00Z"
    assert request.partition_key == "2026-11-30"
    assert request.tags[t.DAGSTER_PARTITION] == "2026-11-30"


@pytest.mark.daemon
def test_the_scheduler_daemon_launches_the_scheduled_run_on_its_days_partition(tmp_path):
    target = CodeTarget.from_module("orchestration.definitions", attribute="defs")
    due = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
    with (
        daemon_instance("mocked", temp_dir=tmp_path / "instance") as instance,
        daemon_workspace(instance, target) as ctx,
    ):
        run_scheduler_tick(ctx, due - timedelta(minutes=1))  # the schedule starts
        run_scheduler_tick(ctx, due + timedelta(seconds=5))
        runs = instance.get_runs(dg.RunsFilter(tags={t.TAG_TASK: "billing_maintenance"}))
    (run,) = runs
    assert run.tags[t.DAGSTER_RUN_KEY] == "2026-11-30T23:00:00Z"
    assert run.tags[t.DAGSTER_PARTITION] == "2026-11-30"
    assert run.tags[t.TAG_DUE] == "2026-11-30T23:00:00Z"


def test_only_known_partition_schemes_are_accepted_and_keys_are_utc_days():
    spec = TaskSpec(key="x", rule=Cron("0 * * * *"), declared_cadence="hourly", partitions="daily")
    validate_spec(spec, 15)
    late_evening = datetime(2026, 11, 30, 23, 45, tzinfo=UTC)
    assert partition_key_for(spec, late_evening) == "2026-11-30"
    with pytest.raises(TaskSpecError, match="partitions"):
        validate_spec(
            TaskSpec(
                key="x",
                rule=Cron("0 * * * *"),
                declared_cadence="hourly",
                partitions="hourly",
            ),
            15,
        )
