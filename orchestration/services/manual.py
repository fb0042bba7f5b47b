"""Manual launches in their own namespace: `dueledger launch TASK ...`.

A manual launch never carries a run_key and its ledger key is ``manual:<request_id>``,
so it can neither be swallowed by nor swallow a scheduled due. The Dagster run id is
derived from (task, request id), so Dagster's own unique run id makes "the same
request twice" one run even when two launches race.

A request whose entry is ``dispatch_failed`` -- its launch failed, or its run ended before
claiming the entry (canceled in the queue; ``ledger_outcome_sensor`` records it) -- is
re-dispatched when it is launched again: ``dispatch_failed -> queued`` with the earlier
errors kept (DESIGN rule 5), under the run id of its next dispatch.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import dagster as dg

from orchestration.services.hooks import CreationGate, Hooks, record
from orchestration.services.launch import (
    MAX_MANUAL_REDISPATCHES,
    LaunchFailed,
    manual_run_id,
    submit_run,
)
from orchestration.task_spec import OverlapPolicy, TaskSpec, find_task, task_run_tags
from resources.core import tags as t
from resources.core.arguments import check_reason, check_request_id
from resources.core.entry import Status, Trigger
from resources.core.errors import InvalidInput, Refused
from resources.core.operators import check_operator_name
from resources.ledger import Ledger, dedup_key_for_request

#: How a manual launch submits its run: (job name, run id, tags); raises LaunchFailed.
Submit = Callable[[str, str, Mapping[str, str]], object]


@dataclass(frozen=True)
class LaunchResult:
    entry_id: int
    run_id: str
    request_id: str
    task_key: str
    existing: bool
    run_status: str
    #: The request's earlier launch had failed (dispatch_failed): this launch re-dispatched it.
    redispatched: bool = False

    def as_json(self) -> dict[str, object]:
        return {
            "entry_id": self.entry_id,
            "run_id": self.run_id,
            "request_id": self.request_id,
            "task_key": self.task_key,
            "existing": self.existing,
            "run_status": self.run_status,
            "redispatched": self.redispatched,
        }


def manual_tags(spec: TaskSpec, request_id: str, operator: str, reason: str) -> dict[str, str]:
    """Tags of a manual launch: the task's run tags plus the manual namespace."""
    return {
        **task_run_tags(spec),
        t.TAG_TRIGGER: Trigger.MANUAL.value,
        t.TAG_REQUEST_ID: request_id,
        t.TAG_OPERATOR: operator,
        t.TAG_REASON: reason,
    }


def launch_manual(
    specs: Sequence[TaskSpec],
    task_key: str,
    *,
    operator: str,
    reason: str,
    request_id: str | None,
    instance: dg.DagsterInstance,
    ledger: Ledger,
    hooks: Hooks,
    submit: Submit = submit_run,
    queue: bool = False,
) -> LaunchResult:
    """Launch a task manually, idempotent on ``request_id``.

    Raises InvalidInput (unknown task, empty operator/reason), Refused (task not
    manually triggerable, denied by a blocking ``before_task_create`` plugin listener, or --
    overlap ``skip`` -- running now, without ``queue``; nothing launched) or LaunchFailed
    (entry -> dispatch_failed). With ``queue`` the run waits for its turn under ``skip`` and
    ``buffer_one`` (the entry's ``summary.overlap`` is ``queue``).
    """
    spec = find_task(specs, task_key)
    if spec is None:
        known = ", ".join(s.key for s in specs)
        raise InvalidInput(f"unknown task {task_key!r}; registered tasks: {known}")
    try:
        operator = check_operator_name(operator)  # recorded as checked: " alice " is alice
        reason = check_reason(reason, "why the run is launched")
        if request_id is not None:
            check_request_id(request_id)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    if not spec.manual_trigger:
        raise Refused(
            f"task {task_key!r} is not manually triggerable; set manual_trigger=True in "
            f"orchestration/tasks.py if manual runs are safe for it. Nothing was launched."
        )
    request_id = request_id or str(uuid.uuid4())
    dispatch, existing = latest_dispatch(instance, task_key, request_id)
    if existing is None and not queue and spec.overlap_policy == OverlapPolicy.SKIP:
        running = ledger.in_progress(task_key)
        if running:
            busy = running[0]
            raise Refused(
                f"task {task_key!r} is running (entry {busy.id}, {busy.label}, {busy.status}) "
                f"and its overlap policy is skip: this launch would be skipped. Nothing was "
                f"launched; add --queue to wait for its turn"
            )
    if existing is not None and _needs_redispatch(ledger, existing, task_key, request_id):
        # Its run ended before claiming the entry (canceled in the queue, failed to start)
        # and the entry is dispatch_failed, whoever recorded that: this repeat of the
        # request re-dispatches it (DESIGN rule 5) under the next dispatch's run id.
        if dispatch >= MAX_MANUAL_REDISPATCHES:
            raise Refused(
                f"request {request_id!r} of task {task_key!r} failed to launch "
                f"{dispatch + 1} times; launch it as a new request (another --request-id). "
                f"Nothing was launched."
            )
        dispatch, existing = dispatch + 1, None
    run_id = manual_run_id(task_key, request_id, dispatch)
    gate: CreationGate | None = None
    if existing is None:
        # Plugin hooks see the launch before anything is written, so a deny changes nothing.
        gate = hooks.gate_creation(manual_tags(spec, request_id, operator, reason), run_id=run_id)
        if gate.denied:
            raise Refused(
                f"launch of task {task_key!r} was denied by a blocking plugin listener "
                f"({gate.reason}). Nothing was launched; `dueledger hooks` lists the listeners."
            )
    entry = ledger.ensure_entry(
        task_key=task_key,
        trigger=Trigger.MANUAL,
        dedup_key=dedup_key_for_request(request_id),
        max_attempts=spec.max_attempts,
        operator=operator,
        reason=reason,
    )
    if gate is not None:
        record(ledger, entry.id, gate.before.records())
        if queue:
            entry = ledger.wait_turn(entry.id)
        # This request's earlier launch failed before any run existed: launching it again
        # is its re-dispatch, so its run finds the entry claimable.
        redispatched = entry.status == Status.DISPATCH_FAILED
        if redispatched and not ledger.redispatch(entry.id):
            now = ledger.get(entry.id)
            if now is None or now.manual_retry_at is not None:
                raise Refused(
                    f"request {request_id!r} of task {task_key!r} (entry {entry.id}) is "
                    f"dispatch_failed and was retried by hand since; launch a new request "
                    f"or see `dueledger runs show {entry.id}`. Nothing was launched."
                )
            # A racing repeat re-dispatched it first: both submit the same run id, Dagster
            # keeps one run, and the loser finds it existing below.
        try:
            submit(spec.job_name, run_id, dict(gate.tags))
            was_existing = False
        except LaunchFailed as exc:
            # A concurrent launch of the same request may have won the run id: then this
            # call found the request existing, like a launch that came after it.
            if instance.get_run_by_id(run_id) is None:
                ledger.record_dispatch_failure(entry.id, error=str(exc), run_id=run_id)
                raise
            was_existing = True
        if not was_existing:
            announced = hooks.announce_creation(gate, entry_id=entry.id, run_id=run_id)
            if announced.after is not None:
                record(ledger, entry.id, announced.after.records())
        run = instance.get_run_by_id(run_id)
    else:
        run, was_existing, redispatched = existing, True, False
    status = run.status.value if run is not None else "UNKNOWN"
    return LaunchResult(entry.id, run_id, request_id, task_key, was_existing, status, redispatched)


def latest_dispatch(
    instance: dg.DagsterInstance, task_key: str, request_id: str
) -> tuple[int, dg.DagsterRun | None]:
    """The newest dispatch of a manual request: its number and its run (``0, None``: no run
    was created yet). Dispatch n's run id is ``manual_run_id(task, request, n)``; they are
    created in order, so the first id without a run ends the search."""
    latest: tuple[int, dg.DagsterRun | None] = (0, None)
    for number in range(MAX_MANUAL_REDISPATCHES + 1):
        run = instance.get_run_by_id(manual_run_id(task_key, request_id, number))
        if run is None:
            break
        latest = (number, run)
    return latest


def _needs_redispatch(ledger: Ledger, run: dg.DagsterRun, task_key: str, request_id: str) -> bool:
    """The request's newest run has ended and its entry is ``dispatch_failed``: the run never
    claimed it (ledger_outcome_sensor recorded that), so nothing of it ran."""
    if not run.is_finished:
        return False
    entry = ledger.find(task_key, dedup_key_for_request(request_id))
    return entry is not None and entry.status == Status.DISPATCH_FAILED
