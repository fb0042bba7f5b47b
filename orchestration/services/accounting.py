"""Is a task's latest due accounted for? The ledger's answer, for the asset check of every
task asset (``latest_due_accounted_for``, orchestration/checks.py).

The due looked at is the task's latest due whose slot is over: by then its run should have
succeeded. It is accounted for when its entry is ``success`` (or a manual retry of it
succeeded), or while its run is still at work with a live lease. Otherwise the check fails
and says why: no run was created (a missed due), the run failed before claiming
(``dispatch_failed``), the entry failed, its lease expired, or its run is still waiting in
Dagster's queue after its slot. A due skipped for a pause passes saying so; one skipped by the
overlap policy is a warning naming the entry that was running. A task with a ``deadline``
fails on its newest due whose deadline passed without success, naming the entry. Read-only:
nothing is launched or changed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Final

import dagster as dg

from orchestration.deadline import DeadlineMiss, deadline_misses
from orchestration.missed_dues import DueVerdict, due_verdict, expected_dues, scheduling_of
from orchestration.overlap import SUMMARY_OVERLAP_HELD
from orchestration.pause import open_pauses, skipped_for_pause
from orchestration.services.summary import first_line
from orchestration.task_spec import TaskView
from orchestration.timetable import plan_dues
from resources.core import tags as t
from resources.core.due import Due, floor_to_slot
from resources.core.entry import Entry, FailureKind, Status
from resources.ledger import Ledger
from resources.ledger.rules import format_duration

CHECK_NAME: Final = "latest_due_accounted_for"
#: How far back the latest due is looked for: twice the task's cadence, at most 8 days.
_MAX_LOOKBACK: Final = timedelta(days=8)

STATE_NO_DUE: Final = "no_due_yet"
STATE_NEW: Final = "not_running_here_yet"
STATE_PAUSED: Final = "paused"
STATE_SUCCESS: Final = "success"
STATE_RUNNING: Final = "running"
STATE_MISSED: Final = "missed"
STATE_QUEUED: Final = "queued_after_its_slot"
STATE_FAILED: Final = "failed"
STATE_DISPATCH_FAILED: Final = "dispatch_failed"
STATE_STALE_LEASE: Final = "stale_lease"
STATE_SKIPPED: Final = "skipped"
STATE_DEADLINE_MISSED: Final = "deadline_missed"


@dataclass(frozen=True)
class DueAccount:
    """The answer for one task: its latest finished-slot due, and whether it is accounted for."""

    task_key: str
    asset: str
    due: Due | None
    state: str
    passed: bool
    detail: str
    entry_id: int | None = None
    #: A failure that still resolves itself (a queued run) is a warning, not an error.
    warning: bool = False

    def metadata(self) -> dict[str, Any]:
        # The entry as text and a link: a number would be plotted over the check's history,
        # and a chart of entry ids means nothing.
        entry: dict[str, Any] = {}
        if self.entry_id is not None:
            entry = {
                "entry_id": dg.MetadataValue.text(str(self.entry_id)),
                "entry_runs": dg.MetadataValue.url(t.entry_runs_path(self.entry_id)),
            }
        return {
            "task": self.task_key,
            "due": self.due.text if self.due else None,
            "state": self.state,
            **entry,
        }


def latest_finished_due(view: TaskView, now: datetime) -> Due | None:
    """The task's latest due before the start of ``now``'s slot (None: none in the lookback)."""
    end = floor_to_slot(now, view.slot_minutes)
    lookback = min(_MAX_LOOKBACK, timedelta(minutes=2 * view.effective.minutes + view.slot_minutes))
    dues = expected_dues(view, end - lookback, end)
    return Due(dues[-1]) if dues else None


_RETRY: Final = "`dueledger runs retry {id} --operator NAME --reason TEXT{ack}`"
_ACK: Final = " --acknowledge-side-effects"


def next_step(state: str, task_key: str, entry: Entry | None) -> str:
    """What an operator runs next for a due in ``state`` (the check names the next step)."""
    show = f"`dueledger runs show {entry.id}`" if entry is not None else ""
    if entry is not None and state in (STATE_FAILED, STATE_DISPATCH_FAILED):
        # Rule 4: a lease_reclaimed or dispatch_failed entry may have done its side effects.
        risky = entry.status == Status.DISPATCH_FAILED or (
            entry.failure_kind == FailureKind.LEASE_RECLAIMED
        )
        return f"{show}, then once: " + _RETRY.format(id=entry.id, ack=_ACK if risky else "")
    if state == STATE_STALE_LEASE and entry is not None:
        return f"`dueledger reclaim` (fails it, lease_reclaimed), then {show}"
    if state == STATE_MISSED:
        return (
            f"`dueledger summary` (missed_dues); to run the task now: `dueledger launch "
            f"{task_key} --operator NAME --reason TEXT`"
        )
    if state in (STATE_SUCCESS, STATE_RUNNING, STATE_DISPATCH_FAILED, STATE_SKIPPED):
        return show or "`dueledger summary`"
    if state == STATE_DEADLINE_MISSED:
        return show or f"`dueledger dues {task_key}`; `dueledger catch-up {task_key} ...`"
    return ""


def _retried_success(ledger: Ledger, entry: Entry) -> Entry | None:
    """A manual retry of ``entry`` (or of its retries) that succeeded."""
    pending = [entry]
    while pending:
        for child in ledger.children(pending.pop().id):
            if child.status == Status.SUCCESS:
                return child
            pending.append(child)
    return None


def account_latest_due(
    view: TaskView,
    ledger: Ledger,
    now: datetime,
    *,
    instance: dg.DagsterInstance | None = None,
) -> DueAccount:
    """Whether ``view``'s latest finished-slot due is accounted for, as of ``now``. A paused
    task whose due passes says so: who paused it, since when, and its latest skipped due."""
    account = _account(view, ledger, now, instance)
    pauses = open_pauses(ledger, view.spec.key) if account.passed else []
    if not pauses:
        return account
    pause = pauses[0]
    detail = f"{view.spec.key} is {pause.skip_reason} (since {pause.start:%Y-%m-%dT%H:%M:%SZ})"
    skipped = ledger.latest_finished(view.spec.key, limit=1, statuses=(Status.SKIPPED,))
    due, entry_id = account.due, account.entry_id
    if skipped:
        last = skipped[0]
        detail += f"; its latest due, entry {last.id} ({last.label}), was skipped ({last.error})"
        entry_id = last.id
        due = Due.coerce(last.due) if last.due is not None else due
    detail += f"; {account.detail}; next: `dueledger resume {view.spec.key} --reason TEXT`"
    return replace(account, due=due, state=STATE_PAUSED, detail=detail, entry_id=entry_id)


def _account(
    view: TaskView, ledger: Ledger, now: datetime, instance: dg.DagsterInstance | None
) -> DueAccount:
    spec = view.spec
    due = latest_finished_due(view, now)

    def answer(state: str, passed: bool, detail: str, entry: Entry | None = None, **kw: Any):
        entry_id = entry.id if entry is not None else None
        step = next_step(state, spec.key, entry)
        detail = f"{detail}; next: {step}" if step else detail
        return DueAccount(spec.key, spec.asset, due, state, passed, detail, entry_id, **kw)

    missed = _latest_deadline_miss(view, ledger, now)
    if missed is not None:
        due = Due(missed.due)
        return answer(
            STATE_DEADLINE_MISSED,
            False,
            f"due {due} missed its deadline ({format_duration(missed.deadline)} after the due): "
            f"{missed.why}",
            missed.entry,
        )
    if due is None:
        return answer(STATE_NO_DUE, True, "no due of this task has a finished slot yet")
    entry = ledger.find(spec.key, due.key)
    if entry is None:
        # The gap audit's rule (resources/core/dues.py), so the check and `summary` agree:
        # before the task's schedule first ran here, or paused, is not missed.
        scheduling = scheduling_of(ledger, view, instance=instance)
        verdict, why = due_verdict(due.at, scheduling, accounted=False)
        if verdict is DueVerdict.NOT_EXPECTED:
            return answer(STATE_NEW, True, f"due {due}: {why}")
        if verdict is DueVerdict.PAUSED:
            return answer(STATE_PAUSED, True, f"due {due}: {why}")
        return _without_entry(view, due, instance, answer)
    if entry.status == Status.SUCCESS:
        return answer(STATE_SUCCESS, True, f"due {due} succeeded (entry {entry.id})", entry)
    if entry.status == Status.SKIPPED:
        # Never a silent green: a pause is on purpose (passes, saying so); an overlap skip means
        # the task overran its cadence (a warning naming the entry that was running).
        paused = skipped_for_pause(entry.error)
        return answer(
            STATE_PAUSED if paused else STATE_SKIPPED,
            paused,
            f"due {due}: entry {entry.id} skipped ({entry.error})",
            entry,
            warning=not paused,
        )
    if entry.status in (Status.QUEUED, Status.RETRYING, Status.RUNNING):
        expires = entry.lease_expires_at
        if entry.status == Status.RUNNING and expires is not None and expires < now:
            return answer(
                STATE_STALE_LEASE,
                False,
                f"due {due}: entry {entry.id} is running under run {entry.lease_owner} whose "
                f"lease expired at {expires:%Y-%m-%dT%H:%M:%SZ}; ledger_sensor (reclaim) fails it",
                entry,
            )
        held = entry.summary.get(SUMMARY_OVERLAP_HELD) if entry.status == Status.QUEUED else None
        waits = f", waiting for its turn ({held})" if held else ""
        return answer(
            STATE_RUNNING, True, f"due {due}: entry {entry.id} is {entry.status}{waits}", entry
        )
    retried = _retried_success(ledger, entry)
    if retried is not None:
        return answer(
            STATE_SUCCESS,
            True,
            f"due {due}: entry {entry.id} {entry.status}, its manual retry {retried.id} succeeded",
            entry,
        )
    state = STATE_DISPATCH_FAILED if entry.status == Status.DISPATCH_FAILED else STATE_FAILED
    kind = f" ({entry.failure_kind})" if entry.failure_kind else ""
    return answer(
        state,
        False,
        f"due {due}: entry {entry.id} is {entry.status}{kind}: {first_line(entry.error)}",
        entry,
    )


def _latest_deadline_miss(view: TaskView, ledger: Ledger, now: datetime) -> DeadlineMiss | None:
    """The newest due whose deadline has passed, when it missed it (None: met, or no
    deadline): the check fails on it until a later due meets its deadline."""
    deadline = view.spec.deadline
    if deadline is None:
        return None
    window = timedelta(minutes=2 * view.effective.minutes + view.slot_minutes)
    judged = plan_dues(view.plan, view.slot_minutes, now - deadline - window, now - deadline)
    if not judged:
        return None
    misses = deadline_misses(ledger, view, now, window=window)
    return next((m for m in misses if m.due == judged[-1]), None)


def _without_entry(view: TaskView, due: Due, instance: dg.DagsterInstance | None, answer: Any):
    """No entry: a run may still wait in Dagster's queue (entries are made when runs start)."""
    if instance is not None:
        runs = instance.get_runs(
            filters=dg.RunsFilter(tags={t.TAG_TASK: view.spec.key, t.TAG_DUE: due.text}), limit=5
        )
        waiting = [r for r in runs if not r.is_finished]
        if waiting:
            return answer(
                STATE_QUEUED,
                False,
                f"due {due}: run {waiting[0].run_id} is {waiting[0].status.value} after its slot "
                f"ended (the task's pool or the run queue holds it)",
                warning=True,
            )
        if runs:
            return answer(
                STATE_DISPATCH_FAILED,
                False,
                f"due {due}: run {runs[0].run_id} ended {runs[0].status.value} before it "
                f"reached the ledger",
            )
    return answer(
        STATE_MISSED,
        False,
        f"due {due} was missed: no run was created for it (daemon down, schedule stopped or a "
        f"plugin denied it); `dueledger summary` lists missed dues",
    )


def check_evaluation(account: DueAccount) -> dg.AssetCheckEvaluation:
    """The account as an asset check evaluation a sensor reports (no run needed)."""
    return dg.AssetCheckEvaluation(
        asset_key=dg.AssetKey(account.asset),
        check_name=CHECK_NAME,
        passed=account.passed,
        metadata=account.metadata(),
        severity=dg.AssetCheckSeverity.WARN if account.warning else dg.AssetCheckSeverity.ERROR,
        description=account.detail,
    )
