"""`dueledger reclaim` and `dueledger liveness`: operations without the Dagster UI.

- ``reclaim [--dry-run]``: what ``ledger_sensor`` (reclaim) does, for deployments without the
  daemon (or to act now): expired leases -> ``failed`` / ``lease_reclaimed``, stranded
  launches -> ``dispatch_failed``; one structured alert line per entry, delivered to the
  configured alert channels once, and the due alert deliveries retried; never a new run.
  With an operators allow-list it needs the ``retrier`` role (orchestration/cli/guard.py).
- ``liveness [--max-age-seconds N] [--alert]``: exit 0 when the daemon's scheduler heartbeat
  and the latest slot evaluation are fresh, 1 when either is stale (named), for system cron
  or a Kubernetes probe; ``--alert`` also delivers a ``liveness`` alert per stale check
  (with an operators allow-list: the ``retrier`` role).
"""

from __future__ import annotations

import sys
import warnings
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import click

from orchestration.cli.guard import ACTION_LIVENESS_ALERT, ACTION_RECLAIM, require_command_role
from orchestration.cli.support import (
    dagster_instance,
    handle_errors,
    json_option,
    local_settings,
    open_ledger,
    print_json,
)
from resources.core.alerting import DELIVERY_DELIVERED
from resources.core.errors import InvalidInput
from resources.core.instants import iso
from resources.core.operators import ROLE_RETRIER

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.engine import Connection

    from orchestration.cli.guard import Grant
    from orchestration.reclaim import AuditChange
    from resources.core.entry import Entry
    from resources.ledger import DeliveryRecord


def _audit_each(grant: Grant | None) -> Callable[[str], AuditChange | None]:
    """``audit(verb)``: what records each change of a sweep under ``grant``, in the change's
    own transaction (None without an allow-list: nothing is audited)."""

    def audit(verb: str) -> AuditChange | None:
        if grant is None or not grant.audited:
            return None

        def record(entry: Entry, conn: Connection) -> None:
            grant.audit(
                f"{verb} entry {entry.id} ({entry.task_key}, {entry.dedup_key})",
                entry_id=entry.id,
                connection=conn,
            )

        return record

    return audit


@click.command("reclaim")
@click.option("--dry-run", is_flag=True, help="List what would be reclaimed; change nothing.")
@json_option
@handle_errors
def reclaim_cmd(dry_run: bool, as_json: bool) -> None:
    """Fail running entries whose lease expired (lease_reclaimed); never re-run them."""
    # Imported when this command runs, so the other commands do not load it.
    from orchestration.reclaim import (
        ALERT_KIND,
        STRANDED_ALERT_KIND,
        reclaim_leases,
        sweep_stranded,
    )
    from orchestration.services.alerts import Alerts, alert_line
    from orchestration.services.dagster_runs import has_dispatched_run
    from resources.core.alerting import entry_subject, load_alert_settings

    # A bad alert configuration is exit 2 before anything is changed.
    alert_settings = None if dry_run else load_alert_settings()
    settings = local_settings()
    ledger = open_ledger(settings)
    # With an allow-list, reclaiming needs the retrier role (exit 3, audited).
    grant = (
        None
        if dry_run
        else require_command_role(settings, ACTION_RECLAIM, ROLE_RETRIER, ledger=ledger)
    )
    now = datetime.now(UTC)
    audit = _audit_each(grant)
    reclaims = reclaim_leases(
        ledger, now, dry_run=dry_run, audit=audit("reclaimed the expired lease of")
    )
    with dagster_instance() as instance:
        stranded = sweep_stranded(
            ledger,
            lambda entry: has_dispatched_run(instance, entry),
            now,
            dry_run=dry_run,
            audit=audit("recorded as dispatch_failed the stranded launch of"),
        )
    attempts = []
    if alert_settings is not None:
        # As the sensor does: each alert to the configured channels once, then the retries
        # that are due (a deployment without the daemon has no sensor to retry them).
        alerts = Alerts.from_settings(ledger, alert_settings, now=now, use_loggers=False)
        for item in reclaims:
            alerts.record(ALERT_KIND, entry_subject(item.entry_id), item.as_json())
        for swept in stranded:
            alerts.record(STRANDED_ALERT_KIND, entry_subject(swept.entry.id), swept.as_json())
        attempts = alerts.deliver(retry=True)
    if grant is not None and not (reclaims or stranded):
        # Each change was audited in its own transaction; a sweep that changed nothing still
        # leaves a record that it ran.
        grant.audit("reclaimed 0 expired leases, recorded 0 stranded launches")
    if as_json:
        print_json(
            {
                "dry_run": dry_run,
                "now": iso(now),
                "count": len(reclaims),
                "reclaims": [r.as_json() for r in reclaims],
                "stranded": [s.as_json() for s in stranded],
                "alert_deliveries": [delivery_json(a) for a in attempts],
            }
        )
        return
    suffix = "" if not dry_run else "_dry_run"
    for item in reclaims:
        click.echo(alert_line(f"{ALERT_KIND}{suffix}", **item.as_json()))
    for swept in stranded:
        click.echo(alert_line(f"{STRANDED_ALERT_KIND}{suffix}", **swept.as_json()))
    verb = "would reclaim" if dry_run else "reclaimed"
    click.echo(f"{verb} {len(reclaims)} expired lease(s)", err=bool(reclaims))
    if stranded:
        verb = "would record" if dry_run else "recorded"
        click.echo(f"{verb} {len(stranded)} stranded launch(es) as dispatch_failed", err=True)
    say_deliveries(attempts)


def delivery_json(record: DeliveryRecord) -> dict[str, object]:
    """A delivery attempt's outcome for a command's ``--json`` (the alert itself is shown
    elsewhere in the output: no payload)."""
    data = record.as_json()
    data.pop("payload", None)
    return data


def say_deliveries(attempts: list[DeliveryRecord]) -> None:
    """One line per alert delivery this command attempted (failures on stderr)."""
    for a in attempts:
        where = f"{a.channel} {a.kind} {a.subject} (attempt {a.attempts})"
        if a.status == DELIVERY_DELIVERED:
            click.echo(f"alert delivered: {where}")
        elif a.next_attempt_at is not None:
            click.echo(
                f"alert delivery failed: {where}: {a.last_error}; retried from "
                f"{a.next_attempt_at:%Y-%m-%dT%H:%M:%SZ}",
                err=True,
            )
        else:
            click.echo(f"alert delivery failed for good: {where}: {a.last_error}", err=True)


_MAX_AGE_SECONDS = 366 * 24 * 3600


def _max_age(text: str) -> timedelta:
    try:
        seconds = int(text)
    except ValueError:
        seconds = 0
    if not 0 < seconds <= _MAX_AGE_SECONDS:
        raise InvalidInput(
            f"--max-age-seconds {text!r} must be a whole number of seconds from 1 to "
            f"{_MAX_AGE_SECONDS} (a year)"
        )
    return timedelta(seconds=seconds)


@click.command("liveness")
@click.option(
    "--max-age-seconds",
    default="180",
    show_default=True,
    help="Heartbeat / slot evaluation older than this is stale.",
)
@click.option(
    "--alert",
    is_flag=True,
    help=(
        "Deliver a liveness alert per stale check to the configured alert channels (once "
        "per outage), and retry the alert deliveries that are due."
    ),
)
@json_option
@handle_errors
def liveness_cmd(max_age_seconds: str, alert: bool, as_json: bool) -> None:
    """Exit 0 when the daemon's scheduler and slot evaluation are fresh, 1 when stale."""

    # Imported when this command runs, so the other commands do not load it.
    from orchestration.declarations import task_views
    from orchestration.services.alerts import Alerts
    from orchestration.services.liveness import check_liveness
    from resources.core.alerting import (
        ENV_ALERTS_FILE,
        ENV_EMAIL_TO,
        ENV_WEBHOOK_URL,
        KIND_LIVENESS,
        check_subject,
        load_alert_settings,
    )

    max_age = _max_age(max_age_seconds)
    alert_settings = load_alert_settings() if alert else None
    if alert_settings is not None and not alert_settings.channels:
        raise InvalidInput(
            f"--alert needs an alert channel: set {ENV_WEBHOOK_URL} or {ENV_EMAIL_TO} (with "
            f"the SMTP settings), or name a file in {ENV_ALERTS_FILE}; see docs/operations.md"
        )
    settings = local_settings()
    # With an allow-list, delivering alerts needs the retrier role (exit 3, audited).
    grant = require_command_role(settings, ACTION_LIVENESS_ALERT, ROLE_RETRIER) if alert else None
    with warnings.catch_warnings():
        # Cadence warnings belong to `dueledger tasks`; a probe's stderr names staleness only.
        warnings.simplefilter("ignore", UserWarning)
        views = task_views(settings)
    now = datetime.now(UTC)
    with dagster_instance() as instance:
        report = check_liveness(instance, views, now, max_age)
    attempts = []
    if alert_settings is not None:
        # From cron while the daemon is down, this command is what retries deliveries.
        ledger = grant.ledger if grant is not None and grant.ledger else open_ledger(settings)
        alerts = Alerts.from_settings(ledger, alert_settings, now=now, use_loggers=False)
        # The alerts it records and its audit record are one transaction.
        with ledger.transaction() as conn:
            recorded: list[str] = []
            for check in report.checks:
                if not check.fresh:
                    fields = {**check.as_json(), "max_age_seconds": int(max_age.total_seconds())}
                    subject = check_subject(check.name, check.observed_at)
                    if alerts.record(KIND_LIVENESS, subject, fields, connection=conn):
                        recorded.append(subject)
            if grant is not None:
                # Names the alerts this probe recorded (an outage alerts once), so the
                # record says which deliveries it started.
                grant.audit(
                    f"liveness alert: stale checks {list(report.stale)}; alerts recorded "
                    f"{recorded}",
                    connection=conn,
                )
        attempts = alerts.deliver(retry=True)
    if as_json:
        data = report.as_json()
        if alert:
            data["alert_deliveries"] = [delivery_json(a) for a in attempts]
        print_json(data)
    else:
        for check in report.checks:
            click.echo(f"{check.name}: {'fresh' if check.fresh else 'STALE'}: {check.detail}")
        if not report.ok:
            click.echo(f"stale: {', '.join(report.stale)}", err=True)
        say_deliveries(attempts)
    if not report.ok:
        sys.exit(1)
