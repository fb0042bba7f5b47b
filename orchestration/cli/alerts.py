"""`dueledger alerts`: the configured alert channels and the recent alert deliveries.

Read-only: it lists what ``dueledger_alert_deliveries`` holds (newest first), with the
channels in force (secrets masked). A bad alert configuration is exit 2 naming the variable
or the file's key; a viewer command like ``runs list`` (``--operator``, roles).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

import click

from orchestration.cli.runs import parse_limit, viewer_gate
from orchestration.cli.support import handle_errors, json_option, print_json, table
from resources.core.alerting import (
    ALERT_KINDS,
    CHANNEL_WEBHOOK,
    DELIVERY_STATUSES,
    load_alert_settings,
)
from resources.core.errors import InvalidInput

ACTION_ALERTS: Final = "alerts"
DEFAULT_ALERTS_LIMIT: Final = 50
_COLUMNS: Final = (
    "id",
    "channel",
    "kind",
    "subject",
    "status",
    "attempts",
    "created_at",
    "next_attempt_at",
    "last_error",
)


def parse_delivery_statuses(text: str | None) -> list[str] | None:
    """``failed,pending`` -> those statuses; an unknown one is invalid input."""
    if text is None:
        return None
    items = [s.strip() for s in text.split(",")]
    unknown = [s for s in items if s not in DELIVERY_STATUSES]
    if unknown:
        raise InvalidInput(
            f"--status {text!r}: unknown delivery status(es) {', '.join(map(repr, unknown))}; "
            f"use a comma-separated list of {', '.join(DELIVERY_STATUSES)}"
        )
    return items


def parse_kind(text: str | None) -> str | None:
    if text is None or text in ALERT_KINDS:
        return text
    raise InvalidInput(f"--kind {text!r} is not an alert kind; kinds: {', '.join(ALERT_KINDS)}")


def _short(text: str | None, width: int = 80) -> str | None:
    if not text:
        return None
    line = text.strip().splitlines()[0]
    return line if len(line) <= width else line[: width - 3] + "..."


@click.command("alerts")
@click.option("--status", default=None, help="Only these statuses: pending,delivered,failed.")
@click.option("--kind", default=None, help="Only this alert kind (e.g. lease_reclaimed).")
@click.option("--limit", default=None, help=f"At most N (default {DEFAULT_ALERTS_LIMIT}, max 500).")
@click.option("--operator", default=None, help="Who is looking (default: your login name).")
@json_option
@handle_errors
def alerts_cmd(
    status: str | None, kind: str | None, limit: str | None, operator: str | None, as_json: bool
) -> None:
    """Alert channels in force and recent alert deliveries (pending, delivered, failed)."""
    statuses = parse_delivery_statuses(status)
    only_kind = parse_kind(kind)
    count = parse_limit(limit) if limit is not None else DEFAULT_ALERTS_LIMIT
    settings = load_alert_settings()  # a bad configuration: exit 2 naming it
    ledger = viewer_gate(operator, ACTION_ALERTS)
    records = ledger.list_alert_deliveries(statuses=statuses, kind=only_kind, limit=count)
    if settings.webhook is not None:
        # Errors are scrubbed when stored; a row stored by an older version is scrubbed here.
        webhook = settings.webhook
        records = [
            replace(r, last_error=webhook.scrub(r.last_error))
            if r.channel == CHANNEL_WEBHOOK and r.last_error
            else r
            for r in records
        ]
    counts = ledger.alert_delivery_counts()
    if as_json:
        print_json(
            {
                **settings.as_json(),
                "counts": counts,
                "deliveries": [r.as_json() for r in records],
            }
        )
        return
    channels = settings.channels
    if not channels:
        click.echo("alert channels: none configured (alerts are log lines only)")
    for channel in channels:
        described = channel.as_json()
        kinds = ", ".join(described["kinds"]) if described["kinds"] else "all kinds"
        click.echo(f"alert channel {described['channel']}: {described['target']} ({kinds})")
    click.echo("  ".join(f"{k}={v}" for k, v in counts.items()))
    rows = [
        {
            **r.as_json(),
            "status": f"{r.status} (gave up)" if r.gave_up else r.status,
            "last_error": _short(r.last_error),
        }
        for r in records
    ]
    click.echo(table(rows, _COLUMNS))
