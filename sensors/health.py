"""``slot_health_sensor``: once per slot, one warning listing reclaims, dispatch failures,
missed dues and queue backlog — nothing when all is well; and the task assets'
``latest_due_accounted_for`` checks and the ``ledger_health`` asset's ledger checks
(orchestration/checks.py), reported without a run.

What one evaluation reads follows the dues of the slots since the previous one, not the
number of tasks: the entries that changed since then are one indexed read
(``updated_at``), only tasks with a due in those slots are audited for missed dues, and a
task's check is evaluated again only when its latest due moved, one of its entries changed,
or its last evaluation was not settled (the cursor names those tasks). A success is final,
so a check that passed with it stands until the task's next due.

Between slot starts, each tick re-reports the checks of the tasks whose entries settled since
the previous tick (a success, a failure, a skip, a reclaim, a retry's outcome), and the
ledger's checks when ``ledger_health``'s own entry did. Dagster shows a check evaluation on
the asset's materialization only if the evaluation is newer, and a task run materializes
seconds after the slot start: without this, every materialization made after the slot's
evaluation read "Not evaluated", and a failed due's red check disappeared behind it. A run's
materialization precedes its entry's success, so an evaluation made after the entry changed
is newer than it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg

from orchestration.missed_dues import TaskAudit, audit_tasks, expected_dues
from orchestration.services.accounting import (
    STATE_NEW,
    STATE_NO_DUE,
    STATE_SUCCESS,
    account_latest_due,
    check_evaluation,
)
from orchestration.services.alerts import Alerts
from orchestration.services.ledger_checks import ledger_check_evaluations, ledger_health_view
from orchestration.services.summary import SUMMARY_WINDOW, first_line
from orchestration.task_spec import TaskView
from resources.core import tags as t
from resources.core.alerting import KIND_SLOT_HEALTH, slot_subject
from resources.core.due import floor_to_slot, format_due
from resources.core.entry import SUMMARY_DISPATCH_FAILURES, Entry, FailureKind, Status
from resources.core.instants import Clock, iso, utc_now
from resources.ledger import RunLedger
from sensors.support import Duty, DutyContext, duty_sensor

# --- slot health -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotHealth:
    """What went wrong since the previous slot evaluation (empty lists: healthy)."""

    slot: datetime
    since: datetime
    reclaims: list[dict[str, Any]] = field(default_factory=list)
    dispatch_failures: list[dict[str, Any]] = field(default_factory=list)
    missed_dues: dict[str, list[str]] = field(default_factory=dict)
    queue_backlog: dict[str, Any] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return not (
            self.reclaims or self.dispatch_failures or self.missed_dues or self.queue_backlog
        )

    def alert_fields(self) -> dict[str, Any]:
        return {
            "slot": format_due(self.slot),
            "since": iso(self.since),
            "reclaims": self.reclaims,
            "dispatch_failures": self.dispatch_failures,
            "missed_dues": self.missed_dues,
            "queue_backlog": self.queue_backlog,
        }


def queue_backlog(
    instance: dg.DagsterInstance, views: Sequence[TaskView], now: datetime, slot_minutes: int
) -> dict[str, Any]:
    """Task runs waiting in Dagster's queue for longer than a slot (empty dict: none)."""
    oldest_allowed = now - timedelta(minutes=slot_minutes)
    jobs = {v.spec.job_name for v in views}
    waiting = [
        r
        for r in instance.get_run_records(
            filters=dg.RunsFilter(
                statuses=[dg.DagsterRunStatus.QUEUED], created_before=oldest_allowed
            )
        )
        if r.dagster_run.job_name in jobs
    ]
    if not waiting:
        return {}
    by_task: dict[str, int] = {}
    for record in waiting:
        key = record.dagster_run.tags.get(t.TAG_TASK, record.dagster_run.job_name)
        by_task[key] = by_task.get(key, 0) + 1
    oldest = min(r.create_timestamp for r in waiting)
    return {
        "queued_runs": len(waiting),
        "oldest_queued_seconds": int((now - oldest).total_seconds()),
        "by_task": by_task,
    }


def slot_health(
    ledger: RunLedger,
    views: Sequence[TaskView],
    now: datetime,
    since: datetime,
    *,
    instance: dg.DagsterInstance | None = None,
    changed: Sequence[Entry] | None = None,
) -> SlotHealth:
    """Problems that appeared in ``[since, now)``: reclaims and dispatch failures by when
    they happened, missed dues of slots that ended since ``since``'s slot, and queue backlog
    (runs queued for longer than a slot) as of ``now``. ``changed``: the entries updated
    since ``since`` (read here when not given); a reclaim or a dispatch failure updates its
    entry, so no other entry can hold one."""
    slot_minutes = views[0].slot_minutes if views else 15
    slot = floor_to_slot(now, slot_minutes)
    reclaims, failures = [], []
    if changed is None:
        changed = ledger.entries_updated_since(since)
    for e in sorted(changed, key=lambda e: e.id):
        if (
            e.status == Status.FAILED
            and e.failure_kind == FailureKind.LEASE_RECLAIMED
            and e.finished_at is not None
            and since <= e.finished_at < now
        ):
            reclaims.append(
                {
                    "task": e.task_key,
                    "entry_id": e.id,
                    "run_id": e.run_ids[-1] if e.run_ids else None,
                }
            )
        for item in e.summary.get(SUMMARY_DISPATCH_FAILURES, []):
            at = _parse_iso(item.get("at"))
            if at is not None and since <= at < now:
                failures.append(
                    {
                        "task": e.task_key,
                        "entry_id": e.id,
                        "due": format_due(e.due) if e.due else None,
                        "run_id": item.get("run_id"),
                        "error": first_line(item.get("error")),
                    }
                )
    first_slot = floor_to_slot(since, slot_minutes)
    # Only tasks with a due in the slots since ``since`` can have missed one there, and their
    # evidence needs looking at only from ``first_slot`` on (at most the summary's window).
    audits: list[TaskAudit] = audit_tasks(
        ledger,
        tasks_due_between(views, first_slot, slot),
        now,
        window=min(now - first_slot, SUMMARY_WINDOW),
        instance=instance,
    )
    missed = {
        a.task_key: [format_due(d) for d in a.missed if d >= first_slot]
        for a in audits
        if any(d >= first_slot for d in a.missed)
    }
    backlog = queue_backlog(instance, views, now, slot_minutes) if instance is not None else {}
    return SlotHealth(slot, since, reclaims, failures, missed, backlog)


def _parse_iso(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def tasks_due_between(views: Sequence[TaskView], start: datetime, end: datetime) -> list[TaskView]:
    """The tasks with a due in ``[start, end)``: those whose latest finished due moved when
    ``end`` is the current slot and ``start`` the previous evaluation's slot."""
    return [v for v in views if expected_dues(v, start, end)]


@dataclass(frozen=True)
class _Cursor:
    """What the previous evaluation left: its slot and time, a digest of the tasks it knew,
    and the tasks whose check was not a success (None: unknown, evaluate every check)."""

    slot: datetime | None = None
    at: datetime | None = None
    tasks: str | None = None
    unsettled: frozenset[str] | None = None
    #: When the previous tick (slot start or not) read the entries that changed.
    seen: datetime | None = None


def _tasks_digest(views: Sequence[TaskView]) -> str:
    keys = "\n".join(sorted(v.spec.key for v in views))
    return hashlib.sha256(keys.encode()).hexdigest()[:16]


def _slot_cursor(cursor: str | None) -> _Cursor:
    """The previous evaluation's cursor; an empty one when unset or garbled."""
    try:
        data = json.loads(cursor) if cursor else {}
        unsettled = data.get("unsettled")
        return _Cursor(
            _parse_iso(data.get("slot")),
            _parse_iso(data.get("at")),
            data.get("tasks") if isinstance(data.get("tasks"), str) else None,
            frozenset(map(str, unsettled)) if isinstance(unsettled, list) else None,
            _parse_iso(data.get("seen")),
        )
    except (ValueError, AttributeError, TypeError):
        return _Cursor()


#: Check states that stay as they are until the task's latest due moves or one of its
#: entries changes: a success is final, and "no due yet" / "nothing ran here before that
#: due" can only change with a new due or an entry for it.
SETTLED_STATES: frozenset[str] = frozenset({STATE_SUCCESS, STATE_NO_DUE, STATE_NEW})


def checks_to_evaluate(
    views: Sequence[TaskView],
    previous: _Cursor,
    first_slot: datetime,
    slot: datetime,
    changed_tasks: frozenset[str] = frozenset(),
) -> list[TaskView]:
    """The tasks whose ``latest_due_accounted_for`` may have changed since ``previous``:
    every task when the previous evaluation is unknown or knew other tasks; else those with
    a due in ``[first_slot, slot)`` (their latest finished due moved), those with an entry
    that changed since (``changed_tasks``), and those whose last evaluation was not settled
    (:data:`SETTLED_STATES`)."""
    if previous.unsettled is None or previous.tasks != _tasks_digest(views):
        return list(views)
    wanted = {v.spec.key for v in tasks_due_between(views, first_slot, slot)}
    wanted |= changed_tasks | previous.unsettled
    return [v for v in views if v.spec.key in wanted]


def build_slot_health_sensor(
    views: Sequence[TaskView], *, clock: Clock = utc_now, minimum_interval_seconds: int = 60
) -> dg.SensorDefinition:
    """``slot_health_sensor``: the slot health duty alone, as a sensor of its own."""
    return duty_sensor(
        "slot_health_sensor",
        slot_health_duty(views),
        clock=clock,
        minimum_interval_seconds=minimum_interval_seconds,
    )


def slot_health_duty(views: Sequence[TaskView]) -> Duty:
    """Slot health: once per slot, one structured warning when anything is wrong, and the
    checks' evaluations.

    The cursor remembers the slot last evaluated and when; the next evaluation in a new slot
    covers everything since. The first evaluation ever looks back one audit window.
    """
    slot_minutes = views[0].slot_minutes if views else 15

    def evaluate_slot(context: DutyContext, ledger: RunLedger, now: datetime) -> dg.SensorResult:
        slot = floor_to_slot(now, slot_minutes)
        previous = _slot_cursor(context.cursor)
        if previous.slot is not None and previous.slot >= slot:
            return _report_settled_since(context, ledger, views, previous, slot, now)
        since = previous.at if previous.at is not None else now - SUMMARY_WINDOW
        # What changed since the previous evaluation: one indexed read (updated_at).
        changed = ledger.entries_updated_since(since)
        health = slot_health(ledger, views, now, since, instance=context.instance, changed=changed)
        # The latest_due_accounted_for checks that may have changed, as of this slot's
        # start, and the ledger's own checks on ledger_health (bounded queries each).
        first_slot = floor_to_slot(since, slot_minutes)
        changed_tasks = frozenset(e.task_key for e in changed)
        accounts = [
            account_latest_due(v, ledger, now, instance=context.instance)
            for v in checks_to_evaluate(views, previous, first_slot, slot, changed_tasks)
        ]
        # Every task left out was settled already (checks_to_evaluate): it stays so.
        unsettled = {a.task_key for a in accounts if a.state not in SETTLED_STATES}
        cursor = json.dumps(
            {
                "slot": format_due(slot),
                "at": iso(now, micro=True),
                "tasks": _tasks_digest(views),
                "unsettled": sorted(unsettled),
                "seen": iso(now, micro=True),
            }
        )
        checks = [check_evaluation(a) for a in accounts]
        checks += ledger_check_evaluations(ledger, context.instance, views, now)
        if health.healthy:
            return dg.SensorResult(
                skip_reason=f"slot {format_due(slot)}: healthy", cursor=cursor, asset_events=checks
            )
        # Delivered once per slot, even if this evaluation is repeated (its cursor lost).
        alerts = Alerts.from_environment(ledger, now=now, log=context.log)
        alerts.emit(KIND_SLOT_HEALTH, slot_subject(slot), **health.alert_fields())
        alerts.deliver()
        return dg.SensorResult(
            skip_reason=f"slot {format_due(slot)}: problems reported (see the warning)",
            cursor=cursor,
            asset_events=checks,
        )

    return Duty(
        "slot_health",
        evaluate_slot,
        "Once per slot: one structured warning listing lease reclaims, dispatch failures, "
        "missed dues and queue backlog since the previous slot (silent when healthy), and "
        "the checks' evaluations, again whenever an entry settles.",
    )


#: How far back a tick between slot starts reads again before the previous tick: a write
#: stamped just before that tick's read but committed after it is not lost (re-reporting a
#: check twice is harmless).
RESEEN: timedelta = timedelta(seconds=10)


def _report_settled_since(
    context: DutyContext,
    ledger: RunLedger,
    views: Sequence[TaskView],
    previous: _Cursor,
    slot: datetime,
    now: datetime,
) -> dg.SensorResult:
    """A tick inside an evaluated slot: the checks of the tasks whose entries settled since
    the previous tick, reported again so they sit on the materialization those runs made."""
    since = (previous.seen or previous.at or now) - RESEEN
    # A running entry's heartbeat changes its row but not its account: only settled changes.
    settled = {
        e.task_key for e in ledger.entries_updated_since(since) if e.status != Status.RUNNING
    }
    accounts = [
        account_latest_due(v, ledger, now, instance=context.instance)
        for v in views
        if v.spec.key in settled
    ]
    checks = [check_evaluation(a) for a in accounts]
    health = ledger_health_view(views)
    if health is not None and health.spec.key in settled:
        checks += ledger_check_evaluations(ledger, context.instance, views, now)
    unsettled = None
    if previous.unsettled is not None:
        unsettled = sorted(
            (previous.unsettled - settled)
            | {a.task_key for a in accounts if a.state not in SETTLED_STATES}
        )
    cursor = json.dumps(
        {
            "slot": format_due(slot),
            "at": iso(previous.at or now, micro=True),
            "tasks": previous.tasks,
            "unsettled": unsettled,
            "seen": iso(now, micro=True),
        }
    )
    if not checks:
        return dg.SensorResult(
            skip_reason=f"slot {format_due(slot)} already evaluated; no entry settled since",
            cursor=cursor,
        )
    return dg.SensorResult(
        skip_reason=(
            f"slot {format_due(slot)} already evaluated; checks of {len(accounts)} task(s) "
            f"whose entries settled since the previous tick reported again"
        ),
        cursor=cursor,
        asset_events=checks,
    )
