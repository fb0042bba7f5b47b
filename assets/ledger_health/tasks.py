"""``ledger_health``: the run ledger's health as an asset, materialized every slot.

A task like any other (declared in defs.yaml beside this file, so a late or duplicate run does
nothing); its body computes
``orchestration.services.summary.ledger_summary`` as of the run's due and reports it as
metadata: first ``latest_dues`` and one line per task (``task KEY``) with its latest due
(status, lag, a link to its runs, its next due, what to run next:
``orchestration/services/health_page.py``), then the
summary numbers, a per-task table and a Markdown report, so the Dagster UI shows the
ledger's health next to the assets.

The asset also carries the ledger's own checks -- ``no_stale_leases``, ``no_lost_retries``,
``no_unledgered_failed_runs`` (``orchestration/checks.py``, decided in
``orchestration/services/ledger_checks.py``) -- reported by ``ledger_sensor`` (slot health)
each slot and executable from the Catalog; this body does not run them.
"""

from collections.abc import Mapping
from typing import Any

import dagster as dg

from orchestration.declarations import task_views
from orchestration.services.health_page import latest_due_rows, latest_dues_metadata
from orchestration.services.summary import (
    ATTENTION_COLUMNS,
    SUMMARY_TOTALS,
    TASK_COLUMNS,
    ledger_summary,
    summary_markdown,
)
from orchestration.task_run import TaskRun
from resources.ledger import RunLedger


def ledger_health(context: dg.AssetExecutionContext, run: TaskRun, ledger: RunLedger):
    views = task_views()
    summary = ledger_summary(ledger, views, run.as_of, instance=context.instance)
    latest = latest_due_rows(ledger, views, run.as_of, instance=context.instance)
    # The rows a person reads first (the UI lists metadata in this order).
    metadata = {
        **latest_dues_metadata(latest, summary["as_of"]),
        **summary_metadata(summary),
        "ledger_entry": run.entry.id,
    }
    yield dg.MaterializeResult(metadata=metadata)


def summary_metadata(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Asset metadata: the numbers, the per-task table and a Markdown report."""
    int_columns = [
        c for c in TASK_COLUMNS if c not in ("task_key", "missed_slot_policy", "last_success_at")
    ]
    schema = dg.TableSchema(
        columns=[dg.TableColumn(c, "int" if c in int_columns else "string") for c in TASK_COLUMNS]
    )
    records = [
        dg.TableRecord({c: (row[c] if c in int_columns else (row[c] or "")) for c in TASK_COLUMNS})
        for row in summary["tasks"]
    ]
    numbers = {
        k: int(summary[k])
        for k in (*SUMMARY_TOTALS, "missed_24h", "paused_24h", "deadline_missed_24h")
    }
    attention = [
        dg.TableRecord({c: str(row[c] or "") for c in ATTENTION_COLUMNS})
        for row in summary.get("attention", [])
    ]
    return {
        **numbers,
        "as_of": summary["as_of"],
        "needs_attention": dg.MetadataValue.table(
            records=attention,
            schema=dg.TableSchema(columns=[dg.TableColumn(c, "string") for c in ATTENTION_COLUMNS]),
        ),
        "per_task": dg.MetadataValue.table(records=records, schema=schema),
        "report": dg.MetadataValue.md(summary_markdown(summary)),
    }
