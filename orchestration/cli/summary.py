"""`dueledger summary`: the ledger's health, the same computation as the ``ledger_health``
asset (``orchestration/services/summary.py``), from the ledger alone unless it finds missed
dues (then Dagster is asked about queued runs)."""

from __future__ import annotations

import warnings
from datetime import UTC, datetime

import click

from orchestration.cli.runs import ACTION_SUMMARY, viewer_gate
from orchestration.cli.support import (
    dagster_instance,
    handle_errors,
    json_option,
    print_json,
    table,
)
from resources.core.settings import load_settings


@click.command("summary")
@click.option("--operator", default=None, help="Who is looking (default: your login name).")
@json_option
@handle_errors
def summary_cmd(operator: str | None, as_json: bool) -> None:
    """Ledger health: what runs now, what is stale, what happened in the last 24 hours."""

    # Imported when this command runs, so the other commands do not load it.
    from orchestration.declarations import task_views
    from orchestration.services.summary import TASK_COLUMNS, ledger_summary

    ledger = viewer_gate(operator, ACTION_SUMMARY)
    # The same computation as the ledger_health asset: ledger counts + the gap audit.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # cadence warnings: see `tasks`
        views = task_views(load_settings())
    now = datetime.now(UTC)
    data = ledger_summary(ledger, views, now)
    if data["missed_24h"]:
        # Only then is Dagster asked (and loaded): a due whose run still waits in Dagster's
        # queue has no entry yet and is not missed. Healthy, the ledger alone answers.
        with dagster_instance() as instance:
            data = ledger_summary(ledger, views, now, instance=instance)
    if as_json:
        print_json(data)
        return
    totals = {k: v for k, v in data.items() if k not in ("tasks", "notes")}
    click.echo("  ".join(f"{k}={v}" for k, v in totals.items()))
    click.echo(table(data["tasks"], TASK_COLUMNS))
    for key, note in data["notes"].items():
        click.echo(f"note ({key}): {note}")
