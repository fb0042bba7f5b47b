"""The Due type: the one formatter and parser of a due, and the keys made from it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from orchestration.manual_launch import entry_request_from_tags
from orchestration.timetable import Cron, decide_tick, schedule_plan
from resources.core import tags as t
from resources.core.due import Due, format_due, parse_due
from resources.core.entry import Trigger, dedup_key_for_due

AT = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)


def test_text_round_trips_through_parse() -> None:
    due = Due(AT)
    assert due.text == "2026-11-30T22:45:00Z" == str(due) == format_due(AT)
    assert Due.parse(due.text) == due
    assert parse_due(due.text) == AT


def test_key_and_redispatch_run_keys() -> None:
    due = Due(AT)
    assert due.key == "due:2026-11-30T22:45:00Z" == dedup_key_for_due(AT)
    assert Due.from_key(due.key) == due
    assert due.redispatch_run_key(2) == "2026-11-30T22:45:00Z#redispatch-2"
    with pytest.raises(ValueError, match="re-dispatch number"):
        due.redispatch_run_key(0)


def test_a_sensor_of_several_tasks_qualifies_its_redispatch_keys_by_task() -> None:
    # One re-dispatch sensor for every task: Dagster dedups its run keys per sensor, so two
    # tasks' first re-dispatch of one due must not share a key.
    due = Due(AT)
    assert due.redispatch_run_key(1, "order_cleanup") == (
        "order_cleanup@2026-11-30T22:45:00Z#redispatch-1"
    )
    assert due.redispatch_run_key(1, "a") != due.redispatch_run_key(1, "b")
    for bad in ("", "a@b"):
        with pytest.raises(ValueError, match="cannot qualify"):
            due.redispatch_run_key(1, bad)


def test_the_same_instant_in_another_zone_is_the_same_due() -> None:
    plus_one = timezone(timedelta(hours=1))
    other = Due(AT.astimezone(plus_one))
    assert other == Due(AT)
    assert other.at.tzinfo is UTC
    assert other.text == "2026-11-30T22:45:00Z"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (datetime(2026, 11, 30, 22, 45), "timezone-naive"),
        (AT.replace(second=7), "not slot-aligned"),
        (AT.replace(microsecond=1), "not slot-aligned"),
        ("2026-11-30T22:45:00Z", "must be a datetime"),
    ],
)
def test_a_due_that_is_not_a_slot_start_is_refused(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Due(value)  # type: ignore[arg-type]
    if isinstance(value, datetime):
        with pytest.raises(ValueError, match=message):
            dedup_key_for_due(value)


@pytest.mark.parametrize(
    "text", ["2026-11-30 22:45:00", "2026-11-30T22:45:00+00:00", "", "due:2026-11-30T22:45:00Z"]
)
def test_malformed_text_names_the_text_and_the_form(text: str) -> None:
    with pytest.raises(ValueError, match="YYYY-MM-DDTHH:MM:SSZ"):
        Due.parse(text)


def test_from_key_refuses_other_origins() -> None:
    with pytest.raises(ValueError, match="not a due key"):
        Due.from_key("manual:2026-11-30T22:45:00Z")


def test_dues_order_by_time() -> None:
    later = Due(AT + timedelta(minutes=15))
    assert sorted([later, Due(AT)]) == [Due(AT), later]


def test_the_schedule_the_tag_and_the_entry_request_carry_the_same_due() -> None:
    """Schedule decision -> run tag text -> the run's entry request: one Due throughout."""
    plan = schedule_plan(Cron("*/15 * * * *"), 15, "UTC")
    decision = decide_tick(plan, AT + timedelta(minutes=0), 15)
    assert decision.skip_reason is None
    assert isinstance(decision.due, Due)
    tags = {t.TAG_TASK: "x", t.TAG_TRIGGER: Trigger.SCHEDULE.value, t.TAG_DUE: decision.due.text}
    request = entry_request_from_tags(tags, "run-1")
    assert request.due == decision.due
    assert request.dedup_key == decision.due.key
