"""`dueledger pause TASK --reason` and `dueledger resume TASK --reason`, with their audit.

A pause is a row of ``dueledger_pauses`` (source ``cli``), the table that also holds a task's
schedule stopped in the Dagster UI (``schedule_stopped``, by ``dagster-ui``) and a task that
paused itself after its failures (``pause_after_failures``, by ``dueledger``). While a pause is
open the task's schedule ticks run nothing (their skip reason names the pause), every due is
recorded ``skipped`` with ``paused by NAME: REASON``, and `dueledger tasks` shows who paused it,
since when and why. Manual launches still run: a pause holds the schedule, not the operator.

Resuming closes the task's ``cli`` and ``pause_after_failures`` pauses; a schedule stopped in
the Dagster UI is started there (dueledger does not start Dagster schedules).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from orchestration.task_spec import TaskSpec, find_task
from resources.core.arguments import check_reason
from resources.core.dues import Pause
from resources.core.errors import InvalidInput, Refused
from resources.core.instants import iso
from resources.core.pausing import ACTION_TASK_PAUSED, ACTION_TASK_RESUMED
from resources.ledger import Ledger
from resources.ledger.scheduling import PAUSE_AFTER_FAILURES, PAUSE_CLI, PAUSE_SCHEDULE_STOPPED

#: The pauses `dueledger resume` closes.
RESUMABLE: tuple[str, ...] = (PAUSE_CLI, PAUSE_AFTER_FAILURES)


def _reason(reason: str, what: str) -> str:
    try:
        return check_reason(reason, what)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def _registered(specs: Sequence[TaskSpec], task_key: str) -> TaskSpec:
    spec = find_task(specs, task_key)
    if spec is None:
        known = ", ".join(s.key for s in specs)
        raise InvalidInput(f"unknown task {task_key!r}; registered tasks: {known}")
    return spec


def pause_words(pause: Pause) -> str:
    return f"paused by {pause.by} since {iso(pause.start)} ({pause.source}): {pause.reason}"


def pause_task(
    ledger: Ledger,
    specs: Sequence[TaskSpec],
    task_key: str,
    *,
    operator: str,
    reason: str,
    now: datetime | None = None,
) -> Pause:
    """Pause ``task_key`` by ``operator``; Refused (nothing changed) when already paused so."""
    spec = _registered(specs, task_key)
    reason = _reason(reason, "why the task is paused")
    pause = ledger.pause_task(spec.key, by=operator, reason=reason, source=PAUSE_CLI, now=now)
    if pause is None:
        existing = next(p for p in ledger.open_pauses(spec.key) if p.source == PAUSE_CLI)
        raise Refused(
            f"task {spec.key!r} is already {pause_words(existing)}; nothing changed "
            f"(`dueledger resume {spec.key} --reason TEXT` first)"
        )
    ledger.write_audit(
        operator=operator,
        action=ACTION_TASK_PAUSED,
        entry_id=None,
        reason=reason,
        checks={"task_key": spec.key, "pause_id": pause.id, "source": PAUSE_CLI},
        outcome=f"paused: {spec.key} paused by {operator}",
        now=now,
    )
    return pause


def resume_task(
    ledger: Ledger,
    specs: Sequence[TaskSpec],
    task_key: str,
    *,
    operator: str,
    reason: str,
    now: datetime | None = None,
) -> list[Pause]:
    """Close ``task_key``'s ``cli`` and ``pause_after_failures`` pauses; Refused (nothing
    changed) when there is none, naming a schedule stopped in the UI if that is the pause."""
    reason = _reason(reason, "why the task is resumed")
    open_pauses = ledger.open_pauses(task_key)
    if find_task(specs, task_key) is None and not open_pauses:
        _registered(specs, task_key)  # unknown and never paused: invalid input
    closed = ledger.resume_task(task_key, by=operator, reason=reason, sources=RESUMABLE, now=now)
    if not closed:
        stopped = [p for p in open_pauses if p.source == PAUSE_SCHEDULE_STOPPED]
        if stopped:
            raise Refused(
                f"task {task_key!r} is {pause_words(stopped[0])}: start its schedule in the "
                f"Dagster UI (Automation); nothing changed"
            )
        raise Refused(f"task {task_key!r} is not paused; nothing changed")
    ledger.write_audit(
        operator=operator,
        action=ACTION_TASK_RESUMED,
        entry_id=None,
        reason=reason,
        checks={"task_key": task_key, "pause_ids": [p.id for p in closed]},
        outcome=f"resumed: {task_key} ({len(closed)} pause(s) closed) by {operator}",
        now=now,
    )
    return closed
