"""A task's Dagster definitions: its asset (the body inside the claim path), its job and its
due-keyed schedule -- the one factory every task goes through, declared in a ``defs.yaml``
(``orchestration/component.py``) or built by a test from a spec and a body.

A task body is a generator of its materialization that gets the run it claimed::

    def order_cleanup(context: dg.AssetExecutionContext, run: TaskRun, source: SourceStore):
        ...  # runs only once the run has claimed its entry
        yield dg.MaterializeResult(metadata={...})

Every other parameter of the body (``config``, resources such as ``source`` or ``rules``) is
Dagster's, exactly as on ``@dg.asset``; a body may also take ``ledger`` and ``hooks`` (the
code location's plugin hooks). The asset is named after the task; its pool is the task's
under overlap ``queue`` (``overlap.pool_of``). A run the ledger does not let act never reaches
the body: it ends CANCELED with the reason as its first log line and cancellation message,
tagged ``dueledger/outcome`` (``output_required=False``: a run that does nothing
materializes nothing). The rules the run meets are ``orchestration/task_run.py``'s; this
module only carries what Dagster knows in and what the rules answer out.

The schedule's evaluation is a function of the tick's scheduled time only
(``timetable.decide_tick``): the due is the scheduled time floored to the slot, never the wall
clock, and the RunRequest's run_key is exactly the due string, so a re-evaluated tick asks for
the same run. A paused task's tick runs nothing (``pause.tick_skip_reason``).
"""

from __future__ import annotations

import inspect
import time
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from orchestration.declarations import DeclaredTask, task_registry
from orchestration.overlap import TickHold, decide_at_tick, pool_of
from orchestration.pause import tick_skip_reason
from orchestration.services.dagster_runs import (
    dagster_will_retry_failure,
    failed_ancestor,
    run_timed_out,
    turn_off_dagster_retries,
)
from orchestration.services.hooks.registry import Hooks
from orchestration.services.hooks.vocabulary import TASK_AFTER, TASK_BEFORE, TASK_FAILED, HookLog
from orchestration.services.task_events import fire_task_event, record_creation_hooks
from orchestration.services.unsupported import end_unsupported, unsupported_message
from orchestration.task_run import (
    WAIT_POLL_SECONDS,
    Claimed,
    Fatal,
    Heartbeat,
    Prepared,
    SecondWorker,
    TaskRun,
    Unclaimed,
    Unsupported,
    Waiting,
    claim,
    fail,
    prepare,
    succeed,
)
from orchestration.task_spec import (
    DAILY_PARTITIONS_START,
    PARTITIONS_DAILY,
    TaskSpec,
    TaskView,
    partition_key_for,
    task_run_tags,
)
from orchestration.timetable import decide_tick
from resources.core import tags as t
from resources.core.due import Due
from resources.core.entry import Entry, FailureKind, Status, Trigger
from resources.ledger import RunLedger

#: A task body: ``(context, run, **dagster_params)`` yielding its materialization.
TaskBody = Callable[..., Iterator[Any]]
#: Who asks which tasks are registered now (the claim path's "is this task registered?").
Registered = Callable[[], Sequence[TaskSpec]]

#: The partitions of every task declared with ``partitions: daily``: UTC days. The current
#: day exists from its first instant on (end_offset=1), so the schedule's run for a due today
#: can target today's partition.
DAILY_PARTITIONS = dg.DailyPartitionsDefinition(
    start_date=DAILY_PARTITIONS_START, timezone="UTC", end_offset=1
)

_CONTEXT, _RUN, _LEDGER, _HOOKS = "context", "run", "ledger", "hooks"
#: Asset arguments the factory decides for every task asset.
_FIXED = ("name", "pool", "output_required", "partitions_def")


# --- the asset -----------------------------------------------------------------------------------


def task_asset(
    spec: TaskSpec,
    body: TaskBody,
    *,
    hooks: Hooks,
    registered: Registered,
    **asset_kwargs: Any,
) -> dg.AssetsDefinition:
    """The Dagster asset of task ``spec``: ``body`` inside the claim path, firing ``hooks``.

    ``asset_kwargs`` go to ``dg.asset`` (group_name, description, kinds, ...); the name, the
    pool, the partitions and ``output_required`` are the factory's. ``registered`` answers
    which tasks the code location registers when a run starts."""
    fixed = sorted(set(asset_kwargs) & set(_FIXED))
    if fixed:
        raise TypeError(
            f"task {spec.key!r} sets {', '.join(fixed)} itself: the asset's name and pool are "
            f"the task key, its partitions are the declaration's, and a refused run "
            f"materializes nothing"
        )
    signature = _dagster_signature(body)
    wants_ledger = _LEDGER in inspect.signature(body).parameters
    wants_hooks = _HOOKS in inspect.signature(body).parameters

    def compute(
        context: dg.AssetExecutionContext, ledger: RunLedger, **params: Any
    ) -> Iterator[Any]:
        if wants_ledger:
            params[_LEDGER] = ledger
        if wants_hooks:
            params[_HOOKS] = hooks
        yield from run_task(
            context, ledger, spec, body, hooks=hooks, tasks=registered(), params=params
        )

    # Dagster reads resources and config off the signature: the body's, less what the
    # factory supplies, plus the ledger every task run claims against.
    compute.__signature__ = signature  # type: ignore[attr-defined]
    for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
        setattr(compute, attr, getattr(body, attr, None))
    partitions = DAILY_PARTITIONS if spec.partitions == PARTITIONS_DAILY else None
    return dg.asset(
        name=spec.key,
        pool=pool_of(spec),
        output_required=False,
        partitions_def=partitions,
        **asset_kwargs,
    )(compute)


def run_task(
    context: dg.AssetExecutionContext,
    ledger: RunLedger,
    spec: TaskSpec,
    body: TaskBody,
    *,
    hooks: Hooks,
    tasks: Sequence[TaskSpec],
    params: Mapping[str, Any] | None = None,
) -> Iterator[Any]:
    """One run of task ``spec``: the claim path (``task_run``), then ``body(context, run,
    **params)`` under the heartbeat, its outcome recorded, hooks fired around it; what a task
    asset computes. ``tasks``: the tasks the code location registers now."""
    claimed = _claim(context, ledger, spec, tasks, hooks)
    if claimed is None:
        return  # the run's other process holds the claim and does the work
    yield from _work(context, ledger, spec, hooks, claimed, body, dict(params or {}))


def _dagster_signature(body: TaskBody) -> inspect.Signature:
    """``(context, <the body's Dagster parameters>, ledger)`` with resolved annotations."""
    signature = inspect.signature(body)
    names = list(signature.parameters)
    if names[:2] != [_CONTEXT, _RUN]:
        raise TypeError(
            f"task body {body.__qualname__} must start with (context, run: TaskRun, ...); "
            f"it takes ({', '.join(names)})"
        )
    hints = typing.get_type_hints(body)
    params = [
        p.replace(annotation=hints.get(name, p.annotation))
        for name, p in signature.parameters.items()
        if name not in (_RUN, _HOOKS)
    ]
    if _LEDGER not in signature.parameters:
        params.append(
            inspect.Parameter(
                _LEDGER, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=RunLedger
            )
        )
    return signature.replace(
        parameters=params, return_annotation=hints.get("return", inspect.Signature.empty)
    )


class DagsterRunFacts:
    """What the claim path asks Dagster about this run (``task_run.RunFacts``)."""

    def __init__(self, context: dg.AssetExecutionContext) -> None:
        self._context = context
        self.run_id = context.run.run_id
        self.tags: Mapping[str, str] = context.run.tags

    def parent_tags(self, run_id: str) -> Mapping[str, str] | None:
        run = self._context.instance.get_run_by_id(run_id)
        return run.tags if run is not None else None

    def ended_ancestor(self, run_id: str) -> str | None:
        owner = failed_ancestor(self._context.instance, self.tags, run_id)
        if owner is None:
            return None
        return FailureKind.TIMEOUT if run_timed_out(owner, "") else FailureKind.ERROR

    def now(self) -> datetime:
        return datetime.now(UTC)

    def as_of_without_due(self) -> datetime:
        """When its root run was created, but never after the end of its time partition's
        window: a daily backfill of 2026-11-30 computes what was due by 2026-12-01T00:00Z,
        and a backfill of today does not act ahead of time."""
        context = self._context
        root_id = self.tags.get(t.DAGSTER_ROOT_RUN_ID) or self.run_id
        record = context.instance.get_run_record_by_id(root_id)
        if record is not None and record.create_timestamp is not None:
            created = record.create_timestamp.astimezone(UTC)
        else:
            created = datetime.now(UTC)
        partitions = context.assets_def.partitions_def
        if context.has_partition_key and isinstance(partitions, dg.TimeWindowPartitionsDefinition):
            return min(context.partition_time_window.end.astimezone(UTC), created)
        return created


def _claim(
    context: dg.AssetExecutionContext,
    ledger: RunLedger,
    spec: TaskSpec,
    tasks: Sequence[TaskSpec],
    hooks: Hooks,
) -> Claimed | None:
    """The claim path, with Dagster's side of each answer: None for a second worker of the
    run; a run that may not act never returns (it ends CANCELED, or fails unsupported)."""
    facts = DagsterRunFacts(context)
    prepared = prepare(ledger, spec, tasks, facts)
    if isinstance(prepared, Unsupported):
        _end_unsupported_run(context, ledger, hooks, prepared, tasks)
    if isinstance(prepared, Fatal):
        turn_off_dagster_retries(context.instance, facts.run_id, context.log)
        raise dg.Failure(description=prepared.message, allow_retries=False)
    if isinstance(prepared, Unclaimed):
        _end_unclaimed_run(context, prepared)
    assert isinstance(prepared, Prepared)
    for note in prepared.notes:
        context.log.info(note)
    if prepared.run_tags:
        _add_run_tags(context, prepared.run_tags)
    waiting_since: datetime | None = None
    extended_at, said = 0.0, ""
    while True:
        found = claim(ledger, spec, prepared, facts)
        if not isinstance(found, Waiting):
            break
        if waiting_since is None:
            waiting_since = datetime.now(UTC)
        if found.reason != said:  # once per reason: a backoff, then maybe its turn
            context.log.info(f"entry {found.entry.id} {spec.key}: {found.reason}")
            said = found.reason
        # Run monitoring ends a run past its task's timeout, counted from its start: a run
        # that waits keeps moving its limit (the wait is not the task's work).
        if time.monotonic() - extended_at > min(20.0, spec.timeout.total_seconds() / 2):
            _extend_max_runtime(context, spec, waiting_since)
            extended_at = time.monotonic()
        time.sleep(WAIT_POLL_SECONDS)
    if isinstance(found, Unclaimed):
        _end_unclaimed_run(context, found)
    if isinstance(found, SecondWorker):
        context.log.warning(found.message)
        return None
    for old in found.replaced:
        _stop_replaced_run(context, old, found.run.entry)
    if waiting_since is not None:
        _extend_max_runtime(context, spec, waiting_since)
    context.log.info(found.message)
    _add_run_tags(context, found.run_tags)
    entry = found.run.entry
    context.add_asset_metadata(
        {
            "ledger_entry_runs": dg.MetadataValue.url(t.entry_runs_path(entry.id)),
            "ledger_lineage_runs": dg.MetadataValue.url(
                t.lineage_runs_path(int(found.run_tags[t.TAG_LINEAGE]))
            ),
            "ledger_entry_cli": dg.MetadataValue.text(f"dueledger runs show {entry.id}"),
        }
    )
    record_creation_hooks(context, ledger, found.request, entry)
    return found


def _work(
    context: dg.AssetExecutionContext,
    ledger: RunLedger,
    spec: TaskSpec,
    hooks: Hooks,
    claimed: Claimed,
    body: TaskBody,
    params: dict[str, Any],
) -> Iterator[Any]:
    """The body under the heartbeat, hooks around it, its outcome recorded."""
    run, run_id = claimed.run, context.run.run_id
    entry = run.entry
    with Heartbeat(ledger, entry.id, run_id, spec.lease_ttl) as beat:
        fire_task_event(context, ledger, hooks, TASK_BEFORE, entry, run.as_of)
        try:
            yield from body(context, run, **params)
        except BaseException as exc:
            # Rule 2: `retrying` only while a retry will really come (a launchpad run carries
            # no dagster/max_retries, so Dagster retries none of its failures).
            coming = dagster_will_retry_failure(context.instance, context.run)
            failed = fail(ledger, claimed, exc, retry_coming=coming)
            if failed.kind is None:
                context.log.error(failed.error)
            else:
                context.log.error(f"entry {entry.id} {spec.key}: attempt failed -> {failed.status}")
            if failed.settled:
                turn_off_dagster_retries(context.instance, run_id, context.log)
            fire_task_event(
                context,
                ledger,
                hooks,
                TASK_FAILED,
                entry,
                run.as_of,
                error=failed.error,
                status=failed.status,
                failure_kind=failed.kind,
            )
            raise
    rejected = succeed(ledger, claimed, lease_lost=beat.lost)
    if rejected is not None:
        turn_off_dagster_retries(context.instance, run_id, context.log)
        state = (ledger.get(entry.id) or entry).status
        fire_task_event(
            context, ledger, hooks, TASK_FAILED, entry, run.as_of, error=rejected, status=state
        )
        raise dg.Failure(rejected)
    fire_task_event(context, ledger, hooks, TASK_AFTER, entry, run.as_of, status=Status.SUCCESS)


def _add_run_tags(context: dg.AssetExecutionContext, tags: Mapping[str, str]) -> None:
    """Best effort: the ledger already holds the truth; the tags make it findable."""
    try:
        context.instance.add_run_tags(context.run.run_id, dict(tags))
    except Exception as exc:
        context.log.warning(f"could not tag run {context.run.run_id} with {dict(tags)}: {exc}")


def _end_unclaimed_run(context: dg.AssetExecutionContext, unclaimed: Unclaimed) -> typing.NoReturn:
    """The ledger does not let this run act: it does nothing and ends CANCELED -- Dagster does
    not retry a canceled run, and nothing counts it as failed -- with the reason as its first
    log line and cancellation message, tagged ``dueledger/outcome``; the outcome sensor and
    the ``no_unledgered_failed_runs`` check leave it alone: the ledger decided it."""
    outcome, message = unclaimed.outcome, unclaimed.message
    verb = "refused by the ledger" if outcome == t.OUTCOME_REFUSED else outcome
    context.log.warning(f"{verb}: {message}")
    _add_run_tags(context, unclaimed.run_tags)
    context.instance.report_run_canceling(context.run, message=f"{outcome}: {message}")
    # With the run CANCELING, Dagster ends it CANCELED (whichever executor runs the step).
    raise dg.DagsterExecutionInterruptedError(f"{verb}: {message}")


def _stop_replaced_run(context: dg.AssetExecutionContext, replaced: Entry, by: Entry) -> None:
    """The newer run replaced entry ``replaced`` (overlap ``replace``; the ledger ended it and
    audited it in the claim's transaction): tag its run ``dueledger/outcome=replaced`` and ask
    Dagster to terminate it. Best effort: its fence already refuses every side effect."""
    old_run = replaced.run_ids[-1] if replaced.run_ids else None
    if old_run is not None:
        try:
            context.instance.add_run_tags(old_run, {t.TAG_OUTCOME: t.OUTCOME_REPLACED})
            run = context.instance.get_run_by_id(old_run)
            if run is not None and not run.is_finished:
                context.instance.run_coordinator.cancel_run(old_run)
        except Exception as exc:
            context.log.warning(f"could not terminate replaced run {old_run}: {exc}")
    context.log.info(
        f"entry {replaced.id} ({replaced.label}) replaced by entry {by.id}, run {context.run_id}"
    )


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


def _end_unsupported_run(
    context: dg.AssetExecutionContext,
    ledger: RunLedger,
    hooks: Hooks,
    unsupported: Unsupported,
    tasks: Sequence[TaskSpec],
) -> typing.NoReturn:
    """A run of a task the code location does not declare: its entry ends ``failed`` with
    kind ``unsupported_task``, one alert, and the run fails without any retry."""
    request, run_id = unsupported.request, context.run.run_id
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
        metadata={"ledger_entry": end.entry.id, "failure_kind": FailureKind.UNSUPPORTED_TASK.value},
        allow_retries=False,
    )


# --- the job and the schedule ---------------------------------------------------------------------


def _metadata(view: TaskView) -> dict[str, str | int | bool]:
    spec = view.spec
    deadline = int(spec.deadline.total_seconds()) if spec.deadline else None
    return {
        "dueledger/rule": spec.rule.describe(),
        "dueledger/declared_cadence": spec.declared_cadence,
        "dueledger/effective_cadence": view.effective.label,
        "dueledger/slot_minutes": view.slot_minutes,
        "dueledger/cron": " | ".join(view.plan.crons),
        "dueledger/timezone": view.rule_zone,
        "dueledger/max_attempts": spec.max_attempts,
        "dueledger/timeout_seconds": int(spec.timeout.total_seconds()),
        "dueledger/lease_ttl_seconds": int(spec.lease_ttl.total_seconds()),
        "dueledger/manual_trigger": spec.manual_trigger,
        "dueledger/missed_slot_policy": spec.missed_slot_policy,
        "dueledger/overlap_policy": spec.overlap_policy,
        # "none" where the policy is off, as `dueledger tasks` says it (0 read as a value).
        "dueledger/pause_after_failures": spec.pause_after_failures or "none",
        "dueledger/deadline_seconds": deadline or "none",
        "dueledger/retry_backoff_seconds": int(spec.retry_backoff.total_seconds()) or "none",
    }


def _description(view: TaskView) -> str:
    spec = view.spec
    text = (
        f"{spec.description} Rule: {spec.rule.describe()}; declared {spec.declared_cadence}; "
        f"effective {view.effective.label} on {view.slot_minutes}-minute slots."
    ).strip()
    if view.rule_zone != "UTC":
        text += (
            f" Read in {view.rule_zone}: a local time skipped by a clock change runs once at "
            f"the next valid instant, a repeated one once at its first occurrence."
        )
    if spec.overlap_policy != "queue":
        text += f" Overlap policy: {spec.overlap_policy}."
    if view.warnings:
        text += " Warning: declared cadence is finer than the slot allows."
    return text


#: The job of each view built in this process. The schedules, the code location's job list
#: and the re-dispatch sensor (which targets every task job) must hold the same object:
#: Dagster refuses two definitions of one job name.
_JOBS: dict[TaskView, dg.UnresolvedAssetJobDefinition] = {}


def task_job(view: TaskView) -> dg.UnresolvedAssetJobDefinition:
    """The task's job: materializes the task's asset, tagged for the ledger and queue.
    Built once per view in a process; later calls return the same job."""
    job = _JOBS.get(view)
    if job is None:
        job = _JOBS[view] = dg.define_asset_job(
            name=view.spec.job_name,
            # The asset alone: its ledger check (orchestration/checks.py) is reported by a
            # sensor and is not a step of the task's run.
            selection=dg.AssetSelection.assets(view.spec.asset).without_checks(),
            description=_description(view),
            run_tags=task_run_tags(view.spec),
            metadata=_metadata(view),
            # A task job is one asset, so one step: the in-process executor runs it inside the
            # run worker. Multiprocess would start a second process that loads the code
            # location again, for nothing (docs/performance.md).
            executor_def=dg.in_process_executor,
        )
    return job


def schedule_run_request(view: TaskView, scheduled_time: datetime) -> dg.RunRequest | dg.SkipReason:
    """Pure evaluation of one tick (exposed for tests and the missed-due audit)."""
    decision = decide_tick(view.plan, scheduled_time, view.slot_minutes)
    if decision.skip_reason:
        return dg.SkipReason(decision.skip_reason)
    tags = {
        t.TAG_TASK: view.spec.key,
        t.TAG_TRIGGER: Trigger.SCHEDULE.value,
        t.TAG_DUE: decision.due.text,
    }
    partition_key = partition_key_for(view.spec, decision.due)
    if partition_key is not None:
        # The partition tag is set here too, so the request is complete without the
        # repository (build_schedule_context in tests) and the run shows its day in the UI.
        tags[t.DAGSTER_PARTITION] = partition_key
    return dg.RunRequest(run_key=decision.due.text, tags=tags, partition_key=partition_key)


def gate_run_request(
    request: dg.RunRequest, hooks: Hooks, *, log: HookLog | None = None
) -> dg.RunRequest | dg.SkipReason:
    """The plugin creation hooks around a task's schedule/sensor RunRequest.

    ``before_task_create`` listeners may deny it (honored from blocking listeners only: the
    tick is skipped with their reason) or degrade it (extra tags); ``after_task_create``
    fires once the request is final. Their outcomes ride along in the ``dueledger/hooks``
    tag, and the run stores them on its ledger entry when it first claims it.
    """
    gate = hooks.gate_creation(request.tags, log=log)
    if gate.denied:
        due = request.tags.get(t.TAG_DUE, "")
        return dg.SkipReason(
            f"{request.tags.get(t.TAG_TASK)} {due}: run creation denied by a blocking plugin "
            f"listener ({gate.reason}); no run for this due (`dueledger hooks` lists listeners)"
        )
    gate = hooks.announce_creation(gate, log=log)
    return dg.RunRequest(
        run_key=request.run_key,
        run_config=request.run_config,
        tags=gate.run_tags(),
        job_name=request.job_name,
        asset_selection=request.asset_selection,
        partition_key=request.partition_key,
    )


class _ContextLog:
    """``context.log``, touched only when a hook has something to say.

    Reading ``context.log`` in a schedule evaluation opens a compute-log stream, which a
    cloud compute-log manager uploads when the tick ends; with no plugin listeners there is
    nothing to log, so a plain tick should not pay for it.
    """

    def __init__(self, context: dg.ScheduleEvaluationContext) -> None:
        self._context = context

    def info(self, msg: str, *args: Any, **kwargs: Any) -> Any:
        return self._context.log.info(msg, *args, **kwargs)

    def warning(self, msg: str, *args: Any, **kwargs: Any) -> Any:
        return self._context.log.warning(msg, *args, **kwargs)


def _held_reason(view: TaskView, due: Due, held: TickHold) -> str:
    """The tick's skip reason for a due decided at its tick (:func:`decide_at_tick`)."""
    entry, policy = held.entry, view.spec.overlap_policy
    if held.waits:
        return (
            f"{view.spec.key} {due.text}: waits for its turn ({held.reason}; overlap {policy}): "
            f"entry {entry.id} is queued as the task's waiter, with no run yet; ledger_sensor "
            f"launches its run once the task is free (`dueledger runs show {entry.id}`)"
        )
    return (
        f"{view.spec.key} {due.text}: skipped ({entry.error}; overlap {policy}): entry "
        f"{entry.id} records it; no run was requested (`dueledger runs show {entry.id}`)"
    )


def task_schedule(
    view: TaskView,
    job: dg.UnresolvedAssetJobDefinition,
    hooks: Hooks,
) -> dg.ScheduleDefinition:
    """The task's schedule, running by default so `dg dev` really schedules; its requests
    pass the creation ``hooks``; a paused task's ticks run nothing. Its next dues are not in
    its metadata (Dagster would show them as of the code location's load): ``ledger_health``'s
    table shows each task's next due, fresh every slot, as `dueledger dues` lists it."""

    def evaluate(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        scheduled = context.scheduled_execution_time
        if scheduled is None:
            # Keys come from the due time only; an evaluation without one cannot be keyed.
            return dg.SkipReason("no scheduled_execution_time: dueledger never keys on 'now'")
        request = schedule_run_request(view, scheduled)
        if isinstance(request, dg.SkipReason):
            return request
        due = decide_tick(view.plan, scheduled, view.slot_minutes).due
        ledger = context.resources.ledger
        paused = tick_skip_reason(ledger, view.spec.key, due)
        if paused is not None:
            return dg.SkipReason(paused)
        held = decide_at_tick(ledger, view.spec, due)
        if held is not None:
            return dg.SkipReason(_held_reason(view, due, held))
        return gate_run_request(request, hooks, log=_ContextLog(context))

    metadata: dict[str, Any] = dict(_metadata(view))
    crons = view.plan.crons
    return dg.ScheduleDefinition(
        name=view.spec.schedule_name,
        cron_schedule=crons[0] if len(crons) == 1 else list(crons),
        execution_timezone=view.plan.timezone,
        job=job,
        execution_fn=evaluate,
        description=_description(view),
        metadata=metadata,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        required_resource_keys={"ledger"},
    )


def task_definitions(
    declared: DeclaredTask,
    view: TaskView,
    *,
    hooks: Hooks,
    registered: Registered,
) -> dg.Definitions:
    """A declared task's asset (its body inside the claim path), job and schedule."""
    asset = task_asset(
        declared.spec,
        declared.body(),
        hooks=hooks,
        registered=registered,
        **declared.asset_options,
    )
    job = task_job(view)
    schedule = task_schedule(view, job, hooks)
    return dg.Definitions(assets=[asset], jobs=[job], schedules=[schedule])


def task_jobs_and_schedules(
    views: Sequence[TaskView], *, hooks: Hooks
) -> tuple[list[dg.UnresolvedAssetJobDefinition], list[dg.ScheduleDefinition]]:
    """Jobs and schedules for every task; the schedules fire the creation events of
    ``hooks``."""
    jobs = [task_job(v) for v in views]
    return jobs, [task_schedule(v, job, hooks) for v, job in zip(views, jobs, strict=True)]


__all__ = [
    "DAILY_PARTITIONS",
    "TaskBody",
    "TaskRun",
    "gate_run_request",
    "run_task",
    "schedule_run_request",
    "task_asset",
    "task_definitions",
    "task_job",
    "task_jobs_and_schedules",
    "task_schedule",
]
