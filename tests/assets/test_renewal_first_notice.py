"""The hook event ``before_renewal_first_notice``: fired by real ``billing_maintenance`` runs
(dg.materialize, real SQLite source store and ledger) with listeners from a hooks file
(``DUELEDGER_HOOKS_FILE``) naming functions in tests/hook_support.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa
from hook_support import HEARD, build, hooks_file

import assets.billing.tasks as billing_tasks
from assets.billing.reminders import (
    NOTICE_FIRST,
    NOTICE_LATER,
    NOTICE_SKIPPED,
    RULE_RENEWAL,
    RULE_RENEWAL_SKIPPED,
    first_notice_gate,
    first_notice_keys,
    renewal_notices,
)
from assets.domain_config import DomainRules
from orchestration.services.hooks.registry import Hooks
from orchestration.services.hooks.vocabulary import BEFORE_RENEWAL_FIRST_NOTICE
from resources.core import tags as t
from resources.core.due import format_due
from resources.core.entry import Status, Trigger
from resources.ledger import RunLedger
from resources.notifier import ACTION_SKIPPED, OutboxNotifier
from resources.source_store import SourceStore, create_schema

EVENT = BEFORE_RENEWAL_FIRST_NOTICE
DAY = timedelta(days=1)
HOUR = timedelta(hours=1)
#: Every service here expires at 10:00 on 2026-11-30; runs are on the hour (billing's cron).
EXPIRES_AT = datetime(2026, 11, 30, 10, 0)
SEVEN_DAYS_BEFORE = (EXPIRES_AT - 7 * DAY).replace(tzinfo=UTC)
THREE_DAYS_BEFORE = (EXPIRES_AT - 3 * DAY).replace(tzinfo=UTC)
ONE_DAY_BEFORE = (EXPIRES_AT - DAY).replace(tzinfo=UTC)

CUSTOMERS = pd.DataFrame(
    {
        "id": [1, 2],
        "name": ["ada", "bob"],
        "email": ["ada@example.org", "bob@example.org"],
        "phone": ["+100", "+200"],
        "balance_cents": [0, 0],
        "channels": ["email,sms", "sms"],
    }
)


def service(id_: int, customer: int = 1) -> dict[str, Any]:
    return {
        "id": id_,
        "customer_id": customer,
        "product": "vps-small",
        "status": "active",
        "price_cents": 1999,
        "auto_renew": False,
        "expires_at": EXPIRES_AT,
        "suspended_at": None,
        "terminated_at": None,
        "updated_at": datetime(2026, 1, 1),
    }


def allow(**kw: object) -> dict[str, object]:
    return {"target": "hook_support:heard_allow", "events": [EVENT], **kw}


def deny(**kw: object) -> dict[str, object]:
    return {"target": "hook_support:heard_deny", "events": [EVENT], **kw}


@dataclass
class Env:
    source: SourceStore
    ledger: RunLedger
    engine: sa.Engine
    instance: dg.DagsterInstance
    tmp: Path
    monkeypatch: pytest.MonkeyPatch

    def services(self, *rows: dict[str, Any]) -> None:
        pd.DataFrame(list(rows)).to_sql("services", self.engine, if_exists="append", index=False)

    def run(self, due: datetime, *listeners: dict[str, object]) -> dict[str, Any]:
        """One scheduled billing_maintenance run at ``due`` with these listeners (a fresh
        hooks file and code-location hooks object, as after a restart); its metadata."""
        for key, value in hooks_file(self.tmp / "hooks.toml", *listeners).items():
            self.monkeypatch.setenv(key, value)
        asset = build("billing_maintenance", Hooks.from_environment())
        result = dg.materialize(
            [asset],
            resources={
                "source": self.source,
                "ledger": self.ledger,
                "notifier": OutboxNotifier(),
                "rules": DomainRules(),
            },
            instance=self.instance,
            partition_key=due.strftime("%Y-%m-%d"),
            tags={
                t.TAG_TASK: "billing_maintenance",
                t.TAG_TRIGGER: Trigger.SCHEDULE.value,
                t.TAG_DUE: format_due(due),
                t.DAGSTER_PARTITION: due.strftime("%Y-%m-%d"),
            },
        )
        assert result.success
        (mat,) = result.asset_materializations_for_node("billing_maintenance")
        return {k: v.value for k, v in mat.metadata.items()}

    def outbox(self) -> list[tuple[str, int, str]]:
        """(rule, customer, channel) of every notification handed to a channel."""
        rows = self.read("SELECT rule, customer_id, channel FROM notification_outbox ORDER BY id")
        return list(rows.itertuples(index=False, name=None))

    def effects(self, rule: str) -> list[tuple[int, str, str]]:
        rows = self.read(
            "SELECT object_id, channel, status FROM side_effects WHERE rule = :rule ORDER BY id",
            rule=rule,
        )
        return list(rows.itertuples(index=False, name=None))

    def read(self, sql: str, **params: object) -> pd.DataFrame:
        with self.engine.connect() as conn:
            result = conn.execute(sa.text(sql), params)
            return pd.DataFrame(result.fetchall(), columns=list(result.keys()))

    def hooks_on_entry(self, due: datetime) -> list[dict[str, Any]]:
        entry = self.ledger.find("billing_maintenance", f"due:{format_due(due)}")
        assert entry is not None and entry.status == Status.SUCCESS
        return [h for h in entry.summary.get("hooks", []) if h["event"] == EVENT]


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def source_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'source.sqlite'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


def _env(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    source = SourceStore(url=url)
    ledger = RunLedger(database_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    engine = source.engine()
    create_schema(engine)
    CUSTOMERS.to_sql("customers", engine, if_exists="append", index=False)
    with dg.instance_for_test() as instance:
        yield Env(source, ledger, engine, instance, tmp_path, monkeypatch)
    engine.dispose()
    ledger.dispose()


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    yield from _env(f"sqlite:///{tmp_path / 'source.sqlite'}", tmp_path, monkeypatch)


@pytest.fixture
def env_any_store(source_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    yield from _env(source_url, tmp_path, monkeypatch)


# --- through real runs ------------------------------------------------------------------------


def test_an_allowing_listener_hears_the_first_notice_with_its_facts_and_it_is_sent(env):
    env.services(service(7, customer=1))
    metadata = env.run(SEVEN_DAYS_BEFORE, allow(blocking=True))

    (ctx,) = HEARD
    assert (ctx.event, ctx.task_key, ctx.trigger, ctx.due) == (
        EVENT,
        "billing_maintenance",
        Trigger.SCHEDULE,
        format_due(SEVEN_DAYS_BEFORE),
    )
    assert dict(ctx.data) == {
        "service_id": 7,
        "customer_id": 1,
        "expires_at": "2026-11-30T10:00:00Z",
        "stage_days": 7,
        "notice_at": "2026-11-23T10:00:00Z",
        "channels": ["email", "sms"],
    }
    assert env.outbox() == [(RULE_RENEWAL, 1, "email"), (RULE_RENEWAL, 1, "sms")]
    (stored,) = env.hooks_on_entry(SEVEN_DAYS_BEFORE)
    assert (stored["listener"], stored["outcome"], stored["data"]["service_id"]) == (
        "hook_support:heard_allow",
        "allow",
        7,
    )
    assert ctx.entry_id == env.ledger.find("billing_maintenance", f"due:{ctx.due}").id  # type: ignore[union-attr]
    assert (metadata["renewal_first_notices_asked"], metadata["renewal_notices_denied"]) == (1, 0)


def test_a_blocking_deny_skips_the_notice_records_why_and_is_not_asked_again(env_any_store):
    env = env_any_store
    env.services(service(7, customer=1))
    metadata = env.run(SEVEN_DAYS_BEFORE, deny(blocking=True))

    # Skipped: no notification, and nothing under the notice's own key reads as sent.
    assert env.outbox() == []
    assert env.effects(RULE_RENEWAL) == []
    assert env.effects(RULE_RENEWAL_SKIPPED) == [(7, "all", "succeeded")]
    # Why, in the three places an operator looks.
    (stored,) = env.hooks_on_entry(SEVEN_DAYS_BEFORE)
    assert (stored["outcome"], stored["reason"]) == ("deny", "customer 1 renews by contract")
    log = env.read("SELECT action, object_type, object_id, detail FROM automation_log")
    assert log[["action", "object_type", "object_id"]].values.tolist() == [
        [ACTION_SKIPPED, "service", 7]
    ]
    assert "hook_support:heard_deny: customer 1 renews by contract" in log["detail"][0]
    assert "7 days before expiry 2026-11-30T10:00:00Z" in log["detail"][0]
    assert metadata["renewal_notices_denied"] == 1
    (row,) = metadata["renewal_notices_denied_now"].records
    assert (row.data["service_id"], row.data["stage_days"]) == (7, 7)
    assert "renews by contract" in row.data["reason"]

    # The next hourly run does not ask again for the same notice: it stays skipped.
    again = env.run(SEVEN_DAYS_BEFORE + HOUR, deny(blocking=True))
    assert HEARD == []
    assert env.outbox() == []
    assert (again["renewal_notices_skipped_earlier"], again["renewal_first_notices"]) == (1, 0)

    # Three days before expiry nothing has gone out yet: the 3-day notice is the first one,
    # and its listeners are asked (they allow it now).
    third = env.run(THREE_DAYS_BEFORE, allow(blocking=True))
    (ctx,) = HEARD
    assert (ctx.data["service_id"], ctx.data["stage_days"]) == (7, 3)
    assert env.outbox() == [(RULE_RENEWAL, 1, "email"), (RULE_RENEWAL, 1, "sms")]
    assert third["renewal_first_notices_asked"] == 1


def test_a_deny_from_a_listener_that_is_not_blocking_is_ignored_and_the_notice_sent(env):
    env.services(service(7, customer=2))
    env.run(SEVEN_DAYS_BEFORE, deny(blocking=False))

    assert env.outbox() == [(RULE_RENEWAL, 2, "sms")]
    (stored,) = env.hooks_on_entry(SEVEN_DAYS_BEFORE)
    assert stored["outcome"] == "deny_ignored"
    assert "not a blocking listener" in stored["reason"]
    assert env.effects(RULE_RENEWAL_SKIPPED) == []


def test_a_raising_or_slow_listener_never_stops_the_notices(env):
    env.services(service(7, customer=2), service(8, customer=2))
    metadata = env.run(
        SEVEN_DAYS_BEFORE,
        {"target": "hook_support:raising", "events": [EVENT], "blocking": True},
        {
            "target": "hook_support:sleeping",
            "events": [EVENT],
            "blocking": True,
            "timeout_seconds": 0.2,
        },
    )

    assert env.outbox() == [(RULE_RENEWAL, 2, "sms"), (RULE_RENEWAL, 2, "sms")]
    outcomes = [
        (h["listener"], h["outcome"], h["data"]["service_id"])
        for h in env.hooks_on_entry(SEVEN_DAYS_BEFORE)
    ]
    # The listener that timed out is not asked again in the run (an abandoned thread per
    # notice would pile up); the one that raised is, and fails open each time.
    assert outcomes == [
        ("hook_support:raising", "error", 7),
        ("hook_support:sleeping", "timeout", 7),
        ("hook_support:raising", "error", 8),
    ]
    assert (metadata["renewal_first_notices_asked"], metadata["renewal_notices_denied"]) == (2, 0)


def test_past_the_budget_the_remaining_first_notices_go_out_unasked(env, monkeypatch):
    monkeypatch.setattr(billing_tasks, "FIRST_NOTICE_HOOKS_BUDGET_SECONDS", 0.3)
    env.services(service(7, customer=2), service(8, customer=2), service(9, customer=2))
    sleeping = {"target": "hook_support:sleeping", "events": [EVENT], "timeout_seconds": 5}
    metadata = env.run(SEVEN_DAYS_BEFORE, sleeping)

    assert [c.data["service_id"] for c in HEARD] == [7]
    assert len(env.outbox()) == 3
    assert (
        metadata["renewal_first_notices"],
        metadata["renewal_first_notices_asked"],
        metadata["renewal_first_notices_unasked"],
    ) == (3, 1, 2)


def test_the_event_fires_before_the_first_notice_of_an_expiry_only(env):
    env.services(service(7, customer=2))
    before = env.run(SEVEN_DAYS_BEFORE - DAY, allow())  # 8 days before: nothing due yet
    assert (HEARD, before["renewal_first_notices"]) == ([], 0)

    env.run(SEVEN_DAYS_BEFORE, allow())
    assert [(c.data["service_id"], c.data["stage_days"]) for c in HEARD] == [(7, 7)]
    # Service 8 appears four days before its expiry: its 7-day notice never existed.
    env.services(service(8, customer=2))

    env.run(THREE_DAYS_BEFORE, allow())
    # The 3-day notice is service 8's first, and the only one asked about.
    assert [(c.data["service_id"], c.data["stage_days"]) for c in HEARD] == [(8, 3)]

    last = env.run(ONE_DAY_BEFORE, allow())
    assert HEARD == []
    assert last["renewal_first_notices"] == 0
    sent = env.read("SELECT object_id, COUNT(*) AS n FROM side_effects GROUP BY object_id")
    assert dict(sent.itertuples(index=False, name=None)) == {7: 3, 8: 2}  # sms per stage


# --- the pure gate ------------------------------------------------------------------------------


def test_a_notice_is_first_until_any_notice_of_its_expiry_has_a_row():
    due = pd.DataFrame(
        {
            "rule": RULE_RENEWAL,
            "object_id": [1, 2, 3, 4],
            "customer_id": [1, 1, 1, 1],
            "channel": "sms",
            "stage_days": 3,
            "time_point": pd.Timestamp(EXPIRES_AT - 3 * DAY),
            "reference_at": pd.Timestamp(EXPIRES_AT),
        }
    )
    notices = renewal_notices(due)
    keys = first_notice_keys(notices, (7, 3, 1))
    existing = pd.DataFrame(
        {
            "rule": [RULE_RENEWAL, RULE_RENEWAL_SKIPPED, RULE_RENEWAL, RULE_RENEWAL_SKIPPED],
            "object_type": "service",
            "object_id": [2, 3, 4, 4],
            # 2: its 7-day notice failed on email (tried); 3: this notice was skipped;
            # 4: its 7-day notice was skipped, the 3-day one is in doubt on sms.
            "time_point": [
                pd.Timestamp(EXPIRES_AT - 7 * DAY),
                pd.Timestamp(EXPIRES_AT - 3 * DAY),
                pd.Timestamp(EXPIRES_AT - 3 * DAY),
                pd.Timestamp(EXPIRES_AT - 7 * DAY),
            ],
            "channel": ["email", "all", "sms", "all"],
        }
    )
    gate = first_notice_gate(notices, keys, existing)
    assert gate.tolist() == [NOTICE_FIRST, NOTICE_LATER, NOTICE_SKIPPED, NOTICE_LATER]
