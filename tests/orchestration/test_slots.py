"""Due and cadence arithmetic as tables of named instants."""

from datetime import UTC, datetime, timedelta, timezone
from itertools import pairwise

import pytest

from orchestration.timetable import Cron, EverySlots, NthSlotOfDay, decide_tick, schedule_plan
from resources.core.due import floor_to_slot, format_due, parse_due
from resources.core.slots import (
    cron_cadence,
    cron_effective_cadence,
    cron_fire_times,
    first_fire_in_slot,
    slot_aligned_cron,
)

DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)


@pytest.mark.parametrize(
    ("name", "instant", "expected_due"),
    [
        ("just_before_due", DUE - timedelta(seconds=1), "2026-11-30T22:30:00Z"),
        ("at_due", DUE, "2026-11-30T22:45:00Z"),
        ("inside_slot", DUE + timedelta(minutes=14, seconds=59), "2026-11-30T22:45:00Z"),
        ("one_slot_later", DUE + timedelta(minutes=15), "2026-11-30T23:00:00Z"),
        ("crossing_midnight", datetime(2026, 12, 1, 0, 7, tzinfo=UTC), "2026-12-01T00:00:00Z"),
        (
            "just_before_midnight",
            datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC),
            "2026-11-30T23:45:00Z",
        ),
        (
            "non_utc_input_is_converted",
            datetime(2026, 11, 30, 23, 50, tzinfo=timezone(timedelta(hours=1))),
            "2026-11-30T22:45:00Z",
        ),
    ],
)
def test_due_is_the_scheduled_time_floored_to_the_slot_in_utc(name, instant, expected_due):
    assert format_due(floor_to_slot(instant, 15)) == expected_due


def test_due_strings_round_trip_and_reject_other_shapes():
    assert parse_due(format_due(DUE)) == DUE
    with pytest.raises(ValueError, match="YYYY-MM-DDTHH:MM:SSZ"):
        parse_due("2026-11-30 22:45")


@pytest.mark.parametrize(
    ("name", "fire", "first"),
    [
        ("first_minute_of_slot", datetime(2026, 11, 30, 22, 45, tzinfo=UTC), True),
        ("second_minute_of_slot", datetime(2026, 11, 30, 22, 46, tzinfo=UTC), False),
        ("last_minute_of_slot", datetime(2026, 11, 30, 22, 59, tzinfo=UTC), False),
        ("next_slot", datetime(2026, 11, 30, 23, 0, tzinfo=UTC), True),
    ],
)
def test_an_every_minute_cron_starts_only_one_run_per_slot(name, fire, first):
    assert first_fire_in_slot("* * * * *", fire, 15) is first


def test_a_cron_firing_mid_slot_keys_on_the_slot_start():
    plan = schedule_plan(Cron("7 * * * *"), 15, "UTC")
    decision = decide_tick(plan, datetime(2026, 11, 30, 22, 7, tzinfo=UTC), 15)
    assert decision.skip_reason is None
    assert decision.due_key == "2026-11-30T22:00:00Z"


@pytest.mark.parametrize(
    ("name", "rule", "slot", "tz", "declared", "effective"),
    [
        ("every_minute_on_15_minute_slots", Cron("* * * * *"), 15, "UTC", 1, 15),
        ("every_5_minutes_on_15_minute_slots", Cron("*/5 * * * *"), 15, "UTC", 5, 15),
        ("hourly_cron", Cron("0 * * * *"), 15, "UTC", 60, 60),
        ("daily_cron", Cron("0 2 * * *"), 15, "UTC", 1440, 1440),
        ("every_slot", EverySlots(1), 15, "UTC", 15, 15),
        ("every_4_slots", EverySlots(4), 15, "UTC", 60, 60),
        ("every_slot_on_1_minute_slots", EverySlots(1), 1, "UTC", 1, 1),
        ("nth_slot_of_day", NthSlotOfDay(8), 15, "Europe/Berlin", 1440, 1440),
    ],
)
def test_effective_cadence_follows_from_rule_and_slot(name, rule, slot, tz, declared, effective):
    from orchestration.task_spec import _cadences

    got_declared, got_effective = _cadences(rule, slot, tz)
    assert (got_declared.minutes, got_effective.minutes) == (declared, effective)


def test_cron_cadence_helpers_agree_with_hand_counts():
    assert cron_cadence("*/10 * * * *").minutes == 10
    assert cron_effective_cadence("*/10 * * * *", 15).minutes == 15
    assert cron_effective_cadence("*/20 * * * *", 15).minutes == 15  # :00,:20→:15,:40→:30


def _cadences_sampled_one_by_one(cron: str, slots: tuple[int, ...], tz: str) -> list[int]:
    """The cadences sampled one function at a time, croniter stepping from an aware start in
    the zone's offset of the sample start as a fixed offset (the reference for the shared
    sample, as a cadence is the rule's, not its DST days'). The declared cadence, then
    the effective one for each of ``slots``."""
    from datetime import timezone
    from zoneinfo import ZoneInfo

    from croniter import croniter

    from resources.core.instants import as_utc
    from resources.core.slots import _SAMPLE_FIRES, _SAMPLE_SPAN, _SAMPLE_START

    offset = ZoneInfo(tz).utcoffset(_SAMPLE_START.replace(tzinfo=None))
    assert offset is not None
    itr = croniter(cron, _SAMPLE_START.astimezone(timezone(offset)))
    fires = []
    for _ in range(_SAMPLE_FIRES):
        fire = as_utc(itr.get_next(datetime))
        if fire - _SAMPLE_START > _SAMPLE_SPAN:
            break
        fires.append(fire)

    def finest(instants: list[datetime]) -> int:
        gaps = [int((b - a).total_seconds() // 60) for a, b in pairwise(instants)]
        return min((g for g in gaps if g > 0), default=525_600)

    return [finest(fires)] + [finest(sorted({floor_to_slot(f, s) for f in fires})) for s in slots]


@pytest.mark.parametrize("tz", ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"])
@pytest.mark.parametrize(
    "cron",
    [
        "* * * * *",
        "*/5 * * * *",
        "*/7 * * * *",
        "0 * * * *",
        "0 0 * * *",
        "0 2 * * *",  # inside the spring-forward hour in Europe/Berlin
        "30 1 * * 0",
        "15 9-17 * * 1-5",
        "0 0 29 2 *",  # once in four years: no gap inside the sample
        # Daily-periodic (no day, month or weekday): in UTC sampled over two days only.
        "17 3 * * *",
        "5,35 */6 * * *",
        "*/13 2-5 * * *",
        "45 23 * * *",
    ],
)
def test_the_shared_cron_sample_gives_the_cadences_sampling_each_gave(cron, tz):
    # Loading the code location computes both cadences from one memoised sample, and reads a
    # UTC cron over naive datetimes (bench/run_cost.py); neither may change an answer.
    slots = (1, 15, 60)
    got = [cron_cadence(cron, tz).minutes]
    got += [cron_effective_cadence(cron, slot, tz).minutes for slot in slots]
    assert got == _cadences_sampled_one_by_one(cron, slots, tz)


class TestDstInANonUtcTimezone:
    """Europe/Berlin leaves summer time on 2026-10-25 03:00 CEST -> 02:00 CET."""

    TZ = "Europe/Berlin"

    def test_a_daily_local_cron_keys_on_utc_dues_across_the_change(self):
        plan = schedule_plan(Cron("30 6 * * *"), 15, self.TZ)
        before = decide_tick(plan, datetime(2026, 10, 24, 4, 30, tzinfo=UTC), 15)  # 06:30 CEST
        after = decide_tick(plan, datetime(2026, 10, 26, 5, 30, tzinfo=UTC), 15)  # 06:30 CET
        assert (before.skip_reason, after.skip_reason) == (None, None)
        assert before.due_key == "2026-10-24T04:30:00Z"
        assert after.due_key == "2026-10-26T05:30:00Z"

    def test_the_repeated_local_hour_runs_once_at_its_first_occurrence(self):
        # 02:00-03:00 local happens twice; an every-minute cron runs it once.
        plan = schedule_plan(Cron("* * * * *"), 15, self.TZ)
        first = decide_tick(plan, datetime(2026, 10, 25, 0, 30, tzinfo=UTC), 15)  # 02:30 CEST
        again = decide_tick(plan, datetime(2026, 10, 25, 1, 30, tzinfo=UTC), 15)  # 02:30 CET
        assert first.skip_reason is None
        assert again.skip_reason is not None and "happens twice" in again.skip_reason

    def test_nth_slot_of_day_is_read_in_local_time(self):
        plan = schedule_plan(NthSlotOfDay(8), 15, self.TZ)  # 02:00 local: clock changes touch it
        assert (plan.zoned_cron, plan.zone, plan.timezone) == ("0 2 * * *", self.TZ, "UTC")
        decision = decide_tick(plan, datetime(2026, 11, 30, 1, 0, tzinfo=UTC), 15)  # 02:00 CET
        assert decision.skip_reason is None
        assert decision.due_key == "2026-11-30T01:00:00Z"
        # The other UTC hour the schedule fires on (02:00 CEST in summer) is no due in winter.
        assert decide_tick(plan, datetime(2026, 11, 30, 0, 0, tzinfo=UTC), 15).skip_reason

    def test_a_daily_cron_over_a_clock_change_is_daily_not_hourly(self):
        # Regression: croniter stepping through the spring-forward day made a daily 02:00
        # Berlin cron look hourly (its cadence and the load-time warning said so).
        assert cron_cadence("0 2 * * *", self.TZ).minutes == 1440
        assert cron_effective_cadence("0 2 * * *", 15, self.TZ).minutes == 1440


@pytest.mark.parametrize(
    ("name", "slot", "n", "cron", "every"),
    [
        ("quarter_hour_grid", 15, 1, "*/15 * * * *", None),
        ("hourly_grid", 15, 4, "0 * * * *", None),
        ("four_hour_grid", 60, 4, "0 */4 * * *", None),
        ("no_cron_for_75_minutes", 15, 5, "*/15 * * * *", 5),
    ],
)
def test_every_n_slots_uses_an_exact_cron_when_one_exists(name, slot, n, cron, every):
    plan = schedule_plan(EverySlots(n), slot, "Europe/Berlin")
    assert (plan.cron, plan.timezone, plan.every_n_slots) == (cron, "UTC", every)


def test_every_5_slots_skips_slots_off_its_grid():
    plan = schedule_plan(EverySlots(5), 15, "UTC")
    epoch_aligned = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(minutes=75 * 23_600)
    on_grid = decide_tick(plan, epoch_aligned, 15)
    off_grid = decide_tick(plan, epoch_aligned + timedelta(minutes=15), 15)
    assert on_grid.skip_reason is None
    assert off_grid.skip_reason is not None and "every-5-slots grid" in off_grid.skip_reason


# --- the cron a schedule fires on (so the Automation list tells the truth) ------------------
ALIGNED_CRONS = [
    # (name, declared cron, slot minutes, timezone, cron the schedule fires on)
    ("every_minute_on_15_minute_slots", "* * * * *", 15, "UTC", "*/15 * * * *"),
    ("every_5_minutes_on_15_minute_slots", "*/5 * * * *", 15, "UTC", "*/15 * * * *"),
    ("office_hours_keep_their_hours_and_days", "*/5 9-17 * * 1-5", 15, "UTC", "*/15 9-17 * * 1-5"),
    ("a_range_inside_two_slots", "10-20 * * * *", 15, "UTC", "0,15 * * * *"),
    ("every_minute_on_hourly_slots", "* * * * *", 60, "UTC", "0 * * * *"),
    ("every_minute_on_two_hour_slots", "* * * * *", 120, "UTC", "0 */2 * * *"),
    ("berlin_offsets_stay_on_the_15_minute_grid", "* * * * *", 15, "Europe/Berlin", "*/15 * * * *"),
    (
        "kathmandu_5_45_stays_on_the_15_minute_grid",
        "* * * * *",
        15,
        "Asia/Kathmandu",
        "*/15 * * * *",
    ),
    # Kept as declared: at most one fire per slot, or no single cron on the grid exists.
    ("once_an_hour_is_not_finer_than_the_slot", "7 * * * *", 15, "UTC", "7 * * * *"),
    ("one_minute_slots_change_nothing", "* * * * *", 1, "UTC", "* * * * *"),
    ("kathmandu_5_45_is_off_the_hourly_grid", "* * * * *", 60, "Asia/Kathmandu", "* * * * *"),
    ("ninety_minute_slots_would_need_two_crons", "0 * * * *", 90, "UTC", "0 * * * *"),
]


@pytest.mark.parametrize(
    ("declared", "slot", "timezone", "expected"),
    [case[1:] for case in ALIGNED_CRONS],
    ids=[case[0] for case in ALIGNED_CRONS],
)
def test_a_cron_finer_than_the_slot_fires_on_the_slot_grid(declared, slot, timezone, expected):
    assert slot_aligned_cron(declared, slot, timezone) == expected


def test_an_aligned_cron_asks_for_the_same_dues_as_the_declared_one():
    start = datetime(2026, 3, 27, tzinfo=UTC)  # across the EU DST change of 2026-03-29
    end = start + timedelta(days=4)
    for declared, slot, zone in [
        ("* * * * *", 15, "Europe/Berlin"),
        ("*/5 9-17 * * 1-5", 15, "UTC"),
        ("10-20 * * * *", 15, "UTC"),
        ("* * * * *", 120, "UTC"),
    ]:
        aligned = slot_aligned_cron(declared, slot, zone)
        declared_dues = {
            floor_to_slot(f, slot) for f in cron_fire_times(declared, zone, start, end)
        }
        aligned_fires = cron_fire_times(aligned, zone, start, end)
        assert {floor_to_slot(f, slot) for f in aligned_fires} == declared_dues, declared
        assert all(floor_to_slot(f, slot) == f for f in aligned_fires)  # fires at its due


#: UTC crons that name no day, month or weekday: their fires come from their minute and hour
#: fields, not from croniter's steps (resources/core/slots.py).
DAILY_UTC_CRONS = [
    "* * * * *",
    "*/5 * * * *",
    "0 0 * * *",
    "17 3 * * *",
    "5,35 */6 * * *",
    "*/13 2-5 * * *",
    "45 23 * * *",
    "0 * * * *",
    "0-10/3 9-17/4 * * *",
]


@pytest.mark.parametrize("cron", DAILY_UTC_CRONS)
def test_a_daily_utc_crons_sample_is_the_one_croniter_steps_to(cron):
    # Such a cron's sample is computed from its fields, not by stepping croniter
    # (600 steps for a minute cron, in every process); it must be the very same instants.
    from croniter import croniter

    from resources.core.instants import as_utc
    from resources.core.slots import _DAILY_SPAN, _SAMPLE_FIRES, _SAMPLE_START, _sample_fires

    itr = croniter(cron, _SAMPLE_START.replace(tzinfo=None))
    stepped = []
    for _ in range(_SAMPLE_FIRES):
        fire = as_utc(itr.get_next(datetime))
        if fire - _SAMPLE_START > _DAILY_SPAN:
            break
        stepped.append(fire)
    assert _sample_fires.__wrapped__(cron, "UTC") == tuple(stepped)


@pytest.mark.parametrize("cron", DAILY_UTC_CRONS)
@pytest.mark.parametrize(
    ("start", "end"),
    [
        (datetime(2026, 11, 30, 22, 45, tzinfo=UTC), datetime(2026, 12, 2, 1, 0, tzinfo=UTC)),
        # mid-minute bounds, a month's end, a window inside one hour
        (datetime(2027, 2, 27, 3, 4, 30, tzinfo=UTC), datetime(2027, 3, 1, 9, 17, 1, tzinfo=UTC)),
        (datetime(2026, 6, 1, 2, 0, tzinfo=UTC), datetime(2026, 6, 1, 2, 59, tzinfo=UTC)),
    ],
)
def test_a_daily_utc_crons_fire_times_are_the_ones_croniter_steps_to(cron, start, end):
    # Every load lists each task's next dues; a daily UTC cron's fires come from its
    # minute and hour fields, and they must be the very instants croniter steps to.
    from croniter import croniter

    from resources.core.instants import as_utc
    from resources.core.slots import cron_fire_times

    itr = croniter(cron, start - timedelta(microseconds=1))
    stepped = []
    while (fire := as_utc(itr.get_next(datetime))) < end:
        stepped.append(fire)
    assert cron_fire_times(cron, "UTC", start, end) == stepped
