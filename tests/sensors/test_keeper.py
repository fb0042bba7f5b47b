"""``ledger_sensor``: one sensor runs every duty each tick, each with a cursor of its own, and
a duty that raises leaves the others' work standing.

Evaluated as Dagster evaluates a sensor (its function, the real ``RunLedger`` resource, a
real Dagster instance); through the real sensor daemon, the duties' own tests tick it
(tests/fixtures/ledger_defs.py registers ``build_sensors``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
from croniter import croniter

import sensors.keeper as keeper
from orchestration.declarations import task_views
from orchestration.definitions import build_definitions
from resources.core.due import floor_to_slot
from resources.core.entry import FailureKind, Status, Trigger, dedup_key_for_due
from resources.core.settings import ENV_KEEPER_INTERVAL, SettingsError, load_settings
from resources.ledger import RunLedger
from sensors import build_sensors
from sensors.reclaim import reclaim_duty
from sensors.support import Duty

NOW = datetime(2026, 11, 30, 23, 4, tzinfo=UTC)


def _expired_lease(ledger: RunLedger, task: str = "order_cleanup") -> int:
    due = floor_to_slot(NOW, 15) - timedelta(minutes=15)
    entry = ledger.ensure_entry(
        task_key=task, trigger=Trigger.SCHEDULE, dedup_key=dedup_key_for_due(due)
    )
    assert ledger.claim(entry.id, "run-dead", lease_ttl=timedelta(minutes=1), now=due).claimed
    return entry.id


def _tick(sensor: dg.SensorDefinition, ledger: RunLedger, cursor: str | None = None):
    with (
        dg.instance_for_test() as instance,
        dg.build_sensor_context(
            instance=instance, cursor=cursor, resources={"ledger": ledger}
        ) as context,
    ):
        return sensor(context)


def test_one_tick_runs_every_duty_and_keeps_a_cursor_for_each(ledger: RunLedger) -> None:
    views = task_views()
    entry_id = _expired_lease(ledger)
    sensor = keeper.build_keeper_sensor(views, clock=lambda: NOW)
    result = _tick(sensor, ledger)
    reason = result.skip_reason.skip_message
    # Each duty reported, in order, under its name.
    names = [d.name for d in keeper.keeper_duties(views)]
    assert names == [
        "outcomes",
        "reclaim",
        "policies",
        "slot_health",
        "redispatch",
        "waiters",
    ]
    positions = [reason.index(f"{name}: ") for name in names]
    assert positions == sorted(positions), reason
    assert "reclaim: reclaimed 1 expired lease(s)" in reason
    entry = ledger.get(entry_id)
    assert entry is not None and entry.failure_kind == FailureKind.LEASE_RECLAIMED
    # The duties with a cursor keep theirs under their own name; slot health's checks go out.
    cursors = json.loads(result.cursor)
    assert set(cursors) == {"outcomes", "slot_health"}
    assert json.loads(cursors["slot_health"])["slot"] == "2026-11-30T23:00:00Z"
    assert result.asset_events, "slot health's check evaluations"
    # The next tick in the same slot starts from slot health's own cursor: no new evaluation.
    again = _tick(sensor, ledger, cursor=result.cursor)
    assert "already evaluated" in again.skip_reason.skip_message


def test_a_duty_that_raises_leaves_the_others_work_and_its_own_cursor(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(context, ledger, now):
        raise RuntimeError("the ledger is on fire")

    monkeypatch.setattr(
        keeper, "keeper_duties", lambda views: [Duty("broken", broken, "Breaks."), reclaim_duty()]
    )
    sensor = keeper.build_keeper_sensor([], clock=lambda: NOW)
    entry_id = _expired_lease(ledger)
    before = json.dumps({"broken": "where it was"})
    result = _tick(sensor, ledger, cursor=before)
    reason = result.skip_reason.skip_message
    assert reason.startswith("FAILED broken: RuntimeError: the ledger is on fire; "), reason
    assert "reclaim: reclaimed 1 expired lease(s)" in reason
    entry = ledger.get(entry_id)
    assert entry is not None and entry.status == Status.FAILED
    assert json.loads(result.cursor) == {"broken": "where it was"}


def test_a_garbled_cursor_starts_every_duty_afresh(ledger: RunLedger) -> None:
    sensor = keeper.build_keeper_sensor(task_views(), clock=lambda: NOW)
    for garbled in ("not json", "[1, 2]", json.dumps({"outcomes": 7})):
        result = _tick(sensor, ledger, cursor=garbled)
        assert set(json.loads(result.cursor)) == {"outcomes", "slot_health"}


def _ticks_per_day(cron: str) -> int:
    start = datetime(2026, 11, 30, tzinfo=UTC)
    it = croniter(cron, start - timedelta(microseconds=1))
    count = 0
    while it.get_next(datetime) < start + timedelta(days=1):
        count += 1
    return count


def test_the_code_location_stores_at_most_three_sensor_ticks_per_schedule_tick() -> None:
    # Dagster stores a tick for every evaluation of every sensor; five sensors every 30-112 s
    # stored 10,851 a day against the schedules' 650. (bench/idle.py and bench/scale.py
    # count what a running daemon stores.)
    views = task_views()
    sensors = build_sensors(views)
    assert [s.name for s in sensors] == ["ledger_sensor"]
    sensor_ticks = sum(86_400 // (s.minimum_interval_seconds or 30) for s in sensors)
    schedule_ticks = sum(_ticks_per_day(cron) for v in views for cron in v.plan.crons)
    assert sensor_ticks == 1_440
    assert sensor_ticks <= 3 * schedule_ticks, (sensor_ticks, schedule_ticks)


@pytest.mark.parametrize(
    ("slot_minutes", "seconds"), [(1, 30), (2, 30), (4, 60), (5, 60), (15, 60), (60, 60)]
)
def test_the_keeper_runs_every_quarter_slot_from_30_to_60_seconds(slot_minutes, seconds) -> None:
    # On 1-minute slots a 60 s keeper would hardly ever re-dispatch a failed launch in its slot.
    assert keeper.keeper_interval_seconds(slot_minutes) == seconds
    views = task_views(load_settings({"DUELEDGER_SLOT_MINUTES": str(slot_minutes)}))
    (sensor,) = build_sensors(views)
    assert sensor.minimum_interval_seconds == seconds


@pytest.mark.parametrize(("raw", "seconds"), [(None, 60), ("", 60), ("45", 45), ("600", 600)])
def test_the_code_location_runs_the_keeper_as_often_as_the_environment_says(
    tmp_path, raw, seconds
) -> None:
    env = {"DAGSTER_HOME": str(tmp_path)}
    if raw is not None:
        env[ENV_KEEPER_INTERVAL] = raw
    defs = build_definitions(load_settings(env))
    assert defs.resolve_sensor_def(keeper.KEEPER_SENSOR).minimum_interval_seconds == seconds


@pytest.mark.parametrize("raw", ["abc", "9", "601", "1.5", "-60"])
def test_a_keeper_interval_that_cannot_work_is_refused_naming_the_variable(raw) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({ENV_KEEPER_INTERVAL: raw})
    assert str(caught.value).startswith(
        f"{ENV_KEEPER_INTERVAL}={raw!r} must be a whole number of seconds from 10 to 600"
    )
