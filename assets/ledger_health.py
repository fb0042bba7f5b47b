"""``ledger_health``: the run ledger's health as an asset, materialized every slot.

A task like any other (claimed through ``orchestration.runtime.task_run``, so a late or
duplicate run does nothing); its body computes
``orchestration.services.summary.ledger_summary`` as of the run's due and reports it as
metadata: the summary numbers, a per-task table and a Markdown report, so the Dagster UI
shows the ledger's health next to the assets.
"""

import dagster as dg

from orchestration.catalog import task_views
from orchestration.registry import require_task
from orchestration.runtime import task_run
from orchestration.services.summary import ledger_summary, summary_metadata
from orchestration.tasks import TASKS
from resources.ledger import RunLedger

TASK_KEY = "ledger_health"


@dg.asset(
    name=TASK_KEY,
    pool=TASK_KEY,  # one run of the task at a time (DESIGN: overlap)
    group_name="ledger",
    output_required=False,
    description=(
        "Ledger health every slot: active, stale, failed/success/manual-retry/dispatch-failed "
        "and missed dues over 24 h, per task (table + Markdown metadata)."
    ),
    kinds={"sql"},
)
def ledger_health(context: dg.AssetExecutionContext, ledger: RunLedger):
    spec = require_task(TASKS, TASK_KEY)
    with task_run(context, ledger, spec) as run:
        if not run.claimed:
            return
        summary = ledger_summary(ledger, task_views(), run.as_of, instance=context.instance)
        yield dg.MaterializeResult(
            metadata={**summary_metadata(summary), "ledger_entry": run.entry.id}
        )
