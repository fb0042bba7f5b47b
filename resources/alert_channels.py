"""Where alerts go: one interface, a webhook (HTTP POST) and an email (SMTP) channel.

A channel sends one :class:`AlertMessage` and raises :class:`ChannelError` when the channel
did not take it (server down, refused, timed out); the error text is stored on the delivery
record, so it never carries a secret (the webhook URL's user info, path and query, the SMTP
password) nor an escape sequence from a server's answer.
Which alerts are sent, once, and when they are retried is decided by
``orchestration/services/alerts.py`` over the ledger's delivery records
(``resources/ledger/deliveries.py``); tests pass a fake channel.

- :class:`WebhookChannel`: ``POST`` with ``Content-Type: application/json`` (stdlib
  ``urllib``: one request per alert, nothing a library would add here), either the alert as
  JSON (``{"alert", "subject", "delivery_id", "attempt", "fields"}``) or a Slack-compatible
  incoming-webhook body (``{"text": ...}``). A 2xx answer is delivered, anything else fails.
  User info in the URL (``https://user:pw@host/...``) is sent as HTTP Basic authentication.
- :class:`EmailChannel`: one mail to every recipient through the SMTP code of
  ``resources/notifier.py`` (:meth:`SmtpNotifier.open_session`), with a stable
  ``Message-ID`` per delivery so a receiving system can drop a resend.
"""

from __future__ import annotations

import json
import smtplib
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any, Final, Protocol

from resources.core.alerting import (
    CHANNEL_EMAIL,
    CHANNEL_WEBHOOK,
    FORMAT_SLACK,
    AlertSettings,
    EmailSettings,
    WebhookSettings,
)
from resources.core.text import clean_text
from resources.notifier import SmtpNotifier, SmtpSessionError

#: Characters of a webhook's error answer kept in the error text.
_ANSWER_CHARS: Final = 200
#: Characters of the human-readable text (Slack's own limit is far above).
_TEXT_CHARS: Final = 3000


class ChannelError(RuntimeError):
    """The channel did not take the alert; the message says why (no secrets)."""


@dataclass(frozen=True)
class AlertMessage:
    """One alert as a channel sends it: its kind and subject, its fields, which delivery
    record and attempt it is (receivers may deduplicate on ``delivery_id``)."""

    kind: str
    subject: str
    fields: Mapping[str, Any] = field(hash=False)
    delivery_id: int
    attempt: int

    def as_json(self) -> dict[str, Any]:
        return {
            "alert": self.kind,
            "subject": self.subject,
            "delivery_id": self.delivery_id,
            "attempt": self.attempt,
            "fields": dict(self.fields),
        }

    def title(self) -> str:
        return f"dueledger alert: {self.kind} ({self.subject})"

    def text(self) -> str:
        """The alert for people: a title line and one ``name: value`` line per field."""
        lines = [self.title()]
        for name, value in self.fields.items():
            shown = value if isinstance(value, str) else json.dumps(value, default=str)
            lines.append(f"{name}: {shown}")
        text = "\n".join(lines)
        return text if len(text) <= _TEXT_CHARS else text[: _TEXT_CHARS - 4] + " ..."


class AlertChannel(Protocol):
    """An external channel alerts are delivered to."""

    @property
    def name(self) -> str:
        """The channel's name in delivery records (``webhook``, ``email``)."""
        ...

    @property
    def timeout_seconds(self) -> float:
        """The longest one send may take."""
        ...

    def accepts(self, kind: str) -> bool:
        """Whether alerts of ``kind`` go to this channel."""
        ...

    def send(self, message: AlertMessage) -> str | None:
        """Deliver ``message``; raise :class:`ChannelError` when the channel did not take it.
        Returns a note worth keeping on the delivered record (e.g. a refused recipient)."""
        ...


class WebhookChannel:
    """An HTTP(S) webhook (see the module docstring)."""

    name = CHANNEL_WEBHOOK

    def __init__(self, settings: WebhookSettings) -> None:
        self.settings = settings

    def __repr__(self) -> str:
        return f"WebhookChannel({self.settings.masked_url}, format={self.settings.format})"

    @property
    def timeout_seconds(self) -> float:
        return self.settings.timeout_seconds

    def accepts(self, kind: str) -> bool:
        return self.settings.kinds is None or kind in self.settings.kinds

    def body(self, message: AlertMessage) -> dict[str, Any]:
        """The JSON body: the alert, or ``{"text": ...}`` for a Slack incoming webhook."""
        if self.settings.format == FORMAT_SLACK:
            title, _, rest = message.text().partition("\n")
            return {"text": f"*{title}*\n```{rest}```" if rest else f"*{title}*"}
        return message.as_json()

    def send(self, message: AlertMessage) -> str | None:
        try:
            return self._post(message)
        except ChannelError as exc:
            raise ChannelError(self.settings.scrub(str(exc))) from None
        except Exception as exc:  # whatever urllib raises, its text may quote the URL
            raise ChannelError(
                self.settings.scrub(
                    f"webhook {self.settings.masked_url} failed: {type(exc).__name__}: {exc}"
                )
            ) from None

    def _post(self, message: AlertMessage) -> str | None:
        data = json.dumps(self.body(message), default=str).encode("utf-8")
        target = self.settings.target
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "dueledger-alerts",
            "X-Dueledger-Delivery": str(message.delivery_id),
        }
        request = urllib.request.Request(target.endpoint, data=data, method="POST", headers=headers)
        if target.authorization is not None:
            # The URL's user info (https://user:pw@host/...), as HTTP Basic authentication
            # (urllib would take it for part of the host name); unredirected: a redirect to
            # another host must not carry the credentials there.
            request.add_unredirected_header("Authorization", target.authorization)
        where = self.settings.masked_url
        try:
            with urllib.request.urlopen(request, timeout=self.settings.timeout_seconds) as answer:
                status = answer.status
        except urllib.error.HTTPError as exc:
            detail = _read_answer(exc)
            raise ChannelError(
                f"webhook {where} answered HTTP {exc.code} {exc.reason}{detail}"
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ChannelError(
                f"webhook {where} unreachable: {type(exc).__name__}: {reason}"
            ) from None
        if not 200 <= status < 300:
            raise ChannelError(f"webhook {where} answered HTTP {status}, not 2xx")
        return None


def _read_answer(exc: urllib.error.HTTPError) -> str:
    try:
        raw = exc.read(_ANSWER_CHARS + 1).decode("utf-8", "replace")
    except Exception:  # the answer is a detail; its absence is no error of its own
        return ""
    finally:
        exc.close()
    # A server's page may color itself for a terminal: no escape sequence is stored.
    body = clean_text(raw).strip()
    if not body:
        return ""
    return f": {body[:_ANSWER_CHARS]}{'...' if len(body) > _ANSWER_CHARS else ''}"


class EmailChannel:
    """Email over SMTP to every configured recipient (see the module docstring)."""

    name = CHANNEL_EMAIL

    def __init__(self, settings: EmailSettings) -> None:
        self.settings = settings
        self.smtp = SmtpNotifier(
            host=settings.smtp_host,
            port=settings.smtp_port,
            sender=settings.sender,
            username=settings.smtp_user,
            password=settings.smtp_password,
            starttls=settings.smtp_starttls,
            timeout_seconds=settings.timeout_seconds,
        )

    def __repr__(self) -> str:
        return f"EmailChannel({', '.join(self.settings.to)} via {self.settings.smtp_host})"

    @property
    def timeout_seconds(self) -> float:
        return self.settings.timeout_seconds

    def accepts(self, kind: str) -> bool:
        return self.settings.kinds is None or kind in self.settings.kinds

    def mail(self, message: AlertMessage) -> EmailMessage:
        mail = EmailMessage()
        mail["From"] = self.settings.sender
        mail["To"] = ", ".join(self.settings.to)
        mail["Subject"] = f"[dueledger] {message.kind}: {message.subject}"
        # Stable per delivery record: a resend after a crash mid-attempt is recognisable.
        mail["Message-ID"] = f"<alert-{message.delivery_id}@dueledger>"
        mail["X-Dueledger-Alert"] = f"{message.kind}/{message.subject}"
        mail.set_content(
            f"{message.text()}\n\n--\n{json.dumps(message.as_json(), indent=2, default=str)}\n"
        )
        return mail

    def send(self, message: AlertMessage) -> str | None:
        try:
            session = self.smtp.open_session()
        except SmtpSessionError as exc:
            raise ChannelError(str(exc)) from None
        try:
            with session:
                refused = session.send_message(self.mail(message))
        except (OSError, smtplib.SMTPException) as exc:
            raise ChannelError(f"SMTP send failed: {type(exc).__name__}: {exc}") from None
        if refused:
            # Others took it (all refused raises above): sending it again would duplicate
            # it for them, so it counts as delivered, with the refused ones noted.
            return f"SMTP server refused recipient(s) {', '.join(sorted(refused))}"
        return None


def build_channels(settings: AlertSettings) -> list[AlertChannel]:
    """The channels ``settings`` configures (no I/O: a channel connects when it sends)."""
    channels: list[AlertChannel] = []
    if settings.webhook is not None:
        channels.append(WebhookChannel(settings.webhook))
    if settings.email is not None:
        channels.append(EmailChannel(settings.email))
    return channels
