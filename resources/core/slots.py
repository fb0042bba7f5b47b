"""Pure time helpers: slot numbering, rule matching and cadence (the due itself: due.py).

No Dagster import and no wall clock here: every function takes the instant it reasons
about, so schedules, sensors, the CLI and the tests all agree on the same arithmetic.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

from croniter import croniter

from resources.core.due import floor_to_slot
from resources.core.instants import as_utc


def slot_index(due: datetime, slot_minutes: int) -> int:
    """Number of whole slots between the epoch and ``due``."""
    return int(as_utc(due).timestamp()) // (slot_minutes * 60)


def is_valid_cron(expression: str) -> bool:
    """True when croniter (and therefore Dagster) accepts the five-field expression."""
    return len(expression.split()) == 5 and croniter.is_valid(expression)


def first_fire_in_slot(
    cron: str, fire_time: datetime, slot_minutes: int, timezone: str = "UTC"
) -> bool:
    """Is ``fire_time`` (a fire time of ``cron``) the first fire of ``cron`` in its slot?

    A cron finer than the slot fires several times per slot; only the first fire may
    start a run, so the others are skipped instead of starting duplicates.
    """
    local = as_utc(fire_time).astimezone(ZoneInfo(timezone))
    previous = croniter(cron, local).get_prev(datetime)
    return as_utc(previous) < floor_to_slot(fire_time, slot_minutes)


@dataclass(frozen=True)
class Cadence:
    """A typical interval between runs, with a human label."""

    minutes: int

    @property
    def label(self) -> str:
        return cadence_label(self.minutes)


def cadence_label(minutes: int) -> str:
    """Human wording for an interval in minutes ("every 15 minutes", "hourly", "daily")."""
    named = {1: "every minute", 60: "hourly", 1440: "daily", 10080: "weekly"}
    if minutes in named:
        return named[minutes]
    if minutes % 1440 == 0:
        return f"every {minutes // 1440} days"
    if minutes % 60 == 0:
        return f"every {minutes // 60} hours"
    return f"every {minutes} minutes"


#: How far ahead cadence sampling looks, and how many fire times it inspects at most.
_SAMPLE_START = datetime(2026, 1, 5, tzinfo=UTC)  # a Monday, far from DST changes
_SAMPLE_FIRES = 600
_SAMPLE_SPAN = timedelta(days=400)
#: A cron that names no day, month or weekday fires the same way every day: two days of
#: its fires hold every gap it ever has (within each day and across midnight).
_DAILY_SPAN = timedelta(days=2)


def _repeats_daily(cron: str) -> bool:
    fields = cron.split()
    return len(fields) == 5 and fields[2:] == ["*", "*", "*"]


def cron_fire_times(cron: str, timezone: str, start: datetime, end: datetime) -> list[datetime]:
    """Fire times of ``cron`` (read in ``timezone``) in ``[start, end)``, as UTC instants.

    Bounded to a few thousand fires so a pathological call cannot run away.
    """
    end_utc = as_utc(end)
    if timezone == "UTC" and _repeats_daily(cron):
        day = _minutes_of_day(cron)
        if day is not None:
            return _daily_fire_times(day, as_utc(start), end_utc)
    tz = ZoneInfo(timezone)
    itr = croniter(cron, as_utc(start).astimezone(tz) - timedelta(microseconds=1))
    fires: list[datetime] = []
    while len(fires) < 100_000:
        fire = as_utc(itr.get_next(datetime))
        if fire >= end_utc:
            break
        fires.append(fire)
    return fires


def _min_gap_minutes(instants: list[datetime]) -> int | None:
    gaps = [int((b - a).total_seconds() // 60) for a, b in pairwise(instants)]
    gaps = [g for g in gaps if g > 0]
    return min(gaps) if gaps else None


@functools.cache  # pure; every due listing of a daily cron asks
def _minutes_of_day(cron: str) -> tuple[int, ...] | None:
    """The minutes of the day a cron that names no day, month or weekday fires at, from its
    minute and hour fields; None when a field is not a plain list of numbers (croniter's
    own stepping then decides)."""
    fields, _ = croniter.expand(cron)
    minute_field = list(range(60)) if fields[0] == ["*"] else fields[0]
    hour_field = list(range(24)) if fields[1] == ["*"] else fields[1]
    minutes = [v for v in minute_field if isinstance(v, int)]
    hours = [v for v in hour_field if isinstance(v, int)]
    if len(minutes) != len(minute_field) or len(hours) != len(hour_field):
        return None
    return tuple(sorted({h * 60 + m for h in hours for m in minutes}))


def _daily_fire_times(day: Sequence[int], start: datetime, end: datetime) -> list[datetime]:
    """:func:`cron_fire_times` of a UTC cron firing at minutes ``day`` of every day: the same
    fires croniter steps to (a test compares them), a few list items per day instead."""
    midnight = start.replace(hour=0, minute=0, second=0, microsecond=0)
    fires: list[datetime] = []
    while midnight < end and len(fires) < 100_000:
        for minute in day:
            fire = midnight + timedelta(minutes=minute)
            if start <= fire < end:
                fires.append(fire)
        midnight += timedelta(days=1)
    return fires


def _daily_fires(cron: str) -> tuple[datetime, ...] | None:
    """The sample of a UTC cron that names no day, month or weekday, without stepping
    croniter: its fires after the sample start, up to ``_DAILY_SPAN`` after it, at most
    ``_SAMPLE_FIRES`` -- the same fires croniter would give (a test compares them). None when
    a field is not a plain list of numbers (croniter's own stepping then decides)."""
    day = _minutes_of_day(cron)
    if day is None:
        return None
    after = _SAMPLE_START + timedelta(microseconds=1)  # croniter's first fire is after the start
    return tuple(_daily_fire_times(day, after, after + _DAILY_SPAN)[:_SAMPLE_FIRES])


@functools.cache  # pure; both cadences below read it, and every process loading the tasks asks
def _sample_fires(cron: str, timezone: str) -> tuple[datetime, ...]:
    """The first fires of ``cron`` (read in ``timezone``) after the sample start, as UTC
    instants: at most ``_SAMPLE_FIRES``, none later than ``_SAMPLE_SPAN`` after the start.

    The zone is read at its offset of the sample start, all year: a cadence is the rule's,
    not its DST days' (stepping through a clock change, a daily 02:00 cron would show fires
    an hour apart, and "hourly"); resources/core/zoned.py applies the DST rule to dues.
    Loading the code location samples every cron task here, and croniter's steps were most
    of what the definitions cost beyond Dagster's own (bench/run_cost.py): one sample per
    cron serves both cadences, stepping over naive wall times.
    """
    # A cron that names no day, month or weekday needs two days, not 400 (the sample reads
    # the zone at one offset, so its days all repeat); a UTC one's fires follow from its
    # minute and hour fields alone (a platform's many daily tasks at distinct times
    # each cost ~8 ms of croniter steps here, a minute cron 600 steps, in every process).
    daily = _repeats_daily(cron)
    if daily and timezone == "UTC":
        fires_of_day = _daily_fires(cron)
        if fires_of_day is not None:
            return fires_of_day
    span = _DAILY_SPAN if daily else _SAMPLE_SPAN
    offset = ZoneInfo(timezone).utcoffset(_SAMPLE_START.replace(tzinfo=None)) or timedelta(0)
    itr = croniter(cron, (_SAMPLE_START + offset).replace(tzinfo=None))
    fires = []
    for _ in range(_SAMPLE_FIRES):
        fire = (itr.get_next(datetime) - offset).replace(tzinfo=UTC)
        if fire - _SAMPLE_START > span:
            break
        fires.append(fire)
    return tuple(fires)


@functools.cache  # pure; task validation and the task views both ask
def cron_cadence(cron: str, timezone: str = "UTC") -> Cadence:
    """The finest interval between consecutive fires of ``cron`` (its declared cadence)."""
    gap = _min_gap_minutes(list(_sample_fires(cron, timezone)))
    return Cadence(gap if gap is not None else 525_600)


@functools.cache  # pure, like cron_cadence
def cron_effective_cadence(cron: str, slot_minutes: int, timezone: str = "UTC") -> Cadence:
    """The finest interval between distinct dues once fires are floored to the slot."""
    dues: list[datetime] = []
    for fire in _sample_fires(cron, timezone):
        due = floor_to_slot(fire, slot_minutes)
        if not dues or dues[-1] != due:
            dues.append(due)
    gap = _min_gap_minutes(dues)
    return Cadence(gap if gap is not None else 525_600)


def _cron_field(values: list[int], full: range) -> str:
    """A cron field for ``values`` (sorted ints): ``*``, ``*/k``, ``a-b`` or a comma list."""
    if values == list(full):
        return "*"
    step = values[1] - values[0] if len(values) > 1 else 0
    if values[0] == full.start and step > 1 and values == list(range(full.start, full.stop, step)):
        return f"*/{step}"
    if len(values) > 2 and values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}-{values[-1]}"
    return ",".join(str(v) for v in values)


def _offsets_on_slot_grid(timezone: str, slot_minutes: int) -> bool:
    """Does ``timezone`` keep local slot boundaries on the UTC slot grid all year?"""
    tz = ZoneInfo(timezone)
    for month in (1, 4, 7, 10):
        offset = datetime(2026, month, 1, tzinfo=UTC).astimezone(tz).utcoffset()
        if offset is None or int(offset.total_seconds()) % (slot_minutes * 60):
            return False
    return True


def slot_aligned_cron(cron: str, slot_minutes: int, timezone: str = "UTC") -> str:
    """The cron a schedule should fire on for ``cron`` under ``slot_minutes`` slots.

    A cron finer than the slot ("every minute" on 15-minute slots) runs once per slot, at
    its due; firing on the declared cron would show Dagster's Automation list, "Next tick"
    and timeline a tick that is skipped 14 times out of 15. Such a cron is moved to the
    start of every slot that holds one of its fires: ``* * * * *`` -> ``*/15 * * * *``,
    ``*/5 9-17 * * 1-5`` -> ``*/15 9-17 * * 1-5``; day fields are kept. A cron that fires
    at most once per slot, one whose slots cannot be written as one cron, or a timezone
    whose offset leaves the slot grid keeps ``cron`` (the schedule then skips the extra
    fires, see :func:`first_fire_in_slot`). The due of every slot is unchanged either way.
    """
    if cron_cadence(cron, timezone).minutes >= slot_minutes:
        return cron
    if not _offsets_on_slot_grid(timezone, slot_minutes):
        return cron
    fields = cron.split()
    (minutes, hours, *_), _nth = croniter.expand(cron)
    minute_values = list(range(60)) if minutes == ["*"] else [int(m) for m in minutes]
    hour_values = list(range(24)) if hours == ["*"] else [int(h) for h in hours]
    starts = {
        (h * 60 + m) // slot_minutes * slot_minutes for h in hour_values for m in minute_values
    }
    by_minute: dict[int, set[int]] = {}
    for start in starts:
        by_minute.setdefault(start % 60, set()).add(start // 60)
    hour_sets = {frozenset(hs) for hs in by_minute.values()}
    if len(hour_sets) != 1:
        return cron  # not one minute-set x hour-set product: keep the declared cron
    aligned_minutes = _cron_field(sorted(by_minute), range(60))
    aligned_hours = _cron_field(sorted(next(iter(hour_sets))), range(24))
    return " ".join([aligned_minutes, aligned_hours, *fields[2:]])
