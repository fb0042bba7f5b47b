"""Thin Dagster assets for the hosting platform's scheduled tasks.

Each asset (``orchestration.task_asset``, which claims the run's ledger entry): read the
source store as of the run's due time, call the pure pandas rules in ``assets.orders``
/ ``assets.services``, write back with compare-and-set, report counts as metadata.

The rules are imported in the asset bodies, by the run that executes them: loading the
code location (every code server, run worker and sensor evaluation) does not import
pandas (docs/performance.md, "A light code location").
"""

from datetime import timedelta

import dagster as dg

from orchestration.services.runtime import TaskRun
from orchestration.task_asset import task_asset
from resources.core.due import format_due
from resources.source_store import SourceStore


class OrderCleanupConfig(dg.Config):
    """How old a pending order may get before it is cancelled."""

    pending_max_age_hours: float = 24.0


class LifecycleConfig(dg.Config):
    """Suspension happens at expiry; termination only when enabled, counted from suspension."""

    termination_enabled: bool = False
    termination_retention_days: int = 30


@task_asset(
    "order_cleanup",
    group_name="hosting_automation",
    description="Pending orders older than the configured age, cancelled as of the run's due.",
    kinds={"pandas", "sql"},
)
def order_cleanup(
    context: dg.AssetExecutionContext,
    run: TaskRun,
    config: OrderCleanupConfig,
    source: SourceStore,
):
    # The pandas rule loads with the run that uses it, not with the code location.
    from assets.orders import (
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


@task_asset(
    "service_lifecycle_maintenance",
    group_name="hosting_automation",
    description="Services suspended at expiry and terminated after retention, as of the due.",
    kinds={"pandas", "sql"},
)
def service_lifecycle_maintenance(
    context: dg.AssetExecutionContext,
    run: TaskRun,
    config: LifecycleConfig,
    source: SourceStore,
):
    # The pandas rule loads with the run that uses it, not with the code location.
    from assets.services import (
        LifecyclePolicy,
        apply_lifecycle,
        candidate_services_query,
        plan_lifecycle,
    )

    policy = LifecyclePolicy(
        termination_enabled=config.termination_enabled,
        termination_retention=timedelta(days=config.termination_retention_days),
    )
    candidates = source.read_frame(candidate_services_query(run.as_of, policy))
    plan = plan_lifecycle(candidates, run.as_of, policy)
    counts = apply_lifecycle(
        source.engine(),
        plan,
        run.as_of,
        task_key=run.task_key,
        entry_key=run.entry_key,
        guard=run.guard,
    )
    yield dg.MaterializeResult(
        metadata={
            "as_of": format_due(run.as_of),
            "ledger_entry": run.entry.id,
            "due_for_suspension": len(plan.to_suspend),
            "due_for_termination": len(plan.to_terminate),
            "termination_enabled": config.termination_enabled,
            **{k: int(v) for k, v in counts.items()},
        }
    )


TASK_ASSETS = [order_cleanup, service_lifecycle_maintenance]
