"""Ledger health: summary numbers against a hand-built ledger (SQLite and PostgreSQL), the
``ledger_health`` asset's metadata, and the slot-health warning (once per slot, silent when
healthy). Times are injected named instants.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
from sensor_support import fixture_module

from orchestration.reclaim import reclaim_expired
from orchestration.services.accounting import CHECK_NAME
from orchestration.services.ledger_checks import LEDGER_CHECK_NAMES
from orchestration.services.summary import ledger_summary, summary_markdown
from orchestration.task_spec import Cron, EverySlots, TaskSpec, build_views
from resources.core import tags as t
from resources.core.entry import (
    FailureKind,
    Status,
    Trigger,
    dedup_key_for_due,
    dedup_key_for_retry,
)
from resources.ledger import RunLedger
from sensors.health import build_slot_health_sensor

NOW = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
DAY_AGO = NOW - timedelta(hours=24)
THIRTY_HOURS_AGO = NOW - timedelta(hours=30)
TTL = timedelta(minutes=5)


def at(hh: int, mm: int, ss: int = 0) -> datetime:
    return datetime(2026, 11, 30, hh, mm, ss, tzinfo=UTC)


def views():
    module = fixture_module()
    return module.views_of(module.STRICT, module.CATCH_UP_TASK)


def _due_entry(ledger: RunLedger, due: datetime, *, task: str = "strict_task", attempts: int = 3):
    return ledger.ensure_entry(
        task_key=task,
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(due),
        max_attempts=attempts,
        now=due,
    )


def build_ledger(ledger: RunLedger) -> None:
    """strict_task dues 20:00-22:45 with one of each fate, five dues never run; catch_up_task
    last ran 30 hours ago."""
    reclaimed = _due_entry(ledger, at(22, 30))
    ledger.claim(reclaimed.id, "run-reclaimed", lease_ttl=TTL, now=at(22, 30))
    assert len(reclaim_expired(ledger, now=at(22, 40))) == 1  # failed, lease_reclaimed

    ok = _due_entry(ledger, at(20, 0))
    ledger.claim(ok.id, "run-ok", lease_ttl=TTL, now=at(20, 0))
    assert ledger.succeed(ok.id, "run-ok", now=at(20, 1))

    failed = _due_entry(ledger, at(20, 15), attempts=1)
    ledger.claim(failed.id, "run-failed", lease_ttl=TTL, now=at(20, 15))
    ledger.fail(failed.id, "run-failed", error="RuntimeError: boom", now=at(20, 16))

    stale = _due_entry(ledger, at(20, 30))
    ledger.claim(stale.id, "run-stale", lease_ttl=TTL, now=at(20, 30))  # expired 20:35

    dispatch = _due_entry(ledger, at(20, 45))
    ledger.record_dispatch_failure(
        dispatch.id, error="launcher down", run_id="run-x", now=at(20, 46)
    )

    active = _due_entry(ledger, at(21, 0))
    ledger.claim(active.id, "run-active", lease_ttl=timedelta(minutes=10), now=at(22, 58))

    _due_entry(ledger, at(22, 45))  # queued, its run not started yet
    ledger.ensure_entry(
        task_key="strict_task",
        trigger=Trigger.MANUAL_RETRY,
        dedup_key=dedup_key_for_retry(failed.id),
        parent_id=failed.id,
        operator="ops",
        reason="retry the failed due",
        now=at(22, 0),
    )

    old = _due_entry(ledger, THIRTY_HOURS_AGO, task="catch_up_task")
    ledger.claim(old.id, "run-old", lease_ttl=TTL, now=THIRTY_HOURS_AGO)
    ledger.succeed(old.id, "run-old", now=THIRTY_HOURS_AGO + timedelta(minutes=1))


EXPECTED_TOTALS = {
    "active": 1,
    "stale": 1,
    "failed_24h": 2,
    "success_24h": 1,
    "manual_retry_24h": 1,
    "dispatch_failed_24h": 1,
    "lease_reclaimed_24h": 1,
    "queued": 2,
    "retrying": 0,
    # strict: 21:15 21:30 21:45 22:00 22:15; catch_up: every due of the window (96)
    "missed_24h": 5 + 96,
}
COUNTED = (
    "active",
    "stale",
    "failed_24h",
    "success_24h",
    "manual_retry_24h",
    "dispatch_failed_24h",
    "missed_24h",
)


def test_summary_numbers_match_a_hand_built_ledger(ledger):
    build_ledger(ledger)
    summary = ledger_summary(ledger, views(), NOW)
    assert {k: summary[k] for k in EXPECTED_TOTALS} == EXPECTED_TOTALS
    strict = next(r for r in summary["tasks"] if r["task_key"] == "strict_task")
    assert strict["missed_dues"] == [
        "2026-11-30T21:15:00Z",
        "2026-11-30T21:30:00Z",
        "2026-11-30T21:45:00Z",
        "2026-11-30T22:00:00Z",
        "2026-11-30T22:15:00Z",
    ]
    assert strict["last_success_at"] == "2026-11-30T20:01:00Z"
    catch_up = next(r for r in summary["tasks"] if r["task_key"] == "catch_up_task")
    assert (catch_up["success_24h"], catch_up["missed_24h"]) == (0, 96)


def test_per_task_rows_add_up_to_the_summary_totals(ledger):
    # The totals are RunLedger.summary_counts (the query `dueledger summary` runs); the
    # per-task table is computed separately with the same definitions: they must agree.
    build_ledger(ledger)
    summary = ledger_summary(ledger, views(), NOW)
    for key in COUNTED:
        assert sum(row[key] for row in summary["tasks"]) == summary[key], key


def test_needs_attention_lists_the_newest_failed_stale_and_dispatch_failed_entries(ledger):
    build_ledger(ledger)
    summary = ledger_summary(ledger, views(), NOW)
    rows = [(r["status"], r["failure_kind"], r["run_id"]) for r in summary["attention"]]
    assert rows == [
        (Status.FAILED, FailureKind.LEASE_RECLAIMED, "run-reclaimed"),  # 22:40
        (Status.DISPATCH_FAILED, FailureKind.DISPATCH, "run-x"),  # 20:46
        ("stale", "", "run-stale"),  # claimed 20:30, lease expired
        (Status.FAILED, FailureKind.ERROR, "run-failed"),  # 20:16
    ]
    report = summary_markdown(summary)
    failed = next(r for r in summary["attention"] if r["run_id"] == "run-failed")
    # Links to the run and to every run of the entry (the Runs page's tag filter).
    assert f"[run-fail]({t.run_path('run-failed')})" in report
    assert f"[{failed['entry_id']}]({t.entry_runs_path(failed['entry_id'])})" in report
    assert "RuntimeError: boom" in report


def test_an_empty_ledger_is_all_zero_and_audits_nothing(ledger):
    summary = ledger_summary(ledger, views(), NOW)
    assert {k: summary[k] for k in COUNTED} == dict.fromkeys(COUNTED, 0)
    assert [r["audited_since"] for r in summary["tasks"]] == [None, None]


def test_the_ledger_health_asset_reports_the_summary_as_metadata(ledger_url: str):
    from hook_support import build

    due = "2026-11-30T23:00:00Z"
    result = dg.materialize(
        [build("ledger_health")],
        resources={"ledger": RunLedger(database_url=ledger_url)},
        instance=dg.DagsterInstance.ephemeral(),
        tags={t.TAG_TASK: "ledger_health", t.TAG_TRIGGER: Trigger.SCHEDULE.value, t.TAG_DUE: due},
    )
    assert result.success
    (event,) = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    # The health run counts itself: it is running (with a live lease) while it computes.
    assert {k: metadata[k].value for k in COUNTED} == {**dict.fromkeys(COUNTED, 0), "active": 1}
    table, report = metadata["per_task"], metadata["report"]
    assert isinstance(table, dg.TableMetadataValue) and isinstance(report, dg.MarkdownMetadataValue)
    assert "ledger_health" in [r.data["task_key"] for r in table.records]
    assert "Ledger health as of 2026-11-30T23:00:00Z" in (report.md_str or "")
    assert "Needs attention" in (report.md_str or "")
    assert isinstance(metadata["needs_attention"], dg.TableMetadataValue)
    # What a person reads first comes first: each task's latest due, a line per task.
    assert next(iter(metadata)) == "latest_dues"
    assert metadata["task order_cleanup"].value.startswith("no run yet  \ndue ")
    entry = RunLedger(database_url=ledger_url).find("ledger_health", f"due:{due}")
    assert entry is not None and entry.status == Status.SUCCESS


# --- slot health: one warning per slot, silent when healthy ----------------------------------


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.alerts: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.alerts.append(json.loads(record.getMessage()))


@pytest.fixture
def alerts() -> Iterator[list[dict]]:
    handler = _Collect()
    logger = logging.getLogger("dueledger.alerts")
    logger.addHandler(handler)
    yield handler.alerts
    logger.removeHandler(handler)


def _evaluate(ledger: RunLedger, now: datetime, cursor: str | None) -> dg.SensorResult:
    sensor = build_slot_health_sensor(views(), clock=lambda: now)
    with dg.build_sensor_context(
        instance=dg.DagsterInstance.ephemeral(), cursor=cursor, resources={"ledger": ledger}
    ) as context:
        result = sensor(context)
    assert isinstance(result, dg.SensorResult)
    return result


def test_slot_health_is_silent_when_healthy(ledger, alerts):
    for minute in (0, 15, 30):
        due = at(22, minute)
        entry = _due_entry(ledger, due)
        ledger.claim(entry.id, f"run-{minute}", lease_ttl=TTL, now=due)
        ledger.succeed(entry.id, f"run-{minute}", now=due + timedelta(minutes=1))
    result = _evaluate(ledger, at(22, 46), None)
    assert alerts == []
    assert result.cursor is not None and "healthy" in (result.skip_reason.skip_message or "")  # type: ignore[union-attr]


def test_slot_health_warns_once_per_slot_listing_what_went_wrong(ledger, alerts):
    entry = _due_entry(ledger, at(22, 0))
    ledger.claim(entry.id, "run-dead", lease_ttl=TTL, now=at(22, 0))
    reclaim_expired(ledger, now=at(22, 20))
    ok = _due_entry(ledger, at(22, 15))
    ledger.record_dispatch_failure(
        ok.id, error="launcher down\ntrace", run_id="run-y", now=at(22, 16)
    )

    first = _evaluate(
        ledger,
        at(22, 31),
        json.dumps({"slot": "2026-11-30T22:00:00Z", "at": at(22, 1).isoformat()}),
    )
    (alert,) = alerts
    assert alert["alert"] == "slot_health" and alert["slot"] == "2026-11-30T22:30:00Z"
    assert [(r["task"], r["run_id"]) for r in alert["reclaims"]] == [("strict_task", "run-dead")]
    assert [(d["run_id"], d["error"]) for d in alert["dispatch_failures"]] == [
        ("run-y", "launcher down")
    ]
    assert alert["missed_dues"] == {}

    again = _evaluate(ledger, at(22, 40), first.cursor)  # the same slot: nothing more
    assert len(alerts) == 1 and not again.asset_events
    ledger.ensure_entry(
        task_key="strict_task",
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(at(22, 30)),
        now=at(22, 30),
    )
    _evaluate(ledger, at(22, 46), first.cursor)  # next slot, nothing new: silent
    assert len(alerts) == 1
    _evaluate(ledger, at(23, 1), first.cursor)  # 22:45 never ran: that is news
    assert alerts[-1]["missed_dues"] == {"strict_task": ["2026-11-30T22:45:00Z"]}


def _checked_tasks(result: dg.SensorResult) -> list[str]:
    keys = [e.asset_key.to_user_string() for e in result.asset_events or []]
    return sorted(k for k in keys if k != "ledger_health")


def _two_cadences():
    specs = [
        TaskSpec(key="strict_task", rule=EverySlots(1), declared_cadence="slot"),
        TaskSpec(
            key="hourly_task",
            rule=Cron("0 * * * *"),
            declared_cadence="hourly",
        ),
    ]
    return build_views(specs, 15, "UTC")


def _tick(ledger: RunLedger, views, now: datetime, cursor: str | None) -> dg.SensorResult:
    sensor = build_slot_health_sensor(views, clock=lambda: now)
    with dg.build_sensor_context(
        instance=dg.DagsterInstance.ephemeral(), cursor=cursor, resources={"ledger": ledger}
    ) as context:
        result = sensor(context)
    assert isinstance(result, dg.SensorResult)
    return result


def test_a_check_is_evaluated_again_only_when_its_due_moved_or_it_was_not_a_success(ledger):
    # Evaluating every task's check every slot once cost O(tasks) per slot (5 s and 500
    # stored evaluations at 500 tasks on 5-minute slots). A success is final, so a task's
    # check changes only with its next due -- or while its entry is not a success.
    both = _two_cadences()
    for task in ("strict_task", "hourly_task"):
        done = _due_entry(ledger, at(22, 0), task=task)
        ledger.claim(done.id, f"run-{task}", lease_ttl=TTL, now=at(22, 0))
        assert ledger.succeed(done.id, f"run-{task}", now=at(22, 1))

    first = _tick(ledger, both, at(22, 16), None)  # no cursor: every check, both successes
    assert _checked_tasks(first) == ["hourly_task", "strict_task"]
    assert json.loads(first.cursor or "")["unsettled"] == []
    second = _tick(ledger, both, at(22, 31), first.cursor)  # strict_task's 22:15 is due now
    assert _checked_tasks(second) == ["strict_task"]
    assert json.loads(second.cursor or "")["unsettled"] == ["strict_task"]  # 22:15 missed
    third = _tick(ledger, both, at(22, 46), second.cursor)  # missed: evaluated again
    assert _checked_tasks(third) == ["strict_task"]
    fourth = _tick(ledger, both, at(23, 16), third.cursor)  # 23:00 finished: hourly_task too
    assert _checked_tasks(fourth) == ["hourly_task", "strict_task"]
    # A cursor of an older sensor (no unsettled list): every check once.
    old = json.dumps({"slot": "2026-11-30T23:15:00Z", "at": at(23, 16).isoformat()})
    assert _checked_tasks(_tick(ledger, both, at(23, 31), old)) == ["hourly_task", "strict_task"]


def test_a_new_tasks_check_is_settled_until_its_due_moves_or_an_entry_of_it_changes(ledger):
    # A fresh deployment: nothing ran before the latest due (state not_running_here_yet),
    # which only a new due or an entry for it can change -- not something to read each slot.
    both = _two_cadences()
    first = _tick(ledger, both, at(22, 16), None)
    assert _checked_tasks(first) == ["hourly_task", "strict_task"]
    assert json.loads(first.cursor or "")["unsettled"] == []
    second = _tick(ledger, both, at(22, 31), first.cursor)
    assert _checked_tasks(second) == ["strict_task"]  # its due moved; hourly_task's did not
    late = _due_entry(ledger, at(22, 0), task="hourly_task")  # its 22:00 run, late
    ledger.claim(late.id, "run-late", lease_ttl=TTL, now=at(22, 40))
    third = _tick(ledger, both, at(22, 46), second.cursor)
    assert _checked_tasks(third) == ["hourly_task", "strict_task"]  # its entry changed
    assert json.loads(third.cursor or "")["unsettled"] == ["hourly_task"]  # running


def test_inside_a_slot_a_tick_reports_again_the_checks_of_tasks_whose_entries_settled(ledger):
    # A run materializes seconds after its slot's evaluation; Dagster shows an evaluation on a
    # materialization only if it is newer. The tick after the run's entry settles reports the
    # check again; a heartbeat (a running entry's row changes) is no reason to.
    both = _two_cadences()
    start = _tick(ledger, both, at(22, 16), None)
    assert _checked_tasks(start) == ["hourly_task", "strict_task"]
    quiet = _tick(ledger, both, at(22, 17), start.cursor)
    assert not quiet.asset_events
    assert "no entry settled" in (quiet.skip_reason.skip_message or "")  # type: ignore[union-attr]
    running = _due_entry(ledger, at(22, 0))  # the latest finished slot's due, late
    ledger.claim(running.id, "run-a", lease_ttl=TTL, now=at(22, 17, 30))
    ledger.heartbeat(running.id, "run-a", lease_ttl=TTL, now=at(22, 17, 45))
    beating = _tick(ledger, both, at(22, 18), quiet.cursor)
    assert not beating.asset_events  # running: its account has not changed
    assert ledger.succeed(running.id, "run-a", now=at(22, 18, 20))
    settled = _tick(ledger, both, at(22, 19), beating.cursor)
    assert _checked_tasks(settled) == ["strict_task"]
    (evaluation,) = settled.asset_events or []
    assert evaluation.metadata["entry_id"] == dg.MetadataValue.text(str(running.id))  # not a plot
    after = _tick(ledger, both, at(22, 20), settled.cursor)
    assert not after.asset_events  # reported once (and once more at most within RESEEN)
    # The slot's own evaluation is not repeated by these ticks: the next slot start is.
    assert json.loads(after.cursor or "")["slot"] == "2026-11-30T22:15:00Z"


def test_inside_a_slot_ledger_health_settling_reports_the_ledger_checks_again(ledger):
    views = build_views(
        [TaskSpec(key="ledger_health", rule=EverySlots(1), declared_cadence="slot")], 15, "UTC"
    )
    start = _tick(ledger, views, at(22, 16), None)
    own = _due_entry(ledger, at(22, 15), task="ledger_health")
    ledger.claim(own.id, "run-health", lease_ttl=TTL, now=at(22, 16, 10))
    assert ledger.succeed(own.id, "run-health", now=at(22, 16, 30))
    settled = _tick(ledger, views, at(22, 17), start.cursor)
    names = sorted(e.check_name for e in settled.asset_events or [])
    assert names == sorted([CHECK_NAME, *LEDGER_CHECK_NAMES])


def test_summary_and_the_metrics_page_list_the_same_entries_as_needing_attention(ledger):
    # Regression: a failed entry a manual retry made good was gone from `summary` but still
    # on the metrics page (its scrape read failed and running entries only, not the retry).
    from orchestration.services.metrics import scrape

    build_ledger(ledger)
    (failed,) = [
        e for e in ledger.list_entries(task_key="strict_task")[0] if e.error == "RuntimeError: boom"
    ]
    child = ledger.find("strict_task", dedup_key_for_retry(failed.id))
    assert child is not None
    ledger.claim(child.id, "run-retry", lease_ttl=TTL, now=at(22, 1))
    assert ledger.succeed(child.id, "run-retry", now=at(22, 2))

    summary = ledger_summary(ledger, views(), NOW)
    metrics = scrape(ledger, views(), NOW)
    listed = sorted(r["entry_id"] for r in summary["attention"])
    assert failed.id not in listed
    assert sorted(a.entry_id for a in metrics.attention) == listed
