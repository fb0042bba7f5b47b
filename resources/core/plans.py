"""Rules, and the Dagster schedule each implies: its crons, its zone, and which ticks are dues.

A task's rule (:class:`Cron`, :class:`EverySlots`, :class:`NthSlotOfDay`) maps onto one
Dagster schedule (:func:`schedule_plan`); every tick of it is judged by :func:`decide_tick`,
a pure function of the tick's scheduled time; :func:`plan_dues` lists the dues of a window
the same way (the gap audit, `dueledger dues`, catch-up, deadlines). Rules read in a time zone
follow the DST rule of ``resources/core/zoned.py``. Nothing here imports Dagster.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from resources.core.due import Due, floor_to_slot, format_due
from resources.core.slots import cron_fire_times, first_fire_in_slot, slot_aligned_cron, slot_index
from resources.core.zoned import (
    is_due,
    meets_transitions,
    not_due_reason,
    utc_crons,
    zoned_dues,
)


# --- rules ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cron:
    """Run at the fires of a five-field cron expression, read in the task's time zone."""

    expression: str

    def describe(self) -> str:
        return f"cron '{self.expression}'"


@dataclass(frozen=True)
class EverySlots:
    """Run every ``n`` slots, counted from 1970-01-01T00:00Z (so ``n=4`` on 15-minute
    slots runs on the UTC hour)."""

    n: int

    def describe(self) -> str:
        return f"every {self.n} slot{'s' if self.n != 1 else ''}"


@dataclass(frozen=True)
class NthSlotOfDay:
    """Run once a day, in slot number ``n`` (0-based) of the day in the task's time zone."""

    n: int

    def describe(self) -> str:
        return f"slot {self.n} of the day"


Rule = Cron | EverySlots | NthSlotOfDay


def local_cron(rule: Cron | NthSlotOfDay, slot_minutes: int) -> str:
    """The cron a rule read in a time zone fires on (``NthSlotOfDay(n)``: ``m h * * *``)."""
    if isinstance(rule, Cron):
        return rule.expression
    minutes = rule.n * slot_minutes
    return f"{minutes % 60} {minutes // 60} * * *"


# --- plans ------------------------------------------------------------------------------
@dataclass(frozen=True)
class SchedulePlan:
    """How a rule maps onto one Dagster schedule.

    ``cron`` (with ``more_crons``) fires at least at every due (possibly more often); an
    evaluation keeps a fire only when it is the first of its slot and, with
    ``every_n_slots``, when the slot lies on the rule's grid. A rule read in a zone whose
    clock changes touch it (``zoned_cron``/``zone``) fires in UTC on every slot a due can
    fall in, and a tick is kept only when its slot holds a due of that rule (the DST rule).
    """

    cron: str
    timezone: str
    every_n_slots: int | None = None
    more_crons: tuple[str, ...] = ()
    zoned_cron: str | None = None
    zone: str | None = None

    @property
    def crons(self) -> tuple[str, ...]:
        """Every cron the schedule fires on (Dagster takes a list)."""
        return (self.cron, *self.more_crons)


@dataclass(frozen=True)
class TickDecision:
    """What one schedule evaluation at a scheduled time decides."""

    due: Due
    skip_reason: str | None = None

    @property
    def due_key(self) -> str:
        """The due's text: the request's run key and its ``dueledger/due`` tag."""
        return self.due.text


def _grid_cron(minutes: int) -> str | None:
    """A cron that fires exactly every ``minutes`` from UTC midnight, if one exists."""
    if minutes < 60 and 60 % minutes == 0:
        return f"*/{minutes} * * * *" if minutes > 1 else "* * * * *"
    if minutes == 60:
        return "0 * * * *"
    if minutes % 60 == 0 and 1440 % minutes == 0:
        hours = minutes // 60
        return "0 0 * * *" if hours == 24 else f"0 */{hours} * * *"
    return None


def schedule_plan(rule: Rule, slot_minutes: int, timezone: str) -> SchedulePlan:
    """Map a rule onto Dagster crons + a timezone (+ an optional every-N-slots filter).

    ``timezone`` is the zone a ``Cron`` or ``NthSlotOfDay`` rule is read in (``EverySlots``
    is UTC by definition).
    """
    if isinstance(rule, EverySlots):
        exact = _grid_cron(rule.n * slot_minutes)
        if exact is not None:
            return SchedulePlan(exact, "UTC")
        slot_cron = _grid_cron(slot_minutes)
        assert slot_cron is not None  # slot length divides a day (settings validates it)
        return SchedulePlan(slot_cron, "UTC", every_n_slots=rule.n)
    cron = local_cron(rule, slot_minutes)
    if timezone != "UTC" and meets_transitions(cron, timezone):
        first, *more = utc_crons(cron, timezone, slot_minutes)
        return SchedulePlan(first, "UTC", more_crons=tuple(more), zoned_cron=cron, zone=timezone)
    if isinstance(rule, Cron):
        # The schedule fires on the slot grid, so the UI's cron, "Next tick" and timeline
        # show what runs; the declared cron stays in the rule (description, metadata).
        return SchedulePlan(slot_aligned_cron(cron, slot_minutes, timezone), timezone)
    return SchedulePlan(cron, timezone)


def decide_tick(plan: SchedulePlan, scheduled_time: datetime, slot_minutes: int) -> TickDecision:
    """Pure schedule evaluation: the due of a scheduled time, or why this tick is skipped."""
    due = Due.of_slot(scheduled_time, slot_minutes)
    key = due.text
    if plan.zoned_cron is not None and plan.zone is not None:
        if is_due(plan.zoned_cron, plan.zone, slot_minutes, due.at) is None:
            return TickDecision(
                due, not_due_reason(plan.zoned_cron, plan.zone, slot_minutes, due.at)
            )
        return TickDecision(due)
    if not first_fire_in_slot(plan.cron, scheduled_time, slot_minutes, plan.timezone):
        return TickDecision(
            due,
            f"tick at {format_due(scheduled_time)} is not the first of slot {key} "
            f"({slot_minutes}-minute slots): the slot's run was requested by an earlier tick",
        )
    if plan.every_n_slots and slot_index(due.at, slot_minutes) % plan.every_n_slots:
        return TickDecision(
            due, f"slot {key} is not on this task's every-{plan.every_n_slots}-slots grid"
        )
    return TickDecision(due)


def plan_dues(
    plan: SchedulePlan, slot_minutes: int, start: datetime, end: datetime
) -> list[datetime]:
    """The dues the schedule requests in ``[start, end)``, oldest first.

    The fires of the schedule's crons from ``start`` to one slot past ``end`` (a due's first
    fire may lie inside its slot), kept where :func:`decide_tick` would launch a run; for a
    zoned plan the rule's own dues (the same set, computed directly: a test holds them equal).
    """
    if plan.zoned_cron is not None and plan.zone is not None:
        return [d.due for d in zoned_dues(plan.zoned_cron, plan.zone, slot_minutes, start, end)]
    slot = timedelta(minutes=slot_minutes)
    if len(plan.crons) == 1:
        return _one_cron_dues(plan, slot_minutes, start, end)
    fires = sorted(
        {f for cron in plan.crons for f in cron_fire_times(cron, plan.timezone, start, end + slot)}
    )
    dues: list[datetime] = []
    for fire in fires:
        decision = decide_tick(plan, fire, slot_minutes)
        due = decision.due.at
        kept = decision.skip_reason is None and start <= due < end
        if kept and (not dues or dues[-1] != due):
            dues.append(due)
    return dues


def _one_cron_dues(
    plan: SchedulePlan, slot_minutes: int, start: datetime, end: datetime
) -> list[datetime]:
    """:func:`plan_dues` of a one-cron plan: :func:`decide_tick` on each fire without asking
    croniter for each fire's predecessor -- in one list of the cron's fires it is the fire
    before. Listed from a slot before ``start``: a fire whose due is at or after ``start``
    then has its predecessor in the list or more than a slot before its due. (Every code
    location load lists each task's next dues: 500 tasks cost 1.4 CPU-s with a croniter
    step back per fire, a fifth of that now; tests/resources/test_zoned_dues.py holds the
    dues equal to the ticks' decisions in every zone.)"""
    slot = timedelta(minutes=slot_minutes)
    dues: list[datetime] = []
    previous: datetime | None = None
    for fire in cron_fire_times(plan.cron, plan.timezone, start - slot, end + slot):
        due = floor_to_slot(fire, slot_minutes)
        first_in_slot = previous is None or previous < due
        previous = fire
        if not first_in_slot or not start <= due < end:
            continue
        if plan.every_n_slots and slot_index(due, slot_minutes) % plan.every_n_slots:
            continue
        if not dues or dues[-1] != due:
            dues.append(due)
    return dues
