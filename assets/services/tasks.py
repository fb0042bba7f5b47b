"""The services domain's tasks: ``service_lifecycle_maintenance`` and ``service_auto_renew``
(declared in defs.yaml beside this file). Each body reads the source store as of the run's
due, calls its pure pandas rule (``lifecycle.py``, ``renewals.py``: imported by the run that
computes, never at load), writes back exactly once, fenced by the run's claim, and reports
counts and the first rows as metadata.
"""

from collections.abc import Iterator
from datetime import timedelta

import dagster as dg

from assets.domain_config import DomainRules
from assets.metadata import run_metadata, table_metadata
from orchestration.task_run import TaskRun
from resources.core.due import format_due
from resources.idempotency import create_domain_schema
from resources.source_store import SourceStore


class LifecycleConfig(dg.Config):
    """Suspension happens at expiry; termination only when enabled, counted from suspension."""

    termination_enabled: bool = False
    termination_retention_days: int = 30


def service_lifecycle_maintenance(
    context: dg.AssetExecutionContext,
    run: TaskRun,
    config: LifecycleConfig,
    source: SourceStore,
):
    # The pandas rule loads with the run that uses it, not with the code location.
    from assets.services.lifecycle import (
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


def service_auto_renew(
    context: dg.AssetExecutionContext,
    run: TaskRun,
    source: SourceStore,
    rules: DomainRules,
) -> Iterator[dg.MaterializeResult]:
    # The pandas rules load with the run that uses them, not with the code location.
    from assets.services.renewals import (
        OUTCOME_RENEWED,
        RENEW_OUTCOMES,
        apply_auto_renew,
        auto_renew_candidates_query,
        balances_query,
        plan_auto_renew,
    )

    engine = source.engine()
    create_domain_schema(engine)
    policy = rules.auto_renew_policy()
    query = auto_renew_candidates_query(run.as_of, policy)
    plan = plan_auto_renew(
        source.read_frame(query), source.read_frame(balances_query(query)), run.as_of, policy
    )
    result = apply_auto_renew(
        engine, plan, run.as_of, task_key=run.task_key, entry_key=run.entry_key, guard=run.guard
    )
    counts = result["outcome"].value_counts()
    renewed = result.loc[result["outcome"] == OUTCOME_RENEWED]
    yield dg.MaterializeResult(
        metadata={
            **run_metadata(run),
            "due_for_renewal": len(result),
            **{outcome: int(counts.get(outcome, 0)) for outcome in RENEW_OUTCOMES},
            "charged_cents": int(renewed["price_cents"].sum()),
            "first_rows": table_metadata(
                result[
                    [
                        "service_id",
                        "customer_id",
                        "price_cents",
                        "balance_cents",
                        "expires_at",
                        "new_expires_at",
                        "outcome",
                    ]
                ]
            ),
        }
    )
