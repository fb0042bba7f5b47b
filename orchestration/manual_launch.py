"""Manual launches in their own namespace, and which entry any run is for.

**The namespaces.** A run's tags name one ledger entry (:func:`entry_request_from_tags`): a
scheduled or sensor run its due (``due:<due>``), a manual launch its request id
(``manual:<request_id>``), a manual retry its parent (``retry:<parent>``), a backfill run its
backfill and partition. Manual and scheduled keys can never collide, so a manual "run now"
in the same second as a scheduled due is never swallowed, and never swallows it. A run that
carries no dueledger trigger -- the UI's launchpad, "Materialize", GraphQL ``launchRun``,
which apply no job run tags -- belongs to the task whose asset it runs (:func:`task_tags`) and
is a manual launch by operator ``dagster-ui`` whose request id is its root run id. A task
declared ``manual_trigger: false`` runs only what dueledger issued (:func:`unissued_launch`).

**`dueledger launch TASK`** (:func:`launch_manual`) carries no run_key; the Dagster run id is
derived from (task, request id), so Dagster's own unique run id makes "the same request
twice" one run even when two launches race. A request whose entry is ``dispatch_failed`` --
its launch failed, or its run ended before claiming the entry (canceled in the queue;
``ledger_sensor`` (outcomes) records it) -- is re-dispatched when it is launched again:
``dispatch_failed -> queued`` with the earlier errors kept (ledger rule 5), under the run id of
its next dispatch. Dagster-free: the instance is only asked for runs.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestration.overlap import launch_refusal, mark_wait_turn
from orchestration.services.hooks.creation import CreationGate
from orchestration.services.hooks.records import record
from orchestration.services.hooks.registry import Hooks
from orchestration.services.launch import (
    MAX_MANUAL_REDISPATCHES,
    LaunchFailed,
    manual_run_id,
    submit_run,
)
from orchestration.task_spec import TaskSpec, require_task, task_run_tags
from resources.core import tags as t
from resources.core.arguments import check_reason, check_request_id
from resources.core.due import Due
from resources.core.entry import (
    Entry,
    Status,
    Trigger,
    dedup_key_for_backfill,
    dedup_key_for_request,
    dedup_key_for_retry,
)
from resources.core.errors import InvalidInput, Refused
from resources.core.operators import UI_OPERATOR, check_operator_name
from resources.ledger import Ledger

if TYPE_CHECKING:
    import dagster as dg


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

    @classmethod
    def of_entry(cls, entry: Entry) -> EntryRequest:
        """The request that created ``entry`` (its ledger key and context)."""
        return cls(
            entry.task_key,
            entry.trigger,
            entry.dedup_key,
            due=Due.coerce(entry.due) if entry.due is not None else None,
            operator=entry.operator,
            reason=entry.reason,
            parent_id=entry.parent_id,
        )


def entry_request_from_tags(tags: Mapping[str, str], run_id: str) -> EntryRequest:
    """Map a run's tags onto its ledger key (its entry's dedup key: one entry per key).

    - manual_retry (``dueledger/parent_entry``)   -> ``retry:<parent entry id>``
    - schedule / sensor (``dueledger/due``)       -> ``due:<due>``
    - manual with ``dueledger/due`` (catch-up)    -> ``due:<due>``
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
    if trigger == Trigger.MANUAL_RETRY and t.TAG_PARENT_ENTRY in tags:
        parent = int(tags[t.TAG_PARENT_ENTRY])
        return EntryRequest(
            task_key,
            Trigger.MANUAL_RETRY,
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
            Trigger.BACKFILL,
            dedup_key_for_backfill(tags[t.DAGSTER_BACKFILL], tags[t.DAGSTER_PARTITION]),
            due=Due.parse(tags[t.TAG_DUE]) if t.TAG_DUE in tags else None,
        )
    if trigger in (Trigger.SCHEDULE, Trigger.SENSOR) and t.TAG_DUE in tags:
        due = Due.parse(tags[t.TAG_DUE])
        return EntryRequest(task_key, trigger, due.key, due=due)
    if trigger == Trigger.MANUAL and t.TAG_DUE in tags:
        # `dueledger catch-up`: an operator's run of a past due is that due's run.
        due = Due.parse(tags[t.TAG_DUE])
        return EntryRequest(
            task_key, Trigger.MANUAL, due.key, due=due, operator=operator, reason=reason
        )
    if trigger == Trigger.MANUAL and tags.get(t.TAG_REQUEST_ID):
        return EntryRequest(
            task_key,
            Trigger.MANUAL,
            dedup_key_for_request(tags[t.TAG_REQUEST_ID]),
            operator=operator,
            reason=reason,
        )
    root = tags.get(t.DAGSTER_ROOT_RUN_ID) or run_id
    return EntryRequest(
        task_key,
        Trigger.MANUAL,
        dedup_key_for_request(root),
        operator=operator or UI_OPERATOR,
        reason=reason or "launched from the Dagster UI without dueledger tags",
    )


def task_tags(tags: Mapping[str, str], spec: TaskSpec) -> Mapping[str, str]:
    """The run's tags, completed with ``dueledger/task`` from the asset being executed.

    Dagster 1.13's GraphQL ``launchRun`` -- what the launchpad, the Catalog's and the job
    page's "Materialize" call -- does not apply a job's run tags, and a backfill from the
    asset graph runs the implicit asset job: such runs carry no ``dueledger/task``. The
    asset being executed names the task: a run is attributed by what Dagster records.
    """
    if t.TAG_TASK in tags:
        return tags
    return {**tags, t.TAG_TASK: spec.key}


def unissued_launch(spec: TaskSpec, request: EntryRequest, tags: Mapping[str, str]) -> str | None:
    """Why a run of ``spec``'s task may not act: the task is not manually triggerable and the
    run was not launched by anything dueledger issued. None: it may act.

    Issued are: a run of the task's own schedule (Dagster tags it ``dagster/schedule_name``),
    a run of a sensor (``dagster/sensor_name``: re-dispatch, catch-up) and a backfill run
    (``dagster/backfill``); Dagster copies these tags onto its automatic retries. A manual
    retry is the retry rules' to decide (they check the manual trigger themselves). Anything
    else -- the launchpad, "Materialize", GraphQL ``launchRun``, ``dagster job launch``, a
    run with hand-typed dueledger tags -- is a manual launch, whatever it claims to be.
    """
    if spec.manual_trigger or request.trigger == Trigger.MANUAL_RETRY:
        return None
    if request.trigger == Trigger.BACKFILL and tags.get(t.DAGSTER_BACKFILL):
        return None
    if request.trigger == Trigger.SCHEDULE and tags.get(t.DAGSTER_SCHEDULE_NAME) == (
        spec.schedule_name
    ):
        return None
    if request.trigger == Trigger.SENSOR and tags.get(t.DAGSTER_SENSOR_NAME):
        return None
    who = request.operator or UI_OPERATOR
    return (
        f"task {spec.key!r} is not manually triggerable: only its schedule, dueledger's "
        f"sensors and backfills run it, and this run was launched by hand (operator {who}); "
        f"it does nothing. Set manual_trigger: true where the task is declared (its defs.yaml) "
        f"if manual runs are safe for it"
    )


def reexecution_parent(
    tags: Mapping[str, str], parent_tags: Mapping[str, str] | None
) -> EntryRequest | None:
    """For a re-execution started from the Dagster UI, the ledger key of its parent run's
    entry; None for every other run.

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
    if tags.get(t.TAG_TRIGGER) == Trigger.MANUAL_RETRY and t.TAG_PARENT_ENTRY in tags:
        inherited = (
            parent_tags is not None
            and parent_tags.get(t.TAG_TRIGGER) == Trigger.MANUAL_RETRY
            and parent_tags.get(t.TAG_PARENT_ENTRY) == tags[t.TAG_PARENT_ENTRY]
        )
        if not inherited:
            return None
    # The parent's own key; its copied tags give the same key when the run is gone.
    source = parent_tags if parent_tags is not None and t.TAG_TASK in parent_tags else tags
    return entry_request_from_tags(source, parent_run_id)


@dataclass(frozen=True)
class RunAttribution:
    """Everything a run's tags say about the entry it is for, read once, before any rule.

    ``request``: the entry the run names itself; ``parent``: for a re-execution started from
    the Dagster UI, its parent run's entry (the retry rules decide what it claims); and, for a
    task that is not manually triggerable, why the run may not act as itself (``unissued``) or
    as its parent's first attempt (``parent_unissued``) -- None: it may."""

    tags: Mapping[str, str]
    request: EntryRequest
    parent_run_id: str | None = None
    parent: EntryRequest | None = None
    unissued: str | None = None
    parent_unissued: str | None = None


def attribute_run(
    spec: TaskSpec,
    tags: Mapping[str, str],
    run_id: str,
    parent_tags: Callable[[str], Mapping[str, str] | None],
) -> RunAttribution:
    """Which entry run ``run_id`` of ``spec``'s asset is for (see the module docstring);
    ``parent_tags(run_id)``: the tags of a run Dagster has (None: gone), asked only for the
    parent of a UI re-execution."""
    tags = task_tags(tags, spec)
    request = entry_request_from_tags(tags, run_id)
    parent_run_id = tags.get(t.DAGSTER_PARENT_RUN_ID)
    parent = None
    if parent_run_id and t.DAGSTER_RETRY_NUMBER not in tags:
        found = parent_tags(parent_run_id)
        parent = reexecution_parent(tags, task_tags(found, spec) if found is not None else None)
    return RunAttribution(
        tags,
        request,
        parent_run_id=parent_run_id if parent is not None else None,
        parent=parent,
        unissued=unissued_launch(spec, request, tags),
        parent_unissued=unissued_launch(spec, parent, tags) if parent is not None else None,
    )


# --- `dueledger launch` -----------------------------------------------------------------------

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
    spec = require_task(specs, task_key)
    try:
        operator = check_operator_name(operator)  # recorded as checked: " alice " is alice
        reason = check_reason(reason, "why the run is launched")
        if request_id is not None:
            check_request_id(request_id)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    if not spec.manual_trigger:
        raise Refused(
            f"task {task_key!r} is not manually triggerable; set manual_trigger: true where "
            f"the task is declared (its defs.yaml) if manual runs are safe for it. Nothing "
            f"was launched."
        )
    request_id = request_id or str(uuid.uuid4())
    dispatch, existing = latest_dispatch(instance, task_key, request_id)
    skipped = launch_refusal(ledger, spec, queue=queue) if existing is None else None
    if skipped is not None:
        raise Refused(skipped)
    if existing is not None and _needs_redispatch(ledger, existing, task_key, request_id):
        # Its run ended before claiming the entry (canceled in the queue, failed to start)
        # and the entry is dispatch_failed, whoever recorded that: this repeat of the
        # request re-dispatches it (ledger rule 5) under the next dispatch's run id.
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
            entry = mark_wait_turn(ledger, entry.id)
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
    claimed it (ledger_sensor (outcomes) recorded that), so nothing of it ran."""
    if not run.is_finished:
        return False
    entry = ledger.find(task_key, dedup_key_for_request(request_id))
    return entry is not None and entry.status == Status.DISPATCH_FAILED
