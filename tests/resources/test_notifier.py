"""The notifier interface and the exactly-once dispatch, on a real SQLite source store.

Implementations exercised: the outbox (default), SMTP against a local SMTP sink
(tests/alert_sinks.py), and a fake external gateway (the one fake the tests use) that can
fail or die mid-delivery.
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pandas as pd
import pytest
import sqlalchemy as sa
from alert_sinks import SmtpSink, start
from fence_support import lost_guard, refusals

from resources.core.fence import FenceLost
from resources.idempotency import create_domain_schema
from resources.ledger import RunLedger
from resources.ledger.guard import LedgerGuard
from resources.notifier import (
    Notifier,
    OutboxNotifier,
    SmtpNotifier,
    dispatch_notifications,
    outcome_counts,
)
from resources.source_store import make_engine

AT = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)
LATER = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
TIME_POINT = datetime(2026, 11, 29, 10, 0)


class FakeGateway(Notifier):
    """A fake external channel gateway: fails, or dies mid-delivery, when told to."""

    channels: list[str] = ["sms"]
    fail: bool = False
    crash: bool = False

    def external_channels(self) -> frozenset[str]:
        return frozenset(self.channels)

    def deliver(self, messages: pd.DataFrame) -> list[str | None]:
        if self.crash:
            raise RuntimeError("worker died while delivering")
        return ["gateway unavailable" if self.fail else None] * len(messages)


def messages(*channels: str, object_id: int = 7) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "rule": "invoice_overdue_reminder",
            "object_type": "invoice",
            "object_id": object_id,
            "time_point": TIME_POINT,
            "channel": list(channels),
            "customer_id": 1,
            "recipient": [
                {"email": "ada@example.org", "sms": "+100", "in_app": "customer:1"}[c]
                for c in channels
            ],
            "subject": "Reminder: invoice #7 is 1 day overdue",
            "body": "Please pay.",
        }
    )


@pytest.fixture
def engine(tmp_path) -> Iterator[sa.Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'source.sqlite'}")
    create_domain_schema(engine)
    yield engine
    engine.dispose()


def dispatch(engine, notifier, frame, at=AT, entry_key="1:due:2026-11-30T22:00:00Z"):
    return dispatch_notifications(
        engine,
        notifier,
        frame,
        at=at,
        task_key="billing_maintenance",
        entry_key=entry_key,
        guard=None,
    )


def outbox(engine) -> pd.DataFrame:
    return pd.read_sql(
        "SELECT channel, recipient, status, entry_key FROM notification_outbox ORDER BY id",
        engine,
    )


def effects(engine) -> pd.DataFrame:
    return pd.read_sql(
        "SELECT channel, status, attempts, error FROM side_effects ORDER BY channel", engine
    )


def test_the_outbox_records_each_message_once_with_its_idempotency_row(engine):
    first = dispatch(engine, OutboxNotifier(), messages("email", "sms", "in_app"))
    assert first["outcome"].tolist() == ["sent"] * 3
    # A re-run, or an overlapping manual run under another ledger entry, sends nothing.
    second = dispatch(
        engine,
        OutboxNotifier(),
        messages("email", "sms", "in_app"),
        at=LATER,
        entry_key="2:manual:r-1",
    )
    assert second["outcome"].tolist() == ["skipped_already_sent"] * 3
    box = outbox(engine)
    assert sorted(box["channel"]) == ["email", "in_app", "sms"]
    assert set(box["status"]) == {"pending"}
    assert set(box["entry_key"]) == {"1:due:2026-11-30T22:00:00Z"}
    assert effects(engine)["status"].tolist() == ["succeeded"] * 3


def test_a_failed_channel_is_retried_alone_by_the_next_run(engine):
    first = dispatch(engine, FakeGateway(fail=True), messages("email", "sms", "in_app"))
    assert dict(zip(first["channel"], first["outcome"], strict=True)) == {
        "email": "sent",
        "sms": "failed",
        "in_app": "sent",
    }
    assert first.loc[first["channel"] == "sms", "error"].item() == "gateway unavailable"
    second = dispatch(engine, FakeGateway(), messages("email", "sms", "in_app"), at=LATER)
    assert dict(zip(second["channel"], second["outcome"], strict=True)) == {
        "email": "skipped_already_sent",
        "sms": "sent",
        "in_app": "skipped_already_sent",
    }
    box = outbox(engine)
    assert box["channel"].tolist() == ["email", "in_app", "sms"]  # one row each, sms last
    assert box.loc[box["channel"] == "sms", "status"].item() == "delivered"
    sms = effects(engine).set_index("channel").loc["sms"]
    assert (sms["status"], sms["attempts"], sms["error"]) == ("succeeded", 2, None)


def test_a_delivery_that_died_midway_is_in_doubt_and_never_resent(engine):
    with pytest.raises(RuntimeError, match="worker died"):
        dispatch(engine, FakeGateway(crash=True), messages("sms"))
    again = dispatch(engine, FakeGateway(), messages("sms"), at=LATER)
    assert again["outcome"].tolist() == ["in_doubt"]
    assert outbox(engine).empty
    assert effects(engine)["status"].tolist() == ["in_flight"]


def test_a_message_list_repeating_a_key_is_refused(engine):
    with pytest.raises(ValueError, match="repeat an idempotency key"):
        dispatch(engine, OutboxNotifier(), messages("email", "email"))


def test_outcome_counts_per_rule_and_channel(engine):
    dispatch(engine, OutboxNotifier(), messages("email"))
    result = dispatch(engine, FakeGateway(fail=True), messages("email", "sms"), at=LATER)
    counts = outcome_counts(result).set_index("channel")
    assert counts.loc["email", ["due", "sent", "skipped_already_sent"]].tolist() == [1, 0, 1]
    assert counts.loc["sms", ["due", "failed"]].tolist() == [1, 1]


# --- SMTP against a local sink -----------------------------------------------------------


@pytest.fixture
def smtp_sink() -> Iterator[SmtpSink]:
    with start(SmtpSink()) as server:
        yield server


def smtp(sink: SmtpSink) -> SmtpNotifier:
    return SmtpNotifier(
        host="127.0.0.1",
        port=sink.port,
        sender="billing@example.test",
        timeout_seconds=5,
    )


def test_smtp_sends_email_once_and_leaves_other_channels_in_the_outbox(engine, smtp_sink):
    first = dispatch(engine, smtp(smtp_sink), messages("email", "sms"))
    assert first["outcome"].tolist() == ["sent", "sent"]
    second = dispatch(engine, smtp(smtp_sink), messages("email", "sms"), at=LATER)
    assert second["outcome"].tolist() == ["skipped_already_sent"] * 2
    (mail,) = smtp_sink.received
    assert mail["To"] == "ada@example.org"
    assert mail["From"] == "billing@example.test"
    assert mail["Subject"] == "Reminder: invoice #7 is 1 day overdue"
    effect_id = first.loc[first["channel"] == "email", "effect_id"].item()
    assert mail["Message-ID"] == f"<effect-{effect_id}@dueledger>"
    box = outbox(engine).set_index("channel")["status"].to_dict()
    assert box == {"email": "delivered", "sms": "pending"}


def test_smtp_a_refused_recipient_fails_alone_and_is_retried(engine, smtp_sink):
    smtp_sink.refuse.add("ada@example.org")
    batch = pd.concat([messages("email"), messages("email", object_id=8)], ignore_index=True)
    batch.loc[1, "recipient"] = "bob@example.org"
    first = dispatch(engine, smtp(smtp_sink), batch)
    assert first["outcome"].tolist() == ["failed", "sent"]
    assert "550" in first.loc[0, "error"]
    smtp_sink.refuse.clear()
    second = dispatch(engine, smtp(smtp_sink), batch, at=LATER)
    assert second["outcome"].tolist() == ["sent", "skipped_already_sent"]
    assert sorted(m["To"] for m in smtp_sink.received) == ["ada@example.org", "bob@example.org"]


def test_smtp_an_unreachable_server_fails_the_email_and_keeps_it_for_the_next_run(engine):
    with socketserver.TCPServer(("127.0.0.1", 0), socketserver.BaseRequestHandler) as probe:
        closed_port = probe.server_address[1]  # nothing listens there once closed
    notifier = SmtpNotifier(
        host="127.0.0.1", port=closed_port, sender="b@x.test", timeout_seconds=2
    )
    result = dispatch(engine, notifier, messages("email"))
    assert result["outcome"].tolist() == ["failed"]
    assert "connect" in result.loc[0, "error"]
    assert effects(engine)["status"].tolist() == ["failed"]


def test_concurrent_first_runs_create_the_bookkeeping_tables_once(postgres_url):
    engine = make_engine(postgres_url)
    errors: list[BaseException] = []

    def create() -> None:
        try:
            create_domain_schema(engine)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert {"side_effects", "notification_outbox", "log_archives"} <= set(
        sa.inspect(engine).get_table_names()
    )
    engine.dispose()


# --- fenced by the run's claim --------------------------------------------------------------


def test_a_run_that_lost_its_lease_queues_no_notification(engine, tmp_path):
    guard, ledger = lost_guard(tmp_path, "billing_maintenance")
    with pytest.raises(FenceLost):
        dispatch_notifications(
            engine,
            OutboxNotifier(),
            messages("email", "sms"),
            at=AT,
            task_key="billing_maintenance",
            entry_key="e",
            guard=guard,
        )
    assert outbox(engine).empty and effects(engine).empty
    assert ["queue notifications" in reason for reason in refusals(ledger, guard)] == [True]


def test_a_lease_lost_between_claim_and_delivery_sends_no_email_and_frees_it(
    engine, tmp_path, smtp_sink
):
    """The claim of an email commits before its delivery (no transaction can hold an SMTP
    conversation); a run paused in between and reclaimed must not deliver it, and must leave
    it to a later run."""
    zombie, ledger = lost_guard(tmp_path, "billing_maintenance")
    ledger_url = ledger.url

    class ReclaimedAfterTheClaim(LedgerGuard):
        """The real guard of a run whose lease is reclaimed right after its claim commits."""

        checks = 0

        def verify(self, conn, effect):
            self.checks += 1
            if self.checks > 1:  # the pause: the reclaim lands after the claim's commit
                zombie.verify(conn, effect)

    held = ReclaimedAfterTheClaim(RunLedger(database_url=ledger_url), zombie.fence)
    with pytest.raises(FenceLost, match="deliver notifications"):
        dispatch_notifications(
            engine,
            smtp(smtp_sink),
            messages("email"),
            at=AT,
            task_key="billing_maintenance",
            entry_key="e",
            guard=held,
        )
    assert smtp_sink.received == []
    assert outbox(engine).empty
    (row,) = effects(engine).to_dict("records")
    assert (row["status"], row["attempts"]) == ("failed", 1)
    assert "no longer holds" in row["error"]
    # A later run that holds its entry sends it, once.
    later = dispatch(engine, smtp(smtp_sink), messages("email"), at=LATER)
    assert later["outcome"].tolist() == ["sent"] and len(smtp_sink.received) == 1
