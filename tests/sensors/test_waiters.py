"""The waiters duty of ``ledger_sensor``: a ``buffer_one`` due held at its tick without a run
gets its run once its task is free -- one request, with the due's tags and a run key of its own
-- and a waiter whose due a pause covers is written skipped instead of launched, on SQLite and
PostgreSQL. Through Dagster's real scheduler and sensor daemons:
tests/orchestration/test_overlap_policies.py."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import dagster as dg

from orchestration.overlap import decide_at_tick
from orchestration.pause import PAUSE_CLI, open_pause
from orchestration.task_spec import OverlapPolicy, TaskSpec, build_views
from orchestration.timetable import EverySlots
from resources.core import tags as t
from resources.core.due import Due
from resources.core.entry import Status, Trigger
from resources.ledger import RunLedger
from sensors.waiters import waiter_duty

TASK = "buffer_task"
DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
SLOT = timedelta(minutes=15)
NOW = DUE + 2 * SLOT
SPEC = TaskSpec(
    key=TASK, rule=EverySlots(1), declared_cadence="x", overlap_policy=OverlapPolicy.BUFFER_ONE
)
OTHER = TaskSpec(key="other_task", rule=EverySlots(1), declared_cadence="x")


def _context() -> SimpleNamespace:
    return SimpleNamespace(instance=None, log=logging.getLogger("waiters"), cursor=None)


def _held_waiter(ledger: RunLedger) -> tuple[int, int]:
    """A running entry of the first due and the next due held at its tick: their ids."""
    busy = ledger.ensure_entry(task_key=TASK, trigger=Trigger.SCHEDULE, dedup_key=Due(DUE).key)
    assert ledger.claim(busy.id, "run-a", lease_ttl=timedelta(minutes=5)).claimed
    held = decide_at_tick(ledger, SPEC, Due(DUE + SLOT))
    assert held is not None and held.waits
    return busy.id, held.entry.id


def test_a_free_tasks_waiter_gets_one_run_request_with_its_dues_tags(ledger: RunLedger) -> None:
    duty = waiter_duty(build_views([SPEC, OTHER], 15, "UTC"))
    busy, waiter = _held_waiter(ledger)
    result = duty.body(_context(), ledger, NOW)
    assert result.run_requests == [] and result.skip_reason.skip_message == "no waiter to launch"
    ledger.succeed(busy, "run-a")
    result = duty.body(_context(), ledger, NOW)
    (request,) = result.run_requests
    assert isinstance(request, dg.RunRequest)
    assert request.run_key == f"{TASK}@2026-11-30T23:00:00Z#waiter"
    assert request.job_name == SPEC.job_name
    assert request.tags[t.TAG_TASK] == TASK
    assert request.tags[t.TAG_DUE] == "2026-11-30T23:00:00Z"
    # Asked again before the run claims, the same key: Dagster finds the run it made.
    (again,) = duty.body(_context(), ledger, NOW).run_requests
    assert again.run_key == request.run_key
    assert ledger.get(waiter).status == Status.QUEUED  # type: ignore[union-attr]


def test_a_due_held_before_its_policy_changed_still_gets_its_run(ledger: RunLedger) -> None:
    busy, _ = _held_waiter(ledger)
    ledger.succeed(busy, "run-a")
    now_queue = TaskSpec(key=TASK, rule=EverySlots(1), declared_cadence="x")
    duty = waiter_duty(build_views([now_queue], 15, "UTC"))
    (request,) = duty.body(_context(), ledger, NOW).run_requests
    assert request.run_key == f"{TASK}@2026-11-30T23:00:00Z#waiter"


def test_a_paused_waiter_is_written_skipped_and_gets_no_run(ledger: RunLedger) -> None:
    duty = waiter_duty(build_views([SPEC], 15, "UTC"))
    busy, waiter = _held_waiter(ledger)
    pause = open_pause(ledger, TASK, by="alice", reason="migration", source=PAUSE_CLI, now=DUE)
    assert pause is not None
    ledger.succeed(busy, "run-a")
    result = duty.body(_context(), ledger, NOW)
    assert result.run_requests == []
    assert f"entry {waiter}: skipped (paused by alice: migration)" in (
        result.skip_reason.skip_message
    )
    skipped = ledger.get(waiter)
    assert skipped is not None and skipped.status == Status.SKIPPED
    assert duty.body(_context(), ledger, NOW).run_requests == []  # no waiter any more
