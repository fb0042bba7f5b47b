"""A rule read in a time zone, and the DST rule (DESIGN: ``timezone``), pure and Dagster-free.

A ``Cron`` or ``NthSlotOfDay`` rule is read in its task's time zone: its fires are wall-clock
times there. Each fire becomes one UTC instant by one rule, and the instant's slot is the due:

- a wall time that exists once is that instant;
- a wall time that does not exist (the clock springs forward over it: 02:30 in Berlin on the
  last Sunday of March) runs once, at the **next valid instant** -- the transition itself
  (03:00 CEST, 01:00Z);
- a wall time that exists twice (the clock falls back: 02:30 on the last Sunday of October)
  runs once, at its **first occurrence** (02:30 CEST, 00:30Z); the second is not a fire.

Fires that land in one slot are one due; dues only increase. Keys stay UTC. The mapping is
computed from ``zoneinfo`` alone (PEP 495 ``fold``), so every IANA zone follows it, including
zones whose clocks moved by other than an hour or skipped a whole day.

:func:`zone_plan` says how a Dagster schedule fires for such a rule: a zone whose clocks never
move under the rule keeps the rule's own cron in the zone (the UI shows it as declared);
otherwise the schedule fires in UTC at every slot of the day a due of the rule can fall on,
and each tick keeps only a real due (:func:`is_due`), so Dagster's own DST handling (it runs
a repeated time at its second occurrence) never decides a due.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo

from croniter import croniter

from resources.core.due import floor_to_slot, format_due
from resources.core.instants import as_utc

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
    dues: list[ZonedDue] = []
    for wall in _walls(cron, lowest):
        instant, kind = resolve(wall, zone_name)
        due = floor_to_slot(instant, slot_minutes)
        if due >= end:
            break  # the mapping never goes back in time
        if due >= start and (not dues or dues[-1].due != due):
            dues.append(ZonedDue(due, wall, instant, kind))
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
