"""Pauses: a task's schedule held, by an operator, by the Dagster UI's toggle, or by the task
itself after its failures -- the decision and the ledger transactions that record it.

A pause is a row of ``dueledger_pauses``; it is closed (``resumed_at``), never deleted, so what
was paused, by whom and why stays answerable. Three sources open one:

- ``cli``: `dueledger pause TASK --reason` (closed by `dueledger resume`);
- ``schedule_stopped``: the task's schedule stopped in the Dagster UI, as mirrored each tick
  of ``ledger_sensor`` (policies) (:func:`sync_schedules`);
- ``pause_after_failures``: the task's last N finished entries failed
  (:func:`pause_after_failures`, ``ledger_sensor`` (policies); closed by `dueledger resume`).

**One pause, seen from both sides.** Whatever opened it, `dueledger resume` closes it, and so
does starting the schedule in the UI (a start later than the pause ends it, by
``dagster-ui``, audited). And the UI's toggle shows it: while a task has an open pause its
schedule is stopped in Dagster, and once none is left it runs again
(:func:`toggle_action`: the policy sensor stops or starts the schedule; a stop it made is not
a new pause).

While a pause is open, **one function decides for every moment**, :func:`pause_at`: the
schedule's tick runs nothing (its skip reason names the pause), a run that reaches a due of it
anyway (queued before the pause, a re-dispatch) ends it ``skipped`` at its claim, and the
policy sensor writes every due of it ``skipped`` with ``paused by NAME: REASON``
(:func:`record_paused_dues`). Whichever of the last two comes second is a no-op (the due's
entry is unique), so no due is lost or written twice. Manual launches still run: a pause
holds the schedule, not the operator.

Every state change and its audit record are one transaction. Dagster-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Final

import sqlalchemy as sa

from orchestration.task_spec import TaskSpec, TaskView, require_task
from orchestration.timetable import plan_dues
from resources.core.alerting import KIND_TASK_PAUSED
from resources.core.arguments import check_reason, require_text
from resources.core.due import Due, floor_to_slot
from resources.core.entry import Entry, Origin, Status
from resources.core.errors import InvalidInput, Refused
from resources.core.instants import iso
from resources.core.operators import UI_OPERATOR
from resources.ledger import Ledger, LedgerConflict
from resources.ledger.model import from_db, to_db
from resources.ledger.schema import pauses as pauses_table
from resources.ledger.schema import schedules

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from orchestration.services.alerts import Alerts

#: How a due skipped for a pause says so (``Pause.skip_reason``): ``paused by NAME: REASON``.
PAUSED_PREFIX: Final = "paused by "
#: Where a pause comes from.
PAUSE_SCHEDULE_STOPPED: Final = "schedule_stopped"
PAUSE_CLI: Final = "cli"
PAUSE_AFTER_FAILURES: Final = "pause_after_failures"
PAUSE_SOURCES: Final = (PAUSE_SCHEDULE_STOPPED, PAUSE_CLI, PAUSE_AFTER_FAILURES)
#: The pauses `dueledger resume` closes: every kind (the schedule then runs again).
RESUMABLE: Final = PAUSE_SOURCES
#: Who pauses a task after its failures (the pause's ``by``; audit operator).
PAUSED_BY_DUELEDGER: Final = "dueledger"
#: The audit actions of a pause and a resume.
ACTION_TASK_PAUSED: Final = "task_paused"
ACTION_TASK_RESUMED: Final = "task_resumed"
#: A schedule's states as the ledger mirrors them.
SCHEDULE_RUNNING: Final = "running"
SCHEDULE_STOPPED: Final = "stopped"
#: How far back the paused-dues sweep looks each tick.
SWEEP_WINDOW: Final = timedelta(hours=24)


def skipped_for_pause(error: str | None) -> bool:
    """Does a skipped entry's reason say a pause skipped it?"""
    return (error or "").startswith(PAUSED_PREFIX)


@dataclass(frozen=True)
class Pause:
    """One pause of a task: from ``start`` until ``end`` (None: still paused)."""

    start: datetime
    end: datetime | None
    by: str
    reason: str
    source: str = ""
    #: Its row in ``dueledger_pauses`` (None for a pause not read from the ledger).
    id: int | None = None
    task_key: str = ""

    def covers(self, due: datetime) -> bool:
        return self.start <= due and (self.end is None or due < self.end)

    @property
    def skip_reason(self) -> str:
        """What a due skipped for this pause says: ``paused by NAME: REASON``."""
        return f"{PAUSED_PREFIX}{self.by}: {self.reason}"

    def words(self) -> str:
        return f"paused by {self.by} since {iso(self.start)} ({self.source}): {self.reason}"

    def as_json(self) -> dict[str, str | None]:
        return {
            "by": self.by,
            "reason": self.reason,
            "since": iso(self.start),
            "until": iso(self.end),
            "source": self.source,
            "skip_reason": self.skip_reason,
        }


@dataclass(frozen=True)
class ScheduleState:
    """A task's schedule as last observed."""

    task_key: str
    schedule_name: str
    status: str
    first_started_at: datetime | None
    started_at: datetime | None
    observed_at: datetime


# --- reading ---------------------------------------------------------------------------------


def _pause(row: sa.RowMapping) -> Pause:
    start = from_db(row["paused_at"])
    assert start is not None  # NOT NULL
    return Pause(
        start=start,
        end=from_db(row["resumed_at"]),
        by=row["paused_by"],
        reason=row["reason"],
        source=row["source"],
        id=int(row["id"]),
        task_key=row["task_key"],
    )


def _ordered() -> sa.Select:
    return sa.select(pauses_table).order_by(pauses_table.c.paused_at, pauses_table.c.id)


def _open(conn: Connection, task_key: str | None) -> list[Pause]:
    query = _ordered().where(pauses_table.c.resumed_at.is_(None))
    if task_key is not None:
        query = query.where(pauses_table.c.task_key == task_key)
    return [_pause(r) for r in conn.execute(query).mappings()]


def open_pauses(ledger: Ledger, task_key: str | None = None) -> list[Pause]:
    """The pauses not resumed yet, of ``task_key`` (every task's when None), oldest first."""
    with ledger.connect("autocommit") as conn:
        return _open(conn, task_key)


def task_pauses(ledger: Ledger, task_key: str | None = None) -> list[Pause]:
    """The pauses of ``task_key`` (every task's when None), oldest first."""
    query = _ordered()
    if task_key is not None:
        query = query.where(pauses_table.c.task_key == task_key)
    with ledger.connect("autocommit") as conn:
        return [_pause(r) for r in conn.execute(query).mappings()]


def pauses_by_task(ledger: Ledger) -> dict[str, tuple[Pause, ...]]:
    """Every task's pauses, oldest first."""
    by_task: dict[str, list[Pause]] = {}
    for pause in task_pauses(ledger):
        by_task.setdefault(pause.task_key, []).append(pause)
    return {k: tuple(v) for k, v in by_task.items()}


def last_resume(ledger: Ledger, task_key: str) -> datetime | None:
    """When ``task_key``'s latest pause to end ended (None: none has)."""
    query = sa.select(sa.func.max(pauses_table.c.resumed_at)).where(
        pauses_table.c.task_key == task_key
    )
    with ledger.connect("autocommit") as conn:
        return from_db(conn.execute(query).scalar())


def schedule_states(ledger: Ledger) -> dict[str, ScheduleState]:
    """Every task's observed schedule, by task key."""
    with ledger.connect("autocommit") as conn:
        rows = conn.execute(sa.select(schedules)).mappings()
        return {
            r["task_key"]: ScheduleState(
                r["task_key"],
                r["schedule_name"],
                r["status"],
                from_db(r["first_started_at"]),
                from_db(r["started_at"]),
                from_db(r["observed_at"]) or datetime.min,
            )
            for r in rows
        }


# --- the decision: one function for the tick, the claim and the sweep -------------------------


def pause_at(pauses: Sequence[Pause], due: datetime) -> Pause | None:
    """The pause of ``pauses`` that holds ``due``, if any: the decision every moment asks."""
    return next((p for p in pauses if p.covers(due)), None)


def tick_skip_reason(ledger: Ledger, task_key: str, due: Due) -> str | None:
    """Why the schedule's tick of ``due`` runs nothing: an open pause of the task (None: run).
    The due's entry is written ``skipped`` by :func:`record_paused_dues`."""
    pause = pause_at(open_pauses(ledger, task_key), due.at)
    if pause is None:
        return None
    return (
        f"{task_key} {due.text}: {pause.skip_reason} (since {pause.start:%Y-%m-%dT%H:%M:%SZ}); "
        f"the due is recorded skipped; `dueledger resume {task_key} --reason TEXT` resumes it"
    )


def skip_paused_due(ledger: Ledger, entry: Entry, now: datetime | None = None) -> Entry | None:
    """At a run's claim: a fresh due entry whose due lies in a pause of its task ends
    ``skipped`` with the pause's reason; returns it so (None: not paused, claim it)."""
    if entry.origin != Origin.DUE or entry.due is None:
        return None  # not a due: a manual launch is not held by a pause
    if entry.status != Status.QUEUED or entry.attempt:
        return None
    pause = pause_at(task_pauses(ledger, entry.task_key), entry.due)
    if pause is None:
        return None
    return ledger.skip_entry(entry.id, reason=pause.skip_reason, now=now)


def record_paused_dues(
    ledger: Ledger, views: Sequence[TaskView], now: datetime, *, window: timedelta = SWEEP_WINDOW
) -> list[Entry]:
    """Write the entry of every due inside a pause (slot started, within ``window``) as
    ``skipped`` with the pause's reason, insert-or-ignore; returns the entries written."""
    written: list[Entry] = []
    by_task = pauses_by_task(ledger)
    for view in views:
        slot = timedelta(minutes=view.slot_minutes)
        horizon = floor_to_slot(now, view.slot_minutes) + slot  # dues whose slot has started
        for pause in by_task.get(view.spec.key, ()):
            start = max(pause.start, now - window)
            end = min(pause.end or horizon, horizon)
            if start >= end:
                continue
            known = ledger.due_entries(view.spec.key, start, end)
            for due in plan_dues(view.plan, view.slot_minutes, start, end):
                if due in known or not pause.covers(due):
                    continue
                entry, wrote = ledger.record_skipped_due(
                    view.spec.key,
                    due,
                    reason=pause.skip_reason,
                    max_attempts=view.spec.max_attempts,
                )
                if wrote:
                    written.append(entry)
    return written


# --- `dueledger pause` / `dueledger resume` ---------------------------------------------------


def _insert(
    conn: Connection,
    task_key: str,
    at: datetime,
    by: str,
    reason: str,
    source: str,
    *,
    resumed: tuple[datetime, str, str] | None = None,
) -> int:
    # A pause seen only once over (a stop and restart between two observations) is
    # inserted closed (``resumed``: when, by whom, why), never meeting the unique index
    # over open pauses.
    end, resumed_by, resume_reason = resumed if resumed else (None, None, None)
    result = conn.execute(
        sa.insert(pauses_table)
        .values(
            task_key=task_key,
            source=source,
            paused_at=to_db(at, "paused_at"),
            paused_by=by,
            reason=reason,
            resumed_at=to_db(end, "resumed_at") if end else None,
            resumed_by=resumed_by,
            resume_reason=resume_reason,
        )
        .returning(pauses_table.c.id)
    )
    return int(result.scalar_one())


def _close(conn: Connection, pause_id: int, at: datetime, by: str, reason: str) -> bool:
    """Close an open pause; False when another process closed it first."""
    done = conn.execute(
        sa.update(pauses_table)
        .where(pauses_table.c.id == pause_id, pauses_table.c.resumed_at.is_(None))
        .values(resumed_at=to_db(at, "resumed_at"), resumed_by=by, resume_reason=reason)
    )
    return done.rowcount == 1


def open_pause(
    ledger: Ledger,
    task_key: str,
    *,
    by: str,
    reason: str,
    source: str,
    audit: dict[str, object] | None = None,
    entry_id: int | None = None,
    now: datetime | None = None,
) -> Pause | None:
    """Open a pause of ``task_key`` from ``source`` and write its audit record, in one
    transaction; None when one from that source is open already (at most one: a unique index
    over the open pauses, so a concurrent opener loses cleanly)."""
    at = ledger.clock(now)
    try:
        with ledger.transaction() as conn:
            if any(p.source == source for p in _open(conn, task_key)):
                return None
            pause_id = _insert(conn, task_key, at, by, reason, source)
            ledger.write_audit(
                operator=by,
                action=ACTION_TASK_PAUSED,
                entry_id=entry_id,
                reason=reason,
                checks={
                    "task_key": task_key,
                    "pause_id": pause_id,
                    "source": source,
                    **(audit or {}),
                },
                outcome=f"paused: {task_key} paused by {by}",
                now=at,
                connection=conn,
            )
    except LedgerConflict:
        return None  # another process opened it between our read and our insert
    return Pause(at, None, by, reason, source, id=pause_id, task_key=task_key)


def pause_task(
    ledger: Ledger,
    specs: Sequence[TaskSpec],
    task_key: str,
    *,
    operator: str,
    reason: str,
    now: datetime | None = None,
) -> Pause:
    """`dueledger pause`: pause ``task_key`` by ``operator``, audited in the same
    transaction; Refused (nothing changed) when it is already paused so."""
    spec = require_task(specs, task_key)
    reason = _checked(reason, "why the task is paused")
    pause = open_pause(
        ledger, spec.key, by=operator, reason=reason, source=PAUSE_CLI, audit={}, now=now
    )
    if pause is None:
        existing = [p for p in open_pauses(ledger, spec.key) if p.source == PAUSE_CLI]
        state = existing[0].words() if existing else "paused by another command just now"
        raise Refused(
            f"task {spec.key!r} is already {state}; nothing changed "
            f"(`dueledger resume {spec.key} --reason TEXT` first)"
        )
    return pause


def _close_audited(
    conn: Connection,
    ledger: Ledger,
    task_key: str,
    pauses: Sequence[Pause],
    at: datetime,
    by: str,
    reason: str,
) -> list[Pause]:
    """Close ``pauses`` in ``conn``'s transaction with one ``task_resumed`` audit record for
    those this call closed (one another process closed first is not counted)."""
    closed = [
        replace(p, end=at)
        for p in pauses
        if p.id is not None and _close(conn, p.id, at, by, reason)
    ]
    if closed:
        ledger.write_audit(
            operator=by,
            action=ACTION_TASK_RESUMED,
            entry_id=None,
            reason=reason,
            checks={"task_key": task_key, "pause_ids": [p.id for p in closed]},
            outcome=f"resumed: {task_key} ({len(closed)} pause(s) closed) by {by}",
            now=at,
            connection=conn,
        )
    return closed


def close_pauses(
    ledger: Ledger,
    task_key: str,
    *,
    by: str,
    reason: str,
    sources: Sequence[str],
    now: datetime | None = None,
) -> tuple[list[Pause], list[Pause]]:
    """Close ``task_key``'s open pauses from ``sources`` and write the audit record, in one
    transaction; returns the pauses it closed and those still open. A pause another process
    closed first is not counted (one resume, one audit)."""
    at = ledger.clock(now)
    with ledger.transaction() as conn:
        open_now = _open(conn, task_key)
        chosen = [p for p in open_now if p.source in sources]
        closed = _close_audited(conn, ledger, task_key, chosen, at, by, reason)
    closed_ids = {p.id for p in closed}
    return closed, [p for p in open_now if p.id not in closed_ids]


def resume_task(
    ledger: Ledger,
    specs: Sequence[TaskSpec],
    task_key: str,
    *,
    operator: str,
    reason: str,
    now: datetime | None = None,
) -> list[Pause]:
    """`dueledger resume`: close ``task_key``'s open pauses, whatever opened them (a stop in
    the UI too: the policy sensor then starts the schedule), audited in the same transaction;
    Refused (nothing changed) when there is none to close."""
    reason = _checked(reason, "why the task is resumed")
    closed, still_open = close_pauses(
        ledger, task_key, by=operator, reason=reason, sources=RESUMABLE, now=now
    )
    if closed:
        return closed
    if not still_open:
        require_task(specs, task_key)  # unknown and never paused: invalid input
    raise Refused(f"task {task_key!r} is not paused; nothing changed")


def _checked(reason: str, what: str) -> str:
    try:
        return check_reason(reason, what)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


# --- pause on failure -------------------------------------------------------------------------


def failure_streak(
    threshold: int, finished_newest_first: Sequence[Entry], since: datetime | None
) -> tuple[Entry, ...] | None:
    """The ``threshold`` consecutive final failures that pause the task, newest first, or
    None. "Consecutive" reads the task's finished entries newest first: ``failed`` ones count,
    a ``success`` ends the streak, ``skipped`` ones (not run, on purpose) neither count nor end
    it. Only failures after ``since`` (when the task was last resumed from such a pause)
    count, so resuming it gives it ``threshold`` fresh attempts at a due."""
    streak: list[Entry] = []
    for entry in finished_newest_first:
        if since is not None and (entry.finished_at is None or entry.finished_at <= since):
            break
        if entry.status == Status.SKIPPED:
            continue
        if entry.status != Status.FAILED:
            break
        streak.append(entry)
        if len(streak) == threshold:
            return tuple(streak)
    return None


def failure_pause_reason(streak: Sequence[Entry]) -> str:
    """The pause's reason: how many failures, and which entries."""
    listed = ", ".join(f"{e.id} ({e.label}: {e.failure_kind or 'error'})" for e in streak)
    return (
        f"{len(streak)} consecutive final failures (pause_after_failures={len(streak)}): "
        f"entries {listed}"
    )


def pause_after_failures(
    ledger: Ledger, views: Sequence[TaskView], now: datetime, alerts: Alerts | None = None
) -> list[Pause]:
    """Pause every task whose last ``pause_after_failures`` finished entries failed (since it
    was last resumed from such a pause); one ``task_paused`` alert each; the pauses opened."""
    opened: list[Pause] = []
    for view in views:
        threshold = view.spec.pause_after_failures
        if not threshold:
            continue
        key = view.spec.key
        own = [p for p in task_pauses(ledger, key) if p.source == PAUSE_AFTER_FAILURES]
        if any(p.end is None for p in own):
            continue  # paused for its failures already
        since = max((p.end for p in own if p.end is not None), default=None)
        finished = ledger.latest_finished(
            key, limit=threshold, statuses=(Status.SUCCESS, Status.FAILED)
        )
        streak = failure_streak(threshold, finished, since)
        if streak is None:
            continue
        reason = failure_pause_reason(streak)
        pause = open_pause(
            ledger,
            key,
            by=PAUSED_BY_DUELEDGER,
            reason=reason,
            source=PAUSE_AFTER_FAILURES,
            audit={"entries": [e.id for e in streak]},
            entry_id=streak[0].id,
            now=now,
        )
        if pause is None:
            continue  # another process paused it first
        opened.append(pause)
        if alerts is not None:
            alerts.emit(
                KIND_TASK_PAUSED,
                f"pause:{pause.id}",
                task=key,
                pause_id=pause.id,
                paused_by=PAUSED_BY_DUELEDGER,
                since=iso(pause.start),
                reason=reason,
                entries=[e.id for e in streak],
                action=f"fix the cause, then `dueledger resume {key} --reason TEXT`",
            )
    return opened


# --- the Dagster UI's schedule toggle ----------------------------------------------------------


@dataclass(frozen=True)
class ObservedSchedule:
    """What Dagster says of a task's schedule now: running or not, and since when (and the
    ids Dagster stores its state under, for the sensor to stop or start it)."""

    running: bool
    started_at: datetime | None
    origin_id: str | None = None
    selector_id: str | None = None


def observe_schedule(
    ledger: Ledger,
    task_key: str,
    schedule_name: str,
    *,
    running: bool,
    started_at: datetime | None,
    now: datetime | None = None,
) -> list[str]:
    """Record the schedule of ``task_key`` as Dagster reports it now; what changed, in words
    (empty: nothing). A schedule seen stopped with no pause open opens one (source
    ``schedule_stopped``, by ``dagster-ui``); seen started again, that pause closes, and so do
    the task's other pauses opened before the start (the UI's start resumes any pause). A start
    later than the one recorded means it was stopped and started again unseen: that gap is
    recorded as a closed pause.
    ``first_started_at`` keeps the earliest start."""
    require_text(task_key, "task_key")
    at = ledger.clock(now)
    status = SCHEDULE_RUNNING if running else SCHEDULE_STOPPED
    changes: list[str] = []
    with ledger.transaction() as conn:
        row = (
            conn.execute(sa.select(schedules).where(schedules.c.task_key == task_key))
            .mappings()
            .first()
        )
        previous_start = from_db(row["started_at"]) if row else None
        first = from_db(row["first_started_at"]) if row else None
        if started_at is not None and (first is None or started_at < first):
            first = started_at
        values = {
            "schedule_name": schedule_name,
            "status": status,
            "first_started_at": to_db(first, "first_started_at"),
            "started_at": to_db(started_at if running else previous_start, "started_at"),
            "observed_at": to_db(at, "now"),
        }
        if row is None:
            conn.execute(sa.insert(schedules).values(task_key=task_key, **values))
            changes.append(f"schedule {schedule_name} first seen {status}")
        else:
            conn.execute(
                sa.update(schedules).where(schedules.c.task_key == task_key).values(**values)
            )
        open_now = _open(conn, task_key)
        stopped = [p for p in open_now if p.source == PAUSE_SCHEDULE_STOPPED]
        restarted = (
            row is not None
            and running
            and started_at is not None
            and (
                row["status"] == SCHEDULE_STOPPED
                or (previous_start is not None and started_at > previous_start)
            )
        )
        if restarted and started_at is not None:
            # Started in the UI after a pause of another kind: that start resumes it. (Only a
            # start seen happen: a pause made before the scheduler first ran stays open.)
            ended = [p for p in open_now if p not in stopped and p.start < started_at]
            if ended:
                why = f"schedule {schedule_name} started in the Dagster UI"
                _close_audited(conn, ledger, task_key, ended, at, UI_OPERATOR, why)
                changes.append(
                    f"schedule {schedule_name} started in Dagster: {len(ended)} pause(s) resumed"
                )
        if not running and not open_now:
            # A fresh stop with no pause to explain it: the UI's toggle. (A stop while
            # another pause is open is that pause shown: the policy sensor's own stop.)
            _insert(
                conn,
                task_key,
                at,
                UI_OPERATOR,
                f"schedule {schedule_name} stopped in Dagster",
                PAUSE_SCHEDULE_STOPPED,
            )
            changes.append(f"schedule {schedule_name} stopped: paused")
        elif running and stopped and stopped[-1].id is not None:
            _close(conn, stopped[-1].id, at, UI_OPERATOR, "schedule started again")
            changes.append(f"schedule {schedule_name} running again: resumed")
        elif (
            running
            and row is not None
            and previous_start is not None
            and started_at is not None
            and started_at > previous_start
            and row["status"] == SCHEDULE_RUNNING
        ):
            # Stopped and started again between two observations: the gap was a pause.
            _insert(
                conn,
                task_key,
                from_db(row["observed_at"]) or at,
                UI_OPERATOR,
                f"schedule {schedule_name} stopped and started again (restarted at "
                f"{started_at:%Y-%m-%dT%H:%M:%SZ})",
                PAUSE_SCHEDULE_STOPPED,
                resumed=(started_at, UI_OPERATOR, "schedule started again"),
            )
            changes.append(f"schedule {schedule_name} restarted: the gap is a pause")
    return changes


class ToggleAction(StrEnum):
    """What the policy sensor does to a task's schedule so the UI's toggle shows its pause."""

    STOP = "stop"
    START = "start"


def toggle_action(
    mirrored: ScheduleState | None, observed: ObservedSchedule, open_now: Sequence[Pause]
) -> ToggleAction | None:
    """The toggle's side of a pause, decided after :func:`sync_schedules` recorded what the UI
    did: a running schedule with an open pause is stopped; a schedule the ledger has already
    seen stopped, with no pause left open (`dueledger resume` closed them), is started. None:
    the toggle already shows the ledger. A schedule seen stopped for the first time opened a
    pause of its own in :func:`sync_schedules`, so it is never started here."""
    if observed.running:
        return ToggleAction.STOP if open_now else None
    if not open_now and mirrored is not None and mirrored.status == SCHEDULE_STOPPED:
        return ToggleAction.START
    return None


def sync_schedules(
    ledger: Ledger,
    views: Sequence[TaskView],
    observed: Mapping[str, ObservedSchedule],
    now: datetime,
) -> list[str]:
    """Mirror Dagster's state of every task's schedule (``observed``, by schedule name: what
    the policy sensor read of Dagster) into the ledger; what changed, in words. A write only
    for a schedule whose state changed, plus one statement stamping when the others were all
    seen (a later restart is then dated from the last time they were seen running)."""
    known = schedule_states(ledger)
    changes: list[str] = []
    seen: list[str] = []
    for view in views:
        spec = view.spec
        state = observed.get(spec.schedule_name)
        if state is None:
            continue  # the scheduler has not stored it yet (it does at its first iteration)
        row = known.get(spec.key)
        if row is not None and _unchanged(row, state):
            seen.append(spec.key)
            continue
        for change in observe_schedule(
            ledger,
            spec.key,
            spec.schedule_name,
            running=state.running,
            started_at=state.started_at,
            now=now,
        ):
            changes.append(f"{spec.key}: {change}")
    if seen:
        with ledger.transaction() as conn:
            conn.execute(
                sa.update(schedules)
                .where(schedules.c.task_key.in_(seen))
                .values(observed_at=to_db(now, "now"))
            )
    return changes


def _unchanged(row: ScheduleState, state: ObservedSchedule) -> bool:
    status_same = (row.status == SCHEDULE_RUNNING) == state.running
    return status_same and (not state.running or row.started_at == state.started_at)
