"""Every schedule in `defs`, evaluated as a function (dg.build_schedule_context)."""

from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest

from orchestration.definitions import defs
from resources.core import tags as t
from resources.core.entry import Trigger
from resources.ledger import RunLedger

DEFS = defs()  # the code location, built once for this module
SCHEDULES = sorted(s.name for s in DEFS.schedules or [])
# A slot start that every rule of the default registry is due at (midnight UTC).
MIDNIGHT = datetime(2026, 12, 1, 0, 0, tzinfo=UTC)


def _evaluate(name: str, when: datetime, instance: dg.DagsterInstance):
    schedule = DEFS.resolve_schedule_def(name)
    with dg.build_schedule_context(
        instance=instance, scheduled_execution_time=when, resources={"ledger": _LEDGER[0]}
    ) as context:
        return schedule.evaluate_tick(context)


#: The ledger a tick reads the task's pauses from: one per module, empty.
_LEDGER: list[RunLedger] = []


@pytest.fixture(scope="module")
def instance(tmp_path_factory: pytest.TempPathFactory):
    ledger = RunLedger(database_url=f"sqlite:///{tmp_path_factory.mktemp('ledger')}/l.sqlite")
    ledger.migrate()
    _LEDGER.append(ledger)
    with dg.instance_for_test() as inst:
        yield inst
    ledger.dispose()
    _LEDGER.clear()


def test_there_is_one_schedule_per_task():
    from orchestration.declarations import registered_tasks

    expected = sorted(f"{task.key}_schedule" for task in registered_tasks())
    assert expected == SCHEDULES


@pytest.mark.parametrize("name", SCHEDULES)
def test_the_same_scheduled_time_twice_gives_the_same_run_key(name, instance):
    first = _evaluate(name, MIDNIGHT, instance).run_requests
    again = _evaluate(name, MIDNIGHT, instance).run_requests
    assert len(first) == 1
    assert [r.run_key for r in first] == [r.run_key for r in again]


@pytest.mark.parametrize("name", SCHEDULES)
def test_run_key_equals_the_due_tag_and_the_slot_start(name, instance):
    (request,) = _evaluate(name, MIDNIGHT, instance).run_requests
    assert request.run_key == "2026-12-01T00:00:00Z"
    assert request.tags[t.TAG_DUE] == request.run_key
    assert request.tags[t.TAG_TRIGGER] == Trigger.SCHEDULE
    assert request.tags[t.TAG_TASK] == name.removesuffix("_schedule")


@pytest.mark.parametrize("name", SCHEDULES)
def test_the_next_due_gives_a_different_run_key(name, instance):
    schedule = DEFS.resolve_schedule_def(name)
    # The next fire of this schedule after midnight, whatever its cadence.
    from croniter import croniter

    nxt = croniter(schedule.cron_schedule, MIDNIGHT).get_next(datetime)
    # A cron finer than the slot fires again inside the same slot; those ticks are skipped
    # by design. Take the first fire of the next slot.
    while nxt < MIDNIGHT + timedelta(minutes=15):
        nxt = croniter(schedule.cron_schedule, nxt).get_next(datetime)
    first = _evaluate(name, MIDNIGHT, instance).run_requests
    later = _evaluate(name, nxt, instance).run_requests
    assert first and later
    assert first[0].run_key != later[0].run_key


@pytest.mark.parametrize("name", SCHEDULES)
def test_evaluation_does_not_depend_on_the_wall_clock(name, instance):
    # Evaluating a due from a year ago gives that due, not "now".
    long_ago = MIDNIGHT - timedelta(days=365)
    (request,) = _evaluate(name, long_ago, instance).run_requests
    assert request.run_key == "2025-12-01T00:00:00Z"


def test_schedules_are_running_by_default():
    for name in SCHEDULES:
        assert DEFS.resolve_schedule_def(name).default_status == dg.DefaultScheduleStatus.RUNNING


def test_a_tick_without_plugin_listeners_does_not_open_the_compute_log(instance, monkeypatch):
    # context.log opens a compute-log stream (an upload per tick with a cloud compute-log
    # manager); with nothing to log a plain tick must not touch it.
    schedule = DEFS.resolve_schedule_def("order_cleanup_schedule")  # due every slot
    with dg.build_schedule_context(
        instance=instance, scheduled_execution_time=MIDNIGHT, resources={"ledger": _LEDGER[0]}
    ) as context:

        def opened(self):
            raise AssertionError("the schedule evaluation opened context.log")

        monkeypatch.setattr(type(context), "log", property(opened))
        (request,) = schedule.evaluate_tick(context).run_requests or []
    assert request.tags[t.TAG_TASK]


def test_no_schedule_carries_a_frozen_list_of_next_dues():
    # A list computed at the code location's load went stale within a slot and disagreed with
    # `dueledger dues`; ledger_health's table shows each task's next due, fresh every slot.
    for schedule in DEFS.schedules or []:
        assert "dueledger/next_dues" not in schedule.metadata, schedule.name
