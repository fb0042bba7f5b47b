"""The orders domain's task: ``order_cleanup`` (declared in defs.yaml beside this file).

The body reads the source store as of the run's due, calls the pure pandas rule
(``cleanup.py``, imported by the run that computes, never at load: a code location loads no
pandas), writes back with compare-and-set, fenced by the run's claim, and reports counts.
"""

from datetime import timedelta

import dagster as dg

from orchestration.task_run import TaskRun
from resources.core.due import format_due
from resources.source_store import SourceStore


class OrderCleanupConfig(dg.Config):
    """How old a pending order may get before it is cancelled."""

    pending_max_age_hours: float = 24.0


def order_cleanup(
    context: dg.AssetExecutionContext,
    run: TaskRun,
    config: OrderCleanupConfig,
    source: SourceStore,
):
    # The pandas rule loads with the run that uses it, not with the code location.
    from assets.orders.cleanup import (
        OrderCleanupPolicy,
        cancel_orders,
        candidate_orders_query,
        select_orders_to_cancel,
    )

    policy = OrderCleanupPolicy(pending_max_age=timedelta(hours=config.pending_max_age_hours))
    # The indexed query narrows to candidates; the pure rule stays the authority.
    candidates = source.read_frame(candidate_orders_query(run.as_of, policy))
    to_cancel = select_orders_to_cancel(candidates, run.as_of, policy)
    cancelled = cancel_orders(
        source.engine(),
        to_cancel["id"].tolist(),
        run.as_of,
        task_key=run.task_key,
        entry_key=run.entry_key,
        guard=run.guard,
    )
    yield dg.MaterializeResult(
        metadata={
            "as_of": format_due(run.as_of),
            "ledger_entry": run.entry.id,
            "due_for_cancel": len(to_cancel),
            "cancelled": cancelled,
            "skipped_changed_meanwhile": len(to_cancel) - cancelled,
        }
    )
