"""Alert delivery from the sensors, with the channels configured by environment variables as
an operator would: a real local webhook (HTTP) and SMTP server (tests/alert_sinks.py).

- ``ledger_sensor``'s reclaim duty through the real sensor daemon path: both channels down (webhook
  answering 500, SMTP not listening) -> the tick still succeeds and its reclaim stands, the
  deliveries are recorded ``failed`` with the error; the channels come up -> a later tick
  retries and delivers, and no tick after that sends anything again.
- ``ledger_sensor`` (slot health) evaluated twice for one slot (its cursor lost): one delivery.
- ``ledger_sensor`` (outcomes): a dispatch failure and a lost Dagster retry each raise their
  alert, delivered once however often the sensor runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
from alert_sinks import SmtpSink, WebhookSink, free_port, start
from dagster_internals import (
    TickStatus,
    daemon_instance,
    daemon_workspace,
    instigator_ticks,
    run_sensor_tick,
)
from sensor_support import fixture_module, target, utc_now

from orchestration.reclaim import reclaim_expired
from orchestration.services.dagster_runs import RETRY_LOST_AFTER
from resources.core import alerting as a
from resources.core import tags as t
from resources.core.entry import FailureKind, Trigger, dedup_key_for_due
from resources.ledger import RunLedger
from sensors.health import build_slot_health_sensor
from sensors.outcomes import build_outcome_sensor

# The code location's own RunLedger() (sensors, CLI) reads DUELEDGER_DATABASE_URL.
pytestmark = pytest.mark.usefixtures("ledger_in_environment")


SENSOR_INTERVAL = timedelta(seconds=31)  # past the reclaim sensor's 30 s


@pytest.fixture
def webhook(monkeypatch: pytest.MonkeyPatch) -> Iterator[WebhookSink]:
    with start(WebhookSink()) as sink:
        monkeypatch.setenv(a.ENV_WEBHOOK_URL, sink.url())
        monkeypatch.setenv(a.ENV_TIMEOUT, "5")
        yield sink


def configure_email(monkeypatch: pytest.MonkeyPatch, port: int) -> None:
    monkeypatch.setenv(a.ENV_EMAIL_TO, "oncall@example.org")
    monkeypatch.setenv(a.ENV_EMAIL_FROM, "dueledger@example.test")
    monkeypatch.setenv(a.ENV_SMTP_HOST, "127.0.0.1")
    monkeypatch.setenv(a.ENV_SMTP_PORT, str(port))


def _expired_lease(ledger: RunLedger, now: datetime):
    """A running entry of lease_defs' task whose worker died ten minutes ago."""
    due = now - timedelta(minutes=15)
    entry = ledger.ensure_entry(
        task_key="sleepy_task",
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(due.replace(second=0, microsecond=0)),
        now=due,
    )
    assert ledger.claim(entry.id, "run-dead", lease_ttl=timedelta(minutes=1), now=due).claimed
    return entry


@pytest.mark.daemon
def test_a_reclaim_alert_survives_both_channels_down_and_is_delivered_once_when_they_are_up(
    ledger: RunLedger, webhook: WebhookSink, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:

    smtp_port = free_port()  # nothing listens there until the SMTP server comes up
    configure_email(monkeypatch, smtp_port)
    # Only the reclaim's own alert: the slot-health report of the same tick would list it too.
    monkeypatch.setenv(a.ENV_KINDS, a.KIND_LEASE_RECLAIMED)
    webhook.status = 500
    now = utc_now()
    entry = _expired_lease(ledger, now)
    with (
        daemon_instance("mocked", temp_dir=tmp_path / "instance") as instance,
        daemon_workspace(instance, target("lease_defs")) as ctx,
    ):
        run_sensor_tick(ctx, now)  # raises if any sensor's evaluation failed
        tick = instigator_ticks(ctx, "ledger_sensor")[0]
        assert tick.status == TickStatus.SKIPPED
        assert "reclaimed 1 expired lease" in (tick.skip_reason or "")
        assert "alert deliveries: 0 delivered, 2 failed" in (tick.skip_reason or "")
        after = ledger.get(entry.id)
        assert after is not None and after.failure_kind == FailureKind.LEASE_RECLAIMED
        failed = {r.channel: r for r in ledger.list_alert_deliveries()}
        assert {c: (r.status, r.attempts) for c, r in failed.items()} == {
            "webhook": (a.DELIVERY_FAILED, 1),
            "email": (a.DELIVERY_FAILED, 1),
        }
        assert "HTTP 500" in (failed["webhook"].last_error or "")
        assert f"127.0.0.1:{smtp_port} failed" in (failed["email"].last_error or "")
        assert "secret-token" not in (failed["webhook"].last_error or "")

        webhook.status = 200
        with start(SmtpSink(smtp_port)) as smtp:
            run_sensor_tick(ctx, now + SENSOR_INTERVAL)  # the backoff (30 s) is over
            run_sensor_tick(ctx, now + 2 * SENSOR_INTERVAL)  # nothing is sent again
            (mail,) = smtp.received
        assert mail["Subject"] == f"[dueledger] lease_reclaimed: entry:{entry.id}"
    (body,) = webhook.bodies()
    assert (body["alert"], body["subject"]) == ("lease_reclaimed", f"entry:{entry.id}")
    assert (body["fields"]["run_id"], body["attempt"]) == ("run-dead", 2)
    assert len(webhook.received) == 2  # the 500 and the delivery: nothing after it
    delivered = ledger.list_alert_deliveries()
    assert {(r.channel, r.status, r.attempts) for r in delivered} == {
        ("webhook", a.DELIVERY_DELIVERED, 2),
        ("email", a.DELIVERY_DELIVERED, 2),
    }


# --- slot health: once per slot -------------------------------------------------------------


def _evaluate(sensor: dg.SensorDefinition, ledger: RunLedger, instance=None, cursor=None):
    with dg.build_sensor_context(
        instance=instance or dg.DagsterInstance.ephemeral(),
        cursor=cursor,
        resources={"ledger": ledger},
    ) as context:
        return sensor(context)


def test_a_slot_health_report_repeated_for_its_slot_is_delivered_once(
    ledger: RunLedger, webhook: WebhookSink
) -> None:
    module = fixture_module()
    views = module.views_of(module.STRICT)
    due = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)
    entry = ledger.ensure_entry(
        task_key="strict_task",
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(due),
        now=due,
    )
    ledger.claim(entry.id, "run-dead", lease_ttl=timedelta(minutes=5), now=due)
    reclaim_expired(ledger, now=due + timedelta(minutes=20))
    now = due + timedelta(minutes=31)
    sensor = build_slot_health_sensor(views, clock=lambda: now)
    for _ in range(2):  # the cursor was lost: the same slot is evaluated again
        result = _evaluate(sensor, ledger)
        assert "problems reported" in (result.skip_reason.skip_message or "")
    (body,) = webhook.bodies()
    assert (body["alert"], body["subject"]) == ("slot_health", "slot:2026-11-30T22:30:00Z")
    assert [r["entry_id"] for r in body["fields"]["reclaims"]] == [entry.id]


# --- the outcome sensor: dispatch failures and lost retries ------------------------------------

_TAGS = {t.TAG_TASK: "strict_task", t.TAG_TRIGGER: Trigger.SCHEDULE.value}


def _failed_run(
    instance: dg.DagsterInstance, due: str, *, will_retry: bool, parent: dg.DagsterRun | None = None
) -> dg.DagsterRun:
    job = dg.GraphDefinition(name="noop", node_defs=[]).to_job(name="strict_task_job")
    tags = {**_TAGS, t.TAG_DUE: due}
    if parent is not None:
        tags |= {t.DAGSTER_PARENT_RUN_ID: parent.run_id, t.DAGSTER_RETRY_NUMBER: "1"}
    run = instance.create_run_for_job(
        job,
        tags=tags,
        parent_run_id=parent.run_id if parent else None,
        root_run_id=parent.run_id if parent else None,
    )
    instance.report_run_failed(run)
    instance.add_run_tags(run.run_id, {t.DAGSTER_WILL_RETRY: str(will_retry).lower()})
    return run


def test_a_dispatch_failure_and_a_lost_retry_each_alert_once(
    ledger: RunLedger, webhook: WebhookSink
) -> None:
    module = fixture_module()
    views = module.views_of(module.STRICT)
    now = utc_now()
    with dg.instance_for_test() as instance:
        # A run that failed before it claimed its entry (e.g. the launcher raised).
        never_claimed = _failed_run(instance, "2026-11-30T22:45:00Z", will_retry=False)
        # A claimed run that died; Dagster announced its retry and never created it.
        lost = _failed_run(instance, "2026-11-30T23:00:00Z", will_retry=True)
        entry = ledger.ensure_entry(
            task_key="strict_task",
            trigger=Trigger.SCHEDULE,
            dedup_key="due:2026-11-30T23:00:00Z",
            max_attempts=3,
            now=now - timedelta(minutes=10),
        )
        ledger.claim(entry.id, lost.run_id, lease_ttl=timedelta(minutes=2))
        ledger.fail(entry.id, lost.run_id, error="killed worker")
        later = now + RETRY_LOST_AFTER + timedelta(minutes=1)
        cursor = None
        for at in (now, later, later + timedelta(minutes=1)):
            sensor = build_outcome_sensor(views, clock=lambda at=at: at)
            result = _evaluate(sensor, ledger, instance, cursor)
            cursor = result.cursor
    bodies = {b["alert"]: b for b in webhook.bodies()}
    assert sorted(bodies) == ["dispatch_failed", "retry_lost"]
    assert len(webhook.bodies()) == 2
    failed = bodies["dispatch_failed"]["fields"]
    assert (failed["run_id"], failed["status"]) == (never_claimed.run_id, "dispatch_failed")
    assert "before it claimed" in failed["error"]
    lost_alert = bodies["retry_lost"]
    assert lost_alert["subject"] == f"entry:{entry.id}"
    assert (lost_alert["fields"]["run_id"], lost_alert["fields"]["status"]) == (
        lost.run_id,
        "failed",
    )
    assert "the retry was lost" in lost_alert["fields"]["error"]
