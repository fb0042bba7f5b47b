"""What a task is: its declaration (:class:`TaskSpec`), the checks a declaration must pass, and
the view of it under this process's slot and time zone (:class:`TaskView`). Dagster-free.

A task is declared once, in the ``defs.yaml`` beside its body (``orchestration/declarations.py``
reads it); everything Dagster sees -- the job, the schedule, its cron and time zone, tags,
descriptions -- is derived from the spec and its timetable (``orchestration/timetable.py``).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Final

from orchestration.timetable import (
    Cron,
    EverySlots,
    ListedDue,
    NthSlotOfDay,
    Rule,
    SchedulePlan,
    Window,
    list_dues,
    local_cron,
    schedule_plan,
    zone_problem,
)
from resources.core.due import Due, floor_to_slot
from resources.core.errors import InvalidInput
from resources.core.instants import as_utc
from resources.core.slots import Cadence, cron_cadence, cron_effective_cadence, is_valid_cron
from resources.core.tags import (
    DAGSTER_MAX_RETRIES,
    DAGSTER_MAX_RUNTIME,
    SOURCE_CORE,
    SOURCE_PLUGIN_PREFIX,
    TAG_SOURCE,
    TAG_TASK,
)


class OverlapPolicy(StrEnum):
    """What a run does when its task is already running (the rule: ``orchestration/overlap.py``)."""

    #: Later runs wait in the task's Dagster pool (one run of the task at a time).
    QUEUE = "queue"
    #: A run that finds the task running is not run: its entry ends ``skipped``.
    SKIP = "skip"
    #: At most one run waits for the running one; any further one is ``skipped``.
    BUFFER_ONE = "buffer_one"
    #: A new run ends the running one (``failed``, kind ``replaced``) and runs.
    REPLACE = "replace"
    #: Runs of the task run side by side (a task declared ``concurrent_safe=True`` only).
    ALLOW = "allow"


class MissedSlotPolicy(StrEnum):
    """What becomes of a due the scheduler never fired (``orchestration/catch_up.py``)."""

    #: Only the current slot runs; a missed due is reported, not run.
    STRICT_CURRENT_SLOT = "strict_current_slot"
    #: A missed due inside ``catch_up_window`` is run by the task's catch-up sensor.
    CATCH_UP = "catch_up"


#: The overlap policies the ledger decides when a run claims (their task asset has no Dagster
#: pool, so a second run starts and asks); ``queue`` is Dagster's pool, ``allow`` is nothing.
LEDGER_OVERLAP_POLICIES: Final = (
    OverlapPolicy.SKIP,
    OverlapPolicy.BUFFER_ONE,
    OverlapPolicy.REPLACE,
)
#: A catch-up window longer than this would let a long outage replay a flood of dues.
MAX_CATCH_UP_WINDOW: Final = timedelta(days=7)
#: Longest deadline: the deadline sweep and ``deadline_missed_24h`` look this far back.
MAX_DEADLINE: Final = timedelta(days=7)
#: Longest first wait before an automatic retry (it doubles with each attempt after).
MAX_RETRY_BACKOFF: Final = timedelta(hours=1)
#: Most consecutive failures a task may wait for before it pauses itself.
MAX_PAUSE_AFTER_FAILURES: Final = 1000
#: Partitioning a task's asset may declare: one partition per UTC day (backfills by day).
PARTITIONS_DAILY: Final = "daily"
PARTITION_SCHEMES: Final = (PARTITIONS_DAILY,)
#: First day of daily partitions (a backfill cannot reach further back).
DAILY_PARTITIONS_START: Final = "2025-01-01"

_SNAKE_CASE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")


class CadenceWarning(UserWarning):
    """A task declares a cadence finer than the slot allows: it runs once per slot. Warned
    when the code location loads; the CLI shows it as the task's effective cadence instead."""


class TaskSpecError(ValueError):
    """A task declaration is invalid; the message names the task and the field."""

    def __init__(self, task_key: str, field_name: str, problem: str) -> None:
        super().__init__(
            f"task {task_key!r}: {field_name}: {problem} (fix it where the task is declared, "
            f"its defs.yaml)"
        )
        self.task_key = task_key
        self.field_name = field_name
        #: The problem alone (a plugin's load error words the rest itself).
        self.problem = problem


class UnknownTask(InvalidInput):
    """No registered task has this key (exit 2); the message lists the registered ones."""


# --- task spec ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskSpec:
    """One unit of scheduled work: a Dagster job materializing the asset ``key``, on ``rule``."""

    key: str
    rule: Rule
    declared_cadence: str
    description: str = ""
    timeout: timedelta = timedelta(minutes=10)
    lease_ttl: timedelta = timedelta(minutes=15)
    max_attempts: int = 3
    manual_trigger: bool = True
    missed_slot_policy: str = MissedSlotPolicy.STRICT_CURRENT_SLOT
    catch_up_window: timedelta | None = None
    #: What a run does when the task is already running.
    overlap_policy: str = OverlapPolicy.QUEUE
    #: The task's runs may overlap without harm (required by overlap_policy="allow").
    concurrent_safe: bool = False
    #: After this many consecutive final failures the task pauses itself (None: never).
    pause_after_failures: int | None = None
    #: A due not ``success`` this long after it raises ``deadline_missed`` (None: no deadline).
    deadline: timedelta | None = None
    #: An automatic retry waits this long after the failed attempt, doubling with each
    #: attempt (0: retry at once). Dagster launches its retry runs at once; the wait is at
    #: the retry's claim (``orchestration/retry.py``).
    retry_backoff: timedelta = timedelta(seconds=60)
    #: IANA zone its Cron / NthSlotOfDay rule is read in (None: ``DUELEDGER_TIMEZONE``).
    timezone: str | None = None
    #: None, or "daily": the asset has UTC-daily partitions and each scheduled run
    #: targets the partition of its due's day (so the UI can backfill by day).
    partitions: str | None = None
    #: Where the task is declared: "core" (a folder of ``assets/``) or "plugin:<name>", set by
    #: the loader (``orchestration/declarations.py``), never by a declaration itself.
    source: str = SOURCE_CORE

    def __post_init__(self) -> None:
        # Policies are kept as their plain names: they travel into Dagster metadata, whose
        # serializer refuses enum members.
        for name in ("overlap_policy", "missed_slot_policy"):
            value = getattr(self, name)
            if isinstance(value, StrEnum):
                object.__setattr__(self, name, value.value)

    @property
    def asset(self) -> str:
        """The task's asset: named after the task."""
        return self.key

    @property
    def from_plugin(self) -> bool:
        """Declared by an installed plugin, not in a folder of ``assets/``."""
        return self.source != SOURCE_CORE

    @property
    def job_name(self) -> str:
        return f"{self.key}_job"

    @property
    def schedule_name(self) -> str:
        return f"{self.key}_schedule"

    @property
    def uses_task_pool(self) -> bool:
        """Does the task's asset sit in a Dagster pool of one slot (overlap ``queue``)?"""
        return self.overlap_policy == OverlapPolicy.QUEUE


@dataclass(frozen=True)
class TaskView:
    """A task with everything derived from the slot and timezone (what `tasks` shows)."""

    spec: TaskSpec
    plan: SchedulePlan
    declared: Cadence
    effective: Cadence
    slot_minutes: int
    warnings: tuple[str, ...] = field(default=())
    #: The zone the task's rule is read in (its ``timezone``, else ``DUELEDGER_TIMEZONE``).
    zone: str = "UTC"

    @property
    def rule_zone(self) -> str:
        """The zone the rule is read in: UTC for ``EverySlots``, else the task's zone."""
        return "UTC" if isinstance(self.spec.rule, EverySlots) else self.zone

    def dues(
        self,
        start: datetime,
        *,
        end: datetime | None = None,
        count: int | None = None,
        pauses: Sequence[Window] = (),
    ) -> list[ListedDue]:
        """The dues the task's schedule produces from ``start`` (see ``timetable.list_dues``)."""
        return list_dues(
            self.plan,
            self.slot_minutes,
            self.rule_zone,
            start,
            step=timedelta(minutes=self.effective.minutes),
            end=end,
            count=count,
            pauses=pauses,
        )

    def next_dues(
        self, now: datetime, count: int, pauses: Sequence[Window] = ()
    ) -> list[ListedDue]:
        """The ``count`` dues after ``now``'s slot: what `dueledger dues --next` lists and
        ``ledger_health``'s table shows."""
        start = floor_to_slot(now, self.slot_minutes) + timedelta(minutes=self.slot_minutes)
        return self.dues(start, count=count, pauses=pauses)

    def as_json(self) -> dict[str, object]:
        s = self.spec
        return {
            "key": s.key,
            "rule": s.rule.describe(),
            "declared_cadence": s.declared_cadence,
            "declared_interval_minutes": self.declared.minutes,
            "effective_cadence": self.effective.label,
            "effective_interval_minutes": self.effective.minutes,
            "slot_minutes": self.slot_minutes,
            # The rule's cron as it is read, in its own zone; what Dagster fires on (UTC crons
            # around a clock change) is "schedule_crons".
            "cron": self.plan.zoned_cron or self.plan.cron,
            "timezone": self.rule_zone,
            "schedule_crons": list(self.plan.crons),
            "schedule_timezone": self.plan.timezone,
            "job": s.job_name,
            "schedule": s.schedule_name,
            "asset": s.asset,
            "timeout_seconds": int(s.timeout.total_seconds()),
            "lease_ttl_seconds": int(s.lease_ttl.total_seconds()),
            "max_attempts": s.max_attempts,
            "manual_trigger": s.manual_trigger,
            "missed_slot_policy": s.missed_slot_policy,
            "catch_up_window_seconds": (
                int(s.catch_up_window.total_seconds()) if s.catch_up_window else None
            ),
            "overlap_policy": s.overlap_policy,
            "concurrent_safe": s.concurrent_safe,
            "pause_after_failures": s.pause_after_failures,
            "deadline_seconds": int(s.deadline.total_seconds()) if s.deadline else None,
            "retry_backoff_seconds": int(s.retry_backoff.total_seconds()),
            "partitions": s.partitions,
            "source": s.source,
            "warnings": list(self.warnings),
        }


def _cadences(rule: Rule, slot_minutes: int, timezone: str) -> tuple[Cadence, Cadence]:
    if isinstance(rule, Cron | NthSlotOfDay):
        expression = local_cron(rule, slot_minutes)
        return (
            cron_cadence(expression, timezone),
            cron_effective_cadence(expression, slot_minutes, timezone),
        )
    return Cadence(rule.n * slot_minutes), Cadence(rule.n * slot_minutes)


def _policy_problem(spec: TaskSpec) -> tuple[str, str] | None:
    """The first problem of a declaration's policy values, as ``(field, problem)``."""
    overlap, safe, after = spec.overlap_policy, spec.concurrent_safe, spec.pause_after_failures
    if overlap not in tuple(OverlapPolicy):
        return (
            "overlap_policy",
            f"unknown policy {overlap!r}; use one of {', '.join(OverlapPolicy)}",
        )
    if not isinstance(safe, bool):
        return "concurrent_safe", f"must be True or False, got {safe!r}"
    if overlap == OverlapPolicy.ALLOW and not safe:
        return (
            "overlap_policy",
            "'allow' runs several runs of the task at once; declare concurrent_safe=True only "
            "when its side effects stay exactly-once under concurrency, else use 'queue'",
        )
    if after is not None and (
        isinstance(after, bool)
        or not isinstance(after, int)
        or not 1 <= after <= MAX_PAUSE_AFTER_FAILURES
    ):
        return (
            "pause_after_failures",
            f"must be None or a whole number from 1 to {MAX_PAUSE_AFTER_FAILURES}, got {after!r}",
        )
    deadline = spec.deadline
    if deadline is not None and (
        not isinstance(deadline, timedelta) or not timedelta(0) < deadline <= MAX_DEADLINE
    ):
        return (
            "deadline",
            f"must be None or a duration after the due in (0, {MAX_DEADLINE}], got {deadline!r}",
        )
    backoff = spec.retry_backoff
    if not isinstance(backoff, timedelta) or not timedelta(0) <= backoff <= MAX_RETRY_BACKOFF:
        return (
            "retry_backoff",
            f"must be a duration in [0, {MAX_RETRY_BACKOFF}] (0: retry at once), got {backoff!r}",
        )
    if spec.timezone is not None:
        problem = zone_problem(spec.timezone)
        if problem is not None:
            return "timezone", problem
    return None


def validate_spec(spec: TaskSpec, slot_minutes: int) -> None:
    """Raise TaskSpecError naming the task and the field for the first problem found."""
    key = spec.key
    if not isinstance(key, str) or not _SNAKE_CASE.match(key):
        raise TaskSpecError(str(key), "key", "must be snake_case, e.g. 'order_cleanup'")
    rule = spec.rule
    if isinstance(rule, Cron):
        if not is_valid_cron(rule.expression):
            raise TaskSpecError(
                key, "rule", f"invalid cron expression {rule.expression!r} (five fields expected)"
            )
    elif isinstance(rule, EverySlots):
        if not isinstance(rule.n, int) or rule.n < 1:
            raise TaskSpecError(key, "rule", f"EverySlots(n={rule.n!r}) needs n >= 1")
    elif isinstance(rule, NthSlotOfDay):
        per_day = 1440 // slot_minutes
        if not isinstance(rule.n, int) or not 0 <= rule.n < per_day:
            raise TaskSpecError(
                key,
                "rule",
                f"NthSlotOfDay(n={rule.n!r}) must be in 0..{per_day - 1} "
                f"for {slot_minutes}-minute slots",
            )
    else:
        raise TaskSpecError(
            key, "rule", f"unknown rule {rule!r}; use Cron, EverySlots or NthSlotOfDay"
        )
    if not spec.declared_cadence.strip():
        raise TaskSpecError(key, "declared_cadence", "must say how often the task is meant to run")
    if spec.timeout <= timedelta(0):
        raise TaskSpecError(key, "timeout", f"must be positive, got {spec.timeout}")
    if spec.lease_ttl <= spec.timeout:
        raise TaskSpecError(
            key,
            "lease_ttl",
            f"{spec.lease_ttl} must be greater than timeout {spec.timeout}, or a run still "
            f"inside its timeout could be reclaimed",
        )
    if not isinstance(spec.max_attempts, int) or spec.max_attempts < 1:
        raise TaskSpecError(key, "max_attempts", f"must be >= 1, got {spec.max_attempts!r}")
    if spec.missed_slot_policy not in tuple(MissedSlotPolicy):
        raise TaskSpecError(
            key,
            "missed_slot_policy",
            f"unknown policy {spec.missed_slot_policy!r}; use one of {', '.join(MissedSlotPolicy)}",
        )
    if spec.missed_slot_policy == MissedSlotPolicy.CATCH_UP:
        window = spec.catch_up_window
        if window is None or not timedelta(0) < window <= MAX_CATCH_UP_WINDOW:
            raise TaskSpecError(
                key,
                "catch_up_window",
                f"catch_up needs a bounded window in (0, {MAX_CATCH_UP_WINDOW}], got {window}",
            )
    elif spec.catch_up_window is not None:
        raise TaskSpecError(
            key, "catch_up_window", "only meaningful with missed_slot_policy='catch_up'"
        )
    if spec.partitions is not None and spec.partitions not in PARTITION_SCHEMES:
        raise TaskSpecError(
            key,
            "partitions",
            f"unknown scheme {spec.partitions!r}; "
            f"use None or one of {', '.join(PARTITION_SCHEMES)}",
        )
    problem = _policy_problem(spec)
    if problem is not None:
        raise TaskSpecError(key, *problem)
    source = spec.source
    if source != SOURCE_CORE and not (
        isinstance(source, str)
        and source.startswith(SOURCE_PLUGIN_PREFIX)
        and len(source) > len(SOURCE_PLUGIN_PREFIX)
    ):
        raise TaskSpecError(
            key,
            "source",
            f"{source!r} is neither {SOURCE_CORE!r} nor '{SOURCE_PLUGIN_PREFIX}<name>' "
            f"(the plugin loader sets it; leave it out of a declaration)",
        )


def build_views(specs: Sequence[TaskSpec], slot_minutes: int, timezone: str) -> list[TaskView]:
    """Validate every spec and derive plan and cadences; duplicates are an error.

    A load-time ``UserWarning`` is emitted for every task whose declared cadence is finer
    than what its slot allows, so the difference shows up in `dg dev` logs too.
    """
    seen: set[str] = set()
    views: list[TaskView] = []
    for spec in specs:
        validate_spec(spec, slot_minutes)
        if spec.key in seen:
            raise TaskSpecError(spec.key, "key", "is declared twice; task keys must be unique")
        seen.add(spec.key)
        zone = spec.timezone or timezone
        plan = schedule_plan(spec.rule, slot_minutes, zone)
        declared, effective = _cadences(spec.rule, slot_minutes, zone)
        notes: list[str] = []
        if declared.minutes < effective.minutes:
            notes.append(
                f"task {spec.key!r} declares {declared.label} ({spec.rule.describe()}) but "
                f"runs {effective.label} on {slot_minutes}-minute slots"
            )
        for note in notes:
            warnings.warn(note, CadenceWarning, stacklevel=2)
        views.append(
            TaskView(spec, plan, declared, effective, slot_minutes, tuple(notes), zone=zone)
        )
    return views


def partition_key_for(spec: TaskSpec, due: Due | datetime) -> str | None:
    """The partition a scheduled run of ``spec`` at ``due`` targets (None: unpartitioned).

    Daily partitions are UTC days, like dues: ``2026-11-30T22:45:00Z`` -> ``2026-11-30``.
    """
    if spec.partitions == PARTITIONS_DAILY:
        return as_utc(due.at if isinstance(due, Due) else due).strftime("%Y-%m-%d")
    return None


def task_run_tags(spec: TaskSpec) -> dict[str, str]:
    """Tags every run of a task carries, whoever launches it.

    ``dueledger/task`` drives the run queue's one-per-task limit (overlap policy
    ``queue``); ``dagster/max_retries`` turns Dagster run retries into ledger attempts;
    ``dagster/max_runtime`` lets run monitoring end a run that outlives its timeout;
    ``dueledger/source`` (plugin tasks only) keeps the plugin's name on the run, for when
    the plugin is gone. Dagster applies a job's run tags to schedule runs but not to runs
    submitted with ``dagster job launch`` or GraphQL, so manual launches and retries add
    them explicitly.
    """
    tags = {
        TAG_TASK: spec.key,
        DAGSTER_MAX_RETRIES: str(spec.max_attempts - 1),
        DAGSTER_MAX_RUNTIME: str(int(spec.timeout.total_seconds())),
    }
    if spec.from_plugin:
        tags[TAG_SOURCE] = spec.source
    return tags


def task_keys_of_run(
    specs: Iterable[TaskSpec],
    job_name: str | None,
    asset_keys: Iterable[str] | None,
    tags: Mapping[str, str],
) -> tuple[str, ...]:
    """The tasks a Dagster run belongs to, from what Dagster records (attribution).

    Its ``dueledger/task`` tag when it has one; else its job (``<task>_job``); else the
    tasks whose assets it executes (the implicit asset job of a Catalog "Materialize" or an
    asset-graph backfill; a run of several task assets belongs to each of them), as the
    task asset itself decides when it claims. No task: ``()``. ``asset_keys`` are the run's
    selected assets as user strings (``AssetKey.to_user_string()``).
    """
    tagged = tags.get(TAG_TASK)
    if tagged:
        return (tagged,)
    specs = list(specs)
    for spec in specs:
        if spec.job_name == job_name:
            return (spec.key,)
    selected = set(asset_keys or ())
    return tuple(spec.key for spec in specs if spec.asset in selected)


def find_task(specs: Iterable[TaskSpec], key: str) -> TaskSpec | None:
    """The spec registered under ``key``, or None."""
    return next((s for s in specs if s.key == key), None)


def require_task(specs: Iterable[TaskSpec], key: str) -> TaskSpec:
    """The spec registered under ``key``; :class:`UnknownTask` listing the registered ones."""
    specs = list(specs)
    spec = find_task(specs, key)
    if spec is None:
        known = ", ".join(s.key for s in specs) or "none"
        raise UnknownTask(f"unknown task {key!r}; registered tasks: {known}")
    return spec
