"""The soak's invariant checker catches each broken promise (and passes a clean record), so a
green soak means the promises held, not that the checker looked away."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from invariants import (
    Delivery,
    Effect,
    RunInfo,
    SoakRecord,
    check,
    outcome_counts,
    parse_alerts,
)

from resources.core import tags as t
from resources.core.entry import (
    SUMMARY_DISPATCH_FAILURES,
    Entry,
    FailureKind,
    Status,
    Trigger,
    dedup_key_for_due,
)

DUE = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
POINT = DUE.replace(tzinfo=None)
TASK = "soak_00"
MESSAGES = 2


def _entry(entry_id: int = 1, **changes: object) -> Entry:
    base = Entry(
        id=entry_id,
        task_key=TASK,
        trigger=Trigger.SCHEDULE,
        origin="due",
        dedup_key=dedup_key_for_due(DUE),
        due=DUE,
        status=Status.SUCCESS,
        attempt=1,
        max_attempts=3,
        parent_id=None,
        run_ids=("run-a",),
        lease_owner=None,
        lease_expires_at=None,
        heartbeat_at=None,
        created_at=DUE,
        started_at=DUE,
        finished_at=DUE,
        updated_at=DUE,
        operator=None,
        reason=None,
        failure_kind=None,
        error=None,
        summary={},
        manual_retry_at=None,
        manual_retry_by=None,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _clean() -> SoakRecord:
    """One due, done once: every message on both channels, delivered once."""
    entry = _entry()
    entry_key = f"{entry.id}:{entry.dedup_key}"
    effects, deliveries, outbox = [], [], []
    for number in range(MESSAGES):
        sms_id, email_id = 2 * number + 1, 2 * number + 2
        effects.append(Effect(sms_id, TASK, number, POINT, "sms", "succeeded", entry_key))
        effects.append(Effect(email_id, TASK, number, POINT, "email", "succeeded", entry_key))
        outbox.append(Delivery(sms_id, TASK, number, POINT, "sms", ""))
        deliveries.append(Delivery(email_id, TASK, number, POINT, "email", "run-a"))
    run = RunInfo("run-a", TASK, "SUCCESS", {t.DAGSTER_RUN_KEY: "2026-12-01T03:00:00Z"})
    return SoakRecord(
        tasks=[TASK],
        dues=[DUE],
        messages=MESSAGES,
        entries=[entry],
        runs=[run],
        effects=effects,
        deliveries=deliveries,
        outbox=outbox,
    )


def _reclaimed(record: SoakRecord, *, killed: bool, alert: bool) -> SoakRecord:
    entry = _entry(
        status=Status.FAILED,
        failure_kind=FailureKind.LEASE_RECLAIMED,
        error="lease of run run-a expired at ...; not re-run automatically",
    )
    record.entries = [entry]
    record.deliveries = record.deliveries[:1]  # died after the first email
    record.outbox = record.outbox[:1]
    record.effects = [e for e in record.effects if e.object_id == 0]
    record.killed = {"run-a"} if killed else set()
    record.reclaim_alerts = {(entry.id, "run-a")} if alert else set()
    return record


def test_a_clean_record_has_no_violation():
    assert check(_clean()) == []


def test_a_reclaim_of_a_killed_worker_with_its_alert_is_fine():
    assert check(_reclaimed(_clean(), killed=True, alert=True)) == []


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        ("lost due", "0 ledger entries"),
        ("double entry", "2 ledger entries"),
        ("double schedule run", "2 scheduled runs"),
        ("hanging entry", "left running"),
        ("failure without kill", "was killed"),
        ("double email", "recorded 2 times"),
        ("double sms", "sms outbox row"),
        ("email from a non-owner", "never claimed"),
        ("success missing sms", "success without sms"),
        ("email succeeded never delivered", "delivered 0 times"),
        ("doubt without kill", "in doubt though no run of it was killed"),
        ("entry outside the window", "unexpected entry"),
        ("dispatch failure whose retry did nothing", "left dispatch_failed though Dagster's"),
    ],
)
def test_each_broken_promise_is_reported(breakage: str, expected: str):
    record = _clean()
    entry = record.entries[0]
    if breakage == "lost due":
        record.entries = []
    elif breakage == "double entry":
        record.entries = [entry, _entry(2)]
    elif breakage == "double schedule run":
        record.runs = [*record.runs, dataclasses.replace(record.runs[0], run_id="run-b")]
    elif breakage == "hanging entry":
        record.entries = [_entry(status=Status.RUNNING, lease_owner="run-a")]
    elif breakage == "failure without kill":
        record.entries = [_entry(status=Status.FAILED, failure_kind=FailureKind.ERROR)]
    elif breakage == "double email":
        record.deliveries = [*record.deliveries, record.deliveries[0]]
    elif breakage == "double sms":
        record.outbox = [*record.outbox, record.outbox[0]]
    elif breakage == "email from a non-owner":
        record.deliveries = [dataclasses.replace(record.deliveries[0], run_id="run-z")]
    elif breakage == "success missing sms":
        record.outbox = record.outbox[1:]
    elif breakage == "email succeeded never delivered":
        record.deliveries = record.deliveries[1:]
    elif breakage == "doubt without kill":
        record.effects = [
            dataclasses.replace(e, status="in_flight") if e.channel == "email" else e
            for e in record.effects
        ]
        record.deliveries = []
    elif breakage == "entry outside the window":
        later = DUE + timedelta(minutes=1)
        record.entries = [entry, _entry(2, dedup_key=dedup_key_for_due(later), due=later)]
    elif breakage == "dispatch failure whose retry did nothing":
        record.entries = [_dispatch_failed()]
        record.deliveries, record.outbox, record.effects = [], [], []
        record.killed = {"run-a"}
        record.runs = [*record.runs, _retry_of("run-a", "run-b")]
    problems = check(record)
    assert any(expected in p for p in problems), problems


def _dispatch_failed() -> Entry:
    item = {"at": "2026-12-01T03:00:10.000000Z", "error": "killed", "run_id": "run-a"}
    return _entry(
        status=Status.DISPATCH_FAILED,
        failure_kind=FailureKind.DISPATCH,
        attempt=0,
        run_ids=(),
        summary={SUMMARY_DISPATCH_FAILURES: [item]},
    )


def _retry_of(parent: str, run_id: str) -> RunInfo:
    tags = {
        t.DAGSTER_RETRY_NUMBER: "1",
        t.DAGSTER_PARENT_RUN_ID: parent,
        t.DAGSTER_ROOT_RUN_ID: parent,
        t.DAGSTER_RUN_KEY: "2026-12-01T03:00:00Z",
    }
    return RunInfo(run_id, TASK, "FAILURE", tags)


def test_a_dispatch_failure_whose_retries_were_killed_too_is_fine():
    record = _clean()
    record.entries = [_dispatch_failed()]
    record.deliveries, record.outbox, record.effects = [], [], []
    record.runs = [*record.runs, _retry_of("run-a", "run-b")]
    record.killed = {"run-a", "run-b"}
    assert check(record) == []


@pytest.mark.parametrize(
    ("killed", "alert", "expected"),
    [(False, True, "reclaimed from live run"), (True, False, "without an alert")],
)
def test_an_untraced_reclaim_is_reported(killed: bool, alert: bool, expected: str):
    problems = check(_reclaimed(_clean(), killed=killed, alert=alert))
    assert any(expected in p for p in problems), problems


def test_alerts_are_read_from_daemon_log_lines_and_outcomes_counted():
    lines = [
        "2026-12-01 03:01:00 - dueledger.alerts - WARNING - "
        '{"alert":"lease_reclaimed","task":"soak_00","entry_id":7,"run_id":"run-a"}',
        '{"alert":"slot_missed","entry_id":8,"run_id":"run-b"}',
        "not json {",
    ]
    assert parse_alerts(lines, "lease_reclaimed") == {(7, "run-a")}
    record = _reclaimed(_clean(), killed=True, alert=True)
    record.entries = [*record.entries, _entry(2, attempt=2)]
    assert outcome_counts(record) == {
        "failed:lease_reclaimed": 1,
        "success": 1,
        "success_after_retry": 1,
    }


@pytest.mark.parametrize(
    ("minutes", "status", "error", "fine"),
    [
        (1, Status.SKIPPED, "paused by dagster-ui: schedule stopped in the Dagster UI", True),
        (1, Status.SKIPPED, "paused by alice: maintenance", False),  # not the soak's stop
        (1, Status.SKIPPED, "overlap: entry 1 running", False),
        (1, Status.SUCCESS, None, False),  # a run after the window: a real leak
        (-1, Status.SKIPPED, "paused by dagster-ui: schedule stopped in the Dagster UI", False),
    ],
)
def test_a_due_after_the_window_is_fine_only_skipped_for_the_soaks_stop(
    minutes: int, status: str, error: str | None, fine: bool
):
    # The soak ends its window by stopping the schedules, which the ledger records as a pause
    # by dagster-ui; a due that passes before the soak settles is then written skipped.
    record = _clean()
    other = DUE + timedelta(minutes=minutes)
    record.entries = [
        *record.entries,
        _entry(2, dedup_key=dedup_key_for_due(other), due=other, status=status, error=error),
    ]
    problems = check(record)
    assert (problems == []) is fine, problems
