"""A run the ledger does not let act ends CANCELED, saying why: refused, skipped or replaced.

:func:`end_unclaimed_run` is the one way a task run that may not do its work ends (docs/
operators.md, "A run the ledger refused"): nothing of the task runs, the run ends CANCELED --
never a green "Success" -- with the reason as its first log line and cancellation message,
tagged ``dueledger/outcome=refused|skipped`` with the entry it was decided on and that
entry's lineage, and audited once (action ``run_refused`` or ``run_skipped``). A run a newer
one replaced (overlap ``replace``) is tagged ``dueledger/outcome=replaced`` and audited
``run_replaced`` by the run that replaced it (:func:`mark_replaced_run`). The outcome sensor
and the ``no_unledgered_failed_runs`` check leave runs with an outcome tag alone: the ledger
decided them and recorded why.
"""

from __future__ import annotations

from typing import NoReturn

import dagster as dg

from orchestration.task_run import EntryRequest
from resources.core import tags as t
from resources.core.entry import ACTION_RUN_REFUSED, ACTION_RUN_REPLACED, ACTION_RUN_SKIPPED
from resources.ledger import Entry, Ledger

_ACTIONS = {
    t.OUTCOME_REFUSED: ACTION_RUN_REFUSED,
    t.OUTCOME_SKIPPED: ACTION_RUN_SKIPPED,
}


def end_unclaimed_run(
    context: dg.AssetExecutionContext,
    ledger: Ledger,
    message: str,
    entry: Entry | None,
    request: EntryRequest,
    *,
    outcome: str = t.OUTCOME_REFUSED,
) -> NoReturn:
    """The ledger does not let this run act (``outcome`` ``refused``: a duplicate or late run,
    a rule; ``skipped``: its entry ended skipped -- overlap, a pause): it does nothing and ends
    CANCELED. `dueledger summary` counts refused runs as ``refused_24h`` (audit
    ``run_refused``) and skipped entries as ``skipped_24h``, apart from failures: Dagster
    does not retry a canceled run, and nothing counts it as failed."""
    run_id = context.run.run_id
    verb = "refused by the ledger" if outcome == t.OUTCOME_REFUSED else outcome
    context.log.warning(f"{verb}: {message}")
    tags = {t.TAG_OUTCOME: outcome}
    if entry is not None:
        tags |= {t.TAG_ENTRY: str(entry.id), t.TAG_LINEAGE: str(lineage_root(ledger, entry))}
    try:
        context.instance.add_run_tags(run_id, tags)
    except Exception as exc:  # the ledger holds the truth; the tags make it findable
        context.log.warning(f"could not tag run {run_id} as {outcome}: {exc}")
    ledger.write_audit(
        operator=request.operator,
        action=_ACTIONS[outcome],
        entry_id=entry.id if entry is not None else None,
        reason=None,
        checks={"run_id": run_id, "task_key": request.task_key, "dedup_key": request.dedup_key},
        outcome=f"{outcome}: {message}",
    )
    context.instance.report_run_canceling(context.run, message=f"{outcome}: {message}")
    # With the run CANCELING, Dagster ends it CANCELED (whichever executor runs the step).
    raise dg.DagsterExecutionInterruptedError(f"{verb}: {message}")


def mark_replaced_run(
    instance: dg.DagsterInstance,
    ledger: Ledger,
    replaced: Entry,
    by: Entry,
    run_id: str,
    log: dg.DagsterLogManager,
) -> None:
    """The newer run ``run_id`` (entry ``by``) replaced entry ``replaced`` (overlap ``replace``):
    tag the old run ``dueledger/outcome=replaced``, ask Dagster to terminate it, and audit it.

    Best effort on Dagster's side: the ledger already ended the old entry ``failed``
    (``replaced``), so the old run's fence refuses every side effect it still tries."""
    old_run = replaced.run_ids[-1] if replaced.run_ids else None
    if old_run is not None:
        try:
            instance.add_run_tags(old_run, {t.TAG_OUTCOME: t.OUTCOME_REPLACED})
            run = instance.get_run_by_id(old_run)
            if run is not None and not run.is_finished:
                instance.run_coordinator.cancel_run(old_run)
        except Exception as exc:
            log.warning(f"could not terminate replaced run {old_run}: {exc}")
    log.info(f"entry {replaced.id} ({replaced.label}) replaced by entry {by.id}, run {run_id}")
    ledger.write_audit(
        operator=None,
        action=ACTION_RUN_REPLACED,
        entry_id=replaced.id,
        child_entry_id=by.id,
        reason=None,
        checks={"run_id": old_run, "replaced_by_run": run_id, "task_key": replaced.task_key},
        outcome=f"replaced: entry {replaced.id} ended failed (replaced) by entry {by.id}",
    )


def lineage_root(ledger: Ledger, entry: Entry) -> int:
    """The id of the entry at the top of ``entry``'s manual-retry lineage (itself if none)."""
    seen = {entry.id}
    root = entry
    while root.parent_id is not None and root.parent_id not in seen:
        parent = ledger.get(root.parent_id)
        if parent is None:
            return root.parent_id
        seen.add(parent.id)
        root = parent
    return root.id
