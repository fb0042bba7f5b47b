"""Manual launches in their own namespace: `dueledger launch TASK ...`.

A manual launch never carries a run_key and its ledger key is ``manual:<request_id>``,
so it can neither be swallowed by nor swallow a scheduled due. The Dagster run id is
derived from (task, request id), so Dagster's own unique run id makes "the same
request twice" one run even when two launches race.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import dagster as dg

from orchestration.services.hooks import CreationGate, Hooks, record
from orchestration.services.launch import LaunchFailed, manual_run_id, submit_run
from resources.core import tags as t
from resources.core.checks import check_reason, check_request_id
from resources.core.errors import InvalidInput, Refused
from resources.core.operators import check_operator_name
from resources.core.registry import TaskSpec, find_task, task_run_tags
from resources.ledger import RunLedger, dedup_key_for_request

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
        t.TAG_TRIGGER: t.TRIGGER_MANUAL,
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
    ledger: RunLedger,
    hooks: Hooks,
    submit: Submit = submit_run,
) -> LaunchResult:
    """Launch a task manually, idempotent on ``request_id``.

    Raises InvalidInput (unknown task, empty operator/reason), Refused (task not
    manually triggerable, or denied by a blocking ``before_task_create`` plugin listener;
    nothing launched) or LaunchFailed (entry -> dispatch_failed).
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
    run_id = manual_run_id(task_key, request_id)
    existing = instance.get_run_by_id(run_id)
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
        trigger=t.TRIGGER_MANUAL,
        dedup_key=dedup_key_for_request(request_id),
        max_attempts=spec.max_attempts,
        operator=operator,
        reason=reason,
    )
    if gate is not None:
        record(ledger, entry.id, gate.before.records())
        # This request's earlier launch failed before any run existed: launching it again
        # is its re-dispatch, so its run finds the entry claimable.
        redispatched = entry.status == t.STATUS_DISPATCH_FAILED
        if redispatched and not ledger.redispatch(entry.id):
            raise Refused(
                f"request {request_id!r} of task {task_key!r} (entry {entry.id}) is "
                f"dispatch_failed and was retried by hand since; launch a new request "
                f"or see `dueledger runs show {entry.id}`. Nothing was launched."
            )
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
