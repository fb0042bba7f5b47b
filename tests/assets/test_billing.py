"""Overdue-invoice reminders and renewal notices: pure rules on fixed dates, then the
exactly-once send through the real outbox, then the task end to end (SQLite source and
ledger; the concurrency test runs on PostgreSQL)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa
from hook_support import build

from assets.billing.reminders import (
    RULE_OVERDUE,
    RULE_RENEWAL,
    expand_channels,
    overdue_reminders_due,
    overdue_stages,
    render_reminders,
    renewal_notices_due,
    renewal_stages,
)
from assets.domain_config import DomainRules
from assets.tunables import ReminderPolicy
from resources.core import tags as t
from resources.core.due import format_due
from resources.core.entry import Trigger
from resources.idempotency import create_domain_schema
from resources.ledger import RunLedger
from resources.notifier import Notifier, OutboxNotifier, dispatch_notifications
from resources.source_store import SourceStore, create_schema, make_engine

# The code location's assets, built with this environment's plugin hooks.
billing_maintenance = build("billing_maintenance")

POLICY = ReminderPolicy()
DAY = timedelta(days=1)
#: An invoice due at 10:00 on 2026-11-20 and a service expiring 10:00 on 2026-11-30.
DUE_AT = datetime(2026, 11, 20, 10, 0)
EXPIRES_AT = datetime(2026, 11, 30, 10, 0)
SECOND = timedelta(seconds=1)

CUSTOMERS = pd.DataFrame(
    {
        "id": [1, 2, 3],
        "email": ["ada@example.org", "bob@example.org", "cy@example.org"],
        "phone": ["+100", "+200", "+300"],
        "channels": ["email,sms,in_app", "sms", ""],
    }
)


def invoice(id_=1, customer=1, due_at=DUE_AT, paid_at=None, created_at=None, amount=1299):
    return {
        "id": id_,
        "customer_id": customer,
        "service_id": None,
        "amount_cents": amount,
        "created_at": created_at or due_at - timedelta(days=14),
        "due_at": due_at,
        "paid_at": paid_at,
    }


def service(id_=1, customer=1, expires_at=EXPIRES_AT, status="active", price=1999):
    return {
        "id": id_,
        "customer_id": customer,
        "product": "vps-small",
        "status": status,
        "price_cents": price,
        "auto_renew": False,
        "expires_at": expires_at,
        "suspended_at": None,
        "terminated_at": None,
        "updated_at": datetime(2026, 1, 1),
    }


def utc(naive: datetime) -> datetime:
    return naive.replace(tzinfo=UTC)


# --- pure rules: a table of named instants -------------------------------------------------

OVERDUE_INSTANTS = [
    ("on_the_due_date", DUE_AT, None),
    ("just_before_day_1", DUE_AT + DAY - SECOND, None),
    ("day_1", DUE_AT + DAY, 1),
    ("day_2", DUE_AT + 2 * DAY, 1),
    ("just_before_day_3", DUE_AT + 3 * DAY - SECOND, 1),
    ("day_3", DUE_AT + 3 * DAY, 3),
    ("day_4", DUE_AT + 4 * DAY, 3),
    ("day_5", DUE_AT + 5 * DAY, 5),
    ("day_6", DUE_AT + 6 * DAY, 5),
    ("a_month_later", DUE_AT + 30 * DAY, 5),
]


@pytest.mark.parametrize(
    ("name", "as_of", "stage"), OVERDUE_INSTANTS, ids=[i[0] for i in OVERDUE_INSTANTS]
)
def test_the_latest_reached_overdue_stage_is_due(name, as_of, stage):
    stages = overdue_stages(pd.DataFrame([invoice()]), utc(as_of), POLICY.overdue_days)
    assert stages["stage_days"].tolist() == ([stage] if stage else [])
    if stage:
        assert stages["time_point"].tolist() == [pd.Timestamp(DUE_AT + stage * DAY)]


RENEWAL_INSTANTS = [
    ("eight_days_before", EXPIRES_AT - 8 * DAY, None),
    ("just_before_seven_days", EXPIRES_AT - 7 * DAY - SECOND, None),
    ("seven_days_before", EXPIRES_AT - 7 * DAY, 7),
    ("four_days_before", EXPIRES_AT - 4 * DAY, 7),
    ("three_days_before", EXPIRES_AT - 3 * DAY, 3),
    ("one_day_before", EXPIRES_AT - DAY, 1),
    ("just_before_expiry", EXPIRES_AT - SECOND, 1),
    ("at_expiry", EXPIRES_AT, None),
    ("after_expiry", EXPIRES_AT + DAY, None),
]


@pytest.mark.parametrize(
    ("name", "as_of", "stage"), RENEWAL_INSTANTS, ids=[i[0] for i in RENEWAL_INSTANTS]
)
def test_the_latest_reached_renewal_stage_is_due_until_expiry(name, as_of, stage):
    stages = renewal_stages(pd.DataFrame([service()]), utc(as_of), POLICY.renewal_days)
    assert stages["stage_days"].tolist() == ([stage] if stage else [])
    if stage:
        assert stages["time_point"].tolist() == [pd.Timestamp(EXPIRES_AT - stage * DAY)]


def test_paid_future_and_unborn_invoices_get_no_reminder():
    as_of = utc(DUE_AT + 2 * DAY)
    frame = pd.DataFrame(
        [
            invoice(1, paid_at=DUE_AT + DAY),  # paid before as_of
            invoice(2, paid_at=DUE_AT + 3 * DAY),  # paid, but only after as_of: still due then
            invoice(3, due_at=DUE_AT + 5 * DAY),  # not yet due
            invoice(4, created_at=DUE_AT + 3 * DAY),  # did not exist at as_of
        ]
    )
    assert overdue_stages(frame, as_of, POLICY.overdue_days)["object_id"].tolist() == [2]


def test_suspended_services_get_no_renewal_notice():
    frame = pd.DataFrame([service(1, status="suspended"), service(2)])
    stages = renewal_stages(frame, utc(EXPIRES_AT - DAY), POLICY.renewal_days)
    assert stages["object_id"].tolist() == [2]


def test_each_opted_in_and_enabled_channel_gets_one_row_with_its_recipient():
    frame = pd.DataFrame([invoice(1, customer=1), invoice(2, customer=2), invoice(3, customer=3)])
    due = overdue_reminders_due(frame, CUSTOMERS, utc(DUE_AT + DAY), POLICY)
    assert list(zip(due["object_id"], due["channel"], due["recipient"], strict=True)) == [
        (1, "email", "ada@example.org"),
        (1, "in_app", "customer:1"),
        (1, "sms", "+100"),
        (2, "sms", "+200"),
    ]
    email_only = ReminderPolicy(channels=("email",))
    due = overdue_reminders_due(frame, CUSTOMERS, utc(DUE_AT + DAY), email_only)
    assert due["channel"].tolist() == ["email"]


def test_a_sms_channel_does_not_match_a_longer_name_by_substring():
    customers = CUSTOMERS.assign(channels=["smsx,email", "sms", ""])
    stages = overdue_stages(
        pd.DataFrame([invoice(1, customer=1)]), utc(DUE_AT + DAY), POLICY.overdue_days
    )
    assert expand_channels(stages, customers, POLICY.channels)["channel"].tolist() == ["email"]


def test_messages_are_rendered_per_rule():
    due = pd.concat(
        [
            overdue_reminders_due(
                pd.DataFrame([invoice(customer=2, amount=1299)]),
                CUSTOMERS.iloc[1:2],
                utc(DUE_AT + DAY),
                POLICY,
            ),
            renewal_notices_due(
                pd.DataFrame([service(customer=2, price=1999)]),
                CUSTOMERS.iloc[1:2],
                utc(EXPIRES_AT - DAY),
                POLICY,
            ),
        ],
        ignore_index=True,
    )
    rendered = render_reminders(due).set_index("rule")
    assert rendered.loc[RULE_OVERDUE, "subject"] == "Reminder: invoice #1 is 1 day overdue"
    assert "12.99" in rendered.loc[RULE_OVERDUE, "body"]
    assert rendered.loc[RULE_RENEWAL, "subject"] == "Your service #1 expires in 1 day"
    assert "19.99" in rendered.loc[RULE_RENEWAL, "body"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"overdue_reminder_days": [-1, 3]}, "between 1 and 365"),
        ({"overdue_reminder_days": [0]}, "between 1 and 365"),
        ({"renewal_notice_days": []}, "non-empty"),
        ({"renewal_notice_days": [3, 3]}, "repeats a day"),
        ({"channels": ["email", "fax"]}, "unknown channel"),
        ({"channels": []}, "non-empty"),
    ],
)
def test_bad_reminder_configuration_fails_at_load_naming_the_setting(fields, message):
    with pytest.raises(ValueError, match=message) as error:
        DomainRules(**fields)
    assert "DomainRules." in str(error.value)


def test_the_default_rules_are_the_seeds():
    policy = DomainRules().reminder_policy()
    assert (policy.overdue_days, policy.renewal_days, policy.channels) == (
        (1, 3, 5),
        (7, 3, 1),
        ("email", "sms", "in_app"),
    )


# --- the send, day by day, through the real outbox -----------------------------------------


@pytest.fixture
def engine(tmp_path) -> Iterator[sa.Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'source.sqlite'}")
    create_schema(engine)
    create_domain_schema(engine)
    yield engine
    engine.dispose()


def send(engine, due: pd.DataFrame, as_of: datetime, notifier: Notifier | None = None):
    return dispatch_notifications(
        engine,
        notifier or OutboxNotifier(),
        render_reminders(due),
        at=as_of,
        task_key="billing_maintenance",
        entry_key=f"test:{format_due(as_of)}",
        guard=None,
    )


def test_daily_runs_send_each_overdue_reminder_day_exactly_once(engine):
    invoices_frame = pd.DataFrame([invoice(customer=2)])
    sent_per_day = {}
    for day in range(8):
        as_of = utc(DUE_AT + day * DAY)
        outcome = send(
            engine, overdue_reminders_due(invoices_frame, CUSTOMERS, as_of, POLICY), as_of
        )
        sent_per_day[day] = outcome.loc[outcome["outcome"] == "sent", "stage_days"].tolist()
    assert sent_per_day == {0: [], 1: [1], 2: [], 3: [3], 4: [], 5: [5], 6: [], 7: []}
    assert pd.read_sql("SELECT COUNT(*) AS n FROM notification_outbox", engine)["n"][0] == 3


def test_daily_runs_send_each_renewal_notice_day_exactly_once(engine):
    services_frame = pd.DataFrame([service(customer=2)])
    sent_per_day = {}
    for before in range(9, -2, -1):
        as_of = utc(EXPIRES_AT - before * DAY)
        outcome = send(engine, renewal_notices_due(services_frame, CUSTOMERS, as_of, POLICY), as_of)
        sent_per_day[before] = outcome.loc[outcome["outcome"] == "sent", "stage_days"].tolist()
    assert {k: v for k, v in sent_per_day.items() if v} == {7: [7], 3: [3], 1: [1]}


def test_a_first_run_late_sends_the_latest_stage_only(engine):
    as_of = utc(DUE_AT + 4 * DAY)
    outcome = send(
        engine,
        overdue_reminders_due(pd.DataFrame([invoice(customer=2)]), CUSTOMERS, as_of, POLICY),
        as_of,
    )
    assert outcome["stage_days"].tolist() == [3]


# --- end to end: the asset under the ledger ----------------------------------------------


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def source_url(request, tmp_path) -> str:
    """The source store on SQLite or PostgreSQL (for the write-back paths)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'source.sqlite'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def stores(tmp_path):
    yield from _stores(f"sqlite:///{tmp_path / 'source.sqlite'}", tmp_path)


@pytest.fixture
def both_stores(source_url, tmp_path):
    yield from _stores(source_url, tmp_path)


def _stores(url: str, tmp_path):
    source = SourceStore(url=url)
    ledger = RunLedger(database_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    engine = source.engine()
    create_schema(engine)
    pd.DataFrame(CUSTOMERS.assign(name="c", balance_cents=0)).to_sql(
        "customers", engine, if_exists="append", index=False
    )
    yield source, ledger, engine
    engine.dispose()


def scheduled(due: datetime) -> dict[str, str]:
    return {
        t.TAG_TASK: "billing_maintenance",
        t.TAG_TRIGGER: Trigger.SCHEDULE.value,
        t.TAG_DUE: format_due(due),
        t.DAGSTER_PARTITION: due.strftime("%Y-%m-%d"),
    }


def run_billing(stores, instance, due: datetime, notifier: Notifier | None = None, tags=None):
    source, ledger, _ = stores
    return dg.materialize(
        [billing_maintenance],
        resources={
            "source": source,
            "ledger": ledger,
            "notifier": notifier or OutboxNotifier(),
            "rules": DomainRules(),
        },
        instance=instance,
        partition_key=due.strftime("%Y-%m-%d"),
        tags=tags or scheduled(due),
    )


def metadata(result) -> dict:
    (mat,) = result.asset_materializations_for_node("billing_maintenance")
    return {k: v.value for k, v in mat.metadata.items()}


def test_a_missed_hour_is_compensated_by_the_next_run(stores):
    _, _, engine = stores
    # Reminder day 1 of this invoice falls at 10:30, inside the 11:00 hour that never ran.
    due_at = datetime(2026, 11, 29, 10, 30)
    pd.DataFrame([invoice(customer=2, due_at=due_at)]).to_sql(
        "invoices", engine, if_exists="append", index=False
    )
    ten = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    with dg.instance_for_test() as instance:
        first = run_billing(stores, instance, ten)
        # 11:00 missed (daemon down); the 12:00 run picks the reminder up.
        noon = run_billing(stores, instance, ten + timedelta(hours=2))
        again = run_billing(stores, instance, ten + timedelta(hours=3))
    assert metadata(first)["due"] == 0
    assert (metadata(noon)["sms/due"], metadata(noon)["sms/sent"]) == (1, 1)
    assert metadata(noon)["as_of"] == "2026-11-30T12:00:00Z"
    assert (metadata(again)["sms/sent"], metadata(again)["sms/skipped_already_sent"]) == (0, 1)
    box = pd.read_sql("SELECT channel, entry_key FROM notification_outbox", engine)
    assert box["channel"].tolist() == ["sms"]
    assert box["entry_key"].str.endswith("due:2026-11-30T12:00:00Z").all()


class _SmsDown(Notifier):
    """The test fake: an SMS gateway that is down."""

    def external_channels(self) -> frozenset[str]:
        return frozenset({"sms"})

    def deliver(self, messages: pd.DataFrame) -> list[str | None]:
        return ["sms gateway down"] * len(messages)


def test_a_failing_channel_is_retried_alone_by_the_next_scheduled_run(both_stores):
    stores = both_stores
    _, _, engine = stores
    pd.DataFrame([invoice(customer=1, due_at=datetime(2026, 11, 29, 9, 0))]).to_sql(
        "invoices", engine, if_exists="append", index=False
    )
    ten = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    with dg.instance_for_test() as instance:
        first = run_billing(stores, instance, ten, notifier=_SmsDown())
        second = run_billing(stores, instance, ten + timedelta(hours=1))
    m1, m2 = metadata(first), metadata(second)
    assert (m1["email/sent"], m1["in_app/sent"], m1["sms/failed"]) == (1, 1, 1)
    assert (m2["email/skipped_already_sent"], m2["in_app/skipped_already_sent"]) == (1, 1)
    assert (m2["sms/sent"], m2["sent"]) == (1, 1)
    box = pd.read_sql("SELECT channel FROM notification_outbox ORDER BY id", engine)
    assert box["channel"].tolist() == ["email", "in_app", "sms"]
    first_rows = metadata(second)["first_rows"]
    assert [r.data["channel"] for r in first_rows.records] == ["email", "in_app", "sms"]


def test_a_manual_run_overlapping_a_scheduled_one_sends_nothing_twice(stores):
    _, ledger, engine = stores
    pd.DataFrame([invoice(customer=2, due_at=datetime(2026, 11, 29, 9, 0))]).to_sql(
        "invoices", engine, if_exists="append", index=False
    )
    due = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    manual = {
        t.TAG_TASK: "billing_maintenance",
        t.TAG_TRIGGER: Trigger.MANUAL.value,
        t.TAG_REQUEST_ID: "r-1",
        t.TAG_OPERATOR: "ops",
        t.TAG_REASON: "resend check",
    }
    with dg.instance_for_test() as instance:
        run_billing(stores, instance, due)
        # A manual run of the same day's partition computes as of that day's end, never
        # the wall clock: later overdue stages (day 3 is 2026-12-02 09:00) stay unreached.
        result = dg.materialize(
            [billing_maintenance],
            resources={
                "source": stores[0],
                "ledger": ledger,
                "notifier": OutboxNotifier(),
                "rules": DomainRules(),
            },
            instance=instance,
            partition_key=due.strftime("%Y-%m-%d"),
            tags=manual,
        )
    assert result.success
    assert metadata(result)["sms/skipped_already_sent"] == 1
    assert metadata(result)["sent"] == 0
    assert ledger.find("billing_maintenance", "manual:r-1").status == "success"
    assert pd.read_sql("SELECT COUNT(*) AS n FROM notification_outbox", engine)["n"][0] == 1


# --- PostgreSQL: concurrent runs race for the same keys ------------------------------------


def test_concurrent_runs_on_postgres_send_each_reminder_once(postgres_url):
    engine = make_engine(postgres_url)
    try:
        create_schema(engine)
        create_domain_schema(engine)
        frame = pd.DataFrame([invoice(i, customer=1) for i in range(1, 41)])
        as_of = utc(DUE_AT + DAY)
        due = overdue_reminders_due(frame, CUSTOMERS, as_of, POLICY)
        results: list[pd.DataFrame] = []
        errors: list[BaseException] = []
        start = threading.Barrier(4)

        def worker(n: int) -> None:
            try:
                start.wait()
                results.append(
                    dispatch_notifications(
                        engine,
                        OutboxNotifier(),
                        render_reminders(due),
                        at=as_of,
                        task_key="billing_maintenance",
                        entry_key=f"worker-{n}",
                        guard=None,
                        chunk_rows=7,
                    )
                )
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors
        sent = sum(int((r["outcome"] == "sent").sum()) for r in results)
        assert sent == len(due) == 120
        count = pd.read_sql("SELECT COUNT(*) AS n FROM notification_outbox", engine)["n"][0]
        assert count == 120
    finally:
        engine.dispose()
