"""Outcome reconciliation and re-dispatch: the ledger learns what Dagster knows.

A task run normally records its own outcome (``orchestration.runtime.task_run``). When it
cannot — the worker was killed, the run never started (START_TIMEOUT), the launcher
raised, run monitoring ended it — Dagster still ends the run FAILURE or CANCELED.
``ledger_outcome_sensor`` follows those run-status events with a cursor (the event
storage id) and applies ledger rules 2 and 5:

- failed **before claiming** (the run id is not among the entry's runs) -> the entry is
  created if needed and becomes ``dispatch_failed`` with Dagster's error (once per run),
  except a ``retrying`` entry whose dead retry Dagster retries again (that retry claims);
- failed **after claiming** while still the lease owner -> ``retrying`` when Dagster will
  retry it (``dagster/will_retry``) and attempts are left, else ``failed`` with kind
  ``timeout`` (max runtime) or ``error``;
- a ``retrying`` entry whose awaited retry will not come (Dagster will not retry, or
  announced a retry it has not created RETRY_LOST_AFTER later) -> ``failed``;
- a run of a task this code location does not register (its plugin was uninstalled or is
  no longer allowed: a queued run then fails when Dagster dequeues it, its job being gone)
  and every ``retrying`` entry of such a task -> ``failed`` with kind ``unsupported_task``
  and one alert (``orchestration/services/unsupported.py``), never retried;
- failed before claiming an entry another run holds or finished (a duplicate: the second
  daemon's run of a due) -> traced once in the entry's ``late_job_rejections``, nothing else
  changes, so no failed run is missing from the ledger;
- anything else — terminal entries above all — is left alone.

Every step is a compare-and-set in the ledger and checks the entry first, so evaluating
the same event twice (a crashed tick, a restarted daemon) changes nothing the second time.

``<task>_redispatch_sensor`` re-dispatches a ``dispatch_failed`` entry **within its own
slot only**, at most ``max_redispatches`` times (default 3). Dagster's sensor run-key dedup
holds a key forever, even for a failed run, so the n-th re-dispatch of a due uses run_key
``<due>#redispatch-<n>`` where n is the number of dispatch failures the entry has recorded:
a new failure gives a new key (never blocked), and re-evaluating the same state gives the
same key (Dagster finds its run; no second run). The ledger's ``dispatch_failed -> queued``
compare-and-set decides which evaluation re-dispatches; the claim decides which run acts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final, Literal

import dagster as dg

from orchestration.registry import TaskSpec, TaskView
from orchestration.runtime import EntryRequest, entry_request_from_tags, run_timed_out
from orchestration.services.alerts import Alerts, utc_now
from orchestration.services.dagster_runs import (
    RETRY_LOST_AFTER,
    RetryState,
    attributed_tags,
    dagster_retry_state,
    newest_automatic_retry,
)
from orchestration.services.unsupported import (
    end_unsupported,
    unsupported_alert,
    unsupported_message,
)
from orchestration.task_plugins import task_registry
from resources.core import tags as t
from resources.core.alerting import KIND_DISPATCH_FAILED, KIND_RETRY_LOST, entry_subject
from resources.core.due import Due
from resources.core.slots import floor_to_slot, format_due
from resources.ledger import (
    DEFAULT_MAX_ATTEMPTS,
    DISPATCHABLE_STATUSES,
    MAX_DISPATCH_FAILURES,
    SUMMARY_DISPATCH_FAILURES,
    SUMMARY_REJECTIONS,
    Entry,
    RunLedger,
    dedup_key_for_due,
)
from sensors.audit import due_run_request
from sensors.pools import ensure_task_pools

#: Re-dispatches of one due per slot (the ledger keeps the newest 5 dispatch failures, and
#: the failure count numbers the re-dispatches, so at most 4 are possible).
DEFAULT_MAX_REDISPATCHES: Final = 3
MAX_REDISPATCHES_LIMIT: Final = MAX_DISPATCH_FAILURES - 1
#: A failed run without ``dagster/will_retry`` yet (the tag is written just after the
#: failure event) is looked at again on the next tick, for at most this long.
WILL_RETRY_GRACE: Final = timedelta(seconds=60)
#: Run-status events one evaluation handles per event type.
BATCH: Final = 200
#: On first evaluation (no cursor), look this far back for run failures.
FIRST_LOOKBACK: Final = timedelta(hours=24)
#: Characters of a run's error an alert carries (the entry keeps all of it).
ALERT_ERROR_CHARS: Final = 1000
#: A re-dispatch sensor evaluates once per REDISPATCH_SLOT_FRACTION of its slot, between
#: these bounds (see :func:`redispatch_interval_seconds`).
REDISPATCH_INTERVAL_MIN: Final = 30
REDISPATCH_INTERVAL_MAX: Final = 120
REDISPATCH_SLOT_FRACTION: Final = 8

_RunEnd = Literal[dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.RUN_CANCELED]
_OUTCOME_EVENTS: Final[dict[str, _RunEnd]] = {
    "FAILURE": dg.DagsterEventType.RUN_FAILURE,
    "CANCELED": dg.DagsterEventType.RUN_CANCELED,
}


class Action(StrEnum):
    """What the reconciler does to an entry for one ended run."""

    NONE = "none"
    DISPATCH_FAILED = "dispatch_failed"  # never claimed -> dispatch_failed (+ error)
    FAIL_ATTEMPT = "fail_attempt"  # owner died, Dagster retries -> ledger.fail (retrying)
    FAIL_FINAL = "fail_final"  # no further attempt will come -> failed
    UNSUPPORTED = "unsupported_task"  # its task is not registered -> failed, unsupported_task
    TRACE_DUPLICATE = "trace_duplicate"  # a duplicate ended before claiming -> a rejection


#: Why a task is not registered, naming its plugin (task key, the run's dueledger/source).
Explain = Callable[[str, str | None], str]


def explain_unregistered(task_key: str, recorded_source: str | None) -> str:
    """The process's task registry says why ``task_key`` is not registered (the default)."""
    return task_registry().why_unregistered(task_key, recorded_source)


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
        return t.FAILURE_TIMEOUT if self.timed_out else t.FAILURE_ERROR

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
        if entry.status == t.STATUS_RETRYING and outcome.will_retry:
            # A Dagster retry died before claiming and Dagster retries it again: that next
            # retry claims the entry. Marking it dispatch_failed now would refuse it.
            return Action.NONE, "the retry died before claiming; Dagster's next retry claims"
        if entry.status in DISPATCHABLE_STATUSES:
            return Action.DISPATCH_FAILED, "the run ended before claiming the entry"
        return Action.NONE, f"entry is {entry.status} under another run: this run was a duplicate"
    if entry.status == t.STATUS_RUNNING and entry.lease_owner == outcome.run_id:
        if outcome.will_retry and entry.attempt < entry.max_attempts:
            return Action.FAIL_ATTEMPT, "the lease owner ended and Dagster will retry it"
        return Action.FAIL_FINAL, "the lease owner ended and no retry will come"
    if (
        entry.status == t.STATUS_RETRYING
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


def reconcile_run(
    ledger: RunLedger,
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
    ledger: RunLedger,
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
        if entry.is_terminal or entry.status == t.STATUS_DISPATCH_FAILED:
            return Reconciled(
                run_id, request.task_key, Action.NONE, f"entry is {entry.status}", entry
            )
        if entry.status == t.STATUS_RUNNING and entry.lease_owner != run_id:
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
    if record is None:
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
    ledger: RunLedger,
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
    ledger: RunLedger,
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
    waiting, _ = ledger.list_entries(statuses=[t.STATUS_RETRYING], limit=BATCH)
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
        elif state is RetryState.NOT_RETRIED and run.status == dg.DagsterRunStatus.SUCCESS:
            message = (
                "the last run of the entry's retry chain succeeded without claiming the "
                "entry (refused: nothing done), and Dagster retries only failed runs"
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
    if item.action is Action.DISPATCH_FAILED and entry.status == t.STATUS_DISPATCH_FAILED:
        failures = entry.summary.get(SUMMARY_DISPATCH_FAILURES) or [{}]
        last = failures[-1] if isinstance(failures[-1], Mapping) else {}
        return KIND_DISPATCH_FAILED, {
            **fields,
            "error": str(last.get("error") or entry.error or "").strip()[:ALERT_ERROR_CHARS],
            "action": (
                f"a scheduled due is re-dispatched within its own slot by "
                f"{entry.task_key}_redispatch_sensor; see `dueledger runs show {entry.id}`"
            ),
        }
    return None


def end_unregistered_retry(
    instance: dg.DagsterInstance,
    ledger: RunLedger,
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
    request = EntryRequest(
        entry.task_key,
        entry.trigger,
        entry.dedup_key,
        due=Due.coerce(entry.due) if entry.due is not None else None,
        operator=entry.operator,
        reason=entry.reason,
        parent_id=entry.parent_id,
    )
    source = run.tags.get(t.TAG_SOURCE) if run is not None else None
    return end_unregistered(
        ledger, request, run_id, registered, source=source, explain=explain, now=now, log=log
    )


def _end_unregistered_run(
    instance: dg.DagsterInstance,
    ledger: RunLedger,
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
    if entry is not None and entry.status == t.STATUS_RETRYING and run_id in entry.run_ids:
        return end_unregistered_retry(
            instance, ledger, entry, registered, explain=explain, now=now, log=log
        )
    source = tags.get(t.TAG_SOURCE)
    return end_unregistered(
        ledger, request, run_id, registered, source=source, explain=explain, now=now, log=log
    )


def build_outcome_sensor(
    views: Sequence[TaskView],
    *,
    clock: Callable[[], datetime] = utc_now,
    minimum_interval_seconds: int = 30,
) -> dg.SensorDefinition:
    """``ledger_outcome_sensor``: brings entries in line with runs Dagster ended FAILURE or
    CANCELED without the run recording its outcome, and creates missing task pools
    (``sensors/pools.py``). Launches nothing."""

    @dg.sensor(
        name="ledger_outcome_sensor",
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Reconciles ledger entries with task runs that Dagster ended FAILURE or CANCELED "
            "(killed worker, START_TIMEOUT, launch error, max runtime) and ends entries of "
            "tasks no longer registered (unsupported_task); never a new run."
        ),
    )
    def ledger_outcome_sensor(
        context: dg.SensorEvaluationContext, ledger: RunLedger
    ) -> dg.SensorResult:
        now = clock()
        alerts = Alerts.from_environment(ledger, now=now, log=context.log)
        ensure_task_pools(context.instance, views)
        cursor, done = reconcile_events(
            context.instance, ledger, views, context.cursor, now, context.log
        )
        done += settle_abandoned_retries(context.instance, ledger, views, now, context.log)
        for item in done:
            alert = alert_of(item)
            if alert is not None and item.entry is not None:
                alerts.emit(alert[0], entry_subject(item.entry.id), **alert[1])
        alerts.deliver()  # this tick's alerts; lease_reclaim_sensor retries what fails
        summary = f"reconciled {len(done)} run(s)" if done else "nothing to reconcile"
        return dg.SensorResult(skip_reason=summary, cursor=cursor)

    return ledger_outcome_sensor


# --- re-dispatch -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RedispatchPlan:
    """What a re-dispatch evaluation does for the current slot's entry."""

    number: int | None  # n of run_key <due>#redispatch-<n>; None: nothing to request
    compare_and_set: bool  # dispatch_failed -> queued first
    reason: str


def redispatch_run_key(due: Due | datetime, number: int) -> str:
    """``<due>#redispatch-<n>``: unique per (due, n), so never blocked by an older key."""
    return Due.coerce(due).redispatch_run_key(number)


def plan_redispatch(
    entry: Entry | None, max_redispatches: int, *, last_failure_canceled: bool = False
) -> RedispatchPlan:
    """Pure: whether the current slot's entry gets (or keeps) a re-dispatch run request."""
    if entry is None:
        return RedispatchPlan(None, False, "no entry for this slot's due")
    failures = len(entry.summary.get(SUMMARY_DISPATCH_FAILURES, []))
    if entry.status == t.STATUS_DISPATCH_FAILED:
        if failures == 0:
            return RedispatchPlan(None, False, "dispatch_failed without a recorded failure")
        if entry.manual_retry_at is not None:
            return RedispatchPlan(None, False, "a manual retry was made of this entry")
        if last_failure_canceled:
            return RedispatchPlan(None, False, "its last run was canceled by an operator")
        if failures > max_redispatches:
            return RedispatchPlan(
                None,
                False,
                f"re-dispatch budget used: {failures} dispatch failures, at most "
                f"{max_redispatches} re-dispatches per slot",
            )
        return RedispatchPlan(failures, True, f"dispatch failure {failures}: re-dispatching")
    if entry.status == t.STATUS_QUEUED and 0 < failures <= max_redispatches:
        # Re-dispatched already (perhaps by a tick that crashed before its run request was
        # stored): ask again with the same key; Dagster finds the run if it exists.
        return RedispatchPlan(failures, False, f"re-dispatch {failures} pending")
    return RedispatchPlan(None, False, f"entry is {entry.status}: nothing to re-dispatch")


def _last_failure_canceled(instance: dg.DagsterInstance, entry: Entry) -> bool:
    items = entry.summary.get(SUMMARY_DISPATCH_FAILURES, [])
    run_id = items[-1].get("run_id") if items and isinstance(items[-1], Mapping) else None
    if not run_id:
        return False
    run = instance.get_run_by_id(str(run_id))
    return run is not None and run.status == dg.DagsterRunStatus.CANCELED


def redispatch_interval_seconds(slot_minutes: int) -> int:
    """How often a re-dispatch sensor evaluates: an eighth of the slot, 30 s to 2 minutes.

    A re-dispatch sensor has work only while its slot's entry is ``dispatch_failed``, and it
    must act within that slot; every other evaluation is a skipped tick the daemon still
    pays for (a gRPC call to the code server, a tick written to Dagster's storage), once per
    task. On 15-minute slots it evaluates every 112 s (it was 30 s): a dispatch failure waits
    at most that much longer for its re-dispatch, and one recorded in the last 112 s of its
    slot is left ``dispatch_failed`` (the slot-health warning and ``summary`` report it).
    Slots of 4 minutes or less keep 30 s, so a re-dispatch still fits in the slot."""
    share = slot_minutes * 60 // REDISPATCH_SLOT_FRACTION
    return max(REDISPATCH_INTERVAL_MIN, min(REDISPATCH_INTERVAL_MAX, share))


def build_redispatch_sensor(
    view: TaskView,
    *,
    clock: Callable[[], datetime] = utc_now,
    max_redispatches: int = DEFAULT_MAX_REDISPATCHES,
    minimum_interval_seconds: int | None = None,
) -> dg.SensorDefinition:
    """``<task>_redispatch_sensor``: re-dispatches the current slot's ``dispatch_failed``
    entry of one task, at most ``max_redispatches`` times per slot, evaluated every
    ``minimum_interval_seconds`` (default :func:`redispatch_interval_seconds` of the slot).

    One sensor per task, not one for all: Dagster looks a sensor's run keys up per sensor
    (``dagster/sensor_name`` and ``dagster/run_key``, whatever job a run is for), so two
    tasks re-dispatching the same due from one sensor would share ``<due>#redispatch-<n>``
    and the second run would never be created (docs/operations.md)."""
    if not 0 <= max_redispatches <= MAX_REDISPATCHES_LIMIT:
        raise ValueError(
            f"max_redispatches={max_redispatches} must be in 0..{MAX_REDISPATCHES_LIMIT} "
            f"(the ledger keeps the newest {MAX_DISPATCH_FAILURES} dispatch failures)"
        )
    spec = view.spec
    if minimum_interval_seconds is None:
        minimum_interval_seconds = redispatch_interval_seconds(view.slot_minutes)

    @dg.sensor(
        name=f"{spec.key}_redispatch_sensor",
        job_name=spec.job_name,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            f"Re-dispatches {spec.key}'s dispatch_failed entry within its own slot, at most "
            f"{max_redispatches} times; run_key <due>#redispatch-<n>."
        ),
    )
    def _redispatch(context: dg.SensorEvaluationContext, ledger: RunLedger):
        now = clock()
        due = floor_to_slot(now, view.slot_minutes)
        entry = ledger.find(spec.key, dedup_key_for_due(due))
        canceled = entry is not None and _last_failure_canceled(context.instance, entry)
        plan = plan_redispatch(entry, max_redispatches, last_failure_canceled=canceled)
        if plan.number is None or entry is None:
            return dg.SkipReason(f"{spec.key}@{format_due(due)}: {plan.reason}")
        if plan.compare_and_set and not ledger.redispatch(entry.id, now=now):
            return dg.SkipReason(f"{spec.key}@{format_due(due)}: entry changed meanwhile")
        context.log.info(f"{spec.key}@{format_due(due)} entry {entry.id}: {plan.reason}")
        return due_run_request(view, due, redispatch_run_key(due, plan.number))

    return _redispatch
