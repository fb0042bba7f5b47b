"""Thin Dagster assets for billing and account automation (issue 7).

Each asset (``orchestration.task_asset``, which claims the run's ledger entry): read the
source store as of the run's due, call the pure pandas rules (``assets.billing``,
``assets.renewals``, ``assets.reconcile``, ``assets.tickets``, ``assets.log_archive``),
write back exactly once, and report counts (and the first rows) as metadata.

The rules (and pandas) are imported in the asset bodies, by the run that executes them:
loading the code location does not import them (docs/performance.md, "A light code
location").
"""

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import dagster as dg

from assets.domain_config import DomainRules
from orchestration.factory import DAILY_PARTITIONS
from orchestration.services.hooks import (
    BEFORE_RENEWAL_FIRST_NOTICE,
    OUTCOME_TIMEOUT,
    HookRegistry,
    Hooks,
)
from orchestration.services.runtime import TaskRun
from orchestration.services.task_events import fire_task_event
from orchestration.task_asset import task_asset
from resources.core.due import format_due
from resources.core.instants import iso
from resources.idempotency import create_domain_schema, read_effects
from resources.ledger import RunLedger
from resources.notifier import (
    OUTCOME_FAILED,
    OUTCOME_SENT,
    OUTCOMES,
    Notifier,
    dispatch_notifications,
    outcome_counts,
    skip_notifications,
)
from resources.source_store import SourceStore

if TYPE_CHECKING:
    import pandas as pd

    from assets.policies import ReminderPolicy

GROUP = "hosting_billing"
#: Rows shown in the "first rows" tables of the UI.
PREVIEW_ROWS = 10


def _cell(value: Any) -> str | int | float | bool:
    import numpy as np
    import pandas as pd

    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    if isinstance(value, pd.Timestamp | datetime | np.datetime64):
        return iso(pd.Timestamp(value).to_pydatetime())
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, bool | int | float | str):
        return value
    return str(value)


def table_metadata(frame: "pd.DataFrame", limit: int | None = PREVIEW_ROWS) -> dg.MetadataValue:
    """A frame (its first `limit` rows) as a table the UI renders."""
    shown = frame if limit is None else frame.head(limit)
    columns = [str(c) for c in shown.columns]
    records = [
        dg.TableRecord({c: _cell(v) for c, v in zip(columns, row, strict=True)})
        for row in shown.itertuples(index=False)
    ]
    schema = dg.TableSchema(columns=[dg.TableColumn(c) for c in columns])
    return dg.MetadataValue.table(records=records, schema=schema)


def _run_metadata(run: TaskRun) -> dict[str, Any]:
    return {"as_of": format_due(run.as_of), "ledger_entry": run.entry.id}


# --- billing_maintenance ---------------------------------------------------------------

#: What asking the listeners of ``before_renewal_first_notice`` may take in one run, in all.
#: Past it the remaining first notices go out unasked (hooks fail open), so slow listeners
#: cannot hold the notices back or push the run past its 20-minute timeout.
FIRST_NOTICE_HOOKS_BUDGET_SECONDS: Final = 120.0


def _instant(value: Any) -> str:
    import pandas as pd

    return iso(pd.Timestamp(value).to_pydatetime())


@dataclass
class _FirstNoticeAsks:
    """What asking before the first renewal notices came to in one run."""

    asked: int = 0
    #: Row label of each denied notice -> who denied it and why.
    denied: dict[Any, str] = field(default_factory=dict)
    #: First notices sent without asking: the budget ran out, or every listener timed out.
    unasked: int = 0


def _ask_before_first_notices(
    context: dg.AssetExecutionContext,
    run: TaskRun,
    ledger: RunLedger,
    hooks: Hooks,
    first: "pd.DataFrame",
) -> _FirstNoticeAsks:
    """Fire ``before_renewal_first_notice`` once per first notice, before it is sent.

    Each call is isolated like every hook (threads, timeouts, fail open) and its outcomes are
    stored on the run's ledger entry (``summary.hooks``). A listener that timed out is not
    asked again in this run (an abandoned thread per notice would pile up), and the whole
    asking stops after FIRST_NOTICE_HOOKS_BUDGET_SECONDS: what is left goes out unasked.
    """
    asks = _FirstNoticeAsks()
    active = hooks.registry.for_event(BEFORE_RENEWAL_FIRST_NOTICE)
    if not active or first.empty:
        return asks
    started = time.monotonic()
    for position, (label, row) in enumerate(first.iterrows()):
        spent = time.monotonic() - started
        if not active or spent > FIRST_NOTICE_HOOKS_BUDGET_SECONDS:
            asks.unasked = len(first) - position
            why = (
                "every listener timed out"
                if not active
                else f"the {FIRST_NOTICE_HOOKS_BUDGET_SECONDS:g} s budget for asking is spent"
            )
            context.log.warning(
                f"{asks.unasked} first renewal notice(s) go out without asking the "
                f"{BEFORE_RENEWAL_FIRST_NOTICE} listeners: {why} (hooks fail open)"
            )
            break
        data = {
            "service_id": int(row["object_id"]),
            "customer_id": int(row["customer_id"]),
            "expires_at": _instant(row["reference_at"]),
            "stage_days": int(row["stage_days"]),
            "notice_at": _instant(row["time_point"]),
            "channels": str(row["channels"]).split(","),
        }
        dispatch = fire_task_event(
            context,
            ledger,
            Hooks.of(HookRegistry(active)),
            BEFORE_RENEWAL_FIRST_NOTICE,
            run.entry,
            run.as_of,
            data=data,
        )
        if dispatch is None:
            continue
        asks.asked += 1
        if dispatch.denied:
            asks.denied[label] = dispatch.deny_reason or "denied"
        slow = {o.listener for o in dispatch.outcomes if o.outcome == OUTCOME_TIMEOUT}
        if slow:
            active = tuple(x for x in active if x.name not in slow)
            context.log.warning(
                f"{', '.join(sorted(slow))} timed out on {BEFORE_RENEWAL_FIRST_NOTICE}: not "
                f"asked again in this run"
            )
    return asks


def _gate_renewal_notices(
    context: dg.AssetExecutionContext,
    run: TaskRun,
    ledger: RunLedger,
    hooks: Hooks,
    engine: Any,
    due: "pd.DataFrame",
    policy: "ReminderPolicy",
) -> tuple["pd.DataFrame", dict[str, Any]]:
    """The due renewal notices (``renewal_notices_due`` rows) less those not to be sent:
    the ones a blocking listener of ``before_renewal_first_notice`` denies now (recorded as
    skipped, with why) and the ones denied in an earlier run; and metadata saying so."""
    import pandas as pd

    # The pandas rules load with the run that uses them, not with the code location.
    from assets.billing import (
        NOTICE_FIRST,
        NOTICE_SKIPPED,
        first_notice_gate,
        first_notice_keys,
        renewal_notices,
        skip_keys,
    )

    notices = renewal_notices(due)
    keys = first_notice_keys(notices, policy.renewal_days)
    gate = first_notice_gate(notices, keys, read_effects(engine, keys))
    asks = _ask_before_first_notices(context, run, ledger, hooks, notices.loc[gate == NOTICE_FIRST])
    denied = notices.loc[list(asks.denied)].assign(reason=list(asks.denied.values()))
    if not denied.empty:
        details = [
            f"renewal notice of service {r.object_id} ({r.stage_days} days before expiry "
            f"{_instant(r.reference_at)}, channels {r.channels}) skipped: denied by a blocking "
            f"{BEFORE_RENEWAL_FIRST_NOTICE} listener ({r.reason}); ledger entry {run.entry.id}"
            for r in denied.itertuples(index=False)
        ]
        skip_notifications(
            engine,
            skip_keys(denied).assign(detail=details),
            at=run.as_of,
            task_key=run.task_key,
            entry_key=run.entry_key,
            guard=run.guard,
        )
        for detail in details:
            context.log.warning(detail)
    held = notices.loc[(gate == NOTICE_SKIPPED) | notices.index.isin(denied.index)]
    kept = due
    if not held.empty:
        held_keys = pd.MultiIndex.from_frame(held[["object_id", "time_point"]])
        kept = due.loc[~pd.MultiIndex.from_frame(due[["object_id", "time_point"]]).isin(held_keys)]
    skipped_table = denied.rename(
        columns={"object_id": "service_id", "reference_at": "expires_at"}
    )[["service_id", "customer_id", "expires_at", "stage_days", "channels", "reason"]]
    return kept, {
        "renewal_first_notices": int((gate == NOTICE_FIRST).sum()),
        "renewal_first_notices_asked": asks.asked,
        "renewal_first_notices_unasked": asks.unasked,
        "renewal_notices_denied": len(denied),
        "renewal_notices_skipped_earlier": int((gate == NOTICE_SKIPPED).sum()),
        "renewal_notices_denied_now": table_metadata(skipped_table),
    }


@task_asset(
    "billing_maintenance",
    group_name=GROUP,
    partitions_def=DAILY_PARTITIONS,
    description=(
        "Overdue-invoice reminders and renewal notices due as of the run's due (a backfill: "
        "as of the end of its day), sent once per rule, object, time point and channel; "
        "plugin listeners of before_renewal_first_notice are asked before a service's first "
        "renewal notice of an expiry, and a blocking deny skips it."
    ),
    kinds={"pandas", "sql"},
)
def billing_maintenance(
    context: dg.AssetExecutionContext,
    run: TaskRun,
    source: SourceStore,
    notifier: Notifier,
    rules: DomainRules,
    ledger: RunLedger,
    hooks: Hooks,
) -> Iterator[dg.MaterializeResult]:
    import pandas as pd

    # The pandas rules load with the run that uses them, not with the code location.
    from assets.billing import (
        overdue_candidates_query,
        overdue_reminders_due,
        reminder_customers_query,
        render_reminders,
        renewal_candidates_query,
        renewal_notices_due,
    )

    engine = source.engine()
    create_domain_schema(engine)
    policy = rules.reminder_policy()
    overdue_query = overdue_candidates_query(run.as_of, policy)
    renewal_query = renewal_candidates_query(run.as_of, policy)
    contacts = source.read_frame(reminder_customers_query(overdue_query, renewal_query))
    renewals, first_notices = _gate_renewal_notices(
        context,
        run,
        ledger,
        hooks,
        engine,
        renewal_notices_due(source.read_frame(renewal_query), contacts, run.as_of, policy),
        policy,
    )
    due = pd.concat(
        [
            overdue_reminders_due(source.read_frame(overdue_query), contacts, run.as_of, policy),
            renewals,
        ],
        ignore_index=True,
    )
    outcomes = dispatch_notifications(
        engine,
        notifier,
        render_reminders(due),
        at=run.as_of,
        task_key=run.task_key,
        entry_key=run.entry_key,
        guard=run.guard,
    )
    counts = outcome_counts(outcomes)
    per_channel = outcome_counts(outcomes, by=("channel",))
    flat = {
        f"{channel}/{column}": int(count)
        for column in ("due", *OUTCOMES)
        for channel, count in zip(
            per_channel["channel"].tolist(), per_channel[column].tolist(), strict=True
        )
    }
    failed = int((outcomes["outcome"] == OUTCOME_FAILED).sum())
    if failed:
        context.log.warning(f"{failed} notification(s) failed; the next run retries them")
    preview = outcomes[
        ["rule", "object_id", "customer_id", "channel", "stage_days", "time_point", "outcome"]
    ]
    yield dg.MaterializeResult(
        metadata={
            **_run_metadata(run),
            "due": len(outcomes),
            "sent": int((outcomes["outcome"] == OUTCOME_SENT).sum()),
            "failed": failed,
            **flat,
            **first_notices,
            "counts_by_rule_and_channel": table_metadata(counts, limit=None),
            "first_rows": table_metadata(preview),
        }
    )


# --- service_auto_renew ----------------------------------------------------------------


@task_asset(
    "service_auto_renew",
    group_name=GROUP,
    description=(
        "Auto-renew services expiring within the window, paid from the balance; services "
        "whose balance is short get an insufficient-balance record."
    ),
    kinds={"pandas", "sql"},
)
def service_auto_renew(
    context: dg.AssetExecutionContext,
    run: TaskRun,
    source: SourceStore,
    rules: DomainRules,
) -> Iterator[dg.MaterializeResult]:
    # The pandas rules load with the run that uses them, not with the code location.
    from assets.renewals import (
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
            **_run_metadata(run),
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


# --- reconcile_account_balance ---------------------------------------------------------


@task_asset(
    "reconcile_account_balance",
    group_name=GROUP,
    description=(
        "Balances recomputed from payments and invoices; mismatches reported (never fixed)."
    ),
    kinds={"pandas", "sql"},
)
def reconcile_account_balance(
    context: dg.AssetExecutionContext,
    run: TaskRun,
    source: SourceStore,
) -> Iterator[dg.MaterializeResult]:
    # The pandas rule loads with the run that uses it, not with the code location.
    from assets.reconcile import movements_query, reconcile_balances

    mismatches, summary = reconcile_balances(source.read_frame(movements_query()))
    if summary["mismatched"]:
        context.log.warning(
            f"{summary['mismatched']} customer balance(s) disagree with payments - "
            f"invoices (total {summary['absolute_difference_cents']} cents); reported, "
            f"not fixed"
        )
    yield dg.MaterializeResult(
        metadata={
            **_run_metadata(run),
            **summary,
            "mismatches": table_metadata(mismatches, limit=20),
        }
    )


# --- ticket_auto_close -----------------------------------------------------------------


@task_asset(
    "ticket_auto_close",
    group_name=GROUP,
    description="Tickets waiting on the customer for N days, closed as of the run's due.",
    kinds={"pandas", "sql"},
)
def ticket_auto_close(
    context: dg.AssetExecutionContext,
    run: TaskRun,
    source: SourceStore,
    rules: DomainRules,
) -> Iterator[dg.MaterializeResult]:
    # The pandas rule loads with the run that uses it, not with the code location.
    from assets.tickets import candidate_tickets_query, close_tickets, select_tickets_to_close

    policy = rules.ticket_policy()
    candidates = source.read_frame(candidate_tickets_query(run.as_of, policy))
    to_close = select_tickets_to_close(candidates, run.as_of, policy)
    closed = close_tickets(
        source.engine(),
        to_close["id"],
        run.as_of,
        policy,
        task_key=run.task_key,
        entry_key=run.entry_key,
        guard=run.guard,
    )
    yield dg.MaterializeResult(
        metadata={
            **_run_metadata(run),
            "due_for_close": len(to_close),
            "closed": len(closed),
            "skipped_changed_meanwhile": len(to_close) - len(closed),
        }
    )


# --- log_archive -------------------------------------------------------------------------


@task_asset(
    "log_archive",
    group_name=GROUP,
    description=(
        "Automation and notification logs older than the retention, moved to verified gzip "
        "CSV archives (the run ledger is never touched)."
    ),
    kinds={"pandas", "sql"},
)
def log_archive(
    context: dg.AssetExecutionContext,
    run: TaskRun,
    source: SourceStore,
    rules: DomainRules,
) -> Iterator[dg.MaterializeResult]:
    import pandas as pd

    # The archive rule loads with the run that uses it, not with the code location.
    from assets.log_archive import ARCHIVED_LOGS, archive_log

    engine = source.engine()
    create_domain_schema(engine)
    policy = rules.archive_policy()
    manifests: list[dict[str, object]] = []
    for log in ARCHIVED_LOGS:
        manifests.extend(
            archive_log(
                engine,
                log,
                policy,
                run.as_of,
                task_key=run.task_key,
                entry_key=run.entry_key,
                guard=run.guard,
                entry_id=run.entry.id,
                attempt=run.entry.attempt,
            )
        )
    files = pd.DataFrame(
        manifests, columns=["table_name", "path", "rows", "deleted", "min_id", "max_id"]
    )
    per_table = {
        f"{log.table.name}/archived": int(
            files.loc[files["table_name"] == log.table.name, "rows"].sum()
        )
        for log in ARCHIVED_LOGS
    }
    yield dg.MaterializeResult(
        metadata={
            **_run_metadata(run),
            "archive_dir": str(policy.directory),
            "retention_days": policy.retention.days,
            "files": len(files),
            "archived_rows": int(files["rows"].sum()),
            "deleted_rows": int(files["deleted"].sum()),
            **per_table,
            "archives": table_metadata(files, limit=20),
        }
    )


DOMAIN_ASSETS = [
    billing_maintenance,
    service_auto_renew,
    reconcile_account_balance,
    ticket_auto_close,
    log_archive,
]
