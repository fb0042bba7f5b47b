"""``ledger_health``: the run ledger's health as an asset, materialized every slot.

A task like any other (its asset made by ``orchestration.task_asset``, so a late or
duplicate run does nothing); its body computes
``orchestration.services.summary.ledger_summary`` as of the run's due and reports it as
metadata: the summary numbers, a per-task table and a Markdown report, so the Dagster UI
shows the ledger's health next to the assets.
"""

import dagster as dg

from orchestration.catalog import task_views
from orchestration.services.summary import ledger_summary, summary_metadata
from orchestration.task_asset import TaskRun, task_asset
from resources.ledger import RunLedger


@task_asset(
    "ledger_health",
    group_name="ledger",
    description=(
        "Ledger health every slot: active, stale, failed/success/manual-retry/dispatch-failed "
        "and missed dues over 24 h, per task (table + Markdown metadata)."
    ),
    kinds={"sql"},
)
def ledger_health(context: dg.AssetExecutionContext, run: TaskRun, ledger: RunLedger):
    summary = ledger_summary(ledger, task_views(), run.as_of, instance=context.instance)
    yield dg.MaterializeResult(metadata={**summary_metadata(summary), "ledger_entry": run.entry.id})
