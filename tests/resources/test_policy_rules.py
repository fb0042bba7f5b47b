"""The scheduling policies' pure decisions, as tables: overlap, pause on failure,
deadlines, catch-up steps, and which runs map onto a due's entry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestration.catch_up import LAUNCH, LEAVE, RELAUNCH, RETRY, catch_up_step
from orchestration.deadline import deadline_miss
from orchestration.manual_launch import entry_request_from_tags
from orchestration.overlap import OverlapAction, decide_overlap
from orchestration.pause import failure_pause_reason, failure_streak
from resources.core import tags as t
from resources.core.due import Due
from resources.core.entry import Entry, Status, Trigger

DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
DEADLINE = timedelta(minutes=20)


def entry(id: int, status: str, **kw: object) -> Entry:
    base: dict[str, object] = {
        "id": id,
        "task_key": "t",
        "trigger": Trigger.SCHEDULE,
        "origin": "due",
        "dedup_key": Due(DUE).key,
        "due": DUE,
        "status": status,
        "attempt": 1,
        "max_attempts": 1,
        "parent_id": None,
        "run_ids": (),
        "lease_owner": None,
        "lease_expires_at": None,
        "heartbeat_at": None,
        "created_at": DUE,
        "started_at": DUE,
        "finished_at": DUE + timedelta(minutes=1),
        "updated_at": DUE,
        "operator": None,
        "reason": None,
        "failure_kind": None,
        "error": None,
        "summary": {},
        "manual_retry_at": None,
        "manual_retry_by": None,
    }
    return Entry(**{**base, **kw})  # type: ignore[arg-type]


# --- overlap --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("policy", "in_progress", "waiter", "wait_turn", "action", "reason"),
    [
        ("skip", [], None, False, OverlapAction.CLAIM, ""),
        ("skip", [7], None, False, OverlapAction.SKIP, "overlap: entry 7 running"),
        ("skip", [7], None, True, OverlapAction.WAIT, "overlap: entry 7 running"),
        ("buffer_one", [7], None, False, OverlapAction.WAIT, "overlap: entry 7 running"),
        ("buffer_one", [7], 9, False, OverlapAction.WAIT, "overlap: entry 7 running"),  # itself
        ("buffer_one", [7], 8, False, OverlapAction.SKIP, "overlap: entry 8 already waiting"),
        ("buffer_one", [7], 8, True, OverlapAction.WAIT, "overlap: entry 7 running"),
        ("replace", [7], None, False, OverlapAction.REPLACE, "overlap: replaces entry 7"),
        ("replace", [], None, False, OverlapAction.CLAIM, ""),
        ("queue", [7], None, False, OverlapAction.CLAIM, ""),  # Dagster's pool decided
        ("allow", [7], None, False, OverlapAction.CLAIM, ""),
        ("skip", [9], None, False, OverlapAction.CLAIM, ""),  # its own entry is no overlap
    ],
)
def test_the_overlap_decision(policy, in_progress, waiter, wait_turn, action, reason) -> None:
    decision = decide_overlap(policy, 9, in_progress, waiter, wait_turn=wait_turn)
    assert (decision.action, decision.reason) == (action, reason)


# --- pause on failure -----------------------------------------------------------------------
def test_a_streak_counts_failures_skips_over_skipped_and_stops_at_a_success() -> None:
    failed = [entry(i, Status.FAILED, failure_kind="error") for i in (5, 4)]
    skipped = entry(3, Status.SKIPPED)
    assert failure_streak(2, [failed[0], skipped, failed[1]], None) == (failed[0], failed[1])
    assert failure_streak(2, [failed[0], entry(2, Status.SUCCESS), failed[1]], None) is None
    assert failure_streak(3, failed, None) is None
    # After a resume, only later failures count.
    resumed = DUE + timedelta(minutes=1)
    assert failure_streak(2, failed, resumed) is None
    text = failure_pause_reason(failed)
    assert text.startswith("2 consecutive final failures") and "entries 5 (t@" in text


# --- deadlines ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "finished", "met"),
    [
        (Status.SUCCESS, DUE + timedelta(minutes=19), True),
        (Status.SUCCESS, DUE + timedelta(minutes=21), False),  # late
        (Status.FAILED, DUE + timedelta(minutes=2), False),
        (Status.RUNNING, None, False),
        (Status.SKIPPED, DUE, True),  # not run on purpose: not judged
    ],
)
def test_a_deadline_is_met_by_a_success_in_time(status, finished, met) -> None:
    found = entry(4, status, finished_at=finished)
    miss = deadline_miss("t", DUE, DEADLINE, found)
    assert (miss is None) == met
    if miss is not None:
        assert miss.subject == "deadline:t@2026-11-30T22:45:00Z"
        assert miss.fields()["entry_id"] == 4


def test_a_retry_that_succeeded_in_time_meets_the_deadline() -> None:
    failed = entry(4, Status.FAILED)
    child = entry(5, Status.SUCCESS, finished_at=DUE + timedelta(minutes=10))
    assert deadline_miss("t", DUE, DEADLINE, failed, [child]) is None
    never_ran = deadline_miss("t", DUE, DEADLINE, None)
    assert never_ran is not None and never_ran.why.startswith("no run was created")


# --- catch-up ------------------------------------------------------------------------------
CATCH_UP_ENTRY = entry(1, Status.QUEUED, trigger=Trigger.MANUAL, attempt=0)


@pytest.mark.parametrize(
    ("found", "has_run", "paused", "only", "action"),
    [
        (None, False, None, None, LAUNCH),
        (None, False, None, "failed", LEAVE),
        (None, True, None, None, LEAVE),
        (None, False, "paused by a: b", None, LEAVE),
        (entry(1, Status.FAILED, failure_kind="error"), False, None, None, RETRY),
        (entry(1, Status.FAILED, failure_kind="error"), False, None, "missed", LEAVE),
        (entry(1, Status.FAILED, failure_kind="lease_reclaimed"), False, None, None, LEAVE),
        (entry(1, Status.FAILED, manual_retry_at=DUE), False, None, None, LEAVE),
        (entry(1, Status.SUCCESS), False, None, None, LEAVE),
        (entry(1, Status.SKIPPED, error="overlap: entry 2 running"), False, None, None, LEAVE),
        (
            entry(1, Status.QUEUED, trigger=Trigger.MANUAL, attempt=0),
            False,
            None,
            None,
            RELAUNCH,
        ),
        (entry(1, Status.QUEUED, trigger=Trigger.MANUAL, attempt=0), True, None, None, LEAVE),
        (entry(1, Status.DISPATCH_FAILED), False, None, None, LEAVE),
    ],
)
def test_each_due_of_a_catch_up_gets_one_step(found, has_run, paused, only, action) -> None:
    step = catch_up_step(DUE, found, has_run=has_run, pause_reason=paused, only=only)
    assert step.action == action, step


def test_a_due_whose_run_was_never_queued_is_named_with_the_command_that_frees_it() -> None:
    fresh = entry(1, Status.QUEUED, trigger=Trigger.MANUAL, attempt=0)
    for found in (None, fresh):
        step = catch_up_step(
            DUE, found, has_run=True, pause_reason=None, only=None, unqueued_run="run-x"
        )
        assert (step.action, step.status) == (LEAVE, "unqueued"), step
        assert "`dagster run delete run-x`, then run this catch-up again" in step.note
    # An entry its run claimed is that run's business, whatever else Dagster holds.
    claimed = entry(1, Status.RUNNING, trigger=Trigger.MANUAL, run_ids=["run-y"])
    step = catch_up_step(DUE, claimed, has_run=True, pause_reason=None, only=None, unqueued_run="x")
    assert step.status != "unqueued"


def test_unqueued_runs_are_the_tasks_runs_dagster_never_queued() -> None:
    import dagster as dg

    from orchestration.missed_dues import unqueued_runs

    @dg.op
    def nothing() -> None:
        return None

    @dg.job
    def order_cleanup_job() -> None:
        nothing()

    tags = {t.TAG_TASK: "order_cleanup", t.TAG_DUE: Due(DUE).text}
    with dg.instance_for_test() as instance:
        run = instance.create_run_for_job(job_def=order_cleanup_job, tags=tags)
        other = instance.create_run_for_job(job_def=order_cleanup_job, tags={**tags, "x": "1"})
        instance.report_run_canceled(other)  # ended: not unqueued
        now = datetime.now(UTC)
        window = (now - timedelta(hours=1), now + timedelta(minutes=1))
        assert unqueued_runs(instance, "order_cleanup", *window) == {DUE: run.run_id}
        assert unqueued_runs(instance, "order_cleanup", window[0], now - timedelta(minutes=5)) == {}


def test_a_manual_run_naming_a_due_is_that_dues_run() -> None:
    tags = {t.TAG_TASK: "t", t.TAG_TRIGGER: Trigger.MANUAL.value, t.TAG_DUE: Due(DUE).text}
    request = entry_request_from_tags({**tags, t.TAG_OPERATOR: "alice"}, "run-1")
    assert (request.dedup_key, request.operator) == (Due(DUE).key, "alice")
    assert request.trigger == Trigger.MANUAL
    # Without a due it stays in the manual namespace.
    launched = {t.TAG_TASK: "t", t.TAG_TRIGGER: Trigger.MANUAL.value, t.TAG_REQUEST_ID: "r1"}
    assert entry_request_from_tags(launched, "run-2").dedup_key == "manual:r1"
