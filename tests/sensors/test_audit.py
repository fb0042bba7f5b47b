"""Missed-due audit and catch-up.

Expected dues as a pure table of rules and named instants; then "the daemon was down for
three slots" through the real scheduler and sensor daemon paths: the strict task reports
three missed dues, the catch_up task gets exactly those three launched once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
from dagster_internals import daemon_instance, daemon_workspace, run_scheduler_tick, run_sensor_tick
from sensor_support import fixture_module, target, task_runs

from orchestration.missed_dues import audit_task, expected_dues
from orchestration.services.summary import ledger_summary
from orchestration.task_spec import TaskSpec, build_views
from orchestration.timetable import Cron, EverySlots, NthSlotOfDay
from resources.core import tags as t
from resources.core.due import format_due
from resources.core.entry import Trigger, dedup_key_for_due
from resources.ledger import RunLedger

pytestmark = pytest.mark.daemon

MIDNIGHT = datetime(2026, 12, 1, tzinfo=UTC)
JUST_BEFORE_MIDNIGHT = MIDNIGHT - timedelta(minutes=30)


def view(rule, slot: int = 15, timezone: str = "UTC"):
    spec = TaskSpec(key="t", rule=rule, declared_cadence="x")
    (v,) = build_views([spec], slot, timezone)
    return v


EXPECTED = [
    (
        "every slot, 30 min across midnight",
        EverySlots(1),
        JUST_BEFORE_MIDNIGHT,
        MIDNIGHT + timedelta(minutes=15),
        ["2026-11-30T23:30:00Z", "2026-11-30T23:45:00Z", "2026-12-01T00:00:00Z"],
    ),
    (
        "every 4 slots = on the hour",
        EverySlots(4),
        JUST_BEFORE_MIDNIGHT,
        MIDNIGHT + timedelta(hours=1, minutes=1),
        ["2026-12-01T00:00:00Z", "2026-12-01T01:00:00Z"],
    ),
    (
        "cron at :05 lands in the slot starting :00",
        Cron("5 * * * *"),
        MIDNIGHT,
        MIDNIGHT + timedelta(hours=2),
        ["2026-12-01T00:00:00Z", "2026-12-01T01:00:00Z"],
    ),
    (
        "a cron finer than the slot: one due per slot",
        Cron("* * * * *"),
        MIDNIGHT,
        MIDNIGHT + timedelta(minutes=45),
        ["2026-12-01T00:00:00Z", "2026-12-01T00:15:00Z", "2026-12-01T00:30:00Z"],
    ),
    (
        "slot 2 of the day",
        NthSlotOfDay(2),
        MIDNIGHT - timedelta(days=1),
        MIDNIGHT + timedelta(days=1),
        ["2026-11-30T00:30:00Z", "2026-12-01T00:30:00Z"],
    ),
    ("end is exclusive", EverySlots(1), MIDNIGHT, MIDNIGHT, []),
]


@pytest.mark.parametrize(
    ("rule", "start", "end", "dues"), [pytest.param(r, s, e, d, id=n) for n, r, s, e, d in EXPECTED]
)
def test_expected_dues_follow_the_schedules_own_decision(rule, start, end, dues):
    assert [format_due(d) for d in expected_dues(view(rule), start, end)] == dues


def test_a_task_without_any_recorded_run_is_not_audited(ledger_url: str):
    ledger = RunLedger(database_url=ledger_url)
    ledger.migrate()
    audit = audit_task(view(EverySlots(1)), ledger, MIDNIGHT)
    assert (audit.start, audit.missed) == (None, ())
    ledger.dispose()


def test_dues_before_the_first_recorded_run_are_not_missed_and_gaps_after_it_are(ledger_url: str):
    ledger = RunLedger(database_url=ledger_url)
    ledger.migrate()
    first = MIDNIGHT - timedelta(hours=2)
    for due in (first, first + timedelta(minutes=15), first + timedelta(minutes=45)):
        ledger.ensure_entry(
            task_key="t", trigger=Trigger.SCHEDULE, dedup_key=dedup_key_for_due(due), now=due
        )
    audit = audit_task(view(EverySlots(1)), ledger, first + timedelta(hours=1, minutes=5))
    assert audit.start == first
    assert [format_due(d) for d in audit.missed] == ["2026-11-30T22:30:00Z"]  # 22:45 is this slot
    ledger.dispose()


# --- the daemon was down for three slots ----------------------------------------------------------

D0 = datetime(2026, 11, 30, 20, 0, tzinfo=UTC)
SLOT = timedelta(minutes=15)
D1, D2, D3, D4 = (D0 + n * SLOT for n in range(1, 5))
MISSED = [format_due(d) for d in (D1, D2, D3)]


@dataclass
class Outage:
    instance: dg.DagsterInstance
    ledger: RunLedger
    summary_before: dict
    summary_after: dict
    catch_up_keys: list[str]
    runs_after_reevaluation: int
    runs_after_first: int
    slot_alerts: list[dict]


@pytest.fixture(scope="module")
def outage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outage]:
    tmp = tmp_path_factory.mktemp("outage")
    handler = _Collect()
    logging.getLogger("dueledger.alerts").addHandler(handler)
    with pytest.MonkeyPatch.context() as mp:
        url = f"sqlite:///{tmp / 'ledger.sqlite'}"
        mp.setenv("DUELEDGER_DATABASE_URL", url)
        ledger = RunLedger(database_url=url)
        ledger.migrate()
        defs_module = fixture_module()
        audit_views = defs_module.views_of(defs_module.STRICT, defs_module.CATCH_UP_TASK)
        with (
            daemon_instance("mocked", temp_dir=tmp / "instance") as instance,
            daemon_workspace(instance, target("audit_defs")) as ctx,
        ):
            run_scheduler_tick(ctx, D0 - timedelta(minutes=1))
            run_sensor_tick(ctx, D0 - timedelta(minutes=1))
            run_scheduler_tick(ctx, D0 + timedelta(seconds=5))
            run_sensor_tick(ctx, D0 + timedelta(minutes=1))
            handler.lines.clear()
            # ... the daemon is down for D1, D2, D3 ...
            run_scheduler_tick(ctx, D4 + timedelta(seconds=5))  # only the latest due runs
            before = ledger_summary(
                ledger, audit_views, D4 + timedelta(seconds=30), instance=instance
            )
            run_sensor_tick(ctx, D4 + timedelta(minutes=1))  # catch-up + slot health
            first = len(instance.get_runs())
            run_sensor_tick(ctx, D4 + timedelta(minutes=3))  # evaluated again
            run_sensor_tick(ctx, D4 + timedelta(minutes=5))
            after = ledger_summary(
                ledger, audit_views, D4 + timedelta(minutes=6), instance=instance
            )
            keys = [
                r.tags[t.DAGSTER_RUN_KEY]
                for r in task_runs(instance, "catch_up_task")
                if r.tags.get(t.TAG_TRIGGER) == Trigger.SENSOR
            ]
            yield Outage(
                instance,
                ledger,
                before,
                after,
                keys,
                len(instance.get_runs()),
                first,
                [a for a in map(json.loads, handler.lines) if a["alert"] == "slot_health"],
            )
        ledger.dispose()
    logging.getLogger("dueledger.alerts").removeHandler(handler)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _row(summary: dict, task: str) -> dict:
    return next(r for r in summary["tasks"] if r["task_key"] == task)


def test_three_slots_without_a_daemon_are_three_missed_dues_of_a_strict_task(outage):
    row = _row(outage.summary_before, "strict_task")
    assert row["missed_dues"] == MISSED
    assert row["missed_24h"] == 3
    # Audited from when the daemon first ran the schedule (its first iteration, a minute
    # before D0), as the outcome sensor's tick recorded it.
    assert row["audited_since"] == format_due(D0 - timedelta(minutes=1))
    assert outage.summary_before["missed_24h"] == 6  # strict + catch_up, before catching up
    assert _row(outage.summary_after, "strict_task")["missed_dues"] == MISSED  # never replayed
    assert not [
        r
        for r in task_runs(outage.instance, "strict_task")
        if r.tags.get(t.TAG_TRIGGER) != Trigger.SCHEDULE
    ]


def test_a_catch_up_task_gets_each_missed_due_launched_once_with_the_due_as_run_key(outage):
    assert sorted(outage.catch_up_keys) == MISSED
    for run in task_runs(outage.instance, "catch_up_task"):
        assert run.tags[t.TAG_DUE] == run.tags[t.DAGSTER_RUN_KEY]
    assert _row(outage.summary_after, "catch_up_task")["missed_dues"] == []


def test_re_evaluating_the_catch_up_sensor_launches_nothing_more(outage):
    assert outage.runs_after_reevaluation == outage.runs_after_first


def test_the_slot_health_warning_lists_the_missed_dues_once(outage):
    (alert,) = outage.slot_alerts
    assert alert["missed_dues"]["strict_task"] == MISSED
    assert alert["slot"] == format_due(D4)
