"""Alert channel settings (resources/core/alerting.py): environment variables and the TOML
file, validated with errors that name the variable or the file's key and the fix, and never
show a secret; the backoff and the subjects. Pure: no network, no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from resources.alert_channels import EmailChannel, WebhookChannel, build_channels
from resources.core import alerting as a
from resources.core.settings import SettingsError

SLACK_URL = "https://hooks.slack.com/services/T000/B000/xoxb-secret-token"
SMTP = {
    a.ENV_EMAIL_TO: "oncall@example.org, ops@example.org",
    a.ENV_EMAIL_FROM: "dueledger@example.org",
    a.ENV_SMTP_HOST: "smtp.example.org",
}


def load(env: dict[str, str]) -> a.AlertSettings:
    return a.load_alert_settings(env)


def test_nothing_configured_means_no_channels_and_no_io() -> None:
    settings = load({})
    assert settings.channels == () and build_channels(settings) == []
    assert settings.max_attempts == a.DEFAULT_MAX_ATTEMPTS


def test_a_webhook_and_email_from_the_environment() -> None:
    settings = load(
        {
            a.ENV_WEBHOOK_URL: SLACK_URL,
            a.ENV_WEBHOOK_FORMAT: "Slack",
            a.ENV_SMTP_PORT: "587",
            a.ENV_SMTP_USER: "alerts",
            a.ENV_SMTP_PASSWORD: "hunter2",
            a.ENV_SMTP_STARTTLS: "yes",
            a.ENV_KINDS: "lease_reclaimed, slot_health",
            a.ENV_MAX_ATTEMPTS: "3",
            **SMTP,
        }
    )
    assert settings.webhook is not None and settings.email is not None
    assert (settings.webhook.url, settings.webhook.format) == (SLACK_URL, "slack")
    assert settings.webhook.kinds == frozenset({"lease_reclaimed", "slot_health"})
    email = settings.email
    assert email.to == ("oncall@example.org", "ops@example.org")
    assert (email.smtp_port, email.smtp_user, email.smtp_starttls) == (587, "alerts", True)
    assert settings.max_attempts == 3
    channels = build_channels(settings)
    assert [type(c) for c in channels] == [WebhookChannel, EmailChannel]
    assert not channels[0].accepts("dispatch_failed") and channels[0].accepts("slot_health")


def test_secrets_never_show_in_repr_or_json() -> None:
    settings = load(
        {a.ENV_WEBHOOK_URL: SLACK_URL, a.ENV_SMTP_USER: "u", a.ENV_SMTP_PASSWORD: "hunter2", **SMTP}
    )
    shown = f"{settings!r} {settings.as_json()} {build_channels(settings)!r}"
    assert "xoxb-secret-token" not in shown and "T000" not in shown
    assert "hunter2" not in shown
    assert "https://hooks.slack.com/***" in shown


def test_the_toml_file_with_the_environment_taking_precedence(tmp_path: Path) -> None:
    path = tmp_path / "alerts.toml"
    path.write_text(
        f"""
max_attempts = 4
kinds = ["slot_health"]

[webhook]
url = "{SLACK_URL}"
format = "json"
timeout_seconds = 2.5

[email]
to = ["oncall@example.org"]
from = "dueledger@example.org"
smtp_host = "smtp.example.org"
smtp_port = 2525
kinds = ["liveness", "lease_reclaimed"]
""",
        encoding="utf-8",
    )
    settings = load({a.ENV_ALERTS_FILE: str(path), a.ENV_WEBHOOK_FORMAT: "slack"})
    assert settings.webhook is not None and settings.email is not None
    assert (settings.webhook.format, settings.webhook.timeout_seconds) == ("slack", 2.5)
    assert settings.webhook.kinds == frozenset({"slot_health"})  # the file's top level
    assert settings.email.kinds == frozenset({"liveness", "lease_reclaimed"})  # its own
    assert (settings.email.smtp_port, settings.max_attempts) == (2525, 4)
    assert str(path) in settings.source


BAD = [
    pytest.param(
        {a.ENV_WEBHOOK_URL: "hooks.example.org/T0/secret-token"},
        f"{a.ENV_WEBHOOK_URL} .*not an http:// or https:// URL.*incoming-webhook URL",
        id="webhook-url-without-scheme",
    ),
    pytest.param(
        {a.ENV_WEBHOOK_URL: "ftp://hooks.example.org/secret-token"},
        "not an http:// or https:// URL",
        id="webhook-url-not-http",
    ),
    pytest.param(
        {a.ENV_WEBHOOK_URL: SLACK_URL, a.ENV_WEBHOOK_FORMAT: "teams"},
        f"{a.ENV_WEBHOOK_FORMAT}='teams' must be one of json, slack",
        id="webhook-format",
    ),
    pytest.param(
        {a.ENV_WEBHOOK_URL: SLACK_URL, a.ENV_TIMEOUT: "600"},
        f"{a.ENV_TIMEOUT}='600' must be a number of seconds from 0.1 to 30",
        id="timeout-too-long",
    ),
    pytest.param(
        {a.ENV_EMAIL_TO: "oncall@example.org"},
        f"alert email is configured \\({a.ENV_EMAIL_TO}\\) but {a.ENV_SMTP_HOST} is not set",
        id="email-without-smtp-host",
    ),
    pytest.param(
        {**SMTP, a.ENV_EMAIL_FROM: ""},
        f"{a.ENV_EMAIL_FROM} is not set: set it to the From address",
        id="email-without-sender",
    ),
    pytest.param(
        {**SMTP, a.ENV_EMAIL_TO: "oncall, ops@example.org"},
        f"{a.ENV_EMAIL_TO}=.*'oncall', not an email address",
        id="email-bad-address",
    ),
    pytest.param(
        {**SMTP, a.ENV_SMTP_PORT: "smtp"},
        f"{a.ENV_SMTP_PORT}='smtp' must be a whole number of port from 1 to 65535",
        id="smtp-port",
    ),
    pytest.param(
        {**SMTP, a.ENV_SMTP_PASSWORD: "hunter2"},
        f"{a.ENV_SMTP_PASSWORD} is set but no SMTP user is: set {a.ENV_SMTP_USER}",
        id="password-without-user",
    ),
    pytest.param(
        {**SMTP, a.ENV_SMTP_STARTTLS: "maybe"},
        f"{a.ENV_SMTP_STARTTLS}='maybe' must be true or false",
        id="starttls",
    ),
    pytest.param(
        {a.ENV_KINDS: "lease_reclaimed,disk_full"},
        "unknown alert kind\\(s\\) disk_full; known kinds: lease_reclaimed",
        id="unknown-kind",
    ),
    pytest.param(
        {a.ENV_MAX_ATTEMPTS: "0"},
        f"{a.ENV_MAX_ATTEMPTS}='0' must be a whole number of attempts from 1 to 100",
        id="max-attempts",
    ),
]


@pytest.mark.parametrize(("env", "message"), BAD)
def test_a_bad_setting_names_the_variable_and_the_fix(env: dict[str, str], message: str) -> None:
    with pytest.raises(a.AlertSettingsError, match=message) as raised:
        load(env)
    assert isinstance(raised.value, SettingsError)  # the CLI's exit 2
    assert "secret-token" not in str(raised.value) and "hunter2" not in str(raised.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[webhook]\nurl = 5\n", r"\[webhook\] url=<hidden> must be a non-empty string"),
        ("[webhok]\nurl = 'x'\n", r"unknown key\(s\) webhok; known: email, kinds"),
        ("[email]\nsmtp_hots = 'x'\n", r"unknown key\(s\) smtp_hots in \[email\]"),
        ("webhook = 'x'\n", r"\[webhook\] must be a table"),
        ("[webhook\n", "not valid TOML"),
    ],
    ids=["wrong-type", "unknown-table", "unknown-key", "not-a-table", "bad-toml"],
)
def test_a_bad_file_names_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "alerts.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(a.AlertSettingsError, match=message) as raised:
        load({a.ENV_ALERTS_FILE: str(path)})
    assert f"{a.ENV_ALERTS_FILE}={path}" in str(raised.value)


def test_a_missing_file_is_an_error_not_no_alerts(tmp_path: Path) -> None:
    # A typo in the path must not silently switch alert delivery off.
    missing = tmp_path / "nope.toml"
    with pytest.raises(a.AlertSettingsError, match="the file does not exist"):
        load({a.ENV_ALERTS_FILE: str(missing)})


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (SLACK_URL, "https://hooks.slack.com/***"),
        ("http://127.0.0.1:8080/hook?token=abc", "http://127.0.0.1:8080/***"),
        ("https://user:pw@alerts.example.org", "https://alerts.example.org/"),
        ("https://alerts.example.org/", "https://alerts.example.org/"),
        ("not a url", "<unparseable webhook URL>"),
    ],
)
def test_mask_webhook_url_keeps_scheme_and_host_only(url: str, shown: str) -> None:
    assert a.mask_webhook_url(url) == shown


@pytest.mark.parametrize(
    ("failed", "delay"),
    [
        (1, timedelta(seconds=30)),
        (2, timedelta(seconds=60)),
        (3, timedelta(minutes=2)),
        (7, timedelta(minutes=32)),
        (8, timedelta(hours=1)),
        (50, timedelta(hours=1)),
    ],
)
def test_the_backoff_doubles_up_to_an_hour(failed: int, delay: timedelta) -> None:
    assert a.retry_delay(failed) == delay


def test_subjects() -> None:
    slot = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
    assert a.entry_subject(42) == "entry:42"
    assert a.slot_subject(slot) == "slot:2026-11-30T23:00:00Z"
    assert a.check_subject("scheduler_heartbeat", slot) == (
        "check:scheduler_heartbeat@2026-11-30T23:00:00Z"
    )
    assert a.check_subject("slot_evaluation", None) == "check:slot_evaluation@never"
