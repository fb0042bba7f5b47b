"""A task's timetable: its rule, the Dagster schedule the rule implies, which ticks are dues,
and the DST rule for rules read in a time zone. Pure and Dagster-free.

A task's rule (:class:`Cron`, :class:`EverySlots`, :class:`NthSlotOfDay`) maps onto one
Dagster schedule (:func:`schedule_plan`); every tick of it is judged by :func:`decide_tick`,
a pure function of the tick's scheduled time; :func:`plan_dues` lists the dues of a window
the same way (the gap audit, `dueledger dues`, catch-up, deadlines) and :func:`list_dues`
shows them with their wall times.

**The DST rule.** A ``Cron`` or ``NthSlotOfDay`` rule is read in its task's time zone: its
fires are wall-clock times there. Each fire becomes one UTC instant by one rule, and the
instant's slot is the due:

- a wall time that exists once is that instant;
- a wall time that does not exist (the clock springs forward over it: 02:30 in Berlin on the
  last Sunday of March) runs once, at the **next valid instant** -- the transition itself
  (03:00 CEST, 01:00Z);
- a wall time that exists twice (the clock falls back: 02:30 on the last Sunday of October)
  runs once, at its **first occurrence** (02:30 CEST, 00:30Z); the second is not a fire.

Fires that land in one slot are one due; dues only increase. Keys stay UTC. The mapping is
computed from ``zoneinfo`` alone (PEP 495 ``fold``), so every IANA zone follows it, including
zones whose clocks moved by other than an hour or skipped a whole day. A zone whose clocks
never move under the rule keeps the rule's own cron in the zone (the UI shows it as
declared); otherwise the schedule fires in UTC at every slot of the day a due of the rule can
fall on, and each tick keeps only a real due (:func:`is_due`), so Dagster's own DST handling
(it runs a repeated time at its second occurrence) never decides a due.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from resources.core.due import Due, floor_to_slot, format_due
from resources.core.instants import as_utc
from resources.core.slots import cron_fire_times, first_fire_in_slot, slot_aligned_cron, slot_index

KIND_GAP: Final = "gap"
KIND_FOLD: Final = "fold"
#: Years whose transitions decide how a zoned schedule fires (and the property test's span).
PLAN_YEARS: Final = (2000, 2040)
_DAY: Final = timedelta(days=1)


@dataclass(frozen=True)
class Transition:
    """A change of a zone's UTC offset at ``at`` (UTC), from ``before`` to ``after``."""

    at: datetime
    before: timedelta
    after: timedelta

    @property
    def is_gap(self) -> bool:
        """The clock springs forward: wall times in between do not exist."""
        return self.after > self.before

    def wall_window(self) -> tuple[datetime, datetime]:
        """The wall times (naive) that do not exist (gap) or exist twice (fold)."""
        low, high = sorted((self.before, self.after))
        naive = self.at.replace(tzinfo=None)
        return naive + low, naive + high


def _offset(zone: ZoneInfo, instant: datetime) -> timedelta:
    offset = instant.astimezone(zone).utcoffset()
    assert offset is not None  # a ZoneInfo always has one
    return offset


def _transition_at(zone: ZoneInfo, low: datetime, high: datetime) -> datetime:
    """The first instant in ``(low, high]`` whose offset is ``high``'s (bisection, seconds)."""
    target = _offset(zone, high)
    lo, hi = int(low.timestamp()), int(high.timestamp())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _offset(zone, datetime.fromtimestamp(mid, UTC)) == target:
            hi = mid
        else:
            lo = mid
    return datetime.fromtimestamp(hi, UTC)


def transitions_between(zone_name: str, start: datetime, end: datetime) -> list[Transition]:
    """The zone's offset changes in ``[start, end)`` (found day by day, then to the second)."""
    zone = ZoneInfo(zone_name)
    found: list[Transition] = []
    at = as_utc(start)
    stop = as_utc(end)
    previous = _offset(zone, at)
    while at < stop:
        nxt = min(at + _DAY, stop)
        offset = _offset(zone, nxt)
        if offset != previous:
            moment = _transition_at(zone, at, nxt)
            found.append(Transition(moment, _offset(zone, moment - timedelta(seconds=1)), offset))
        previous, at = offset, nxt
    return found


@functools.cache  # pure; every zoned task asks once per process
def plan_transitions(zone_name: str) -> tuple[Transition, ...]:
    """The zone's transitions in :data:`PLAN_YEARS`."""
    start, end = (datetime(y, 1, 1, tzinfo=UTC) for y in PLAN_YEARS)
    return tuple(transitions_between(zone_name, start, end))


def resolve(wall: datetime, zone_name: str) -> tuple[datetime, str]:
    """The UTC instant a wall time (naive) runs at, and ``""``, ``"gap"`` or ``"fold"``."""
    zone = ZoneInfo(zone_name)
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if first == second:
        return first, ""
    low, high = sorted((first, second))

    def back(instant: datetime) -> datetime:
        return instant.astimezone(zone).replace(tzinfo=None)

    if back(low) == wall and back(high) == wall:
        return low, KIND_FOLD  # it exists twice: its first occurrence
    # It does not exist: fold=1 reads it with the offset after the transition, fold=0 with the
    # one before; the transition lies between the two readings.
    return _transition_at(zone, low, high), KIND_GAP


@dataclass(frozen=True)
class ZonedDue:
    """One due of a zoned rule: the slot, the fire (wall time) that made it, and how."""

    due: datetime
    wall: datetime
    instant: datetime
    kind: str = ""

    def note(self, zone_name: str) -> str:
        """The DST rule in words for this due (empty when the wall time exists once)."""
        wall = f"{self.wall:%Y-%m-%d %H:%M} {zone_name}"
        local = self.instant.astimezone(ZoneInfo(zone_name))
        if self.kind == KIND_GAP:
            return (
                f"{wall} does not exist (clocks spring forward): it runs once, at the next valid "
                f"instant {local:%H:%M} {local.tzname()} ({format_due(self.instant)})"
            )
        if self.kind == KIND_FOLD:
            return (
                f"{wall} happens twice (clocks fall back): it runs once, at its first "
                f"occurrence {local:%H:%M} {local.tzname()} ({format_due(self.instant)})"
            )
        return ""


def _walls(cron: str, start: datetime) -> Iterator[datetime]:
    """Wall times (naive) of ``cron`` after ``start`` (naive), in order."""
    itr = croniter(cron, start - timedelta(microseconds=1))
    while True:
        yield itr.get_next(datetime)


_TICK: Final = timedelta(microseconds=1)


def zoned_dues(
    cron: str, zone_name: str, slot_minutes: int, start: datetime, end: datetime
) -> list[ZonedDue]:
    """The dues of ``cron`` read in ``zone_name`` whose slot starts in ``[start, end)``, oldest
    first, one per slot (the slot's first fire names it)."""
    start, end = as_utc(start), as_utc(end)
    margin = end + timedelta(days=3)
    changes = transitions_between(zone_name, start - timedelta(days=3), margin)
    offsets = [_offset(ZoneInfo(zone_name), start - timedelta(days=3))]
    offsets += [c.after for c in changes]
    # A fire whose due is at or after ``start`` runs at or after ``start``, and its wall time
    # is that instant plus the offset then (a skipped wall time lies after the transition's
    # instant plus the offset before it): never before start + the smallest offset.
    lowest = (start + min(offsets) - timedelta(hours=1)).replace(tzinfo=None)
    zone = ZoneInfo(zone_name)
    slot = timedelta(minutes=slot_minutes)
    dues: list[ZonedDue] = []
    walls = _walls(cron, lowest)
    while True:
        wall = next(walls)
        instant, kind = resolve(wall, zone_name)
        due = floor_to_slot(instant, slot_minutes)
        if due >= end:
            break  # the mapping never goes back in time
        if due >= start and (not dues or due > dues[-1].due):
            dues.append(ZonedDue(due, wall, instant, kind))
            # One due per slot: go on from the next slot's start instead of walking every fire
            # inside this one (a cron firing each minute has 15 per 15-minute slot). No wall
            # that runs at or after that instant lies before its wall time read with the
            # offset in force just before it (a skipped wall time runs at the instant after
            # the gap) or just at it (a repeated one runs at its first occurrence, earlier).
            nxt = due + slot
            following = min(
                nxt.astimezone(zone).replace(tzinfo=None),
                (nxt - _TICK).astimezone(zone).replace(tzinfo=None) + _TICK,
            )
            if following > wall:
                walls = _walls(cron, following)
    return dues


def is_due(cron: str, zone_name: str, slot_minutes: int, slot: datetime) -> ZonedDue | None:
    """The due of ``cron`` in ``zone_name`` whose slot starts at ``slot``, if there is one."""
    found = zoned_dues(cron, zone_name, slot_minutes, slot, slot + timedelta(minutes=slot_minutes))
    return found[0] if found else None


def not_due_reason(cron: str, zone_name: str, slot_minutes: int, slot: datetime) -> str:
    """Why a tick at ``slot`` runs nothing: a repeated wall time already ran, or no fire."""
    text = format_due(slot)
    zone = ZoneInfo(zone_name)
    last = slot + timedelta(minutes=slot_minutes) - timedelta(seconds=1)
    for instant in (slot, last):
        local = instant.astimezone(zone)
        if local.fold:  # the second occurrence of a repeated wall time
            first, _ = resolve(local.replace(tzinfo=None, fold=0), zone_name)
            ran = format_due(floor_to_slot(first, slot_minutes))
            return (
                f"slot {text}: {local:%H:%M} {zone_name} happens twice (clocks fall back); "
                f"its fires ran once, at the first occurrence (slot {ran})"
            )
    return f"slot {text} holds no due of {cron!r} read in {zone_name}"


@functools.cache  # pure; decided once per rule and zone
def meets_transitions(cron: str, zone_name: str) -> bool:
    """Does ``cron`` read in ``zone_name`` fire at a wall time some transition of
    :data:`PLAN_YEARS` skips or repeats? If not, the zone's clock changes never touch it."""
    for change in plan_transitions(zone_name):
        low, high = change.wall_window()
        if next(_walls(cron, low)) < high:
            return True
    return False


def _minutes(cron: str) -> list[int]:
    """Minutes of the day at which ``cron`` fires on some day (its minute x hour fields)."""
    (minutes, hours, *_), _nth = croniter.expand(cron)
    minute_values = list(range(60)) if minutes == ["*"] else [int(m) for m in minutes]
    hour_values = list(range(24)) if hours == ["*"] else [int(h) for h in hours]
    return sorted({h * 60 + m for h in hour_values for m in minute_values})


def _field(values: list[int], full: range) -> str:
    if values == list(full):
        return "*"
    return ",".join(str(v) for v in values)


@functools.cache  # pure; decided once per rule, zone and slot
def utc_crons(cron: str, zone_name: str, slot_minutes: int) -> tuple[str, ...]:
    """UTC crons that fire at the start of every slot a due of ``cron`` read in ``zone_name``
    can fall in (any offset the zone takes in :data:`PLAN_YEARS`, and every clock change
    that skips wall times), every day: a superset of the dues, each slot at most once."""
    start = datetime(PLAN_YEARS[0], 1, 1, tzinfo=UTC)
    changes = plan_transitions(zone_name)
    offsets = {_offset(ZoneInfo(zone_name), start), *(c.after for c in changes)}
    slot_starts: set[int] = set()
    for minute in _minutes(cron):
        for offset in offsets:
            utc = (minute - int(offset.total_seconds() // 60)) % 1440
            slot_starts.add(utc // slot_minutes * slot_minutes)
    for change in changes:
        if change.is_gap:
            at = floor_to_slot(change.at, slot_minutes)
            slot_starts.add(at.hour * 60 + at.minute)
    by_minute: dict[int, set[int]] = {}
    for start_minute in slot_starts:
        by_minute.setdefault(start_minute % 60, set()).add(start_minute // 60)
    by_hours: dict[frozenset[int], list[int]] = {}
    for minute, hours in by_minute.items():
        by_hours.setdefault(frozenset(hours), []).append(minute)
    crons = [
        f"{_field(sorted(minutes), range(60))} {_field(sorted(hours), range(24))} * * *"
        for hours, minutes in by_hours.items()
    ]
    return tuple(sorted(crons))


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


def zone_problem(name: object) -> str | None:
    """Why ``name`` is not an IANA time zone ``zoneinfo`` knows (None: it is one)."""
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        return f"{name!r} is not an IANA time zone name (e.g. 'UTC', 'Europe/Berlin')"
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return (
            f"{name!r} is not a time zone zoneinfo knows; use an IANA name such as "
            f"'Europe/Berlin' or 'America/New_York'"
        )
    return None


# --- the dues a task's schedule produces (`dueledger dues`, the schedule's metadata) ---------

#: Dues the schedule's metadata in the UI lists.
NEXT_DUES_SHOWN: Final = 5
#: Most dues one listing holds (`dueledger dues --next N`, a `--from/--to` range).
MAX_DUES_LISTED: Final = 1000
#: How far one listing looks: a `--from/--to` range spans at most this, a `--next N` listing
#: searches at most this far ahead (a rule as rare as `0 2 29 2 *` may find fewer than N).
DUES_HORIZON: Final = timedelta(days=800)


class TooManyDues(ValueError):
    """A range holds more dues than one listing does (:data:`MAX_DUES_LISTED`)."""

    def __init__(self, found: int) -> None:
        super().__init__(
            f"the range holds {found} dues; one listing holds at most {MAX_DUES_LISTED}"
        )
        self.found = found


class Window(Protocol):
    """A span of time that skips the dues it covers (a pause of the task)."""

    def covers(self, instant: datetime) -> bool: ...

    def as_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ListedDue:
    """One due of a task's schedule: its UTC instant, its wall time in the rule's zone, what
    the DST rule did to it (empty: nothing), and the pause that skips it (None: none)."""

    due: datetime
    local: str
    dst: str = ""
    pause: Window | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "due": format_due(self.due),
            "local": self.local,
            "dst": self.dst or None,
            "skipped_by_pause": self.pause is not None,
            "pause": self.pause.as_json() if self.pause is not None else None,
        }


def list_dues(
    plan: SchedulePlan,
    slot_minutes: int,
    zone: str,
    start: datetime,
    *,
    step: timedelta,
    end: datetime | None = None,
    count: int | None = None,
    pauses: Sequence[Window] = (),
) -> list[ListedDue]:
    """The dues ``plan`` produces from ``start``: those before ``end`` (:class:`TooManyDues`
    past :data:`MAX_DUES_LISTED`), or the first ``count`` within :data:`DUES_HORIZON` (at most
    :data:`MAX_DUES_LISTED`; ``step``: the rule's interval, where the search starts),
    each with its wall time in ``zone`` (the rule's), the DST rule's note, and the pause of
    ``pauses`` that skips it."""
    slot = timedelta(minutes=slot_minutes)
    if end is None:
        wanted = min(count or NEXT_DUES_SHOWN, MAX_DUES_LISTED)
        step = max(step, slot) * (wanted + 1)
        end = start + step
        dues = plan_dues(plan, slot_minutes, start, end)
        while len(dues) < wanted and end - start < DUES_HORIZON:
            step *= 2
            end = start + step
            dues = plan_dues(plan, slot_minutes, start, end)
        dues = dues[:wanted]
    else:
        dues = plan_dues(plan, slot_minutes, start, end)
        if len(dues) > MAX_DUES_LISTED:
            raise TooManyDues(len(dues))
    notes: dict[datetime, str] = {}
    if plan.zoned_cron is not None and plan.zone is not None and dues:
        for zoned in zoned_dues(plan.zoned_cron, plan.zone, slot_minutes, dues[0], end):
            notes[zoned.due] = zoned.note(plan.zone)
    local_zone = ZoneInfo(zone)
    listed = []
    for due in dues:
        local = due.astimezone(local_zone)
        covering = next((p for p in pauses if p.covers(due)), None)
        text = f"{local:%Y-%m-%d %H:%M} {local.tzname()}"
        listed.append(ListedDue(due, text, notes.get(due, ""), covering))
    return listed
