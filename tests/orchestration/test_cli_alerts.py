"""`dueledger alerts`, and alert delivery from `dueledger reclaim` and `dueledger liveness
--alert` (deployments without the daemon): exit codes, JSON shapes, once per alert, and a bad
configuration refused before anything changes, naming the variable and never a secret.
Channels: a real local webhook (tests/alert_sinks.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from alert_sinks import WebhookSink, start
from click.testing import CliRunner

from orchestration.cli import main
from resources.core import alerting as a
from resources.core.entry import Status, Trigger, dedup_key_for_due
from resources.ledger import RunLedger
from resources.ledger.schema import alert_deliveries


@pytest.fixture
def ledger_url(sqlite_url: str) -> str:
    """This module's ledger is SQLite only."""
    return sqlite_url


# The code location's own RunLedger() (sensors, CLI) reads DUELEDGER_DATABASE_URL.
pytestmark = pytest.mark.usefixtures("ledger_in_environment")


BAD_URL = "hooks.example.org/T0/secret-token"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def webhook(monkeypatch: pytest.MonkeyPatch) -> Iterator[WebhookSink]:
    with start(WebhookSink()) as sink:
        monkeypatch.setenv(a.ENV_WEBHOOK_URL, sink.url())
        yield sink


def _expired_lease(ledger: RunLedger) -> int:
    due = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=15)
    entry = ledger.ensure_entry(
        task_key="order_cleanup", trigger=Trigger.SCHEDULE, dedup_key=dedup_key_for_due(due)
    )
    ledger.claim(entry.id, "run-dead", lease_ttl=timedelta(minutes=1), now=due)
    return entry.id


def test_alerts_lists_channels_counts_and_deliveries_newest_first(ledger, webhook) -> None:
    at = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
    for entry_id in (1, 2):
        ledger.record_alert(
            channels=["webhook"],
            kind="lease_reclaimed",
            subject=f"entry:{entry_id}",
            payload={"entry_id": entry_id},
            now=at,
        )
    (first, _second) = sorted(ledger.list_alert_deliveries(), key=lambda r: r.id)
    ledger.claim_alert_attempt(first.id, lease=timedelta(minutes=1), now=at)
    ledger.finish_alert_attempt(first.id, attempt=1, error="HTTP 500", next_attempt_at=None)

    code, out, _ = invoke("alerts", "--json")
    assert code == 0
    data = json.loads(out)
    (channel,) = data["channels"]
    assert channel["channel"] == "webhook" and channel["target"].endswith("/***")
    assert "secret-token" not in out
    assert data["counts"] == {"pending": 1, "delivered": 0, "failed": 1}
    assert [d["subject"] for d in data["deliveries"]] == ["entry:2", "entry:1"]
    failed = data["deliveries"][1]
    assert (failed["status"], failed["gave_up"]) == ("failed", True)
    assert failed["last_error"] == "HTTP 500"
    assert failed["payload"] == {"entry_id": 1}

    code, out, _ = invoke("alerts", "--json", "--status", "failed", "--kind", "lease_reclaimed")
    assert [d["subject"] for d in json.loads(out)["deliveries"]] == ["entry:1"]
    code, out, _ = invoke("alerts")
    assert code == 0
    assert "alert channel webhook: http://127.0.0.1:" in out
    assert "failed (gave up)" in out and "HTTP 500" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--status", "lost"], "unknown delivery status(es) 'lost'"),
        (["--kind", "disk_full"], "--kind 'disk_full' is not an alert kind"),
        (["--limit", "0"], "--limit '0' must be a whole number from 1 to 500"),
    ],
)
def test_alerts_bad_options_are_exit_2(ledger, args: list[str], message: str) -> None:
    code, out, _ = invoke("alerts", *args, "--json")
    assert code == 2 and message in json.loads(out)["error"]


def test_a_bad_alert_configuration_is_exit_2_naming_the_variable_and_no_secret(
    ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(a.ENV_WEBHOOK_URL, BAD_URL)
    code, out, _ = invoke("alerts", "--json")
    assert code == 2
    error = json.loads(out)["error"]
    assert a.ENV_WEBHOOK_URL in error and "secret-token" not in error
    # `reclaim` refuses too, before it reclaims anything.
    entry_id = _expired_lease(ledger)
    code, out, _ = invoke("reclaim", "--json")
    assert code == 2 and a.ENV_WEBHOOK_URL in json.loads(out)["error"]
    assert ledger.get(entry_id).status == Status.RUNNING  # type: ignore[union-attr]


def test_reclaim_delivers_its_alerts_once(ledger, webhook) -> None:
    entry_id = _expired_lease(ledger)
    code, out, _ = invoke("reclaim", "--json")
    assert code == 0
    data = json.loads(out)
    assert [r["entry_id"] for r in data["reclaims"]] == [entry_id]
    (delivery,) = data["alert_deliveries"]
    assert (delivery["channel"], delivery["kind"], delivery["subject"], delivery["status"]) == (
        "webhook",
        "lease_reclaimed",
        f"entry:{entry_id}",
        "delivered",
    )
    code, out, _ = invoke("reclaim", "--json")
    assert (code, json.loads(out)["alert_deliveries"]) == (0, [])
    (body,) = webhook.bodies()
    assert body["fields"]["entry_id"] == entry_id and body["fields"]["run_id"] == "run-dead"


def test_reclaim_says_when_a_delivery_failed_and_retries_it_on_the_next_run(
    ledger, webhook
) -> None:
    webhook.status = 500
    entry_id = _expired_lease(ledger)
    code, _, err = invoke("reclaim")
    assert code == 0
    assert f"alert delivery failed: webhook lease_reclaimed entry:{entry_id} (attempt 1)" in err
    assert "HTTP 500" in err and "retried from" in err
    (record,) = ledger.list_alert_deliveries()
    assert record.status == a.DELIVERY_FAILED
    webhook.status = 200
    # The next run comes after the backoff (30 s): move the row's due time back by it.
    with ledger.transaction() as conn:
        conn.execute(
            sa.update(alert_deliveries)
            .where(alert_deliveries.c.id == record.id)
            .values(next_attempt_at=datetime(2000, 1, 1))
        )
    code, out, _ = invoke("reclaim")
    assert code == 0 and f"alert delivered: webhook lease_reclaimed entry:{entry_id}" in out
    assert len(webhook.bodies()) == 1


def test_liveness_alert_needs_a_channel(ledger) -> None:
    code, out, _ = invoke("liveness", "--alert", "--json")
    assert code == 2
    assert a.ENV_WEBHOOK_URL in json.loads(out)["error"]


def test_liveness_alert_delivers_each_stale_check_once_per_outage(ledger, webhook) -> None:
    # The test instance has no daemon: both checks are stale.
    code, out, _ = invoke("liveness", "--alert", "--json")
    assert code == 1
    data = json.loads(out)
    assert sorted(d["subject"] for d in data["alert_deliveries"]) == [
        "check:scheduler_heartbeat@never",
        "check:slot_evaluation@never",
    ]
    code, out, _ = invoke("liveness", "--alert", "--json")  # the probe runs again: no resend
    assert code == 1 and json.loads(out)["alert_deliveries"] == []
    bodies = webhook.bodies()
    assert sorted(b["fields"]["name"] for b in bodies) == ["scheduler_heartbeat", "slot_evaluation"]
    assert {b["alert"] for b in bodies} == {"liveness"}
    assert all(b["fields"]["max_age_seconds"] == 180 for b in bodies)
    # Without --alert the probe stays read-only.
    code, out, _ = invoke("liveness", "--json")
    assert code == 1 and "alert_deliveries" not in json.loads(out)
