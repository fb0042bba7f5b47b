"""`dueledger reclaim` and `dueledger liveness`: operations without the Dagster UI.

- ``reclaim [--dry-run]``: what ``lease_reclaim_sensor`` does, for deployments without the
  daemon (or to act now): expired leases -> ``failed`` / ``lease_reclaimed``, stranded
  launches -> ``dispatch_failed``; one structured alert line per entry; never a new run.
- ``liveness [--max-age-seconds N]``: exit 0 when the daemon's scheduler heartbeat and the
  latest slot evaluation are fresh, 1 when either is stale (named), for system cron or a
  Kubernetes probe.
"""

from __future__ import annotations

import sys
import warnings
from datetime import UTC, datetime, timedelta

import click

from orchestration.cli.support import (
    dagster_instance,
    handle_errors,
    json_option,
    local_settings,
    open_ledger,
    print_json,
)
from resources.core.errors import InvalidInput


@click.command("reclaim")
@click.option("--dry-run", is_flag=True, help="List what would be reclaimed; change nothing.")
@json_option
@handle_errors
def reclaim_cmd(dry_run: bool, as_json: bool) -> None:
    """Fail running entries whose lease expired (lease_reclaimed); never re-run them."""
    # Imported when this command runs, so the other commands do not load it.
    from orchestration.services import stranded as strand
    from orchestration.services.alerts import alert_line
    from orchestration.services.reclaim import ALERT_KIND, reclaim_leases

    ledger = open_ledger(local_settings())
    now = datetime.now(UTC)
    reclaims = reclaim_leases(ledger, now, dry_run=dry_run)
    with dagster_instance() as instance:
        stranded = strand.sweep_stranded(ledger, instance, now, dry_run=dry_run)
    if as_json:
        print_json(
            {
                "dry_run": dry_run,
                "now": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "count": len(reclaims),
                "reclaims": [r.as_json() for r in reclaims],
                "stranded": [s.as_json() for s in stranded],
            }
        )
        return
    suffix = "" if not dry_run else "_dry_run"
    for item in reclaims:
        click.echo(alert_line(f"{ALERT_KIND}{suffix}", **item.as_json()))
    for swept in stranded:
        click.echo(alert_line(f"{strand.ALERT_KIND}{suffix}", **swept.as_json()))
    verb = "would reclaim" if dry_run else "reclaimed"
    click.echo(f"{verb} {len(reclaims)} expired lease(s)", err=bool(reclaims))
    if stranded:
        verb = "would record" if dry_run else "recorded"
        click.echo(f"{verb} {len(stranded)} stranded launch(es) as dispatch_failed", err=True)


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
@json_option
@handle_errors
def liveness_cmd(max_age_seconds: str, as_json: bool) -> None:
    """Exit 0 when the daemon's scheduler and slot evaluation are fresh, 1 when stale."""

    # Imported when this command runs, so the other commands do not load it.
    from orchestration.catalog import task_views
    from orchestration.services.liveness import check_liveness

    max_age = _max_age(max_age_seconds)
    settings = local_settings()
    with warnings.catch_warnings():
        # Cadence warnings belong to `dueledger tasks`; a probe's stderr names staleness only.
        warnings.simplefilter("ignore", UserWarning)
        views = task_views(settings)
    with dagster_instance() as instance:
        report = check_liveness(instance, views, datetime.now(UTC), max_age)
    if as_json:
        print_json(report.as_json())
    else:
        for check in report.checks:
            click.echo(f"{check.name}: {'fresh' if check.fresh else 'STALE'}: {check.detail}")
        if not report.ok:
            click.echo(f"stale: {', '.join(report.stale)}", err=True)
    if not report.ok:
        sys.exit(1)
