"""The billing domain's tasks: ``billing_maintenance`` and ``reconcile_account_balance``
(declared in defs.yaml beside this file). Each body reads the source store as of the run's
due, calls its pure pandas rules (``reminders.py``, ``reconcile.py``: imported by the run that
computes, never at load), writes back exactly once, fenced by the run's claim, and reports
counts and the first rows as metadata.
"""

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import dagster as dg

from assets.domain_config import DomainRules
from assets.metadata import run_metadata, table_metadata
from orchestration.services.hooks.registry import Hooks
from orchestration.services.hooks.vocabulary import (
    BEFORE_RENEWAL_FIRST_NOTICE,
    OUTCOME_TIMEOUT,
    HookRegistry,
)
from orchestration.services.task_events import fire_task_event
from orchestration.task_run import TaskRun
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

    from assets.domain_config import ReminderPolicy


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
    from assets.billing.reminders import (
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
    from assets.billing.reminders import (
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
            **run_metadata(run),
            "due": len(outcomes),
            "sent": int((outcomes["outcome"] == OUTCOME_SENT).sum()),
            "failed": failed,
            **flat,
            **first_notices,
            "counts_by_rule_and_channel": table_metadata(counts, limit=None),
            "first_rows": table_metadata(preview),
        }
    )


def reconcile_account_balance(
    context: dg.AssetExecutionContext,
    run: TaskRun,
    source: SourceStore,
) -> Iterator[dg.MaterializeResult]:
    # The pandas rule loads with the run that uses it, not with the code location.
    from assets.billing.reconcile import movements_query, reconcile_balances

    mismatches, summary = reconcile_balances(source.read_frame(movements_query()))
    if summary["mismatched"]:
        context.log.warning(
            f"{summary['mismatched']} customer balance(s) disagree with payments - "
            f"invoices (total {summary['absolute_difference_cents']} cents); reported, "
            f"not fixed"
        )
    yield dg.MaterializeResult(
        metadata={
            **run_metadata(run),
            **summary,
            "mismatches": table_metadata(mismatches, limit=20),
        }
    )
