"""What every task run does around its work: find its ledger entry, claim it, keep the
lease alive, and record the outcome. One wrapper, used by every task asset.

The pure part (`entry_request_from_tags`) decides which logical execution a Dagster
run belongs to from its tags; the context manager `task_run` is the thin shell.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

import dagster as dg

from orchestration.hooks import (
    TAG_HOOKS,
    TASK_AFTER,
    TASK_BEFORE,
    TASK_FAILED,
    Dispatch,
    HookContext,
    Hooks,
    decode_outcomes,
    record,
)
from orchestration.operators import UI_OPERATOR
from orchestration.registry import TaskSpec, find_task
from orchestration.retry import (
    UiRetryOutcome,
    retry_for_ui_reexecution,
    unrecorded_retry_refusal,
)
from orchestration.services.dagster_runs import failed_ancestor
from orchestration.services.unsupported import end_unsupported, unsupported_message
from orchestration.task_plugins import task_registry
from resources.core import tags as t
from resources.core.due import Due, floor_to_slot, format_due
from resources.core.fence import EffectGuard, FenceLost
from resources.core.settings import load_settings
from resources.ledger import (
    Entry,
    RunLedger,
    dedup_key_for_backfill,
    dedup_key_for_request,
    dedup_key_for_retry,
)
from resources.ledger.fence import LedgerGuard


@dataclass(frozen=True)
class EntryRequest:
    """The logical execution a run belongs to: the ledger's unique key and its context."""

    task_key: str
    trigger: str
    dedup_key: str
    due: Due | None = None
    operator: str | None = None
    reason: str | None = None
    parent_id: int | None = None


def entry_request_from_tags(tags: Mapping[str, str], run_id: str) -> EntryRequest:
    """Map a run's tags onto its ledger key (DESIGN: dedup keys).

    - manual_retry (``dueledger/parent_entry``)   -> ``retry:<parent entry id>``
    - schedule / sensor (``dueledger/due``)       -> ``due:<due>``
    - backfill (``dagster/backfill`` + partition) -> ``backfill:<id>:<partition>``
    - manual (``dueledger/request_id``)           -> ``manual:<request id>``
    - no dueledger trigger (UI launchpad run)     -> ``manual:<root run id>``

    Dagster copies a run's tags onto its retries and re-executions, so an automatic
    retry lands on the same entry as its root run; for a launchpad run the root run id
    (``dagster/root_run_id``) plays the request id.
    """
    task_key = tags.get(t.TAG_TASK)
    if not task_key:
        raise ValueError(f"run {run_id} has no {t.TAG_TASK} tag; it was not launched as a task")
    trigger = tags.get(t.TAG_TRIGGER)
    operator, reason = tags.get(t.TAG_OPERATOR), tags.get(t.TAG_REASON)
    # First: a retry of a backfill or scheduled run still carries its parent's tags.
    if trigger == t.TRIGGER_MANUAL_RETRY and t.TAG_PARENT_ENTRY in tags:
        parent = int(tags[t.TAG_PARENT_ENTRY])
        return EntryRequest(
            task_key,
            t.TRIGGER_MANUAL_RETRY,
            dedup_key_for_retry(parent),
            # The parent's due, when it had one: the retry computes as of the same instant.
            due=Due.parse(tags[t.TAG_DUE]) if t.TAG_DUE in tags else None,
            operator=operator,
            reason=reason,
            parent_id=parent,
        )
    if t.DAGSTER_BACKFILL in tags and t.DAGSTER_PARTITION in tags:
        return EntryRequest(
            task_key,
            t.TRIGGER_BACKFILL,
            dedup_key_for_backfill(tags[t.DAGSTER_BACKFILL], tags[t.DAGSTER_PARTITION]),
            due=Due.parse(tags[t.TAG_DUE]) if t.TAG_DUE in tags else None,
        )
    if trigger in (t.TRIGGER_SCHEDULE, t.TRIGGER_SENSOR) and t.TAG_DUE in tags:
        due = Due.parse(tags[t.TAG_DUE])
        return EntryRequest(task_key, trigger, due.key, due=due)
    if trigger == t.TRIGGER_MANUAL and tags.get(t.TAG_REQUEST_ID):
        return EntryRequest(
            task_key,
            t.TRIGGER_MANUAL,
            dedup_key_for_request(tags[t.TAG_REQUEST_ID]),
            operator=operator,
            reason=reason,
        )
    root = tags.get(t.DAGSTER_ROOT_RUN_ID) or run_id
    return EntryRequest(
        task_key,
        t.TRIGGER_MANUAL,
        dedup_key_for_request(root),
        operator=operator or "dagster-ui",
        reason=reason or "launched from the Dagster UI without dueledger tags",
    )


def task_tags(tags: Mapping[str, str], spec: TaskSpec) -> Mapping[str, str]:
    """The run's tags, completed with ``dueledger/task`` from the asset being executed.

    Dagster 1.13's GraphQL ``launchRun`` -- what the launchpad, the Catalog's and the job
    page's "Materialize" call -- does not apply a job's run tags, and a backfill from the
    asset graph runs the implicit asset job: such runs carry no ``dueledger/task``. The
    asset being executed names the task (DESIGN: attribution by what Dagster records).
    """
    if t.TAG_TASK in tags:
        return tags
    return {**tags, t.TAG_TASK: spec.key}


def ui_reexecution_parent(
    tags: Mapping[str, str], parent_tags: Mapping[str, str] | None
) -> EntryRequest | None:
    """For a re-execution started from the Dagster UI, the ledger key of its parent run's
    entry; None for every other run (DESIGN rule 4: the UI follows the manual-retry rules).

    A UI re-execution has ``dagster/parent_run_id`` and no ``dagster/retry_number`` (that
    one marks Dagster's automatic retries). A run launched by `dueledger runs retry`
    carries ``dueledger/trigger=manual_retry`` tags that its parent run did not have;
    Dagster copies a parent's tags onto a re-execution, so the same tags also present on
    the parent mean a UI re-execution of a manual-retry run. ``parent_tags`` are the
    parent run's current tags (None when Dagster no longer has that run).
    """
    parent_run_id = tags.get(t.DAGSTER_PARENT_RUN_ID)
    if not parent_run_id or t.DAGSTER_RETRY_NUMBER in tags:
        return None
    if tags.get(t.TAG_TRIGGER) == t.TRIGGER_MANUAL_RETRY and t.TAG_PARENT_ENTRY in tags:
        inherited = (
            parent_tags is not None
            and parent_tags.get(t.TAG_TRIGGER) == t.TRIGGER_MANUAL_RETRY
            and parent_tags.get(t.TAG_PARENT_ENTRY) == tags[t.TAG_PARENT_ENTRY]
        )
        if not inherited:
            return None
    # The parent's own key; its copied tags give the same key when the run is gone.
    source = parent_tags if parent_tags is not None and t.TAG_TASK in parent_tags else tags
    return entry_request_from_tags(source, parent_run_id)


@dataclass(frozen=True)
class TaskRun:
    """What the task body gets: whether it may act, its entry, its "as of" instant, and the
    key of the task whose asset runs (the key its side effects are written under)."""

    claimed: bool
    entry: Entry
    as_of: datetime
    task_key: str
    reason: str | None = None
    #: Checks the run's fence in every side effect's transaction (None when not claimed):
    #: pass it to the domain's write functions (resources/effects.py).
    guard: EffectGuard | None = None

    @property
    def entry_key(self) -> str:
        """A short, stable name for the entry (used in automation logs)."""
        return f"{self.entry.id}:{self.entry.dedup_key}"


class _Heartbeat:
    """Renews the lease from a background thread while the task body works."""

    def __init__(self, ledger: RunLedger, entry_id: int, run_id: str, ttl: timedelta) -> None:
        self._ledger, self._entry_id, self._run_id, self._ttl = ledger, entry_id, run_id, ttl
        # Well under the TTL: three missed beats still leave the lease alive.
        self._interval = max(ttl.total_seconds() / 4, 0.5)
        self._stop = threading.Event()
        self.lost = False
        self._thread = threading.Thread(target=self._run, name="dueledger-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                if not self._ledger.heartbeat(self._entry_id, self._run_id, lease_ttl=self._ttl):
                    self.lost = True
                    return
            except Exception:  # a blip must not kill the run; the next beat retries
                continue

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def partition_window_end(context: dg.AssetExecutionContext) -> datetime | None:
    """End of the run's partition time window (UTC), or None when it has no time partition."""
    if not context.has_partition_key:
        return None
    if not isinstance(context.assets_def.partitions_def, dg.TimeWindowPartitionsDefinition):
        return None
    return context.partition_time_window.end.astimezone(UTC)


def run_as_of(context: dg.AssetExecutionContext, request: EntryRequest) -> datetime:
    """The instant a run computes "as of": its due, else when its root run was created.

    A run of one time partition without a due (a backfill, or a launchpad run with a
    partition) is as of the end of that partition's window -- a daily backfill of
    2026-11-30 computes what was due by 2026-12-01T00:00Z -- but never later than when
    its root run was created, so a backfill of today does not act ahead of time.
    Never the wall clock at execution time, so a late or retried run sees the same world.
    """
    if request.due is not None:
        return request.due.at
    root_id = context.run.tags.get(t.DAGSTER_ROOT_RUN_ID) or context.run.run_id
    record = context.instance.get_run_record_by_id(root_id)
    if record is not None and record.create_timestamp is not None:
        created = record.create_timestamp.astimezone(UTC)
    else:
        created = datetime.now(UTC)
    window_end = partition_window_end(context)
    return min(window_end, created) if window_end is not None else created


def _apply_ui_reexecution_rule(
    context: dg.AssetExecutionContext, ledger: RunLedger, spec: TaskSpec, request: EntryRequest
) -> tuple[EntryRequest, UiRetryOutcome | None]:
    """Rule 4 at claim time, before any side effect: the request to claim, or the refusal.

    A UI re-execution becomes a manual retry by ``dagster-ui`` (or is refused); a run
    tagged ``manual_retry`` claims only a retry that was recorded. Others pass unchanged."""
    tags = task_tags(context.run.tags, spec)
    parent_run_id = tags.get(t.DAGSTER_PARENT_RUN_ID)
    if not parent_run_id or t.DAGSTER_RETRY_NUMBER in tags:
        return _recorded_retry_only(context, ledger, request)
    parent_run = context.instance.get_run_by_id(parent_run_id)
    parent_request = ui_reexecution_parent(
        tags, task_tags(parent_run.tags, spec) if parent_run else None
    )
    if parent_request is None:
        return _recorded_retry_only(context, ledger, request)
    outcome = retry_for_ui_reexecution(
        ledger,
        task_key=parent_request.task_key,
        dedup_key=parent_request.dedup_key,
        run_id=context.run.run_id,
        parent_run_id=parent_run_id,
        spec=spec,
    )
    if not outcome.allowed:
        return request, outcome
    context.log.info(outcome.message)
    child = outcome.entry
    if child is None:  # the parent run never reached the ledger: this is its first attempt
        return _recorded_retry_only(context, ledger, parent_request)
    assert child.parent_id is not None
    retry_tags = {
        t.TAG_TRIGGER: t.TRIGGER_MANUAL_RETRY,
        t.TAG_PARENT_ENTRY: str(child.parent_id),
        t.TAG_OPERATOR: child.operator or UI_OPERATOR,
        t.TAG_REASON: child.reason or "",
    }
    try:
        # So the UI shows the retry, and Dagster's automatic retries of this run (which
        # copy its tags) land on the child entry.
        context.instance.add_run_tags(context.run.run_id, retry_tags)
    except Exception as exc:  # the ledger already holds the truth; tags are a convenience
        context.log.warning(f"could not tag run {context.run.run_id} as a manual retry: {exc}")
    return (
        EntryRequest(
            child.task_key,
            t.TRIGGER_MANUAL_RETRY,
            child.dedup_key,
            due=Due.coerce(child.due) if child.due is not None else None,
            operator=child.operator,
            reason=child.reason,
            parent_id=child.parent_id,
        ),
        None,
    )


def _recorded_retry_only(
    context: dg.AssetExecutionContext, ledger: RunLedger, request: EntryRequest
) -> tuple[EntryRequest, UiRetryOutcome | None]:
    """A ``manual_retry`` run claims the child its retry recorded; it never creates one."""
    if request.trigger != t.TRIGGER_MANUAL_RETRY or request.parent_id is None:
        return request, None
    refusal = unrecorded_retry_refusal(
        ledger,
        task_key=request.task_key,
        parent_id=request.parent_id,
        run_id=context.run.run_id,
        operator=request.operator,
    )
    if refusal is not None and refusal.entry is None:  # not even the parent exists
        _no_dagster_retry(context)
        raise dg.Failure(description=refusal.message, allow_retries=False)
    return request, refusal


def settle_parent_of_automatic_retry(
    context: dg.AssetExecutionContext, ledger: RunLedger, entry: Entry
) -> Entry:
    """Ledger rule 2 for Dagster's automatic retries (issue 4).

    Dagster retries only a run it has ended FAILURE. When a run of this retry's chain died
    after claiming without recording its outcome (killed worker, max runtime) and this retry
    starts before the outcome sensor has seen it, the entry is still leased to that run:
    record its failed attempt now (``running -> retrying``) so this run claims the next
    attempt instead of being refused as a duplicate. The lease owner is usually the parent;
    it is an earlier ancestor when the retries between died before claiming (a worker killed
    while loading). Every other run passes through unchanged.
    """
    tags = context.run.tags
    if t.DAGSTER_RETRY_NUMBER not in tags or not tags.get(t.DAGSTER_PARENT_RUN_ID):
        return entry
    if entry.status != t.STATUS_RUNNING or not entry.lease_owner:
        return entry
    owner = failed_ancestor(context.instance, tags, entry.lease_owner)
    if owner is None:
        return entry
    kind = t.FAILURE_TIMEOUT if run_timed_out(owner, "") else t.FAILURE_ERROR
    return ledger.fail(
        entry.id,
        entry.lease_owner,
        error=(
            f"Dagster run {entry.lease_owner} failed after claiming the entry, without "
            f"recording its outcome; its automatic retry {context.run.run_id} takes over"
        ),
        kind=kind,
    )


def is_retry_of_a_dispatch_failure(run_tags: Mapping[str, str], entry: Entry) -> bool:
    """Pure: is this run Dagster's automatic retry of a run that made ``entry``
    dispatch_failed (its parent or root run is in the entry's ``dispatch_failures``)?"""
    if t.DAGSTER_RETRY_NUMBER not in run_tags or entry.status != t.STATUS_DISPATCH_FAILED:
        return False
    lineage = {run_tags.get(t.DAGSTER_PARENT_RUN_ID), run_tags.get(t.DAGSTER_ROOT_RUN_ID)}
    return bool(lineage & entry.dispatch_failure_run_ids)


def resume_dispatch_failed_entry_in_its_retry(
    context: dg.AssetExecutionContext, ledger: RunLedger, entry: Entry
) -> Entry:
    """Ledger rule 5 for Dagster's automatic retries.

    A run that ended before claiming (its worker killed while loading, run monitoring's
    start timeout) makes its entry ``dispatch_failed``; nothing of the task ran. When Dagster
    retries that run, the retry is the re-dispatch: it moves the entry back to ``queued``
    (``redispatch``: attempt count reset, errors kept, refused once a manual retry was made)
    and claims it, in whatever slot. Only a retry descended from a run recorded in the
    entry's ``dispatch_failures``; every other run passes through unchanged.
    """
    tags = context.run.tags
    if not is_retry_of_a_dispatch_failure(tags, entry):
        return entry
    if ledger.redispatch(entry.id):
        context.log.info(
            f"entry {entry.id} {entry.label}: dispatch_failed -> queued; Dagster's retry of "
            f"run {tags.get(t.DAGSTER_PARENT_RUN_ID)}, which ended before claiming, claims it"
        )
    return ledger.get(entry.id) or entry


def _mark_run(
    context: dg.AssetExecutionContext, entry: Entry, *, refused: bool, source: str | None = None
) -> None:
    """Make the ledger navigable from the UI: tag the run with its entry, a refused run with
    ``dueledger/outcome=refused``, a plugin task's run with ``dueledger/source`` (a UI launch
    carries no job tags), and link the materialization to the entry's runs. Best effort:
    the ledger already holds the truth."""
    tags = {t.TAG_ENTRY: str(entry.id)}
    if refused:
        tags[t.TAG_OUTCOME] = t.OUTCOME_REFUSED
    if source and context.run.tags.get(t.TAG_SOURCE) != source:
        tags[t.TAG_SOURCE] = source
    try:
        context.instance.add_run_tags(context.run.run_id, tags)
    except Exception as exc:
        context.log.warning(f"could not tag run {context.run.run_id} with its entry: {exc}")
    if not refused:
        context.add_asset_metadata(
            {
                "ledger_entry_runs": dg.MetadataValue.url(t.entry_runs_path(entry.id)),
                "ledger_entry_cli": dg.MetadataValue.text(f"dueledger runs show {entry.id}"),
            }
        )


def _no_dagster_retry(context: dg.AssetExecutionContext) -> None:
    """This run is about to fail although its entry is settled (terminal): a Dagster retry
    could only be refused by the ledger, so ask Dagster for none (``dagster/max_retries=0``
    is read when the failure decides ``dagster/will_retry``). Best effort."""
    try:
        context.instance.add_run_tags(context.run.run_id, {t.DAGSTER_MAX_RETRIES: "0"})
    except Exception as exc:  # the ledger already refuses such a retry; this avoids the run
        context.log.warning(f"could not turn off Dagster retries of this run: {exc}")


# --- plugin hooks and unsupported tasks (issue 6) -------------------------------------------


def task_is_registered(task_key: str, spec: TaskSpec, tasks: Sequence[TaskSpec]) -> bool:
    """May a run tagged ``dueledger/task=task_key`` run the body of ``spec``'s asset?

    Yes for the asset's own task and for any other registered task; no for a key the code
    location no longer declares (its plugin was removed, or the key was renamed while the
    asset stayed): such a run is unsupported.
    """
    return task_key == spec.key or find_task(tasks, task_key) is not None


def _hook_context(
    event: str,
    run_id: str,
    entry: Entry,
    as_of: datetime | None,
    tags: Mapping[str, str],
    **extra: Any,
) -> HookContext:
    due = format_due(entry.due) if entry.due is not None else None
    slot = due
    if slot is None and as_of is not None:
        slot = format_due(floor_to_slot(as_of, load_settings().slot_minutes))
    return HookContext(
        event=event,
        task_key=entry.task_key,
        trigger=entry.trigger,
        due=due,
        slot=slot,
        entry_id=entry.id,
        attempt=entry.attempt,
        run_id=run_id,
        tags=tags,
        **extra,
    )


def fire_task_event(
    context: dg.AssetExecutionContext,
    ledger: RunLedger,
    hooks: Hooks,
    event: str,
    entry: Entry,
    as_of: datetime | None,
    **extra: Any,
) -> Dispatch | None:
    """Fire a hook event for this run (task, trigger and due from its claimed ``entry``)
    and store its outcomes on the entry; None when no listener wants the event. Never
    raises: whatever goes wrong is logged, and the task goes on."""
    try:
        if not hooks.wants(event):
            return None  # the common case: no context to build, nothing to store
        hook_context = _hook_context(
            event, context.run.run_id, entry, as_of, context.run.tags, **extra
        )
        return hooks.fire_and_record(hook_context, ledger, log=context.log)
    except Exception as exc:
        context.log.warning(f"hook event {event} not fired: {type(exc).__name__}: {exc}")
        return None


def _record_creation_hooks(
    context: dg.AssetExecutionContext, ledger: RunLedger, request: EntryRequest, entry: Entry
) -> None:
    """A schedule/sensor run's creation outcomes (``dueledger/hooks`` tag) onto its entry,
    once: at the first attempt (automatic retries copy the tag)."""
    if request.trigger not in (t.TRIGGER_SCHEDULE, t.TRIGGER_SENSOR) or entry.attempt != 1:
        return
    items = decode_outcomes(context.run.tags.get(TAG_HOOKS))
    if items:
        record(ledger, entry.id, items, log=context.log)


def _end_unsupported(
    context: dg.AssetExecutionContext,
    ledger: RunLedger,
    hooks: Hooks,
    request: EntryRequest,
    tasks: Sequence[TaskSpec],
) -> NoReturn:
    """A run of a task the code location does not declare: its entry ends ``failed`` with
    kind ``unsupported_task``, one alert, and the run fails without any retry."""
    run_id = context.run.run_id
    source = context.run.tags.get(t.TAG_SOURCE)
    why = task_registry().why_unregistered(request.task_key, source)
    message = unsupported_message(request.task_key, run_id, why, tasks, started=True)
    # First: Dagster decides about a run retry from the run's tags when the run fails.
    _no_dagster_retry(context)
    end = end_unsupported(
        ledger,
        task_key=request.task_key,
        trigger=request.trigger,
        dedup_key=request.dedup_key,
        run_id=run_id,
        message=message,
        log=context.log,
        due=request.due,
        operator=request.operator,
        reason=request.reason,
        parent_id=request.parent_id,
        source=source,
    )
    if end.ended and end.claimed is not None:
        fire_task_event(
            context,
            ledger,
            hooks,
            TASK_FAILED,
            end.claimed,
            None,
            error=message,
            status=end.entry.status,
            failure_kind=t.FAILURE_UNSUPPORTED_TASK,
        )
    elif not end.ended:
        context.log.warning(end.refusal or f"entry {end.entry.id}: claim refused")
    raise dg.Failure(
        description=message,
        metadata={"ledger_entry": end.entry.id, "failure_kind": t.FAILURE_UNSUPPORTED_TASK},
        allow_retries=False,
    )


@contextmanager
def task_run(
    context: dg.AssetExecutionContext,
    ledger: RunLedger,
    spec: TaskSpec,
    *,
    hooks: Hooks,
    tasks: Sequence[TaskSpec] | None = None,
) -> Iterator[TaskRun]:
    """Claim the run's ledger entry, keep its lease alive, and record the outcome.

    When the claim is refused (duplicate or late run) the body gets ``claimed=False``
    and must do nothing: no side effect, no materialization. One log line says why.

    Plugin hooks (``hooks``) fire around the body of a claimed run (``task_before``, then
    ``task_after`` or ``task_failed``); their outcomes are stored on the entry and never fail
    the task. Most assets do not call this directly: ``orchestration.task_asset`` does.
    A run whose ``dueledger/task`` is not registered (``tasks``, default the registered
    tasks: core and allowed plugin tasks) is unsupported: its entry ends ``failed``
    (``unsupported_task``), and ``dg.Failure`` is raised without retries before the body runs.
    """
    run_id = context.run.run_id
    tasks = task_registry().tasks if tasks is None else tasks
    request = entry_request_from_tags(task_tags(context.run.tags, spec), run_id)
    if not task_is_registered(request.task_key, spec, tasks):
        _end_unsupported(context, ledger, hooks, request, tasks)
    request, refusal = _apply_ui_reexecution_rule(context, ledger, spec, request)
    if refusal is not None:
        assert refusal.entry is not None  # a refusal names the parent's entry
        context.log.warning(refusal.message)
        _mark_run(context, refusal.entry, refused=True)
        as_of = run_as_of(context, request)
        yield TaskRun(False, refusal.entry, as_of, spec.key, refusal.message)
        return
    entry = ledger.ensure_entry(
        task_key=request.task_key,
        trigger=request.trigger,
        dedup_key=request.dedup_key,
        due=request.due,
        max_attempts=spec.max_attempts,
        operator=request.operator,
        reason=request.reason,
        parent_id=request.parent_id,
    )
    entry = settle_parent_of_automatic_retry(context, ledger, entry)
    entry = resume_dispatch_failed_entry_in_its_retry(context, ledger, entry)
    as_of = run_as_of(context, request)
    result = ledger.claim(entry.id, run_id, lease_ttl=spec.lease_ttl)
    if not result.claimed and result.entry.status == t.STATUS_DISPATCH_FAILED:
        # The outcome sensor recorded the parent's dispatch failure between our read and
        # the claim: resume once more.
        entry = resume_dispatch_failed_entry_in_its_retry(context, ledger, result.entry)
        if entry.status == t.STATUS_QUEUED:
            result = ledger.claim(entry.id, run_id, lease_ttl=spec.lease_ttl)
    if not result.claimed:
        context.log.warning(result.reason or f"entry {entry.id}: claim refused, nothing done")
        _mark_run(context, result.entry, refused=True)
        yield TaskRun(False, result.entry, as_of, spec.key, result.reason)
        return
    if result.reentrant:
        # A second process of this Dagster run: two daemons dequeued it at once (dagster
        # #33962), or its worker was restarted. The claim is the other process's; acting
        # under it would do the work twice (found by tests/history's shared_claim rule).
        reason = (
            f"entry {entry.id} {spec.key} {request.dedup_key}: run {run_id} already holds "
            f"it in another process; this process does nothing (a second worker of one run)"
        )
        context.log.warning(reason)
        refused = ledger.reject(entry.id, run_id, reason=reason)
        yield TaskRun(False, refused, as_of, spec.key, reason)
        return
    context.log.info(
        f"entry {entry.id} {spec.key} {request.dedup_key}: claimed by run {run_id}, "
        f"attempt {result.entry.attempt}/{result.entry.max_attempts}"
    )
    source = spec.source if spec.from_plugin else None
    _mark_run(context, result.entry, refused=False, source=source)
    claimed = result.entry
    _record_creation_hooks(context, ledger, request, claimed)
    fence = result.fence
    assert fence is not None  # a claimed result names its owner
    guard = LedgerGuard(ledger, fence)
    with _Heartbeat(ledger, entry.id, run_id, spec.lease_ttl) as beat:
        fire_task_event(context, ledger, hooks, TASK_BEFORE, claimed, as_of)
        try:
            yield TaskRun(True, result.entry, as_of, spec.key, guard=guard)
        except BaseException as exc:
            if isinstance(exc, FenceLost):
                # The entry moved on without this run (reclaimed while it was paused): not
                # this run's failure to record, and no retry could claim it.
                error, status, kind = str(exc), exc.state, None
                context.log.error(error)
                _no_dagster_retry(context)
            else:
                error = f"{type(exc).__name__}: {exc}"
                after = ledger.fail(entry.id, run_id, error=error)
                context.log.error(f"entry {entry.id} {spec.key}: attempt failed -> {after.status}")
                if after.is_terminal:
                    _no_dagster_retry(context)
                status, kind = after.status, after.failure_kind
            fire_task_event(
                context,
                ledger,
                hooks,
                TASK_FAILED,
                claimed,
                as_of,
                error=error,
                status=status,
                failure_kind=kind,
            )
            raise
    if not ledger.succeed(entry.id, run_id):
        now = ledger.get(entry.id)
        state = now.status if now else "unknown"
        _no_dagster_retry(context)
        message = (
            f"entry {entry.id} {spec.key} {request.dedup_key}: completion rejected, the entry "
            f"is {state} (lease lost: {beat.lost}); the work was done but is not recorded as "
            f"success. Inspect with `dueledger runs show {entry.id}`; nothing will re-run it."
        )
        fire_task_event(
            context, ledger, hooks, TASK_FAILED, claimed, as_of, error=message, status=state
        )
        raise dg.Failure(message)
    fire_task_event(context, ledger, hooks, TASK_AFTER, claimed, as_of, status=t.STATUS_SUCCESS)


def run_timed_out(record: dg.RunRecord | None, message: str) -> bool:
    """Run monitoring ended the run for exceeding ``dagster/max_runtime``."""
    if "maximum runtime" in message.lower():
        return True
    if record is None or record.start_time is None or record.end_time is None:
        return False
    limit = record.dagster_run.tags.get(t.DAGSTER_MAX_RUNTIME)
    try:
        return limit is not None and record.end_time - record.start_time >= float(limit)
    except ValueError:
        return False
