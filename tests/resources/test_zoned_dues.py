"""The DST rule: a rule read in a time zone, across clock changes.

A local time that does not exist runs once at the next valid instant; a repeated local time
runs once, at its first occurrence; keys stay UTC. Two kinds of test:

- named instants: Berlin's spring-forward and fall-back days, a 30-minute change
  (Australia/Lord_Howe), a day that did not exist (Pacific/Apia, 2011-12-30), for daily,
  hourly and minutely crons;
- a property test (hypothesis) over the IANA zones ``zoneinfo`` knows x 20 years x the
  registry's rule kinds (``Cron``, ``NthSlotOfDay``, ``EverySlots``) x slot lengths, around
  each clock change of the year: the dues the plan lists (``plan_dues``) and the dues the
  Dagster schedule's own ticks keep (its crons' fires through ``decide_tick``) are both
  exactly what an independent oracle says -- strictly increasing in UTC, one per slot, none
  lost or doubled at a transition. The oracle scans UTC minute by minute: a wall time runs
  at the first instant the zone's clock has reached it.

Size: ``DUELEDGER_DST_EXAMPLES`` examples (default 60, about 15 s on 2 cores; the full size
is 3000, run before a release or after a tzdata update).
"""

from __future__ import annotations

import bisect
import os
import zoneinfo
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestration.timetable import (
    Cron,
    EverySlots,
    NthSlotOfDay,
    Rule,
    decide_tick,
    local_cron,
    plan_dues,
    schedule_plan,
    transitions_between,
    zoned_dues,
)
from resources.core.due import Due, floor_to_slot
from resources.core.slots import cron_fire_times

EXAMPLES = int(os.environ.get("DUELEDGER_DST_EXAMPLES", "60"))
ZONES = sorted(zoneinfo.available_timezones())
YEARS = (2006, 2025)  # 20 years
CRONS = (
    "* * * * *",
    "*/5 * * * *",
    "*/20 * * * *",
    "0 * * * *",
    "30 * * * *",
    "0 2 * * *",
    "30 2 * * *",
    "0 0 * * *",
    "45 1 * * 0",
    "0,30 1-3 * * *",
    "15 9-17 * * 1-5",
)


def _utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


# --- named instants ---------------------------------------------------------------------------
BERLIN = "Europe/Berlin"


@pytest.mark.parametrize(
    ("name", "cron", "zone", "start", "end", "expected"),
    [
        (
            "spring_forward_02_30_runs_at_03_00_cest",
            "30 2 * * *",
            BERLIN,
            _utc(2026, 3, 28),
            _utc(2026, 3, 31),
            ["2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"],
        ),
        (
            "fall_back_02_30_runs_once_at_its_first_occurrence",
            "30 2 * * *",
            BERLIN,
            _utc(2026, 10, 24),
            _utc(2026, 10, 27),
            ["2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
        ),
        (
            "hourly_at_30_skips_nothing_on_spring_forward",
            "30 * * * *",
            BERLIN,
            _utc(2026, 3, 29, 0),
            _utc(2026, 3, 29, 3),
            # 01:30 CET, 02:30 (missing) -> 03:00 CEST, 03:30 CEST, 04:30 CEST
            [
                "2026-03-29T00:30:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-29T01:30:00Z",
                "2026-03-29T02:30:00Z",
            ],
        ),
        (
            "hourly_runs_the_repeated_hour_once",
            "0 * * * *",
            BERLIN,
            _utc(2026, 10, 24, 23),
            _utc(2026, 10, 25, 3),
            # 01:00 CEST, 02:00 CEST (first), [02:00 CET repeated: no], 03:00 CET, 04:00 CET
            ["2026-10-24T23:00:00Z", "2026-10-25T00:00:00Z", "2026-10-25T02:00:00Z"],
        ),
        (
            "lord_howe_moves_by_half_an_hour",
            "15 2 * * *",
            "Australia/Lord_Howe",
            _utc(2026, 10, 2),
            _utc(2026, 10, 5),
            # 2026-10-04 02:00 +10:30 -> 02:30 +11:00: that day 02:15 runs at 02:30 (15:30Z)
            ["2026-10-02T15:45:00Z", "2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"],
        ),
        (
            "apia_skipped_30_december_2011",
            "0 12 * * *",
            "Pacific/Apia",
            _utc(2011, 12, 28),
            _utc(2012, 1, 1),
            # 29 Dec 12:00 -10:00; the 30th never was: its 12:00 runs at the next valid
            # instant, 31 Dec 00:00 +14:00 (30 Dec 10:00Z); then 31 Dec and 1 Jan 12:00 +14:00
            [
                "2011-12-28T22:00:00Z",
                "2011-12-29T22:00:00Z",
                "2011-12-30T10:00:00Z",
                "2011-12-30T22:00:00Z",
                "2011-12-31T22:00:00Z",
            ],
        ),
    ],
)
def test_named_instants(name, cron, zone, start, end, expected) -> None:
    got = [d.due.strftime("%Y-%m-%dT%H:%M:%SZ") for d in zoned_dues(cron, zone, 15, start, end)]
    assert got == sorted(set(expected)), name


def test_dues_explain_the_dst_rule() -> None:
    spring, fall = (
        zoned_dues("30 2 * * *", BERLIN, 15, _utc(2026, 3, 29), _utc(2026, 3, 30))[0],
        zoned_dues("30 2 * * *", BERLIN, 15, _utc(2026, 10, 25), _utc(2026, 10, 26))[0],
    )
    assert "does not exist" in spring.note(BERLIN) and "03:00 CEST" in spring.note(BERLIN)
    assert "happens twice" in fall.note(BERLIN) and "02:30 CEST" in fall.note(BERLIN)


# --- the oracle ---------------------------------------------------------------------------------


def _oracle(rule: Rule, zone: str, slot: int, start: datetime, end: datetime) -> list[datetime]:
    """Dues by the rule's words, by brute force over UTC minutes."""
    if isinstance(rule, EverySlots):
        first = floor_to_slot(start, slot)
        dues = []
        at = first if first >= start else first + timedelta(minutes=slot)
        while at < end:
            if int(at.timestamp()) // (slot * 60) % rule.n == 0:
                dues.append(at)
            at += timedelta(minutes=slot)
        return dues
    tz = ZoneInfo(zone)
    scan_from, scan_to = start - timedelta(days=2), end + timedelta(days=2)
    minutes = int((scan_to - scan_from).total_seconds() // 60)
    instants = [scan_from + timedelta(minutes=i) for i in range(minutes)]
    reached: list[datetime] = []  # the latest wall time the clock has shown, per minute
    for instant in instants:
        wall = instant.astimezone(tz).replace(tzinfo=None, fold=0)
        reached.append(max(wall, reached[-1]) if reached else wall)
    cron = local_cron(rule, slot)
    walls = croniter(cron, reached[0] - timedelta(microseconds=1))
    dues: set[datetime] = set()
    while True:
        wall = walls.get_next(datetime)
        if wall > reached[-1]:
            break
        runs_at = instants[bisect.bisect_left(reached, wall)]
        due = floor_to_slot(runs_at, slot)
        if start <= due < end:
            dues.add(due)
    return sorted(dues)


def _ticked(rule: Rule, zone: str, slot: int, start: datetime, end: datetime) -> list[datetime]:
    """What the Dagster schedule's own ticks keep: its crons' fires, judged by decide_tick."""
    plan = schedule_plan(rule, slot, zone)
    kept: set[datetime] = set()
    for cron in plan.crons:
        for fire in cron_fire_times(cron, plan.timezone, start, end + timedelta(minutes=slot)):
            decision = decide_tick(plan, fire, slot)
            if decision.skip_reason is None and start <= decision.due.at < end:
                kept.add(decision.due.at)
    return sorted(kept)


def _windows(zone: str, year: int) -> list[tuple[datetime, datetime]]:
    """Six hours either side of each clock change of ``year`` (a quiet week without any)."""
    changes = transitions_between(zone, _utc(year, 1, 1), _utc(year + 1, 1, 1))
    if not changes:
        return [(_utc(year, 6, 1), _utc(year, 6, 2))]
    hours = timedelta(hours=6)
    return [(floor_to_slot(c.at - hours, 60), floor_to_slot(c.at + hours, 60)) for c in changes]


rules = st.one_of(
    st.sampled_from(CRONS).map(Cron),
    st.integers(0, 23).map(NthSlotOfDay),  # hourly slot numbers: valid on every slot below
    st.integers(1, 6).map(EverySlots),
)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    zone=st.sampled_from(ZONES),
    year=st.integers(*YEARS),
    rule=rules,
    slot=st.sampled_from([15, 30, 60]),
)
def test_dues_across_every_zone_and_year(zone: str, year: int, rule: Rule, slot: int) -> None:
    if isinstance(rule, NthSlotOfDay):
        rule = NthSlotOfDay(rule.n * 60 // slot)
    plan = schedule_plan(rule, slot, zone)
    for start, end in _windows(zone, year):
        listed = plan_dues(plan, slot, start, end)
        assert listed == sorted(set(listed)), "dues strictly increase"
        assert all(Due(d).at == floor_to_slot(d, slot) for d in listed), "one per slot start"
        expected = _oracle(rule, zone, slot, start, end)
        assert listed == expected, (zone, rule, slot, start)
        assert _ticked(rule, zone, slot, start, end) == expected, (zone, rule, slot, start)


def _every_fire(cron: str, zone: str, slot: int, start: datetime, end: datetime) -> list:
    """zoned_dues by walking every fire of the cron (what it did before it skipped ahead to
    the next slot): each slot named by its first fire, wall time and DST kind included."""
    from orchestration.timetable import resolve

    found: list[tuple[datetime, datetime, datetime, str]] = []
    itr = croniter(cron, (start - timedelta(days=1)).replace(tzinfo=None))
    while True:
        wall = itr.get_next(datetime)
        instant, kind = resolve(wall, zone)
        due = floor_to_slot(instant, slot)
        if due >= end:
            return found
        if due >= start and (not found or found[-1][0] != due):
            found.append((due, wall, instant, kind))


@pytest.mark.parametrize("zone", ["Europe/Berlin", "Australia/Lord_Howe", "America/New_York"])
@pytest.mark.parametrize("cron", ["* * * * *", "*/7 1-3 * * *", "30 2 * * *", "0,59 * * * *"])
@pytest.mark.parametrize("slot", [5, 15, 60])
def test_skipping_to_the_next_slot_names_each_slot_by_its_first_fire(
    zone: str, cron: str, slot: int
) -> None:
    from orchestration.timetable import plan_transitions, zoned_dues

    for change in plan_transitions(zone)[:4]:
        start = (change.at - timedelta(hours=6)).replace(minute=0, second=0, microsecond=0)
        end = start + timedelta(hours=14)
        got = [(d.due, d.wall, d.instant, d.kind) for d in zoned_dues(cron, zone, slot, start, end)]
        assert got == _every_fire(cron, zone, slot, start, end), (change, cron, zone, slot)
