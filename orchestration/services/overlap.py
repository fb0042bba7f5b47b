"""The task's pauses and overlap policy, applied when a run claims its entry.

``runtime.task_run`` calls :func:`claim_entry` instead of a plain claim, so every launch path
-- a schedule tick, a sensor, the launchpad, Materialize, a backfill, `dueledger launch`,
`dueledger catch-up`, a manual retry -- meets the same rules:

1. **a pause**: a due (``due:`` entry) inside a pause of its task is not run: the entry ends
   ``skipped`` with ``paused by NAME: REASON`` and the run ends CANCELED, tagged
   ``dueledger/outcome=skipped`` (``unclaimed.end_unclaimed_run``);
2. **the overlap policy**: ``queue`` and ``allow`` claim as before (Dagster's pool of one
   slot holds ``queue`` runs back); ``skip``, ``buffer_one`` and ``replace`` claim through
   ``RunLedger.claim_with_overlap`` (the decision: ``resources/core/overlap.py``). A run told
   to wait polls until the task is free, renewing its waiter mark; a skipped run ends like a
   paused one; a replacing run claims and ends the run it replaced
   (``unclaimed.mark_replaced_run``).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Final

import dagster as dg

from orchestration.services.unclaimed import end_unclaimed_run, mark_replaced_run
from orchestration.task_run import EntryRequest
from orchestration.task_spec import LEDGER_OVERLAP_POLICIES, TaskSpec
from resources.core import tags as t
from resources.core.entry import Origin, Status, Trigger
from resources.core.overlap import OVERLAP_WAIT_TURN, SUMMARY_OVERLAP, OverlapAction
from resources.ledger import ClaimResult, Entry, Ledger

#: How often a run waiting for its turn asks again (its waiter mark lives 30 s).
WAIT_POLL_SECONDS: Final = 2.0


def waits_its_turn(entry: Entry) -> bool:
    """An operator asked this entry to wait for its turn instead of being skipped: a manual
    retry, `dueledger launch --queue`, `dueledger catch-up`."""
    if entry.trigger == Trigger.MANUAL_RETRY:
        return True
    return entry.summary.get(SUMMARY_OVERLAP) == OVERLAP_WAIT_TURN


def pause_of_due(ledger: Ledger, entry: Entry) -> str | None:
    """Why ``entry`` is not run: its due lies inside a pause of its task (None: it does not,
    or it is no fresh due entry)."""
    if entry.origin != Origin.DUE or entry.due is None or entry.status != Status.QUEUED:
        return None
    if entry.attempt:
        return None
    for pause in ledger.pauses(entry.task_key):
        if pause.covers(entry.due):
            return pause.skip_reason
    return None


def claim_entry(
    context: dg.AssetExecutionContext,
    ledger: Ledger,
    spec: TaskSpec,
    entry: Entry,
    request: EntryRequest,
) -> ClaimResult:
    """Claim ``entry`` for this run under the task's pauses and overlap policy (see the module
    docstring); a run that may not claim ends here, CANCELED, saying why."""
    run_id = context.run.run_id
    paused = pause_of_due(ledger, entry)
    if paused is not None:
        skipped = ledger.skip_entry(entry.id, reason=paused)
        if skipped.status == Status.SKIPPED:
            end_unclaimed_run(context, ledger, paused, skipped, request, outcome=t.OUTCOME_SKIPPED)
    if spec.overlap_policy not in LEDGER_OVERLAP_POLICIES:
        return ledger.claim(entry.id, run_id, lease_ttl=spec.lease_ttl)
    wait_turn = waits_its_turn(entry)
    waiting_since: datetime | None = None
    extended_at = 0.0
    while True:
        found = ledger.claim_with_overlap(
            entry.id,
            run_id,
            policy=spec.overlap_policy,
            lease_ttl=spec.lease_ttl,
            wait_turn=wait_turn,
        )
        action = found.decision.action
        if action is OverlapAction.WAIT:
            if waiting_since is None:
                waiting_since = datetime.now(UTC)
                context.log.info(
                    f"entry {entry.id} {spec.key}: waits for its turn ({found.decision.reason}; "
                    f"overlap policy {spec.overlap_policy})"
                )
            # Run monitoring ends a run past its task's timeout, counted from its start: a run
            # that waits keeps moving its limit (the wait is not the task's work).
            if time.monotonic() - extended_at > min(20.0, spec.timeout.total_seconds() / 2):
                _extend_max_runtime(context, spec, waiting_since)
                extended_at = time.monotonic()
            time.sleep(WAIT_POLL_SECONDS)
            continue
        if action is OverlapAction.SKIP:
            end_unclaimed_run(
                context,
                ledger,
                found.decision.reason,
                found.entry,
                request,
                outcome=t.OUTCOME_SKIPPED,
            )
        assert found.claim is not None  # CLAIM and REPLACE claim (or refuse, as a claim does)
        for old in found.replaced:
            mark_replaced_run(context.instance, ledger, old, found.entry, run_id, context.log)
        if waiting_since is not None and found.claim.claimed:
            _extend_max_runtime(context, spec, waiting_since)
        return found.claim


def _extend_max_runtime(
    context: dg.AssetExecutionContext, spec: TaskSpec, waiting_since: datetime
) -> None:
    """Run monitoring counts a run's runtime from its start: a run that waits its turn gets
    its task's timeout from now on (from when it claims, once it has), not from when it
    started waiting."""
    waited = datetime.now(UTC) - waiting_since
    # Slack for the run's start before it began to wait (it counts in its runtime too).
    limit = int((waited + spec.timeout).total_seconds()) + 30
    try:
        context.instance.add_run_tags(context.run.run_id, {t.DAGSTER_MAX_RUNTIME: str(limit)})
    except Exception as exc:  # run monitoring may end it early; the ledger is unaffected
        context.log.warning(f"could not extend the run's max runtime: {exc}")
