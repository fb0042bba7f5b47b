"""The alert channels against real local servers (tests/alert_sinks.py): the webhook's JSON
and Slack bodies over HTTP, email over SMTP, and each channel down (not listening, HTTP 500),
with errors that say what failed and carry no secret."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from alert_sinks import SmtpSink, WebhookSink, free_port, start

from resources.alert_channels import AlertMessage, ChannelError, EmailChannel, WebhookChannel
from resources.core.alerting import EmailSettings, WebhookSettings

MESSAGE = AlertMessage(
    kind="lease_reclaimed",
    subject="entry:42",
    fields={"task": "order_cleanup", "entry_id": 42, "overdue_seconds": 95, "reclaims": [1, 2]},
    delivery_id=7,
    attempt=1,
)


@pytest.fixture
def webhook() -> Iterator[WebhookSink]:
    with start(WebhookSink()) as sink:
        yield sink


@pytest.fixture
def smtp() -> Iterator[SmtpSink]:
    with start(SmtpSink()) as sink:
        yield sink


def test_the_webhook_posts_the_alert_as_json(webhook: WebhookSink) -> None:
    channel = WebhookChannel(WebhookSettings(url=webhook.url(), timeout_seconds=5))
    assert channel.send(MESSAGE) is None
    (post,) = webhook.received
    assert post.path == "/hooks/T000/B000/secret-token"
    assert post.headers["content-type"] == "application/json"
    assert post.headers["x-dueledger-delivery"] == "7"
    assert post.body == {
        "alert": "lease_reclaimed",
        "subject": "entry:42",
        "delivery_id": 7,
        "attempt": 1,
        "fields": {
            "task": "order_cleanup",
            "entry_id": 42,
            "overdue_seconds": 95,
            "reclaims": [1, 2],
        },
    }


def test_the_webhook_posts_a_slack_incoming_webhook_body(webhook: WebhookSink) -> None:
    channel = WebhookChannel(WebhookSettings(url=webhook.url(), format="slack"))
    channel.send(MESSAGE)
    (post,) = webhook.received
    assert list(post.body) == ["text"]  # what a Slack incoming webhook takes
    text = post.body["text"]
    assert text.startswith("*dueledger alert: lease_reclaimed (entry:42)*\n")
    assert "task: order_cleanup" in text and "reclaims: [1, 2]" in text


def test_a_webhook_answering_500_fails_with_the_answer_and_no_secret(webhook: WebhookSink) -> None:
    webhook.status = 500
    channel = WebhookChannel(WebhookSettings(url=webhook.url(), timeout_seconds=5))
    with pytest.raises(ChannelError) as raised:
        channel.send(MESSAGE)
    text = str(raised.value)
    assert "HTTP 500" in text and "upstream exploded" in text
    assert f"http://127.0.0.1:{webhook.port}/***" in text
    assert "secret-token" not in text


def test_a_webhook_nobody_listens_on_fails_at_once_with_no_secret() -> None:
    url = f"http://127.0.0.1:{free_port()}/hooks/secret-token"
    channel = WebhookChannel(WebhookSettings(url=url, timeout_seconds=5))
    with pytest.raises(ChannelError, match=r"unreachable.*(refused|Errno)") as raised:
        channel.send(MESSAGE)
    assert "secret-token" not in str(raised.value)


def email_settings(port: int, **kw: object) -> EmailSettings:
    base: dict = {
        "to": ("oncall@example.org", "ops@example.org"),
        "sender": "dueledger@example.test",
        "smtp_host": "127.0.0.1",
        "smtp_port": port,
        "timeout_seconds": 5,
    }
    return EmailSettings(**{**base, **kw})


def test_email_goes_out_over_smtp_with_a_stable_message_id(smtp: SmtpSink) -> None:
    EmailChannel(email_settings(smtp.port)).send(MESSAGE)
    (mail,) = smtp.received
    assert mail["From"] == "dueledger@example.test"
    assert mail["To"] == "oncall@example.org, ops@example.org"
    assert mail["Subject"] == "[dueledger] lease_reclaimed: entry:42"
    assert mail["Message-ID"] == "<alert-7@dueledger>"
    body = mail.get_payload(decode=True).decode().replace("\r\n", "\n")
    assert "task: order_cleanup" in body
    assert json.loads(body.split("--\n", 1)[1])["fields"]["entry_id"] == 42


def test_email_to_a_server_that_is_not_listening_fails_naming_it() -> None:
    port = free_port()
    with pytest.raises(ChannelError, match=f"SMTP connect to 127.0.0.1:{port} failed"):
        EmailChannel(email_settings(port)).send(MESSAGE)


def test_email_refused_for_every_recipient_fails(smtp: SmtpSink) -> None:
    smtp.refuse.update({"oncall@example.org", "ops@example.org"})
    with pytest.raises(ChannelError, match="SMTP send failed: SMTPRecipientsRefused"):
        EmailChannel(email_settings(smtp.port)).send(MESSAGE)
    assert smtp.received == []


def test_email_refused_for_one_recipient_is_delivered_with_a_note(smtp: SmtpSink) -> None:
    # Sending again would give the others a second copy: delivered, the refusal noted.
    smtp.refuse.add("ops@example.org")
    note = EmailChannel(email_settings(smtp.port)).send(MESSAGE)
    assert note == "SMTP server refused recipient(s) ops@example.org"
    assert len(smtp.received) == 1
