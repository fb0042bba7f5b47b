"""Alert delivery (orchestration/services/alerts.py over resources/ledger/deliveries.py) on
real SQLite and PostgreSQL ledgers: once per (channel, kind, subject), retried with backoff
while a channel is down, bounded, never raising. Channels: the fake (tests/alert_sinks.py)
for the rules, and the real webhook and SMTP channels against local servers."""

from __future__ import annotations

import json
import logging
import socket
import time
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
from alert_sinks import FakeChannel, SmtpSink, WebhookSink, free_port, start
from hook_support import build

from orchestration.services.alerts import Alerts
from resources.alert_channels import EmailChannel, WebhookChannel
from resources.core import tags as t
from resources.core.alerting import (
    DELIVERY_DELIVERED,
    DELIVERY_FAILED,
    DELIVERY_PENDING,
    ENV_WEBHOOK_URL,
    EmailSettings,
    WebhookSettings,
    attempt_lease,
    entry_subject,
)
from resources.core.entry import Trigger
from resources.ledger import DeliveryRecord, RunLedger

NOW = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
FIELDS = {"task": "order_cleanup", "entry_id": 42, "run_id": "run-1"}


def alerts(ledger: RunLedger, *channels, at: datetime = NOW, **kw) -> Alerts:
    return Alerts(ledger=ledger, channels=list(channels), now=at, **kw)


def records(ledger: RunLedger) -> list[DeliveryRecord]:
    return sorted(ledger.list_alert_deliveries(limit=500), key=lambda r: r.id)


def delivery_log(caplog: pytest.LogCaptureFixture) -> list[dict]:
    """What was logged to ``dueledger.alert_delivery`` (set the level first)."""
    return [
        json.loads(r.getMessage()) for r in caplog.records if r.name == "dueledger.alert_delivery"
    ]


# --- the store ------------------------------------------------------------------------------


def test_recording_the_same_alert_again_adds_nothing(ledger: RunLedger) -> None:
    first = ledger.record_alert(
        channels=["webhook", "email"], kind="lease_reclaimed", subject="entry:42", payload=FIELDS
    )
    assert [(r.channel, r.status, r.attempts) for r in first] == [
        ("webhook", DELIVERY_PENDING, 0),
        ("email", DELIVERY_PENDING, 0),
    ]
    again = ledger.record_alert(
        channels=["webhook", "email"], kind="lease_reclaimed", subject="entry:42", payload={}
    )
    assert again == []
    assert [r.payload for r in records(ledger)] == [FIELDS, FIELDS]  # the first one stands
    # Another kind or subject is another alert.
    other = ledger.record_alert(
        channels=["webhook"], kind="slot_health", subject="entry:42", payload={}
    )
    assert len(other) == 1


def test_an_attempt_is_claimed_once_and_a_delivery_is_never_undone(ledger: RunLedger) -> None:
    (row,) = ledger.record_alert(
        channels=["webhook"], kind="lease_reclaimed", subject="entry:1", payload={}, now=NOW
    )
    lease = attempt_lease(5)
    claimed = ledger.claim_alert_attempt(row.id, lease=lease, now=NOW)
    assert claimed is not None and claimed.attempts == 1
    assert claimed.next_attempt_at == NOW + lease
    # A second process at the same moment finds it taken.
    assert ledger.claim_alert_attempt(row.id, lease=lease, now=NOW) is None
    done = ledger.finish_alert_attempt(row.id, attempt=1, error=None, now=NOW)
    assert done is not None and (done.status, done.delivered_at) == (DELIVERY_DELIVERED, NOW)
    assert done.next_attempt_at is None
    # A late failure report of the same attempt, or any later claim, changes nothing.
    late = NOW + timedelta(hours=1)
    assert ledger.finish_alert_attempt(row.id, attempt=1, error="boom", now=late) is None
    assert ledger.claim_alert_attempt(row.id, lease=lease, now=late) is None
    assert records(ledger)[0].status == DELIVERY_DELIVERED
    assert ledger.alert_delivery_counts() == {"pending": 0, "delivered": 1, "failed": 0}


# --- once, retried, bounded (fake channel) -----------------------------------------------------


def test_the_same_alert_emitted_twice_is_delivered_once(ledger: RunLedger) -> None:
    channel = FakeChannel()
    for _tick in range(2):  # e.g. a re-evaluated tick, or the sensor and `dueledger reclaim`
        tick = alerts(ledger, channel)
        tick.emit("lease_reclaimed", entry_subject(42), **FIELDS)
        tick.deliver(retry=True)
    (sent,) = channel.sent
    assert (sent.kind, sent.subject, dict(sent.fields)) == ("lease_reclaimed", "entry:42", FIELDS)
    (row,) = records(ledger)
    assert (row.status, row.attempts) == (DELIVERY_DELIVERED, 1)


def test_a_channel_that_is_down_is_retried_with_backoff_and_delivers_once(
    ledger: RunLedger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dueledger.alert_delivery")
    channel = FakeChannel(down=True)
    tick = alerts(ledger, channel)
    tick.emit("lease_reclaimed", entry_subject(42), **FIELDS)
    (failed,) = tick.deliver()
    assert (failed.status, failed.attempts, failed.last_error) == (
        DELIVERY_FAILED,
        1,
        "webhook is down",
    )
    assert failed.next_attempt_at == NOW + timedelta(seconds=30)
    # Before the backoff is over nothing is tried, even though the channel is back.
    channel.down = False
    assert alerts(ledger, channel, at=NOW + timedelta(seconds=29)).deliver(retry=True) == []
    assert channel.sent == []
    (done,) = alerts(ledger, channel, at=NOW + timedelta(seconds=31)).deliver(retry=True)
    assert (done.status, done.attempts, done.last_error) == (
        DELIVERY_DELIVERED,
        2,
        "webhook is down",  # the earlier failure stays readable
    )
    assert alerts(ledger, channel, at=NOW + timedelta(hours=5)).deliver(retry=True) == []
    assert len(channel.sent) == 1
    outcomes = [line["alert_delivery"] for line in delivery_log(caplog)]
    assert outcomes == ["failed", "delivered"]


def test_after_max_attempts_a_delivery_gives_up(
    ledger: RunLedger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dueledger.alert_delivery")
    channel = FakeChannel(down=True)
    tick = alerts(ledger, channel, max_attempts=2)
    tick.emit("slot_health", "slot:2026-11-30T22:45:00Z", slot="2026-11-30T22:45:00Z")
    tick.deliver()
    (last,) = alerts(ledger, channel, at=NOW + timedelta(minutes=1), max_attempts=2).deliver(
        retry=True
    )
    assert (last.status, last.attempts, last.gave_up) == (DELIVERY_FAILED, 2, True)
    assert alerts(ledger, channel, at=NOW + timedelta(days=1)).deliver(retry=True) == []
    assert channel.tries == 2
    assert delivery_log(caplog)[-1]["alert_delivery"] == "gave_up"


def test_a_channel_that_fails_is_tried_once_per_call_and_others_still_deliver(
    ledger: RunLedger,
) -> None:
    down, up = FakeChannel("webhook", down=True), FakeChannel("email")
    tick = alerts(ledger, down, up)
    for entry_id in (1, 2, 3):
        tick.emit("lease_reclaimed", entry_subject(entry_id), entry_id=entry_id)
    attempted = tick.deliver(retry=True)
    assert down.tries == 1, "a down channel holds the tick for one timeout, not one per alert"
    assert len(up.sent) == 3
    by_channel = {(r.channel, r.status) for r in attempted}
    assert by_channel == {("webhook", DELIVERY_FAILED), ("email", DELIVERY_DELIVERED)}
    waiting = [r for r in records(ledger) if r.channel == "webhook"]
    assert sorted((r.status, r.attempts) for r in waiting) == [
        (DELIVERY_FAILED, 1),
        (DELIVERY_PENDING, 0),
        (DELIVERY_PENDING, 0),
    ]
    # The next tick (channel back) delivers the rest, each once.
    down.down = False
    alerts(ledger, down, up, at=NOW + timedelta(seconds=31)).deliver(retry=True)
    assert sorted(m.subject for m in down.sent) == ["entry:1", "entry:2", "entry:3"]
    assert {r.status for r in records(ledger)} == {DELIVERY_DELIVERED}


def test_a_kinds_filter_keeps_other_alerts_off_the_channel(ledger: RunLedger) -> None:
    health_only = FakeChannel(kinds=frozenset({"slot_health"}))
    tick = alerts(ledger, health_only)
    tick.emit("lease_reclaimed", entry_subject(1), entry_id=1)
    tick.emit("slot_health", "slot:2026-11-30T22:45:00Z")
    tick.deliver()
    assert [m.kind for m in health_only.sent] == ["slot_health"]
    assert [r.kind for r in records(ledger)] == ["slot_health"]


def test_an_attempt_whose_process_died_is_retried_after_its_lease(ledger: RunLedger) -> None:
    channel = FakeChannel(timeout_seconds=5)
    (row,) = ledger.record_alert(
        channels=["webhook"], kind="lease_reclaimed", subject="entry:9", payload={}, now=NOW
    )
    lease = attempt_lease(channel.timeout_seconds)
    ledger.claim_alert_attempt(row.id, lease=lease, now=NOW)  # ... and the process dies
    assert alerts(ledger, channel, at=NOW + lease - timedelta(seconds=1)).deliver(retry=True) == []
    (done,) = alerts(ledger, channel, at=NOW + lease).deliver(retry=True)
    assert (done.status, done.attempts) == (DELIVERY_DELIVERED, 2)


def test_no_channels_means_no_records(ledger: RunLedger) -> None:
    tick = alerts(ledger)
    tick.emit("lease_reclaimed", entry_subject(1), entry_id=1)
    assert tick.deliver(retry=True) == []
    assert records(ledger) == []


def test_a_ledger_that_is_down_never_makes_emit_or_deliver_raise(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="dueledger.alert_delivery")
    gone = RunLedger(database_url=f"sqlite:///{tmp_path / 'missing' / 'ledger.sqlite'}")
    channel = FakeChannel()
    tick = alerts(gone, channel)
    line = tick.emit("lease_reclaimed", entry_subject(1), entry_id=1)
    assert json.loads(line)["alert"] == "lease_reclaimed"  # the line still went out
    assert tick.deliver(retry=True) == []
    said = [json.loads(r.getMessage())["alert_delivery"] for r in caplog.records]
    assert said == ["not_recorded", "not_retried"]


def test_a_bad_configuration_leaves_alert_lines_and_says_why_once(
    ledger: RunLedger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="dueledger.alert_delivery")
    bad = {ENV_WEBHOOK_URL: "hooks.example.org/secret-token"}
    tick = Alerts.from_environment(ledger, now=NOW, environ=bad)
    tick.emit("lease_reclaimed", entry_subject(1), entry_id=1)
    tick.emit("lease_reclaimed", entry_subject(2), entry_id=2)
    tick.deliver(retry=True)
    (said,) = [json.loads(r.getMessage()) for r in caplog.records]
    assert said["alert_delivery"] == "not_configured"
    assert ENV_WEBHOOK_URL in said["error"] and "secret-token" not in said["error"]
    assert records(ledger) == []


# --- the real channels, through the service ----------------------------------------------------


def test_real_webhook_and_email_each_get_the_alert_once(ledger: RunLedger) -> None:
    with start(WebhookSink()) as webhook, start(SmtpSink()) as smtp:
        channels = [
            WebhookChannel(WebhookSettings(url=webhook.url(), timeout_seconds=5)),
            EmailChannel(
                EmailSettings(
                    to=("oncall@example.org",),
                    sender="dueledger@example.test",
                    smtp_host="127.0.0.1",
                    smtp_port=smtp.port,
                    timeout_seconds=5,
                )
            ),
        ]
        for _tick in range(2):
            tick = alerts(ledger, *channels)
            tick.emit("lease_reclaimed", entry_subject(42), **FIELDS)
            tick.deliver(retry=True)
        (body,) = webhook.bodies()
        assert (body["alert"], body["subject"], body["fields"]) == (
            "lease_reclaimed",
            "entry:42",
            FIELDS,
        )
        (mail,) = smtp.received
        assert mail["Subject"] == "[dueledger] lease_reclaimed: entry:42"
    assert {(r.channel, r.status) for r in records(ledger)} == {
        ("webhook", DELIVERY_DELIVERED),
        ("email", DELIVERY_DELIVERED),
    }


def test_a_webhook_that_never_answers_holds_a_tick_for_one_timeout(ledger: RunLedger) -> None:
    # Accepts connections (the kernel's backlog) but never answers: the worst kind of down.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/hook"
        channel = WebhookChannel(WebhookSettings(url=url, timeout_seconds=0.5))
        tick = alerts(ledger, channel)
        for entry_id in range(5):
            tick.emit("lease_reclaimed", entry_subject(entry_id), entry_id=entry_id)
        started = time.monotonic()
        (failed,) = tick.deliver(retry=True)
        took = time.monotonic() - started
    assert failed.status == DELIVERY_FAILED and "timed out" in (failed.last_error or "")
    assert took < 3, f"one silent webhook held deliver() for {took:.1f}s"


def test_a_webhook_that_comes_up_later_gets_the_alert(ledger: RunLedger) -> None:
    port = free_port()  # nothing listens there yet
    channel = WebhookChannel(
        WebhookSettings(url=f"http://127.0.0.1:{port}/hook", timeout_seconds=5)
    )
    tick = alerts(ledger, channel)
    tick.emit("lease_reclaimed", entry_subject(42), **FIELDS)
    (failed,) = tick.deliver()
    assert failed.status == DELIVERY_FAILED and "unreachable" in (failed.last_error or "")
    with start(WebhookSink(port)) as webhook:
        (done,) = alerts(ledger, channel, at=NOW + timedelta(minutes=1)).deliver(retry=True)
        assert done.status == DELIVERY_DELIVERED
        assert [b["fields"] for b in webhook.bodies()] == [FIELDS]


# --- a run: the unsupported_task alert -----------------------------------------------------------


def test_a_run_of_an_unregistered_task_delivers_its_alert_from_the_run(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run queued before a deploy that renamed its task: the run itself raises the alert.
    # (SQLite only: a Dagster run is the slow part; the delivery code is the same.)
    ledger = RunLedger(database_url=sqlite_url)
    ledger.migrate()
    tags = {
        t.TAG_TASK: "tick_renamed_away",
        t.TAG_TRIGGER: Trigger.SCHEDULE.value,
        t.TAG_DUE: "2026-11-30T22:45:00Z",
    }
    with start(WebhookSink()) as webhook, dg.instance_for_test() as instance:
        monkeypatch.setenv(ENV_WEBHOOK_URL, webhook.url())
        run = dg.materialize(
            [build("tick_every_slot")],
            resources={"ledger": ledger},
            instance=instance,
            tags=tags,
            raise_on_error=False,
        )
        assert not run.success
        (body,) = webhook.bodies()
    entry = ledger.find("tick_renamed_away", "due:2026-11-30T22:45:00Z")
    assert entry is not None
    assert (body["alert"], body["subject"]) == ("unsupported_task", f"entry:{entry.id}")
    assert body["fields"]["run_id"] == run.run_id
    (record,) = records(ledger)
    assert (record.status, record.attempts) == (DELIVERY_DELIVERED, 1)
