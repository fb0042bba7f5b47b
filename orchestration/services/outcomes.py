"""Outcome reconciliation: the ledger learns what Dagster knows (ledger rules 2 and 5).

A task run normally records its own outcome (``runtime.task_run``). When it cannot -- the
worker was killed, the run never started (START_TIMEOUT), the launcher raised, run
monitoring ended it -- Dagster still ends the run FAILURE or CANCELED. This service follows
those run-status events with a cursor (the event storage id) and applies the pure decision
below (:func:`decide`) to each, as compare-and-set changes; it also settles
``retrying`` entries whose awaited Dagster retry will never come (RETRY_LOST_AFTER), and
ends entries of tasks this code location no longer registers (``unsupported_task``, one
alert, ``unsupported.py``). ``ledger_sensor`` (outcomes) (``sensors/outcomes.py``) runs it.

Every step checks the entry first, so evaluating the same event twice (a crashed tick, a
restarted daemon) changes nothing the second time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final, Literal

import dagster as dg

from orchestration.declarations import task_registry
from orchestration.manual_launch import EntryRequest, entry_request_from_tags
from orchestration.reclaim import redo_command
from orchestration.services.dagster_runs import (
    RETRY_LOST_AFTER,
    RetryState,
    attributed_tags,
    dagster_retry_state,
    newest_automatic_retry,
    run_timed_out,
)
from orchestration.services.unsupported import (
    end_unsupported,
    unsupported_alert,
    unsupported_message,
)
from orchestration.task_spec import TaskSpec, TaskView
from resources.core import tags as t
from resources.core.alerting import KIND_DISPATCH_FAILED, KIND_RETRY_LOST
from resources.core.due import format_due
from resources.core.entry import (
    DEFAULT_MAX_ATTEMPTS,
    DISPATCHABLE_STATUSES,
    SUMMARY_DISPATCH_FAILURES,
    SUMMARY_REJECTIONS,
    Entry,
    FailureKind,
    Origin,
    Status,
)
from resources.ledger import Ledger

# --- the decision (pure) ---------------------------------------------------------------
#
# outcome (killed worker, START_TIMEOUT, launch error, run monitoring's max runtime).
#
# - failed **before claiming** (the run id is not among the entry's runs) -> the entry is
#   created if needed and becomes ``dispatch_failed`` with Dagster's error (once per run),
#   except a ``retrying`` entry whose dead retry Dagster retries again (that retry claims);
# - failed **after claiming** while still the lease owner -> ``retrying`` when Dagster will
#   retry it (``dagster/will_retry``) and attempts are left, else ``failed`` with kind
#   ``timeout`` (max runtime) or ``error``;
# - a ``retrying`` entry whose awaited retry will not come -> ``failed``;
# - failed before claiming an entry another run holds or finished (a duplicate: the second
#   daemon's run of a due) -> traced once in the entry's ``late_job_rejections``, nothing else
#   changes, so no failed run is missing from the ledger;
# - anything else -- terminal entries above all -- is left alone.


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
        # to `summary` and `runs show`.
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


# --- following Dagster's run-status events -----------------------------------------------

#: A failed run without ``dagster/will_retry`` yet (the tag is written just after the
#: failure event) is looked at again on the next tick, for at most this long.
WILL_RETRY_GRACE: Final = timedelta(seconds=60)
#: Run-status events one evaluation handles per event type.
BATCH: Final = 200
#: On first evaluation (no cursor), look this far back for run failures.
FIRST_LOOKBACK: Final = timedelta(hours=24)
#: Characters of a run's error an alert carries (the entry keeps all of it).
ALERT_ERROR_CHARS: Final = 1000

_RunEnd = Literal[dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.RUN_CANCELED]
_OUTCOME_EVENTS: Final[dict[str, _RunEnd]] = {
    "FAILURE": dg.DagsterEventType.RUN_FAILURE,
    "CANCELED": dg.DagsterEventType.RUN_CANCELED,
}


#: Why a task is not registered, naming its plugin (task key, the run's dueledger/source).
Explain = Callable[[str, str | None], str]


def explain_unregistered(task_key: str, recorded_source: str | None) -> str:
    """The process's task registry says why ``task_key`` is not registered (the default)."""
    return task_registry().why_unregistered(task_key, recorded_source)


def reconcile_run(
    ledger: Ledger,
    tags: Mapping[str, str],
    outcome: RunOutcome,
    specs_max_attempts: Mapping[str, int],
    *,
    now: datetime | None = None,
) -> Reconciled:
    """Apply :func:`decide` to the ledger for one ended run (idempotent)."""
    request = entry_request_from_tags(tags, outcome.run_id)
    entry = ledger.find(request.task_key, request.dedup_key)
    action, reason = decide(entry, outcome)
    if action is Action.DISPATCH_FAILED:
        if entry is None:
            entry = ledger.ensure_entry(
                task_key=request.task_key,
                trigger=request.trigger,
                dedup_key=request.dedup_key,
                due=request.due,
                max_attempts=specs_max_attempts.get(request.task_key, DEFAULT_MAX_ATTEMPTS),
                operator=request.operator,
                reason=request.reason,
                parent_id=request.parent_id,
                now=now,
            )
            action, reason = decide(entry, outcome)  # a racing run may have claimed it
        if action is Action.DISPATCH_FAILED:
            entry = ledger.record_dispatch_failure(
                entry.id, error=outcome.error_text(claimed=False), run_id=outcome.run_id, now=now
            )
    elif action is Action.TRACE_DUPLICATE:
        assert entry is not None
        entry = ledger.reject(
            entry.id,
            outcome.run_id,
            reason=f"{outcome.error_text(claimed=False)}; {reason}",
            now=now,
        )
    elif action is Action.FAIL_ATTEMPT:
        assert entry is not None
        entry = ledger.fail(
            entry.id, outcome.run_id, error=outcome.error_text(True), kind=outcome.kind, now=now
        )
    elif action is Action.FAIL_FINAL:
        assert entry is not None
        after = ledger.settle_unretried_run(
            entry.id, outcome.run_id, error=outcome.error_text(True), kind=outcome.kind, now=now
        )
        entry = after or ledger.get(entry.id)
    return Reconciled(outcome.run_id, request.task_key, action, reason, entry)


def end_unregistered(
    ledger: Ledger,
    request: EntryRequest,
    run_id: str,
    registered: Sequence[TaskSpec],
    *,
    source: str | None = None,
    explain: Explain = explain_unregistered,
    now: datetime | None = None,
    log: Any | None = None,
) -> Reconciled:
    """A run (``run_id``) of a task this code location does not register ended, or an entry
    of such a task waits for a retry that cannot run: the entry ``request`` names ends
    ``failed`` with kind ``unsupported_task`` and one alert, claimed for ``run_id``.
    ``source`` is the ``dueledger/source`` the run carried. Terminal and ``dispatch_failed``
    entries and entries running under another run are left alone; doing it twice changes
    nothing the second time."""
    entry = ledger.find(request.task_key, request.dedup_key)
    if entry is not None:
        if entry.is_terminal or entry.status == Status.DISPATCH_FAILED:
            return Reconciled(
                run_id, request.task_key, Action.NONE, f"entry is {entry.status}", entry
            )
        if entry.status == Status.RUNNING and entry.lease_owner != run_id:
            reason = f"entry is running under run {entry.lease_owner}, which decides its outcome"
            return Reconciled(run_id, request.task_key, Action.NONE, reason, entry)
    started = entry is not None and entry.lease_owner == run_id
    why = explain(request.task_key, source)
    message = unsupported_message(request.task_key, run_id, why, registered, started=started)
    end = end_unsupported(
        ledger,
        task_key=request.task_key,
        trigger=request.trigger,
        dedup_key=request.dedup_key,
        run_id=run_id,
        message=message,
        log=log,
        alert=False,  # raised with the tick's other alerts (alert_of)
        due=request.due,
        operator=request.operator,
        reason=request.reason,
        parent_id=request.parent_id,
        source=source,
        now=now,
    )
    if not end.ended:
        return Reconciled(
            run_id, request.task_key, Action.NONE, end.refusal or "claim refused", end.entry
        )
    return Reconciled(run_id, request.task_key, Action.UNSUPPORTED, why, end.entry, source=source)


# --- reading Dagster's side ----------------------------------------------------------------------


def _error_of(event: Any) -> str:
    """First line of an error attached to a Dagster event, if any."""
    data = getattr(event, "event_specific_data", None)
    error = getattr(data, "error", None)
    message = getattr(error, "message", None)
    return str(message).strip() if message else ""


def _launch_error(instance: dg.DagsterInstance, run_id: str) -> str:
    """The newest engine-event error of a run (a run launcher's exception lands there)."""
    records = instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.ENGINE_EVENT, ascending=False, limit=20
    ).records
    for record in records:
        event = record.event_log_entry.dagster_event
        text = _error_of(event) if event is not None else ""
        if text:
            return text
    return ""


def run_outcome(
    instance: dg.DagsterInstance,
    event_record: dg.EventLogRecord,
    status: str,
    views: Sequence[TaskView],
) -> tuple[RunOutcome, list[Mapping[str, str]]] | None:
    """The :class:`RunOutcome` of a run-status event and the run's tags per task it belongs
    to (None: not a task run, or the run is gone)."""
    run_id = event_record.event_log_entry.run_id
    record = instance.get_run_record_by_id(run_id)
    if record is None or record.dagster_run.tags.get(t.TAG_OUTCOME) in t.OUTCOMES:
        # A run the ledger refused, skipped or replaced ended by the ledger's own decision
        # (recorded then): it is no dispatch failure, and its entry says what happened.
        return None
    per_task = attributed_tags(record.dagster_run, views)
    if not per_task:
        return None
    tags = record.dagster_run.tags
    event = event_record.event_log_entry.dagster_event
    parts = [(event.message or "") if event is not None else ""]
    detail = _error_of(event) if event is not None else ""
    if not detail and status == "FAILURE":
        detail = _launch_error(instance, run_id)
    if detail and detail not in parts[0]:
        parts.append(detail)
    reason = tags.get(t.DAGSTER_FAILURE_REASON)
    if reason:
        parts.append(f"({t.DAGSTER_FAILURE_REASON}={reason})")
    message = " ".join(p.strip() for p in parts if p and p.strip())
    outcome = RunOutcome(
        run_id=run_id,
        status=status,
        will_retry=tags.get(t.DAGSTER_WILL_RETRY, "").lower() == "true",
        message=message,
        timed_out=run_timed_out(record, message),
    )
    return outcome, per_task


def _load_cursor(text: str | None) -> dict[str, int]:
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    return {k: int(v) for k, v in data.items() if k in _OUTCOME_EVENTS and isinstance(v, int)}


def reconcile_events(
    instance: dg.DagsterInstance,
    ledger: Ledger,
    views: Sequence[TaskView],
    cursor: str | None,
    now: datetime,
    log: Any | None = None,
    *,
    explain: Explain = explain_unregistered,
) -> tuple[str, list[Reconciled]]:
    """Handle run FAILURE / CANCELED events after ``cursor``; returns the new cursor and what
    was done. A FAILURE still waiting for its ``dagster/will_retry`` tag stops its batch
    there (for at most WILL_RETRY_GRACE), so the next evaluation sees it again. A run of a
    task ``views`` do not hold is unsupported (:func:`end_unregistered`)."""
    positions = _load_cursor(cursor)
    max_attempts = {v.spec.key: v.spec.max_attempts for v in views}
    registered = [v.spec for v in views]
    done: list[Reconciled] = []
    for status, event_type in _OUTCOME_EVENTS.items():
        after = positions.get(status)
        # No job_names in the filter: dagster-postgres refuses it ("fetch_run_status_changes
        # with selectors ... not supported") and SQLite silently ignores it. Filter here.
        records_filter = dg.RunStatusChangeRecordsFilter(
            event_type=event_type,
            after_storage_id=after,
            after_timestamp=None if after is not None else (now - FIRST_LOOKBACK).timestamp(),
        )
        result = instance.fetch_run_status_changes(records_filter, limit=BATCH, ascending=True)
        for record in result.records:
            # Every ended run is looked at, not only task jobs': a UI "Materialize" runs
            # the implicit asset job. Failures are few; the run record tells the tasks.
            found = run_outcome(instance, record, status, views)
            if found is not None:
                outcome, per_task = found
                waiting = (
                    status == "FAILURE"
                    and instance.run_retries_enabled
                    and t.DAGSTER_WILL_RETRY not in per_task[0]
                    and now.timestamp() - record.timestamp < WILL_RETRY_GRACE.total_seconds()
                    # An unregistered task's entry ends whatever Dagster decides.
                    and any(tags[t.TAG_TASK] in max_attempts for tags in per_task)
                )
                if waiting:
                    break
                for tags in per_task:
                    try:
                        if tags[t.TAG_TASK] in max_attempts:
                            item = reconcile_run(ledger, tags, outcome, max_attempts, now=now)
                        else:
                            item = _end_unregistered_run(
                                instance,
                                ledger,
                                tags,
                                outcome.run_id,
                                registered,
                                explain,
                                now,
                                log,
                            )
                    except ValueError as exc:
                        # Malformed tags (e.g. a hand-made dueledger/due): skip the run
                        # rather than stall the cursor on it forever. Ledger outages raise
                        # LedgerError and are retried on the next evaluation.
                        if log is not None:
                            log.warning(f"run {outcome.run_id}: cannot reconcile: {exc}")
                        continue
                    if item.action is not Action.NONE:
                        done.append(item)
                        if log is not None:
                            log.info(item.line())
            positions[status] = record.storage_id
    return json.dumps(positions, sort_keys=True), done


def settle_abandoned_retries(
    instance: dg.DagsterInstance,
    ledger: Ledger,
    views: Sequence[TaskView],
    now: datetime,
    log: Any | None = None,
    *,
    explain: Explain = explain_unregistered,
) -> list[Reconciled]:
    """``retrying`` entries whose awaited Dagster retry will never come.

    An entry waits in ``retrying`` for Dagster's automatic retry of its latest run (or, when
    that retry died before claiming, for the next retry in the chain). The newest run of
    that chain has ended and Dagster will not retry it when:

    - Dagster tagged it ``dagster/will_retry=true`` and then rewrote the tag to ``false``
      because creating the retry failed (e.g. the code location was unavailable), with no
      new run event, so :func:`reconcile_events` never saw the change;
    - the tag says ``true`` but no retry exists RETRY_LOST_AFTER after the run ended
      (Dagster lost the retry; see RETRY_LOST_AFTER);
    - it succeeded without claiming: the ledger refused it (a retry that started while the
      entry was still leased to a run the runtime could not tell was its ancestor), and
      Dagster retries only failed runs.

    The run's outcome is then applied as "no retry": a claimed run's entry becomes
    ``failed`` (keeping its error), a retry that died or was refused before claiming makes
    it ``dispatch_failed`` (re-dispatched within its slot, like any run that never claimed).
    Without this sweep the entry would wait in ``retrying`` forever.

    A ``retrying`` entry of a task the code location no longer registers ends at once
    (:func:`end_unregistered`): Dagster cannot retry a run whose job is gone ("Could not
    find job ... unable to retry the run", leaving ``dagster/will_retry=true``), and a retry
    it created before still fails when dequeued. It is claimed for that retry run when one
    exists, else for the entry's latest run.
    """
    tasks = {v.spec.key for v in views}
    registered = [v.spec for v in views]
    max_attempts = {v.spec.key: v.spec.max_attempts for v in views}
    waiting, _ = ledger.list_entries(statuses=[Status.RETRYING], limit=BATCH)
    done: list[Reconciled] = []
    for entry in waiting:
        if not entry.run_ids:
            continue
        if entry.task_key not in tasks:
            item = end_unregistered_retry(
                instance, ledger, entry, registered, explain=explain, now=now, log=log
            )
            if item.action is not Action.NONE:
                done.append(item)
                if log is not None:
                    log.info(item.line())
            continue
        newest = newest_automatic_retry(instance, entry.run_ids[-1])
        if newest is None:
            continue
        run = newest.dagster_run
        state = dagster_retry_state(run.status, run.tags, newest.end_time, now)
        if state is RetryState.LOST:
            message = (
                f"Dagster announced a retry of this run ({t.DAGSTER_WILL_RETRY}=true) and had "
                f"not created it {RETRY_LOST_AFTER.total_seconds() / 60:g} minutes after the "
                f"run ended: the retry was lost"
            )
        elif state is RetryState.NOT_RETRIED and _refused(run):
            message = (
                "the last run of the entry's retry chain was refused by the ledger without "
                "claiming the entry (nothing done), and Dagster retries only failed runs"
            )
        elif state is RetryState.NOT_RETRIED and run.tags.get(t.DAGSTER_WILL_RETRY) == "false":
            message = "Dagster announced a retry of this run and then did not launch it"
        elif state is RetryState.NOT_RETRIED:
            message = f"Dagster will not retry this run ({run.status.value})"
        else:
            continue
        outcome = RunOutcome(
            run_id=run.run_id, status=run.status.value, will_retry=False, message=message
        )
        # A UI-launched run's retries copy its tags, which name no task: the entry does.
        tags = {t.TAG_TASK: entry.task_key, **run.tags}
        item = reconcile_run(ledger, tags, outcome, max_attempts, now=now)
        if item.action is not Action.NONE:
            if state is RetryState.LOST:
                # The sensor raises the retry_lost alert for it (alert_of).
                item = replace(item, retry_lost=f"{message} (run {run.run_id})")
            done.append(item)
            if log is not None:
                log.info(item.line())
    return done


def _refused(run: dg.DagsterRun) -> bool:
    """A run the ledger refused: CANCELED by the claim wrapper (older releases ended such
    runs SUCCESS with the same tag)."""
    return run.tags.get(t.TAG_OUTCOME) in t.OUTCOMES or (run.status == dg.DagsterRunStatus.SUCCESS)


def alert_of(item: Reconciled) -> tuple[str, dict[str, Any]] | None:
    """The alert a reconciliation raises, as (kind, fields): ``retry_lost`` when Dagster
    lost the retry an entry waited for, ``unsupported_task`` when an entry of a task that is
    no longer registered was ended, ``dispatch_failed`` when a run ended before it claimed
    its entry; None for anything else."""
    entry = item.entry
    if entry is None:
        return None
    fields: dict[str, Any] = {
        "task": entry.task_key,
        "entry_id": entry.id,
        "run_id": item.run_id,
        "due": format_due(entry.due) if entry.due else None,
        "dedup_key": entry.dedup_key,
        "status": entry.status,
    }
    if item.retry_lost is not None:
        return KIND_RETRY_LOST, {
            **fields,
            "error": item.retry_lost,
            "action": (
                f"nothing runs it again by itself; see `dueledger runs show {entry.id}`, and "
                f"if the work must run, `dueledger runs retry {entry.id}`"
            ),
        }
    if item.action is Action.UNSUPPORTED:
        return unsupported_alert(entry, item.run_id, source=item.source)
    if item.action is Action.DISPATCH_FAILED and entry.status == Status.DISPATCH_FAILED:
        failures = entry.summary.get(SUMMARY_DISPATCH_FAILURES) or [{}]
        last = failures[-1] if isinstance(failures[-1], Mapping) else {}
        return KIND_DISPATCH_FAILED, {
            **fields,
            "error": str(last.get("error") or entry.error or "").strip()[:ALERT_ERROR_CHARS],
            "action": (
                f"a scheduled due is re-dispatched within its own slot by "
                f"ledger_sensor (re-dispatch); see `dueledger runs show {entry.id}`"
                if entry.origin == Origin.DUE
                # A manual launch or retry is re-dispatched by repeating its request.
                else f"{redo_command(entry)}; see `dueledger runs show {entry.id}`"
            ),
        }
    return None


def end_unregistered_retry(
    instance: dg.DagsterInstance,
    ledger: Ledger,
    entry: Entry,
    registered: Sequence[TaskSpec],
    *,
    explain: Explain = explain_unregistered,
    now: datetime | None = None,
    log: Any | None = None,
) -> Reconciled:
    """End a ``retrying`` entry of an unregistered task (:func:`end_unregistered`), claimed
    for the retry it waits for when Dagster created one (its newest automatic retry, not yet
    among the entry's runs), else for the entry's latest run."""
    latest = entry.run_ids[-1]
    newest = newest_automatic_retry(instance, latest)
    run = newest.dagster_run if newest is not None else instance.get_run_by_id(latest)
    run_id = run.run_id if run is not None and run.run_id not in entry.run_ids else latest
    request = EntryRequest.of_entry(entry)
    source = run.tags.get(t.TAG_SOURCE) if run is not None else None
    return end_unregistered(
        ledger, request, run_id, registered, source=source, explain=explain, now=now, log=log
    )


def _end_unregistered_run(
    instance: dg.DagsterInstance,
    ledger: Ledger,
    tags: Mapping[str, str],
    run_id: str,
    registered: Sequence[TaskSpec],
    explain: Explain,
    now: datetime,
    log: Any | None,
) -> Reconciled:
    """An ended run of an unregistered task. The failure of the run that left its entry
    ``retrying`` ends the entry for the retry Dagster queued, when there is one."""
    request = entry_request_from_tags(tags, run_id)
    entry = ledger.find(request.task_key, request.dedup_key)
    if entry is not None and entry.status == Status.RETRYING and run_id in entry.run_ids:
        return end_unregistered_retry(
            instance, ledger, entry, registered, explain=explain, now=now, log=log
        )
    source = tags.get(t.TAG_SOURCE)
    return end_unregistered(
        ledger, request, run_id, registered, source=source, explain=explain, now=now, log=log
    )
