"""Outcome reconciliation's decision (DESIGN rules 2 and 5), pure: what the ledger does
about one task run that Dagster ended FAILURE or CANCELED without the run recording its
outcome (killed worker, START_TIMEOUT, launch error, run monitoring's max runtime).

- failed **before claiming** (the run id is not among the entry's runs) -> the entry is
  created if needed and becomes ``dispatch_failed`` with Dagster's error (once per run),
  except a ``retrying`` entry whose dead retry Dagster retries again (that retry claims);
- failed **after claiming** while still the lease owner -> ``retrying`` when Dagster will
  retry it (``dagster/will_retry``) and attempts are left, else ``failed`` with kind
  ``timeout`` (max runtime) or ``error``;
- a ``retrying`` entry whose awaited retry will not come -> ``failed``;
- failed before claiming an entry another run holds or finished (a duplicate: the second
  daemon's run of a due) -> traced once in the entry's ``late_job_rejections``, nothing else
  changes, so no failed run is missing from the ledger;
- anything else -- terminal entries above all -- is left alone.

The service that applies it, reading Dagster's run events, is
``orchestration/services/outcomes.py``; the sensor is ``sensors/outcomes.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from resources.core.entry import (
    DISPATCHABLE_STATUSES,
    SUMMARY_REJECTIONS,
    Entry,
    FailureKind,
    Status,
)


class Action(StrEnum):
    """What the reconciler does to an entry for one ended run."""

    NONE = "none"
    DISPATCH_FAILED = "dispatch_failed"  # never claimed -> dispatch_failed (+ error)
    FAIL_ATTEMPT = "fail_attempt"  # owner died, Dagster retries -> ledger.fail (retrying)
    FAIL_FINAL = "fail_final"  # no further attempt will come -> failed
    UNSUPPORTED = "unsupported_task"  # its task is not registered -> failed, unsupported_task
    TRACE_DUPLICATE = "trace_duplicate"  # a duplicate ended before claiming -> a rejection


@dataclass(frozen=True)
class RunOutcome:
    """What Dagster knows about one ended task run."""

    run_id: str
    status: str  # "FAILURE" or "CANCELED"
    will_retry: bool
    message: str
    timed_out: bool = False

    @property
    def kind(self) -> str:
        return FailureKind.TIMEOUT if self.timed_out else FailureKind.ERROR

    def error_text(self, claimed: bool) -> str:
        verb = "failed" if self.status == "FAILURE" else "was canceled"
        when = (
            "after claiming the entry, without recording its outcome"
            if claimed
            else ("before it claimed the entry (it never started the task)")
        )
        return f"Dagster run {self.run_id} {verb} {when}: {self.message}".strip()


def _duplicate_untraced(entry: Entry, run_id: str) -> bool:
    """Did ``run_id`` end before claiming an entry another run holds or finished, and is it
    not traced on the entry yet (attempt, dispatch failure or rejection)?"""
    if entry.status in DISPATCHABLE_STATUSES or run_id in entry.run_ids:
        return False
    if run_id in entry.dispatch_failure_run_ids:
        return False
    rejected = {str(r.get("run_id")) for r in entry.summary.get(SUMMARY_REJECTIONS, [])}
    return run_id not in rejected


def decide(entry: Entry | None, outcome: RunOutcome) -> tuple[Action, str]:
    """Pure: the reconciler's decision for one ended run and the entry's current state."""
    if entry is None:
        return Action.DISPATCH_FAILED, "no ledger entry: the run never reached the task"
    if _duplicate_untraced(entry, outcome.run_id):
        # Found by the history checker (tests/history): a duplicate of a due -- the second
        # daemon's run -- that died before claiming was in no entry, a failed run invisible
        # to `summary` and `runs show` (DESIGN rule 4).
        return Action.TRACE_DUPLICATE, (
            f"entry is {entry.status} under another run: this run was a duplicate; traced"
        )
    if entry.is_terminal:
        return Action.NONE, f"entry is {entry.status}: terminal, never overwritten"
    if outcome.run_id not in entry.run_ids:
        if outcome.run_id in entry.dispatch_failure_run_ids:
            return Action.NONE, "dispatch failure of this run already recorded"
        if entry.status == Status.RETRYING and outcome.will_retry:
            # A Dagster retry died before claiming and Dagster retries it again: that next
            # retry claims the entry. Marking it dispatch_failed now would refuse it.
            return Action.NONE, "the retry died before claiming; Dagster's next retry claims"
        if entry.status in DISPATCHABLE_STATUSES:
            return Action.DISPATCH_FAILED, "the run ended before claiming the entry"
        return Action.NONE, f"entry is {entry.status} under another run: this run was a duplicate"
    if entry.status == Status.RUNNING and entry.lease_owner == outcome.run_id:
        if outcome.will_retry and entry.attempt < entry.max_attempts:
            return Action.FAIL_ATTEMPT, "the lease owner ended and Dagster will retry it"
        return Action.FAIL_FINAL, "the lease owner ended and no retry will come"
    if (
        entry.status == Status.RETRYING
        and entry.run_ids
        and entry.run_ids[-1] == outcome.run_id
        and not outcome.will_retry
    ):
        return Action.FAIL_FINAL, "the entry waits for a retry that Dagster will not launch"
    return Action.NONE, f"entry is {entry.status}: nothing to reconcile for this run"


@dataclass(frozen=True)
class Reconciled:
    run_id: str
    task_key: str
    action: Action
    reason: str
    entry: Entry | None
    #: Set when Dagster lost the retry this entry waited for: what happened (the alert's text).
    retry_lost: str | None = None
    #: The ``dueledger/source`` of an unsupported task's run (named by its alert).
    source: str | None = None

    def line(self) -> str:
        where = f"entry {self.entry.id} -> {self.entry.status}" if self.entry else "no entry"
        return f"run {self.run_id} ({self.task_key}): {self.action.value}: {self.reason}; {where}"
