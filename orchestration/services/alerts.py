"""Alerts: the JSON line every sensor and the CLI write, its delivery to the configured
channels, and the clock they read.

:func:`alert_line` renders one alert as one JSON line (``{"alert": kind, ...}``) so log
pipelines can parse it; :func:`emit_alert` writes it to the Dagster context log and to the
``dueledger.alerts`` Python logger.

:class:`Alerts` adds delivery (docs/operations.md, "Alert delivery"). One is made per sensor
tick, command or run (:meth:`Alerts.from_environment`: the channels of
``resources/core/alerting.py``); then

- :meth:`Alerts.emit` writes the line and records a ``pending`` delivery per channel that
  takes the kind, keyed ``(channel, kind, subject)`` insert-or-ignore: the same alert emitted
  again (a re-evaluated tick, the sensor and the CLI) is delivered once;
- :meth:`Alerts.deliver` attempts what this object recorded, and with ``retry=True`` also the
  older deliveries that are due (``pending``, or ``failed`` with attempts left, after their
  backoff). Bounded: each send has the channel's timeout, a channel that fails is not tried
  again in the same call (its deliveries wait for the next), and no new attempt starts after
  :data:`DELIVER_BUDGET`.

Nothing here raises into the caller: a channel that is down, a bad configuration or a ledger
error is logged (``dueledger.alert_delivery``) and the sensor's own work stands.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from resources.alert_channels import AlertChannel, AlertMessage, ChannelError, build_channels
from resources.core.alerting import (
    DEFAULT_MAX_ATTEMPTS,
    AlertSettings,
    AlertSettingsError,
    attempt_lease,
    load_alert_settings,
    retry_delay,
)
from resources.core.instants import iso, utc_now
from resources.ledger import DeliveryRecord, Ledger

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

ALERT_LOGGER: Final = logging.getLogger("dueledger.alerts")
#: Delivery outcomes. Not a child of ``dueledger.alerts``: that logger carries alert lines only.
DELIVERY_LOGGER: Final = logging.getLogger("dueledger.alert_delivery")
#: No new attempt starts once one ``deliver`` call has taken this long.
DELIVER_BUDGET: Final = timedelta(seconds=10)
#: Older due deliveries one ``deliver(retry=True)`` looks at.
RETRY_BATCH: Final = 20


def alert_line(kind: str, **fields: Any) -> str:
    """One alert as one JSON line: ``{"alert": kind, ...fields}`` (keys in the given order)."""
    return json.dumps({"alert": kind, **fields}, default=str, separators=(",", ":"))


def emit_alert(log: Any | None, kind: str, **fields: Any) -> str:
    """Write one alert line as a warning to ``log`` (a Dagster context log) and to the
    ``dueledger.alerts`` logger (the daemon's own log). Returns the line."""
    line = alert_line(kind, **fields)
    if log is not None:
        log.warning(line)
    ALERT_LOGGER.warning(line)
    return line


@dataclass
class Alerts:
    """Alert lines plus their delivery, for one sensor tick, command or run (see the module
    docstring). ``now`` is the caller's clock: records and backoff are stamped with it."""

    ledger: Ledger | None
    channels: Sequence[AlertChannel]
    now: datetime
    log: Any | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    #: Why no channel could be configured (logged once, when there is something to deliver).
    config_error: str | None = None
    #: Write to the ``dueledger.alerts`` / ``dueledger.alert_delivery`` loggers (the CLI
    #: prints alert lines and delivery failures itself instead).
    use_loggers: bool = True
    # Recorded by emit, not yet attempted; channels that failed during this object's life
    # (not tried again by it); whether the configuration error was logged.
    _new: list[DeliveryRecord] = field(default_factory=list, init=False, repr=False)
    _down: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    _said_config: bool = field(default=False, init=False, repr=False)

    @classmethod
    def from_settings(
        cls,
        ledger: Ledger | None,
        settings: AlertSettings,
        *,
        now: datetime | None = None,
        log: Any | None = None,
        use_loggers: bool = True,
    ) -> Alerts:
        """Alerts to the channels ``settings`` configures (none: alert lines only)."""
        return cls(
            ledger=ledger,
            channels=build_channels(settings),
            now=now if now is not None else utc_now(),
            log=log,
            max_attempts=settings.max_attempts,
            use_loggers=use_loggers,
        )

    @classmethod
    def from_environment(
        cls,
        ledger: Ledger | None,
        *,
        now: datetime | None = None,
        log: Any | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Alerts:
        """Alerts to the channels configured in the environment. A bad configuration does
        not raise (a sensor must go on): the alerts stay lines and the error is logged."""
        try:
            settings = load_alert_settings(environ)
        except AlertSettingsError as exc:
            return cls(
                ledger=ledger, channels=(), now=now or utc_now(), log=log, config_error=str(exc)
            )
        return cls.from_settings(ledger, settings, now=now, log=log)

    # --- emitting ---------------------------------------------------------------------------

    def emit(self, kind: str, subject: str, **fields: Any) -> str:
        """Write the alert line and record its delivery to every channel that takes ``kind``
        (once per ``(channel, kind, subject)``); it is sent by :meth:`deliver`."""
        if self.use_loggers:
            line = emit_alert(self.log, kind, **fields)
        else:
            line = alert_line(kind, **fields)
            if self.log is not None:
                self.log.warning(line)
        self.record(kind, subject, fields)
        return line

    def record(
        self,
        kind: str,
        subject: str,
        fields: Mapping[str, Any],
        *,
        connection: Connection | None = None,
    ) -> list[DeliveryRecord]:
        """Record the delivery of one alert (no line written): see :meth:`emit`; with
        ``connection``, in that transaction. Returns the delivery rows this call inserted
        (none when the alert was recorded before)."""
        self._say_config_error()
        channels = [c.name for c in self.channels if c.accepts(kind)]
        if not channels or self.ledger is None:
            return []
        try:
            inserted = self.ledger.record_alert(
                channels=channels,
                kind=kind,
                subject=subject,
                payload=fields,
                now=self.now,
                connection=connection,
            )
            self._new += inserted
            return inserted
        except Exception as exc:  # the alert line is out; delivery must not fail the caller
            self._say(
                logging.ERROR,
                {
                    "alert_delivery": "not_recorded",
                    "kind": kind,
                    "subject": subject,
                    "error": _text(exc),
                },
            )
            return []

    # --- delivering -------------------------------------------------------------------------

    def deliver(self, *, retry: bool = False) -> list[DeliveryRecord]:
        """Attempt the deliveries recorded by :meth:`emit` (and, with ``retry``, older due
        ones); returns the records as each attempt left them. Never raises."""
        started = time.monotonic()
        done: list[DeliveryRecord] = []
        todo, self._new = self._new, []
        if retry:
            self._say_config_error()
        if retry and self.ledger is not None and self.channels:
            try:
                due = self.ledger.due_alert_deliveries(
                    channels=[c.name for c in self.channels], now=self.now, limit=RETRY_BATCH
                )
            except Exception as exc:
                self._say(logging.ERROR, {"alert_delivery": "not_retried", "error": _text(exc)})
                due = []
            fresh = {r.id for r in todo}
            todo += [r for r in due if r.id not in fresh]
        for record in todo:
            if time.monotonic() - started > DELIVER_BUDGET.total_seconds():
                break  # the rest are due still: the next call takes them
            settled = self._attempt(record)
            if settled is not None:
                done.append(settled)
        return done

    def _attempt(self, record: DeliveryRecord) -> DeliveryRecord | None:
        channel = next((c for c in self.channels if c.name == record.channel), None)
        if channel is None or record.channel in self._down or self.ledger is None:
            return None
        try:
            claimed = self.ledger.claim_alert_attempt(
                record.id, lease=attempt_lease(channel.timeout_seconds), now=self.now
            )
        except Exception as exc:
            self._say(logging.ERROR, self._about(record, "not_attempted", error=_text(exc)))
            return None
        if claimed is None:
            return None  # delivered meanwhile, or another process is at it
        message = AlertMessage(
            kind=claimed.kind,
            subject=claimed.subject,
            fields=claimed.payload,
            delivery_id=claimed.id,
            attempt=claimed.attempts,
        )
        error: str | None = None
        note: str | None = None
        try:
            note = channel.send(message)
        except ChannelError as exc:
            error = str(exc)
        except Exception as exc:  # a channel's own bug is a failed attempt, not a failed tick
            error = _text(exc)
        next_at = None
        if error is not None:
            self._down[channel.name] = error
            if claimed.attempts < self.max_attempts:
                next_at = self.now + retry_delay(claimed.attempts)
        try:
            settled = self.ledger.finish_alert_attempt(
                claimed.id,
                attempt=claimed.attempts,
                error=error,
                next_attempt_at=next_at,
                note=note,
                now=self.now,
            )
        except Exception as exc:
            # Unsettled, the attempt's lease runs out and it is tried again (a resend, at
            # worst, never a lost alert).
            self._say(logging.ERROR, self._about(claimed, "not_settled", error=_text(exc)))
            return None
        if settled is None:
            return None
        if error is None:
            self._say(logging.INFO, self._about(settled, "delivered", note=note))
        elif next_at is not None:
            self._say(
                logging.WARNING,
                self._about(settled, "failed", error=error, next_attempt_at=iso(next_at)),
            )
        else:
            self._say(logging.ERROR, self._about(settled, "gave_up", error=error))
        return settled

    # --- logging ----------------------------------------------------------------------------

    @staticmethod
    def _about(record: DeliveryRecord, outcome: str, **extra: Any) -> dict[str, Any]:
        data = {
            "alert_delivery": outcome,
            "channel": record.channel,
            "kind": record.kind,
            "subject": record.subject,
            "delivery_id": record.id,
            "attempt": record.attempts,
        }
        data.update({k: v for k, v in extra.items() if v is not None})
        return data

    def _say_config_error(self) -> None:
        if self.config_error is not None and not self._said_config:
            self._said_config = True
            self._say(
                logging.ERROR,
                {"alert_delivery": "not_configured", "error": self.config_error},
            )

    def _say(self, level: int, data: dict[str, Any]) -> None:
        line = json.dumps(data, default=str, separators=(",", ":"))
        if self.log is not None and level >= logging.WARNING:
            (self.log.error if level >= logging.ERROR else self.log.warning)(line)
        if self.use_loggers:
            DELIVERY_LOGGER.log(level, line)


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def deliver_alert(
    ledger: Ledger | None,
    log: Any | None,
    kind: str,
    subject: str,
    **fields: Any,
) -> str:
    """Emit one alert and attempt its delivery at once (a run or a command that raises a
    single alert; retries are the reclaim sensor's). Returns the line; never raises."""
    alerts = Alerts.from_environment(ledger, log=log)
    line = alerts.emit(kind, subject, **fields)
    alerts.deliver()
    return line
