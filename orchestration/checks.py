"""The ledger as asset checks: ``latest_due_accounted_for`` on every task asset, and
``no_stale_leases``, ``no_lost_retries``, ``no_unledgered_failed_runs`` on ``ledger_health``
(orchestration/services/ledger_checks.py), evaluated the same way.

The check is evaluated from the ledger, never by running the task
(orchestration/services/accounting.py): ``ledger_sensor`` (slot health) reports it at a slot's start
for every task whose latest due moved, whose entry changed or whose last evaluation was not
settled (sensors/health.py), and
"Execute" on the check in the Catalog evaluates it on demand (a small run of the check
alone). A failing check names why the latest due is not
accounted for: missed, failed, dispatch_failed, a stale lease, or still queued after its
slot (a warning).
"""

# No ``from __future__ import annotations``: Dagster reads the check function's annotations
# (the context type, the RunLedger resource) as objects.
from collections.abc import Iterator, Sequence

import dagster as dg

from orchestration.services.accounting import CHECK_NAME, account_latest_due
from orchestration.services.ledger_checks import (
    CHECK_NO_LOST_RETRIES,
    CHECK_NO_STALE_LEASES,
    CHECK_NO_UNLEDGERED_FAILED_RUNS,
    LEDGER_CHECK_NAMES,
    evaluate_ledger_check,
    ledger_health_view,
)
from orchestration.task_spec import TaskView
from resources.core.instants import utc_now
from resources.ledger import RunLedger

_LEDGER_CHECK_DESCRIPTIONS = {
    CHECK_NO_STALE_LEASES: (
        "Passes when no running ledger entry has an expired lease; fails naming the entries "
        "ledger_sensor (reclaim) has not reclaimed (WARN within 3 minutes of the expiry)."
    ),
    CHECK_NO_LOST_RETRIES: (
        "Passes when no retrying entry waits for a Dagster retry that will never come; fails "
        "naming the entries ledger_sensor (outcomes) has not settled."
    ),
    CHECK_NO_UNLEDGERED_FAILED_RUNS: (
        "Passes when every task run Dagster ended FAILURE or CANCELED in the last 24 h is in "
        "the ledger; fails naming the runs that left no trace."
    ),
}


def build_task_checks(views: Sequence[TaskView]) -> list[dg.AssetChecksDefinition]:
    """The ``latest_due_accounted_for`` check of every task asset, as one definition.

    One multi-asset check, not one ``@asset_check`` per task: every check definition is a node
    of Dagster's asset graph, and Dagster resolves each asset job against the whole graph, so
    500 separate checks doubled the code location's load at 500 tasks
    (docs/performance.md). Each task asset still has its own check (key, description,
    evaluations); executing one evaluates that one (the definition subsets)."""
    if not views:
        return []
    by_asset = {dg.AssetKey(v.spec.asset): v for v in views}
    specs = [
        dg.AssetCheckSpec(
            name=CHECK_NAME,
            asset=key,
            blocking=False,
            description=(
                f"Passes when {view.spec.key}'s latest due whose slot is over succeeded (or is "
                f"still running with a live lease); fails naming why not. Evaluated from the "
                f"ledger each slot by ledger_sensor (slot health); executing it never runs the "
                f"task."
            ),
        )
        for key, view in by_asset.items()
    ]

    @dg.multi_asset_check(specs=specs, can_subset=True, name=f"{CHECK_NAME}_checks")
    def _checks(
        context: dg.AssetCheckExecutionContext, ledger: RunLedger
    ) -> Iterator[dg.AssetCheckResult]:
        now = utc_now()
        for key in sorted(context.selected_asset_check_keys, key=lambda k: k.to_user_string()):
            account = account_latest_due(
                by_asset[key.asset_key], ledger, now, instance=context.instance
            )
            yield dg.AssetCheckResult(
                asset_key=key.asset_key,
                check_name=key.name,
                passed=account.passed,
                metadata=account.metadata(),
                severity=(
                    dg.AssetCheckSeverity.WARN if account.warning else dg.AssetCheckSeverity.ERROR
                ),
                description=account.detail,
            )

    return [_checks]


def build_ledger_checks(views: Sequence[TaskView]) -> list[dg.AssetChecksDefinition]:
    """The ledger's own checks on the ``ledger_health`` asset (none without that task)."""
    view = ledger_health_view(views)
    if view is None:
        return []
    return [_ledger_check(view.spec.asset, name, views) for name in LEDGER_CHECK_NAMES]


def _ledger_check(asset: str, name: str, views: Sequence[TaskView]) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=dg.AssetKey(asset),
        name=name,
        blocking=False,
        description=(
            f"{_LEDGER_CHECK_DESCRIPTIONS[name]} Evaluated from the ledger and Dagster's run "
            f"records each slot by ledger_sensor (slot health); executing it never runs a task."
        ),
    )
    def _check(context: dg.AssetCheckExecutionContext, ledger: RunLedger) -> dg.AssetCheckResult:
        return evaluate_ledger_check(name, ledger, context.instance, views, utc_now()).result()

    return _check
