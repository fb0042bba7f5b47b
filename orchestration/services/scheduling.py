"""Each task's scheduling as the ledger knows it: mirrored from Dagster, read by every reader.

:func:`sync_schedules` (run by ``ledger_outcome_sensor`` every tick) copies Dagster's state of
each task's schedule into the ledger: since when it runs (its start time, kept at the
earliest), and whether it was stopped in the Dagster UI (a pause by ``dagster-ui``, closed
when it runs again). :func:`scheduling_of` turns that, and the task's first recorded activity
when no schedule was observed yet, into the ``Scheduling`` every "is this due missed?"
question takes (``resources/core/dues.py``), without loading Dagster. :func:`list_dues` lists
the dues a task's schedule produces (`dueledger dues`, the schedule's metadata), with the DST
rule's notes and the pauses that skip them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from orchestration.task_spec import TaskView
from orchestration.timetable import NEXT_DUES_SHOWN
from resources.core import tags as t
from resources.core.due import floor_to_slot, format_due
from resources.core.dues import Pause, Scheduling
from resources.ledger import Ledger
from resources.ledger.scheduling import ScheduleState

if TYPE_CHECKING:
    import dagster as dg

#: Dagster's states of an instigator that runs (a schedule started in the UI, or running
#: because its code says so); STOPPED is the other one.
_RUNNING_STATUSES = frozenset({"RUNNING", "DECLARED_IN_CODE"})


def sync_schedules(
    instance: dg.DagsterInstance,
    ledger: Ledger,
    views: Sequence[TaskView],
    now: datetime,
    log: Any | None = None,
) -> list[str]:
    """Mirror Dagster's state of every task's schedule into the ledger; what changed, in words.

    One read of Dagster's schedule states and of the ledger's per tick; a write only for a
    schedule whose state changed, plus one statement stamping when they were all seen."""
    states = {
        s.instigator_name: s
        for s in instance.all_instigator_state()
        if s.instigator_type.value == "SCHEDULE"
    }
    known = ledger.schedule_states()
    changes: list[str] = []
    seen: list[str] = []
    for view in views:
        spec = view.spec
        state = states.get(spec.schedule_name)
        if state is None:
            continue  # the scheduler has not stored it yet (it does at its first iteration)
        running = state.status.value in _RUNNING_STATUSES
        stamp = getattr(state.instigator_data, "start_timestamp", None)
        started_at = datetime.fromtimestamp(stamp, UTC) if stamp else None
        row = known.get(spec.key)
        if row is not None and _unchanged(row, running, started_at):
            seen.append(spec.key)
            continue
        for change in ledger.observe_schedule(
            spec.key, spec.schedule_name, running=running, started_at=started_at, now=now
        ):
            changes.append(f"{spec.key}: {change}")
            if log is not None:
                log.info(f"{spec.key}: {change}")
    ledger.touch_schedules(seen, now=now)
    return changes


def _unchanged(row: ScheduleState, running: bool, started_at: datetime | None) -> bool:
    status_same = (row.status == "running") == running
    return status_same and (not running or row.started_at == started_at)


def scheduling_of(
    ledger: Ledger,
    view: TaskView,
    *,
    schedules: dict[str, ScheduleState] | None = None,
    pauses: dict[str, tuple[Pause, ...]] | None = None,
    instance: dg.DagsterInstance | None = None,
) -> Scheduling:
    """What the ledger knows of ``view``'s scheduling: its schedule's first start here, else
    (no schedule observed yet) the slot of its first recorded activity -- a ledger entry, or
    with ``instance`` a Dagster run of the task; None when nothing ran it yet. ``schedules``
    and ``pauses`` are the ledger's tables when the caller read them already (one read for
    many tasks)."""
    key = view.spec.key
    schedules = ledger.schedule_states() if schedules is None else schedules
    pauses = ledger.pauses_by_task() if pauses is None else pauses
    row = schedules.get(key)
    since = row.first_started_at if row is not None else None
    if since is None:
        first = first_activity(ledger, key, instance)
        since = floor_to_slot(first, view.slot_minutes) if first is not None else None
    return Scheduling(since, pauses.get(key, ()))


def first_activity(
    ledger: Ledger, task_key: str, instance: dg.DagsterInstance | None
) -> datetime | None:
    """The earliest recorded activity of a task: its oldest ledger entry and, with
    ``instance``, its oldest Dagster run (their creation times)."""
    found = [x for x in (ledger.first_activity(task_key),) if x is not None]
    if instance is not None:
        # Dagster is loaded only where an instance is: the CLI's read commands have none.
        import dagster as dg

        records = instance.get_run_records(
            filters=dg.RunsFilter(tags={t.TAG_TASK: task_key}), limit=1, ascending=True
        )
        if records:
            found.append(records[0].create_timestamp.astimezone(UTC))
    return min(found) if found else None


def next_dues_text(view: TaskView, now: datetime) -> str:
    """The next :data:`NEXT_DUES_SHOWN` dues after ``now``, as Markdown (the schedule's
    metadata in the UI; computed when the code location loads, so as of then)."""
    start = floor_to_slot(now, view.slot_minutes) + timedelta(minutes=view.slot_minutes)
    lines = [f"Next dues as of {format_due(now)} (`dueledger dues {view.spec.key}` for more):", ""]
    for item in view.dues(start, count=NEXT_DUES_SHOWN):
        note = f" -- {item.dst}" if item.dst else ""
        lines.append(f"- `{format_due(item.due)}` ({item.local}){note}")
    return "\n".join(lines)
