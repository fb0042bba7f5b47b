"""One factory turning each TaskSpec into a Dagster job and a due-keyed schedule.

The schedule's evaluation is a thin shell over ``registry.decide_tick``: the due is the
scheduled execution time floored to the slot (never the wall clock) and the RunRequest's
run_key is exactly the due string, so a re-evaluated tick asks for the same run.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import dagster as dg

from orchestration.services.hooks import HookLog, Hooks
from orchestration.services.scheduling import next_dues_text
from orchestration.task_spec import (
    DAILY_PARTITIONS_START,
    TaskView,
    partition_key_for,
    task_run_tags,
)
from orchestration.timetable import decide_tick
from resources.core import tags as t
from resources.core.entry import Trigger
from resources.ledger import RunLedger

#: The partitions of every task declared with ``partitions="daily"``: UTC days. The
#: current day exists from its first instant on (end_offset=1), so the schedule's run for
#: a due today can target today's partition.
DAILY_PARTITIONS = dg.DailyPartitionsDefinition(
    start_date=DAILY_PARTITIONS_START, timezone="UTC", end_offset=1
)


def job_run_tags(view: TaskView) -> dict[str, str]:
    """Run tags of the task's job (see ``registry.task_run_tags``)."""
    return task_run_tags(view.spec)


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
        "dueledger/pause_after_failures": spec.pause_after_failures or 0,
        "dueledger/deadline_seconds": deadline or 0,
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


def build_task_job(view: TaskView) -> dg.UnresolvedAssetJobDefinition:
    """The task's job: materializes the task's asset, tagged for the ledger and queue.
    Built once per view in a process; later calls return the same job."""
    job = _JOBS.get(view)
    if job is None:
        job = _JOBS[view] = _new_task_job(view)
    return job


def _new_task_job(view: TaskView) -> dg.UnresolvedAssetJobDefinition:
    return dg.define_asset_job(
        name=view.spec.job_name,
        # The asset alone: its ledger check (orchestration/checks.py) is reported by a sensor
        # and is not a step of the task's run.
        selection=dg.AssetSelection.assets(view.spec.asset).without_checks(),
        description=_description(view),
        run_tags=job_run_tags(view),
        metadata=_metadata(view),
        # A task job is one asset, so one step: the in-process executor runs it inside the
        # run worker. Multiprocess would start a second process that loads the code location
        # again, for nothing (docs/performance.md).
        executor_def=dg.in_process_executor,
    )


def schedule_run_request(view: TaskView, scheduled_time) -> dg.RunRequest | dg.SkipReason:
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


def paused_tick(ledger: RunLedger, view: TaskView, due: str) -> dg.SkipReason | None:
    """The tick of a task paused (`dueledger pause`, or pausing after failures) runs nothing:
    its skip reason says who paused it and why. ``ledger_policy_sensor`` records the due's
    entry ``skipped`` (sensors/policies.py)."""
    for pause in ledger.open_pauses(view.spec.key):
        return dg.SkipReason(
            f"{view.spec.key} {due}: {pause.skip_reason} (since {pause.start:%Y-%m-%dT%H:%M:%SZ}"
            f"); the due is recorded skipped; `dueledger resume {view.spec.key}` resumes it"
        )
    return None


def build_task_schedule(
    view: TaskView,
    job: dg.UnresolvedAssetJobDefinition,
    hooks: Hooks,
    *,
    loaded_at: datetime | None = None,
) -> dg.ScheduleDefinition:
    """The task's schedule, running by default so `dagster dev` really schedules; its
    requests pass the creation ``hooks``; a paused task's ticks run nothing. ``loaded_at``:
    the next dues listed in its metadata are those after it (None: not listed)."""

    def evaluate(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        scheduled = context.scheduled_execution_time
        if scheduled is None:
            # Keys come from the due time only; an evaluation without one cannot be keyed.
            return dg.SkipReason("no scheduled_execution_time: dueledger never keys on 'now'")
        request = schedule_run_request(view, scheduled)
        if isinstance(request, dg.SkipReason):
            return request
        paused = paused_tick(context.resources.ledger, view, request.tags[t.TAG_DUE])
        if paused is not None:
            return paused
        return gate_run_request(request, hooks, log=_ContextLog(context))

    metadata: dict[str, Any] = dict(_metadata(view))
    if loaded_at is not None:
        metadata["dueledger/next_dues"] = dg.MetadataValue.md(next_dues_text(view, loaded_at))
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


def build_task_definitions(
    views: list[TaskView], *, hooks: Hooks, loaded_at: datetime | None = None
) -> tuple[list[dg.UnresolvedAssetJobDefinition], list[dg.ScheduleDefinition]]:
    """Jobs and schedules for every task (the one place they are made); the schedules fire
    the creation events of ``hooks``, and list the next dues after ``loaded_at``."""
    jobs, schedules = [], []
    for view in views:
        job = build_task_job(view)
        jobs.append(job)
        schedules.append(build_task_schedule(view, job, hooks, loaded_at=loaded_at))
    return jobs, schedules
