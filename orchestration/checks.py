"""The ledger as asset checks: ``latest_due_accounted_for`` on every task asset.

The check is evaluated from the ledger, never by running the task
(orchestration/services/accounting.py): ``slot_health_sensor`` reports it for every task at
the start of each slot, and "Execute" on the check in the Catalog evaluates it on demand
(a small run of the check alone). A failing check names why the latest due is not
accounted for: missed, failed, dispatch_failed, a stale lease, or still queued after its
slot (a warning).
"""

# No ``from __future__ import annotations``: Dagster reads the check function's annotations
# (the context type, the RunLedger resource) as objects.
from collections.abc import Sequence

import dagster as dg

from orchestration.registry import TaskView
from orchestration.services.accounting import CHECK_NAME, account_latest_due
from orchestration.services.alerts import utc_now
from resources.ledger import RunLedger


def build_task_checks(views: Sequence[TaskView]) -> list[dg.AssetChecksDefinition]:
    """One ``latest_due_accounted_for`` check per task asset."""
    return [_task_check(view) for view in views]


def _task_check(view: TaskView) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=dg.AssetKey(view.spec.asset),
        name=CHECK_NAME,
        blocking=False,
        description=(
            f"Passes when {view.spec.key}'s latest due whose slot is over succeeded (or is "
            f"still running with a live lease); fails naming why not. Evaluated from the "
            f"ledger each slot by slot_health_sensor; executing it never runs the task."
        ),
    )
    def _check(context: dg.AssetCheckExecutionContext, ledger: RunLedger) -> dg.AssetCheckResult:
        account = account_latest_due(view, ledger, utc_now(), instance=context.instance)
        return dg.AssetCheckResult(
            passed=account.passed,
            metadata=account.metadata(),
            severity=dg.AssetCheckSeverity.WARN if account.warning else dg.AssetCheckSeverity.ERROR,
            description=account.detail,
        )

    return _check
