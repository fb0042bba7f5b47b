"""What every task run does around its work: find its ledger entry, claim it, keep the
lease alive, and record the outcome. One wrapper, :func:`task_run`, used by every task asset
(through ``orchestration/task_asset.py``).

The claim path, top-down, each step once:

1. which entry the run is for: ``resources/core/requests.py`` reads it from the run's tags;
2. a task that is not registered ends ``unsupported_task`` (:func:`end_unsupported_run`);
3. DESIGN rule 4 for UI re-executions and ``manual_retry`` runs:
   ``reexecution.apply_reexecution_rule`` (which records a retry through ``retry.py``);
4. the entry is created insert-or-ignore, a dead retry chain's attempt settled, a
   dispatch failure resumed, and the entry claimed by compare-and-set with a lease, under
   the task's pauses and overlap policy (``overlap.py``: a skipped run ends CANCELED);
5. the body runs under a heartbeat, fenced; its outcome is recorded, hooks fired
   (``task_events.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NoReturn

import dagster as dg

from orchestration.manual_launch import unissued_launch
from orchestration.retry import is_retry_of_a_dispatch_failure
from orchestration.services.dagster_runs import (
    dagster_will_retry_failure,
    failed_ancestor,
    run_timed_out,
    turn_off_dagster_retries,
)
from orchestration.services.hooks import TASK_AFTER, TASK_BEFORE, TASK_FAILED, Hooks
from orchestration.services.overlap import claim_entry
from orchestration.services.reexecution import apply_reexecution_rule
from orchestration.services.task_events import fire_task_event, record_creation_hooks
from orchestration.services.task_plugins import task_registry
from orchestration.services.unclaimed import end_unclaimed_run, lineage_root
from orchestration.services.unsupported import end_unsupported, unsupported_message
from orchestration.task_run import (
    EntryRequest,
    entry_request_from_tags,
    task_is_registered,
    task_tags,
)
from orchestration.task_spec import TaskSpec
from resources.core import tags as t
from resources.core.entry import FailureKind, Status
from resources.core.fence import EffectGuard, FenceLost
from resources.ledger import Entry, Ledger
from resources.ledger.fence import LedgerGuard


class SecondWorkerOfRun(Exception):
    """Raised by :func:`task_run` in a second process of a run whose first process holds the
    claim: the body must not run, and this process ends without acting (``task_asset``
    returns quietly; the run's outcome is its first process's)."""


@dataclass(frozen=True)
class TaskRun:
    """What the task body gets: the entry its run claimed, its "as of" instant, and the key of
    the task whose asset runs (the key its side effects are written under)."""

    entry: Entry
    as_of: datetime
    task_key: str
    #: Checks the run's fence in every side effect's transaction: pass it to the domain's
    #: write functions (resources/effects.py).
    guard: EffectGuard

    @property
    def entry_key(self) -> str:
        """A short, stable name for the entry (used in automation logs)."""
        return f"{self.entry.id}:{self.entry.dedup_key}"


@contextmanager
def task_run(
    context: dg.AssetExecutionContext,
    ledger: Ledger,
    spec: TaskSpec,
    *,
    hooks: Hooks,
    tasks: Sequence[TaskSpec] | None = None,
) -> Iterator[TaskRun]:
    """Claim the run's ledger entry, keep its lease alive, and record the outcome.

    The body gets the run it claimed. A run the ledger does not let act -- a duplicate or
    late run, a refused UI re-execution, a manual launch of a task that is not manually
    triggerable -- never reaches the body: it ends CANCELED with the reason as its message
    and first log line, tagged ``dueledger/outcome=refused`` (``unclaimed.end_unclaimed_run``).

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
        end_unsupported_run(context, ledger, hooks, request, tasks)
    request, refusal = apply_reexecution_rule(context, ledger, spec, request)
    if refusal is not None:
        assert refusal.entry is not None  # a refusal names the parent's entry
        end_unclaimed_run(context, ledger, refusal.message, refusal.entry, request)
    unissued = unissued_launch(spec, request, context.run.tags)
    if unissued is not None:
        end_unclaimed_run(context, ledger, unissued, None, request)
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
    # The task's pauses and overlap policy: a run that may not claim ends there (overlap.py).
    result = claim_entry(context, ledger, spec, entry, request)
    if not result.claimed and result.entry.status == Status.DISPATCH_FAILED:
        # The outcome sensor recorded the parent's dispatch failure between our read and
        # the claim: resume once more.
        entry = resume_dispatch_failed_entry_in_its_retry(context, ledger, result.entry)
        if entry.status == Status.QUEUED:
            result = ledger.claim(entry.id, run_id, lease_ttl=spec.lease_ttl)
    if not result.claimed:
        reason = result.reason or f"entry {entry.id}: claim refused, nothing done"
        skipped = result.entry.status == Status.SKIPPED
        outcome = t.OUTCOME_SKIPPED if skipped else t.OUTCOME_REFUSED
        end_unclaimed_run(context, ledger, reason, result.entry, request, outcome=outcome)
    if result.reentrant:
        # A second process of this Dagster run: two daemons dequeued it at once (dagster
        # #33962), or its worker was restarted. The claim is the other process's; acting
        # under it would do the work twice (found by tests/history's shared_claim rule). Not
        # end_unclaimed_run: canceling the run would cancel the process that does the work.
        reason = (
            f"entry {entry.id} {spec.key} {request.dedup_key}: run {run_id} already holds "
            f"it in another process; this process does nothing (a second worker of one run)"
        )
        context.log.warning(reason)
        ledger.reject(entry.id, run_id, reason=reason)
        raise SecondWorkerOfRun(reason)
    context.log.info(
        f"entry {entry.id} {spec.key} {request.dedup_key}: claimed by run {run_id}, "
        f"attempt {result.entry.attempt}/{result.entry.max_attempts}"
    )
    source = spec.source if spec.from_plugin else None
    _mark_run(context, ledger, result.entry, source=source)
    claimed = result.entry
    record_creation_hooks(context, ledger, request, claimed)
    fence = result.fence
    assert fence is not None  # a claimed result names its owner
    guard = LedgerGuard(ledger, fence)
    with _Heartbeat(ledger, entry.id, run_id, spec.lease_ttl) as beat:
        fire_task_event(context, ledger, hooks, TASK_BEFORE, claimed, as_of)
        try:
            yield TaskRun(result.entry, as_of, spec.key, guard)
        except BaseException as exc:
            if isinstance(exc, FenceLost):
                # The entry moved on without this run (reclaimed while it was paused): not
                # this run's failure to record, and no retry could claim it.
                error, status, kind = str(exc), exc.state, None
                context.log.error(error)
                turn_off_dagster_retries(context.instance, run_id, context.log)
            else:
                error = f"{type(exc).__name__}: {exc}"
                # Rule 2: `retrying` only while a retry will really come (a launchpad run
                # carries no dagster/max_retries, so Dagster retries none of its failures).
                coming = dagster_will_retry_failure(context.instance, context.run)
                after = ledger.fail(entry.id, run_id, error=error, retry_coming=coming)
                context.log.error(f"entry {entry.id} {spec.key}: attempt failed -> {after.status}")
                if after.is_terminal:
                    turn_off_dagster_retries(context.instance, run_id, context.log)
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
        turn_off_dagster_retries(context.instance, run_id, context.log)
        message = (
            f"entry {entry.id} {spec.key} {request.dedup_key}: completion rejected, the entry "
            f"is {state} (lease lost: {beat.lost}); the work was done but is not recorded as "
            f"success. Inspect with `dueledger runs show {entry.id}`; nothing will re-run it."
        )
        fire_task_event(
            context, ledger, hooks, TASK_FAILED, claimed, as_of, error=message, status=state
        )
        raise dg.Failure(message)
    fire_task_event(context, ledger, hooks, TASK_AFTER, claimed, as_of, status=Status.SUCCESS)


def end_unsupported_run(
    context: dg.AssetExecutionContext,
    ledger: Ledger,
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
    turn_off_dagster_retries(context.instance, run_id, context.log)
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
            failure_kind=FailureKind.UNSUPPORTED_TASK,
        )
    elif not end.ended:
        context.log.warning(end.refusal or f"entry {end.entry.id}: claim refused")
    raise dg.Failure(
        description=message,
        metadata={"ledger_entry": end.entry.id, "failure_kind": FailureKind.UNSUPPORTED_TASK},
        allow_retries=False,
    )


def settle_parent_of_automatic_retry(
    context: dg.AssetExecutionContext, ledger: Ledger, entry: Entry
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
    if entry.status != Status.RUNNING or not entry.lease_owner:
        return entry
    owner = failed_ancestor(context.instance, tags, entry.lease_owner)
    if owner is None:
        return entry
    kind = FailureKind.TIMEOUT if run_timed_out(owner, "") else FailureKind.ERROR
    return ledger.fail(
        entry.id,
        entry.lease_owner,
        error=(
            f"Dagster run {entry.lease_owner} failed after claiming the entry, without "
            f"recording its outcome; its automatic retry {context.run.run_id} takes over"
        ),
        kind=kind,
    )


def resume_dispatch_failed_entry_in_its_retry(
    context: dg.AssetExecutionContext, ledger: Ledger, entry: Entry
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


def partition_window_end(context: dg.AssetExecutionContext) -> datetime | None:
    """End of the run's partition time window (UTC), or None when it has no time partition."""
    if not context.has_partition_key:
        return None
    if not isinstance(context.assets_def.partitions_def, dg.TimeWindowPartitionsDefinition):
        return None
    return context.partition_time_window.end.astimezone(UTC)


def _mark_run(
    context: dg.AssetExecutionContext, ledger: Ledger, entry: Entry, *, source: str | None
) -> None:
    """Make the ledger navigable from the UI: tag the run with its entry and the entry's
    lineage (the root's Runs filter then lists every retry too), a plugin task's run with
    ``dueledger/source`` (a UI launch carries no job tags), and link the materialization to
    both filters. Best effort: the ledger already holds the truth."""
    root = lineage_root(ledger, entry)
    tags = {t.TAG_ENTRY: str(entry.id), t.TAG_LINEAGE: str(root)}
    if source and context.run.tags.get(t.TAG_SOURCE) != source:
        tags[t.TAG_SOURCE] = source
    try:
        context.instance.add_run_tags(context.run.run_id, tags)
    except Exception as exc:
        context.log.warning(f"could not tag run {context.run.run_id} with its entry: {exc}")
    context.add_asset_metadata(
        {
            "ledger_entry_runs": dg.MetadataValue.url(t.entry_runs_path(entry.id)),
            "ledger_lineage_runs": dg.MetadataValue.url(t.lineage_runs_path(root)),
            "ledger_entry_cli": dg.MetadataValue.text(f"dueledger runs show {entry.id}"),
        }
    )


class _Heartbeat:
    """Renews the lease from a background thread while the task body works."""

    def __init__(self, ledger: Ledger, entry_id: int, run_id: str, ttl: timedelta) -> None:
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
