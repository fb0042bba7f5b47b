"""Liveness: is the Dagster daemon's scheduler alive, and are slots being evaluated?

Two checks, each fresh or stale against ``max_age``:

- ``scheduler_heartbeat``: the newest heartbeat of the daemon's SCHEDULER thread
  (``DagsterInstance.get_daemon_heartbeats()``; the daemon writes one every few seconds).
- ``slot_evaluation``: the newest due a task schedule created a run for, against the
  dues the registry's rules imply. Stale when the first due expected after it is older
  than ``max_age`` with no scheduled run for it — the daemon is up but schedules are not
  evaluated (code location fails to load, schedules stopped, tick errors).

Used by `dueledger liveness` (exit 0 fresh, 1 stale) from system cron or a Kubernetes probe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import dagster as dg

from orchestration.missed_dues import expected_dues
from orchestration.task_spec import TaskView
from resources.core import tags as t
from resources.core.due import floor_to_slot, format_due, parse_due
from resources.core.entry import Trigger

SCHEDULER_DAEMON: Final = "SCHEDULER"
DEFAULT_MAX_AGE: Final = timedelta(seconds=180)
#: How many of the newest scheduled runs are read to find the newest due.
_RECENT_RUNS: Final = 50


@dataclass(frozen=True)
class Check:
    """One liveness check: fresh or not, how old its evidence is, in words."""

    name: str
    fresh: bool
    age_seconds: int | None
    observed_at: datetime | None
    detail: str

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fresh": self.fresh,
            "age_seconds": self.age_seconds,
            "observed_at": format_due(self.observed_at) if self.observed_at else None,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class LivenessReport:
    now: datetime
    max_age: timedelta
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.fresh for c in self.checks)

    @property
    def stale(self) -> list[str]:
        return [c.name for c in self.checks if not c.fresh]

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "stale": self.stale,
            "max_age_seconds": int(self.max_age.total_seconds()),
            "now": format_due(self.now),
            "checks": [c.as_json() for c in self.checks],
        }


def _age(now: datetime, then: datetime) -> int:
    return int((now - then).total_seconds())


def scheduler_heartbeat_check(
    instance: dg.DagsterInstance, now: datetime, max_age: timedelta
) -> Check:
    """Fresh when the daemon's scheduler heartbeat is at most ``max_age`` old."""
    heartbeat = instance.get_daemon_heartbeats().get(SCHEDULER_DAEMON)
    if heartbeat is None:
        return Check(
            "scheduler_heartbeat",
            False,
            None,
            None,
            "no scheduler heartbeat recorded: is `dagster-daemon run` (or `dagster dev`) "
            "running against this DAGSTER_HOME?",
        )
    at = datetime.fromtimestamp(heartbeat.timestamp, tz=UTC)
    age = _age(now, at)
    fresh = age <= max_age.total_seconds()
    detail = f"scheduler heartbeat {age}s old" + (
        "" if fresh else f" (limit {int(max_age.total_seconds())}s)"
    )
    return Check("scheduler_heartbeat", fresh, age, at, detail)


def latest_scheduled_due(instance: dg.DagsterInstance) -> tuple[datetime, str] | None:
    """The newest due any task schedule created a run for, and that run's id."""
    records = instance.get_run_records(
        filters=dg.RunsFilter(tags={t.TAG_TRIGGER: Trigger.SCHEDULE.value}), limit=_RECENT_RUNS
    )
    best: tuple[datetime, str] | None = None
    for record in records:
        text = record.dagster_run.tags.get(t.TAG_DUE)
        try:
            due = parse_due(text) if text else None
        except ValueError:
            due = None
        if due is not None and (best is None or due > best[0]):
            best = (due, record.dagster_run.run_id)
    return best


def next_expected_due(views: Sequence[TaskView], after: datetime, now: datetime) -> datetime | None:
    """The first due after ``after`` (up to ``now``) that any task's rule implies."""
    candidates = [
        dues[0]
        for v in views
        if (
            dues := expected_dues(
                v,
                after + timedelta(seconds=1),
                floor_to_slot(now, v.slot_minutes) + timedelta(seconds=1),
            )
        )
    ]
    return min(candidates) if candidates else None


def slot_evaluation_check(
    instance: dg.DagsterInstance, views: Sequence[TaskView], now: datetime, max_age: timedelta
) -> Check:
    """Fresh unless a due the rules imply has gone unscheduled for more than ``max_age``."""
    latest = latest_scheduled_due(instance)
    if latest is None:
        return Check(
            "slot_evaluation",
            False,
            None,
            None,
            "no task schedule has created a run yet (schedules stopped, or the code location "
            "does not load in the daemon)",
        )
    due, run_id = latest
    expected = next_expected_due(views, due, now)
    if expected is None:
        return Check(
            "slot_evaluation",
            True,
            _age(now, due),
            due,
            f"latest scheduled due {format_due(due)} (run {run_id}); no due expected since",
        )
    overdue = _age(now, expected)
    fresh = overdue <= max_age.total_seconds()
    detail = (
        f"latest scheduled due {format_due(due)} (run {run_id}); next expected due "
        f"{format_due(expected)} has no scheduled run, {overdue}s after it"
    )
    if fresh:
        detail += f" (within the {int(max_age.total_seconds())}s limit)"
    return Check("slot_evaluation", fresh, overdue, due, detail)


def check_liveness(
    instance: dg.DagsterInstance,
    views: Sequence[TaskView],
    now: datetime,
    max_age: timedelta = DEFAULT_MAX_AGE,
) -> LivenessReport:
    """Both checks as of ``now``."""
    if max_age <= timedelta(0):
        raise ValueError(f"max_age must be positive, got {max_age}")
    return LivenessReport(
        now,
        max_age,
        (
            scheduler_heartbeat_check(instance, now, max_age),
            slot_evaluation_check(instance, views, now, max_age),
        ),
    )
