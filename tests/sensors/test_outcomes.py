"""Outcome reconciliation, retries as attempts, and re-dispatch of dispatch failures.

Pure decision tables first; then scenarios through Dagster's real daemon code paths
(scheduler, sensors, run retries, run monitoring) against a real SQLite ledger, with the
test code location tests/fixtures/ledger_defs.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import dagster as dg
import pytest
from dagster_internals import (
    daemon_instance,
    daemon_workspace,
    fail_run_as_the_retry_daemon_reads_it,
    failing_launcher_config,
    retry_daemon_iteration,
    run_monitoring_iteration,
    run_retry_iteration,
    run_scheduler_tick,
    run_sensor_tick,
    start_run_worker,
)
from sensor_support import LedgerEnv, fixture_module, target, task_runs, wait_for

from orchestration.declarations import task_views
from orchestration.retry import is_retry_of_a_dispatch_failure
from orchestration.services.dagster_runs import RETRY_LOST_AFTER, RetryState, dagster_retry_state
from orchestration.services.outcomes import (
    Action,
    RunOutcome,
    decide,
    reconcile_events,
    reconcile_run,
    settle_abandoned_retries,
)
from orchestration.task_spec import TaskSpec, build_views
from orchestration.timetable import EverySlots
from resources.core import tags as t
from resources.core.entry import FailureKind, Status, Trigger
from resources.core.instants import utc_now
from resources.core.redispatch import (
    plan_redispatch,
    redispatch_interval_seconds,
    redispatch_run_key,
)
from resources.ledger import RunLedger
from sensors import build_sensors

pytestmark = pytest.mark.daemon

# --- named instants ---------------------------------------------------------------------------
DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
BEFORE_DUE = DUE - timedelta(minutes=1)  # the daemon is already up (records starts)
AT_DUE = DUE + timedelta(seconds=5)
NEXT_SLOT = DUE + timedelta(minutes=15)

RETRIES_ON = {"run_retries": {"enabled": True, "max_retries": 0}}
MONITORING_ON = {
    "run_monitoring": {"enabled": True, "start_timeout_seconds": 180, "poll_interval_seconds": 30}
}


# --- pure: the reconciler's decision table ---------------------------------------------------


def make_entry(**changes: Any) -> Any:
    from resources.core.entry import Entry

    base: dict[str, Any] = {
        "id": 1,
        "task_key": "strict_task",
        "trigger": Trigger.SCHEDULE,
        "origin": "due",
        "dedup_key": "due:2026-11-30T22:45:00Z",
        "due": DUE,
        "status": Status.QUEUED,
        "attempt": 0,
        "max_attempts": 3,
        "parent_id": None,
        "run_ids": (),
        "lease_owner": None,
        "lease_expires_at": None,
        "heartbeat_at": None,
        "created_at": DUE,
        "started_at": None,
        "finished_at": None,
        "updated_at": DUE,
        "operator": None,
        "reason": None,
        "failure_kind": None,
        "error": None,
        "summary": {"late_job_rejections": [], "dispatch_failures": [], "hooks": []},
        "manual_retry_at": None,
        "manual_retry_by": None,
    }
    base.update(changes)
    return Entry(**base)


def failures(*run_ids: str) -> dict[str, Any]:
    items = [{"at": "2026-11-30T22:46:00.000000Z", "error": "boom", "run_id": r} for r in run_ids]
    return {"late_job_rejections": [], "dispatch_failures": items, "hooks": []}


FAILED_RUN = RunOutcome("run-x", "FAILURE", will_retry=True, message="killed")
NO_RETRY = dataclasses.replace(FAILED_RUN, will_retry=False)
CANCELED = RunOutcome("run-x", "CANCELED", will_retry=False, message="canceled")

DECISIONS = [
    ("no entry: failed before the task started", None, FAILED_RUN, Action.DISPATCH_FAILED),
    ("queued entry, run never claimed", make_entry(), FAILED_RUN, Action.DISPATCH_FAILED),
    (
        "retrying entry, its retry run never started, no further retry",
        make_entry(status=Status.RETRYING, attempt=1, run_ids=("run-a",)),
        NO_RETRY,
        Action.DISPATCH_FAILED,
    ),
    (
        # Found by the soak: marking it dispatch_failed made the next retry's claim fail.
        "retrying entry, its retry run died before claiming, Dagster retries again",
        make_entry(status=Status.RETRYING, attempt=1, run_ids=("run-a",)),
        FAILED_RUN,
        Action.NONE,
    ),
    (
        "the same dispatch failure evaluated again",
        make_entry(status=Status.DISPATCH_FAILED, summary=failures("run-x")),
        FAILED_RUN,
        Action.NONE,
    ),
    (
        "owner died, Dagster retries, attempts left",
        make_entry(status=Status.RUNNING, attempt=1, run_ids=("run-x",), lease_owner="run-x"),
        FAILED_RUN,
        Action.FAIL_ATTEMPT,
    ),
    (
        "owner died on its last attempt",
        make_entry(
            status=Status.RUNNING, attempt=3, run_ids=("a", "b", "run-x"), lease_owner="run-x"
        ),
        FAILED_RUN,
        Action.FAIL_FINAL,
    ),
    (
        "owner died, Dagster will not retry",
        make_entry(status=Status.RUNNING, attempt=1, run_ids=("run-x",), lease_owner="run-x"),
        NO_RETRY,
        Action.FAIL_FINAL,
    ),
    (
        "owner canceled",
        make_entry(status=Status.RUNNING, attempt=1, run_ids=("run-x",), lease_owner="run-x"),
        CANCELED,
        Action.FAIL_FINAL,
    ),
    (
        "retrying after its run recorded the failure, no retry coming",
        make_entry(status=Status.RETRYING, attempt=1, run_ids=("run-x",), error="E"),
        NO_RETRY,
        Action.FAIL_FINAL,
    ),
    (
        "retrying after its run recorded the failure, retry coming",
        make_entry(status=Status.RETRYING, attempt=1, run_ids=("run-x",), error="E"),
        FAILED_RUN,
        Action.NONE,
    ),
    (
        "success is never overwritten",
        make_entry(status=Status.SUCCESS, attempt=1, run_ids=("run-x",)),
        NO_RETRY,
        Action.NONE,
    ),
    (
        "failed is never overwritten",
        make_entry(status=Status.FAILED, attempt=1, run_ids=("run-x",)),
        FAILED_RUN,
        Action.NONE,
    ),
    (
        "a duplicate run while another run holds the lease",
        make_entry(status=Status.RUNNING, attempt=1, run_ids=("run-a",), lease_owner="run-a"),
        FAILED_RUN,
        Action.TRACE_DUPLICATE,
    ),
    (
        # Found by the history checker: the second daemon's run of a due, dead before
        # claiming, was in no entry.
        "a duplicate run that died before claiming a due another run finished",
        make_entry(status=Status.SUCCESS, attempt=1, run_ids=("run-a",)),
        NO_RETRY,
        Action.TRACE_DUPLICATE,
    ),
    (
        "a duplicate already traced (its claim was refused)",
        make_entry(
            status=Status.SUCCESS,
            attempt=1,
            run_ids=("run-a",),
            summary={
                "late_job_rejections": [{"run_id": "run-x", "action": "claim"}],
                "dispatch_failures": [],
                "hooks": [],
            },
        ),
        FAILED_RUN,
        Action.NONE,
    ),
]


@pytest.mark.parametrize(
    ("entry", "outcome", "expected"),
    [pytest.param(e, o, x, id=name) for name, e, o, x in DECISIONS],
)
def test_the_reconciler_decides_from_the_entry_and_what_dagster_knows(entry, outcome, expected):
    action, reason = decide(entry, outcome)
    assert action is expected, reason


REDISPATCH = [
    ("no entry in this slot", None, False, None, False),
    (
        "first dispatch failure",
        make_entry(status=Status.DISPATCH_FAILED, summary=failures("a")),
        False,
        1,
        True,
    ),
    (
        "third dispatch failure",
        make_entry(status=Status.DISPATCH_FAILED, summary=failures("a", "b", "c")),
        False,
        3,
        True,
    ),
    (
        "budget used (4 failures, 3 re-dispatches)",
        make_entry(status=Status.DISPATCH_FAILED, summary=failures("a", "b", "c", "d")),
        False,
        None,
        False,
    ),
    (
        "re-dispatched, run not yet claimed: same key again",
        make_entry(status=Status.QUEUED, summary=failures("a")),
        False,
        1,
        False,
    ),
    ("queued, never failed", make_entry(), False, None, False),
    (
        "operator canceled the run",
        make_entry(status=Status.DISPATCH_FAILED, summary=failures("a")),
        True,
        None,
        False,
    ),
    (
        "a manual retry was made",
        make_entry(status=Status.DISPATCH_FAILED, summary=failures("a"), manual_retry_at=DUE),
        False,
        None,
        False,
    ),
]


@pytest.mark.parametrize(
    ("entry", "canceled", "number", "cas"),
    [pytest.param(e, c, n, s, id=name) for name, e, c, n, s in REDISPATCH],
)
def test_a_redispatch_is_numbered_by_the_dispatch_failures_and_bounded(
    entry, canceled, number, cas
):
    plan = plan_redispatch(entry, 3, last_failure_canceled=canceled)
    assert (plan.number, plan.compare_and_set) == (number, cas), plan.reason


def test_redispatch_run_keys_are_unique_per_due_and_number():
    assert redispatch_run_key(DUE, 1) == "2026-11-30T22:45:00Z#redispatch-1"
    assert redispatch_run_key(DUE, 2) != redispatch_run_key(DUE, 1)
    assert redispatch_run_key(DUE, 1, "a") == "a@2026-11-30T22:45:00Z#redispatch-1"


@pytest.mark.parametrize(
    ("slot_minutes", "seconds"), [(1, 30), (5, 37), (15, 112), (60, 120), (1440, 120)]
)
def test_a_redispatch_sensor_evaluates_once_per_eighth_of_its_slot_30_s_to_2_minutes(
    slot_minutes, seconds
):
    assert redispatch_interval_seconds(slot_minutes) == seconds


def test_the_code_location_re_dispatches_through_its_one_ledger_sensor_for_every_task():
    # One sensor, not one per task: its cost follows the entries to re-dispatch, not the
    # number of tasks. It targets every task job, so its run keys name the task.
    views = task_views()
    sensors = {s.name: s for s in build_sensors(views)}
    assert not [name for name in sensors if "redispatch" in name]
    sensor = sensors["ledger_sensor"]
    assert {j.name for j in sensor.jobs} == {v.spec.job_name for v in views}
    assert sensor.minimum_interval_seconds == 60
    assert "<task>@<due>#redispatch-<n>" in (sensor.description or "")


# --- retries as attempts: run retries relaunch, the same entry counts attempts ----------------


@dataclasses.dataclass
class RetryScenario:
    instance: dg.DagsterInstance
    ledger: RunLedger
    #: (task, run id, attempt, unix time of the claim)
    attempts_log: list[tuple[str, str, int, float]]
    entries_before_outcome_tick: dict[str, Any]
    extra_runs_after_exhaustion: int


@contextlib.contextmanager
def _daemon_up_before_the_due(
    tmp: Path,
    overrides: dict[str, Any],
    defs: str = "dispatch_defs",
    launcher: Literal["mocked", "sync"] = "mocked",
) -> Iterator[tuple[Any, Any]]:
    """A test code location of tests/fixtures/ledger_defs.py on a daemon instance, its
    scheduler and sensors evaluated once just before the due."""
    with (
        daemon_instance(launcher, temp_dir=tmp / "instance", overrides=overrides) as instance,
        daemon_workspace(instance, target(defs)) as ctx,
    ):
        run_scheduler_tick(ctx, BEFORE_DUE)
        run_sensor_tick(ctx, BEFORE_DUE)
        yield instance, ctx


@pytest.fixture(scope="module")
def retried(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RetryScenario]:
    """One due of ``flaky_task`` (fails attempts 1-2) and ``failing_task`` (always fails),
    launched by the real scheduler, executed in-process, retried by Dagster's real run-retry
    daemon code until nothing is left to retry; then the outcome sensor runs over it all."""
    tmp = tmp_path_factory.mktemp("retries")
    with pytest.MonkeyPatch.context() as mp:
        url = f"sqlite:///{tmp / 'ledger.sqlite'}"
        mp.setenv("DUELEDGER_DATABASE_URL", url)
        mp.setenv("LEDGER_DEFS_LOG", str(tmp / "attempts.log"))
        ledger = RunLedger(database_url=url)
        ledger.migrate()
        with _daemon_up_before_the_due(tmp, RETRIES_ON, "retry_defs", "sync") as (instance, ctx):
            run_scheduler_tick(ctx, AT_DUE)  # both runs execute (sync launcher) and fail
            for minute in (1, 2):  # retry 1, then retry 2 (each executes in-process)
                run_retry_iteration(ctx, DUE + timedelta(minutes=minute))
            runs_before = len(instance.get_runs())
            run_retry_iteration(ctx, DUE + timedelta(minutes=3))  # nothing left to retry
            extra = len(instance.get_runs()) - runs_before
            before = {e.task_key: e for e in ledger.list_entries()[0]}
            run_sensor_tick(ctx, DUE + timedelta(minutes=4))
            lines = (tmp / "attempts.log").read_text().splitlines()
            yield RetryScenario(
                instance,
                ledger,
                [(a, b, int(c), float(d)) for a, b, c, d in (x.split("\t") for x in lines)],
                before,
                extra,
            )
        ledger.dispose()


def test_a_task_failing_twice_then_succeeding_is_one_entry_with_attempts_1_2_3(retried):
    runs = task_runs(retried.instance, "flaky_task")
    assert [r.status for r in runs] == [
        dg.DagsterRunStatus.FAILURE,
        dg.DagsterRunStatus.FAILURE,
        dg.DagsterRunStatus.SUCCESS,
    ]
    assert [r.tags.get(t.DAGSTER_RETRY_NUMBER) for r in runs] == [None, "1", "2"]
    claimed = [(run_id, n) for task, run_id, n, _ in retried.attempts_log if task == "flaky_task"]
    assert claimed == [(r.run_id, n) for r, n in zip(runs, (1, 2, 3), strict=True)]
    (entry,) = retried.ledger.list_entries(task_key="flaky_task")[0]
    assert entry.dedup_key == "due:2026-11-30T22:45:00Z"
    assert (entry.status, entry.attempt) == (Status.SUCCESS, 3)
    assert list(entry.run_ids) == [r.run_id for r in runs]


def test_dagster_retries_wait_the_tasks_backoff_doubling_and_a_task_without_one_does_not(retried):
    # Dagster launches a retry run the moment an attempt fails; flaky_task's retry_backoff
    # (2 s) makes attempt 2 claim at least 2 s after attempt 1, attempt 3 at least 4 s after
    # attempt 2. failing_task declares none: its attempts follow one another at once.
    def claims(task: str) -> list[float]:
        return [at for name, _, _, at in retried.attempts_log if name == task]

    flaky = claims("flaky_task")
    backoff = fixture_module().FLAKY_BACKOFF.total_seconds()
    assert flaky[1] - flaky[0] >= backoff and flaky[2] - flaky[1] >= 2 * backoff, flaky

    def backoff_lines(run: dg.DagsterRun) -> list[str]:
        logs = retried.instance.all_logs(run.run_id)
        return [e.user_message for e in logs if "retry backoff" in e.user_message]

    retry_runs = task_runs(retried.instance, "flaky_task")[1:]
    said = [backoff_lines(r) for r in retry_runs]  # the run's log says why it waits, once
    assert [len(lines) for lines in said] == [1, 1], said
    assert "attempt 2/3" in said[0][0] and "attempt 3/3" in said[1][0], said
    # failing_task declares no backoff: its retry runs claim at once (with the sync launcher
    # they execute one after the other, so clock gaps would include flaky_task's waits).
    assert [backoff_lines(r) for r in task_runs(retried.instance, "failing_task")] == [[]] * 3


def test_a_task_that_always_fails_is_failed_after_max_attempts_and_not_retried_further(retried):
    runs = task_runs(retried.instance, "failing_task")
    assert [r.status for r in runs] == [dg.DagsterRunStatus.FAILURE] * 3
    assert [r.tags.get(t.DAGSTER_WILL_RETRY) for r in runs] == ["true", "true", "false"]
    assert retried.extra_runs_after_exhaustion == 0
    (entry,) = retried.ledger.list_entries(task_key="failing_task")[0]
    assert (entry.status, entry.attempt, entry.failure_kind) == (
        Status.FAILED,
        3,
        FailureKind.ERROR,
    )
    assert "attempt 3 fails on purpose" in (entry.error or "")
    assert list(entry.run_ids) == [r.run_id for r in runs]


def test_the_outcome_sensor_leaves_entries_their_runs_recorded_unchanged(retried):
    # Regression: reconciling a run that recorded its own failure must not touch the entry
    # (no second failure report, no rejection noise, terminal states stay as they are).
    after = {e.task_key: e for e in retried.ledger.list_entries()[0]}
    assert after == retried.entries_before_outcome_tick


# --- dispatch failures: launch error or START_TIMEOUT -> dispatch_failed -> re-dispatch ---------


def _entry_of(env: LedgerEnv, task: str = "strict_task"):
    entries = env.entries(task)
    assert len(entries) == 1, entries
    return entries[0]


@pytest.mark.parametrize(
    ("cause", "storage"),
    [
        ("launch_error", "sqlite"),
        ("start_timeout", "sqlite"),
        # dagster-postgres refuses run-status queries filtered by job name (SQLite ignores
        # the filter): the outcome sensor must work on the storage production uses.
        pytest.param("launch_error", "postgres", marks=pytest.mark.postgres),
    ],
)
def test_a_run_that_never_started_becomes_dispatch_failed_and_is_redispatched_in_its_slot(
    ledger_env: LedgerEnv, cause: str, storage: str, request: pytest.FixtureRequest
):
    marker = ledger_env.tmp / "launcher-fails"
    overrides: dict[str, Any] = {**RETRIES_ON, **MONITORING_ON}
    if storage == "postgres":
        pg_server = request.getfixturevalue("pg_server")
        database = f"dagster_{uuid.uuid4().hex[:12]}"
        overrides["storage"] = {"postgres": {"postgres_url": pg_server.create_database(database)}}
        request.addfinalizer(lambda: pg_server.drop_database(database))
    if cause == "launch_error":
        marker.touch()
        overrides.update(failing_launcher_config(marker))
    with _daemon_up_before_the_due(ledger_env.tmp, overrides) as (instance, ctx):
        run_scheduler_tick(ctx, AT_DUE, raise_on_error=False)
        if cause == "start_timeout":
            run_monitoring_iteration(ctx, DUE + timedelta(minutes=3, seconds=10))
        (first,) = task_runs(instance, "strict_task")
        assert first.status == dg.DagsterRunStatus.FAILURE
        marker.unlink(missing_ok=True)  # the launcher works again

        run_sensor_tick(ctx, DUE + timedelta(minutes=4))
        run_sensor_tick(ctx, DUE + timedelta(minutes=5))

        runs = task_runs(instance, "strict_task")
        assert len(runs) == 2
        redispatched = runs[1]
        assert redispatched.tags[t.DAGSTER_RUN_KEY] == "2026-11-30T22:45:00Z#redispatch-1"
        assert redispatched.tags[t.TAG_DUE] == "2026-11-30T22:45:00Z"
        assert redispatched.tags[t.TAG_TRIGGER] == Trigger.SENSOR
        assert redispatched.status == dg.DagsterRunStatus.STARTING  # launched
        entry = _entry_of(ledger_env)
        assert (entry.status, entry.attempt) == (Status.QUEUED, 0)
        (kept,) = entry.summary["dispatch_failures"]
        assert kept["run_id"] == first.run_id
        expected = "refuses to launch" if cause == "launch_error" else "to start"
        assert expected in kept["error"]

        run_sensor_tick(ctx, DUE + timedelta(minutes=6))  # evaluated again: the same request
        assert len(task_runs(instance, "strict_task")) == 2


@contextlib.contextmanager
def _launch_failed_at_due(ledger_env: LedgerEnv) -> Iterator[tuple[Any, Any, Path]]:
    """strict_task's due, whose launch failed; the launcher keeps failing until the test
    removes the marker it yields."""
    marker = ledger_env.tmp / "launcher-fails"
    marker.touch()
    overrides = {**RETRIES_ON, **failing_launcher_config(marker)}
    with _daemon_up_before_the_due(ledger_env.tmp, overrides) as (instance, ctx):
        run_scheduler_tick(ctx, AT_DUE, raise_on_error=False)
        yield instance, ctx, marker


def test_redispatch_stops_after_three_per_slot_keeping_the_errors(ledger_env: LedgerEnv):
    with _launch_failed_at_due(ledger_env) as (instance, ctx, marker):
        quiet = 0
        for minute in range(1, 15):  # until two evaluations in a row change nothing
            runs_before = len(task_runs(instance, "strict_task"))
            before = ledger_env.entries("strict_task")
            run_sensor_tick(ctx, DUE + timedelta(minutes=minute), raise_on_error=False)
            same = before == ledger_env.entries("strict_task")
            quiet = (
                quiet + 1 if same and runs_before == len(task_runs(instance, "strict_task")) else 0
            )
            if quiet == 2:
                break
        keys = [r.tags.get(t.DAGSTER_RUN_KEY) for r in task_runs(instance, "strict_task")]
        assert keys == [
            "2026-11-30T22:45:00Z",
            "2026-11-30T22:45:00Z#redispatch-1",
            "2026-11-30T22:45:00Z#redispatch-2",
            "2026-11-30T22:45:00Z#redispatch-3",
        ]
        entry = _entry_of(ledger_env)
        assert (entry.status, entry.failure_kind) == (Status.DISPATCH_FAILED, FailureKind.DISPATCH)
        assert len(entry.summary["dispatch_failures"]) == 4  # every error kept (newest 5)

        marker.unlink()  # even a working launcher gets nothing more in the next slot
        run_sensor_tick(ctx, NEXT_SLOT + timedelta(minutes=1), raise_on_error=False)
        assert len(task_runs(instance, "strict_task")) == 4
        assert _entry_of(ledger_env).status == Status.DISPATCH_FAILED


def test_a_dispatch_failure_seen_after_its_slot_is_not_redispatched(ledger_env: LedgerEnv):
    with _launch_failed_at_due(ledger_env) as (instance, ctx, marker):
        marker.unlink()
        # The sensor daemon was away for the rest of the slot.
        run_sensor_tick(ctx, NEXT_SLOT + timedelta(minutes=1))
        run_sensor_tick(ctx, NEXT_SLOT + timedelta(minutes=2))
        assert len(task_runs(instance, "strict_task")) == 1
        entry = _entry_of(ledger_env)
        assert entry.status == Status.DISPATCH_FAILED
        assert entry.due == DUE


RETRY_OF = {t.DAGSTER_RETRY_NUMBER: "1", t.DAGSTER_PARENT_RUN_ID: "a", t.DAGSTER_ROOT_RUN_ID: "a"}


@pytest.mark.parametrize(
    ("entry", "tags", "resumes"),
    [
        pytest.param(
            make_entry(status=Status.DISPATCH_FAILED, summary=failures("a")),
            RETRY_OF,
            True,
            id="retry of the run that failed",
        ),
        pytest.param(
            make_entry(status=Status.DISPATCH_FAILED, summary=failures("a")),
            {**RETRY_OF, t.DAGSTER_RETRY_NUMBER: "2", t.DAGSTER_PARENT_RUN_ID: "b"},
            True,
            id="a later retry in the same chain (root)",
        ),
        pytest.param(
            make_entry(status=Status.DISPATCH_FAILED, summary=failures("a")),
            {t.DAGSTER_PARENT_RUN_ID: "a", t.DAGSTER_ROOT_RUN_ID: "a"},
            False,
            id="a re-execution, not Dagster's retry",
        ),
        pytest.param(
            make_entry(status=Status.DISPATCH_FAILED, summary=failures("c")),
            RETRY_OF,
            False,
            id="retry of a run that did not fail this entry",
        ),
        pytest.param(
            make_entry(status=Status.FAILED, summary=failures("a")),
            RETRY_OF,
            False,
            id="entry not dispatch_failed",
        ),
    ],
)
def test_only_dagster_retry_of_a_dispatch_failure_resumes_the_entry(entry, tags, resumes):
    assert is_retry_of_a_dispatch_failure(tags, entry) is resumes


def test_dagster_retry_of_a_run_that_ended_before_claiming_does_the_due_once(
    ledger_env: LedgerEnv,
):
    """Found by the soak: a worker killed before its claim made the entry dispatch_failed,
    and Dagster's retry of that very run was refused ("must be re-dispatched") once the slot
    (the redispatch sensor's window) was over, so the due was never done. Nothing ran
    before the claim: the retry resumes the entry and does the due, once."""
    with _launch_failed_at_due(ledger_env) as (instance, ctx, marker):
        marker.unlink()
        (first,) = task_runs(instance, "strict_task")
        assert first.status == dg.DagsterRunStatus.FAILURE
        assert first.tags[t.DAGSTER_WILL_RETRY] == "true"
        # The outcome sensor sees the failure only after the slot: no re-dispatch.
        run_sensor_tick(ctx, NEXT_SLOT + timedelta(minutes=1))
        entry = _entry_of(ledger_env)
        assert entry.status == Status.DISPATCH_FAILED
        assert entry.dispatch_failure_run_ids == {first.run_id}

        run_retry_iteration(ctx, NEXT_SLOT + timedelta(minutes=2))
        _, retry = task_runs(instance, "strict_task")
        assert retry.tags[t.DAGSTER_PARENT_RUN_ID] == first.run_id
        worker = start_run_worker(instance, retry.run_id, env=ledger_env.worker_env())
        assert worker.wait(timeout=90) == 0
        run_sensor_tick(ctx, NEXT_SLOT + timedelta(minutes=3))
        run_sensor_tick(ctx, NEXT_SLOT + timedelta(minutes=4))

        done = instance.get_run_by_id(retry.run_id)
        assert done is not None and done.status == dg.DagsterRunStatus.SUCCESS
        assert [r.run_id for r in task_runs(instance, "strict_task")] == [
            first.run_id,
            retry.run_id,
        ]
    entry = _entry_of(ledger_env)
    assert (entry.status, entry.attempt) == (Status.SUCCESS, 1)
    assert list(entry.run_ids) == [retry.run_id]
    (kept,) = entry.summary["dispatch_failures"]  # the first run's error stays on record
    assert kept["run_id"] == first.run_id
    assert entry.summary["late_job_rejections"] == []


# --- a claimed run that Dagster ends: the entry follows, the retry is the next attempt ----------


def _claimed(ledger: RunLedger, run_id: str, *, attempts: int = 3):
    from resources.core.entry import dedup_key_for_due

    entry = ledger.ensure_entry(
        task_key="strict_task",
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(DUE),
        max_attempts=attempts,
        now=AT_DUE,
    )
    assert ledger.claim(entry.id, run_id, lease_ttl=timedelta(minutes=2), now=AT_DUE).claimed
    return entry


TAGS = {
    t.TAG_TASK: "strict_task",
    t.TAG_TRIGGER: Trigger.SCHEDULE.value,
    t.TAG_DUE: "2026-11-30T22:45:00Z",
}
LATER = DUE + timedelta(minutes=3)


def test_a_dead_owner_that_dagster_retries_leaves_the_entry_retrying_with_its_error(ledger):
    entry = _claimed(ledger, "run-x")
    outcome = RunOutcome("run-x", "FAILURE", will_retry=True, message="max runtime", timed_out=True)
    done = reconcile_run(ledger, TAGS, outcome, {"strict_task": 3}, now=LATER)
    assert done.action is Action.FAIL_ATTEMPT
    after = ledger.get(entry.id)
    assert after is not None
    assert (after.status, after.failure_kind, after.lease_owner) == (
        Status.RETRYING,
        FailureKind.TIMEOUT,
        None,
    )
    assert "run-x" in (after.error or "") and "max runtime" in (after.error or "")
    again = reconcile_run(ledger, TAGS, outcome, {"strict_task": 3}, now=LATER)
    assert again.action is Action.NONE and ledger.get(entry.id) == after


def test_a_dead_owner_that_dagster_will_not_retry_fails_the_entry_once(ledger):
    entry = _claimed(ledger, "run-x")
    outcome = RunOutcome("run-x", "CANCELED", will_retry=False, message="terminated")
    assert reconcile_run(ledger, TAGS, outcome, {}, now=LATER).action is Action.FAIL_FINAL
    after = ledger.get(entry.id)
    assert after is not None
    assert (after.status, after.failure_kind, after.attempt) == (
        Status.FAILED,
        FailureKind.ERROR,
        1,
    )
    assert reconcile_run(ledger, TAGS, outcome, {}, now=LATER).action is Action.NONE
    assert ledger.get(entry.id) == after  # terminal: never overwritten, no rejection noise


def test_a_retrying_entry_whose_retry_will_not_come_is_failed_keeping_its_error(ledger):
    entry = _claimed(ledger, "run-x")
    ledger.fail(entry.id, "run-x", error="ValueError: bad row", now=LATER)
    outcome = RunOutcome("run-x", "FAILURE", will_retry=False, message="Steps failed")
    assert reconcile_run(ledger, TAGS, outcome, {}, now=LATER).action is Action.FAIL_FINAL
    after = ledger.get(entry.id)
    assert after is not None
    assert (after.status, after.error) == (Status.FAILED, "ValueError: bad row")


def test_a_duplicate_that_died_before_claiming_is_traced_on_the_entry_once(ledger):
    entry = _claimed(ledger, "run-a")
    assert ledger.succeed(entry.id, "run-a", now=LATER)
    outcome = RunOutcome("run-x", "FAILURE", will_retry=False, message="worker killed")
    done = reconcile_run(ledger, TAGS, outcome, {}, now=LATER)
    assert done.action is Action.TRACE_DUPLICATE
    after = ledger.get(entry.id)
    assert after is not None and after.status == Status.SUCCESS
    (traced,) = after.summary["late_job_rejections"]
    assert traced["run_id"] == "run-x" and "duplicate" in traced["reason"]
    assert reconcile_run(ledger, TAGS, outcome, {}, now=LATER).action is Action.NONE
    assert ledger.get(entry.id) == after


def test_a_run_that_never_reached_the_ledger_creates_a_dispatch_failed_entry_once(ledger):
    outcome = RunOutcome("run-x", "FAILURE", will_retry=True, message="START_TIMEOUT")
    done = reconcile_run(ledger, TAGS, outcome, {"strict_task": 2}, now=LATER)
    assert done.action is Action.DISPATCH_FAILED and done.entry is not None
    assert (done.entry.status, done.entry.max_attempts) == (Status.DISPATCH_FAILED, 2)
    assert done.entry.due == DUE
    assert reconcile_run(ledger, TAGS, outcome, {}, now=LATER).action is Action.NONE
    assert len(ledger.get(done.entry.id).summary["dispatch_failures"]) == 1


def _owner_killed_after_claiming(
    ledger_env: LedgerEnv, instance: dg.DagsterInstance, ctx: Any
) -> tuple[dg.DagsterRun, datetime]:
    """The due's run of ``slow_task``, launched by the scheduler; its real worker claims the
    entry and is killed without a word (the entry stays leased to it), then run monitoring
    fails the run past its max runtime (at the returned instant) and Dagster announces a
    retry. The outcome sensor has not seen any of it."""
    run_scheduler_tick(ctx, AT_DUE)
    (run,) = task_runs(instance, "slow_task")
    worker = start_run_worker(instance, run.run_id, env=ledger_env.worker_env())
    try:
        wait_for(
            "the worker's claim",
            lambda: [e for e in ledger_env.entries("slow_task") if e.status == Status.RUNNING],
        )
    finally:
        worker.kill()
        worker.wait(timeout=30)
    # Run monitoring finds the run past its max runtime (1 s) and fails it.
    record = instance.get_run_record_by_id(run.run_id)
    assert record is not None and record.start_time is not None
    over = datetime.fromtimestamp(record.start_time, UTC) + timedelta(seconds=30)
    run_monitoring_iteration(ctx, over)
    failed = instance.get_run_by_id(run.run_id)
    assert failed is not None and failed.status == dg.DagsterRunStatus.FAILURE
    assert failed.tags[t.DAGSTER_WILL_RETRY] == "true"
    assert ledger_env.entries("slow_task")[0].lease_owner == run.run_id  # not seen yet
    return run, over


def test_a_run_ended_by_max_runtime_is_retried_as_the_next_attempt_of_its_entry(
    ledger_env: LedgerEnv, monkeypatch: pytest.MonkeyPatch
):
    # Production order: Dagster's retry daemon relaunches at once, before the outcome sensor
    # (every 30 s) has seen the failure; the retry run itself records its parent's attempt.
    release = ledger_env.tmp / "release"
    monkeypatch.setenv("LEDGER_DEFS_RELEASE", str(release))
    overrides = {**RETRIES_ON, **MONITORING_ON}
    with _daemon_up_before_the_due(ledger_env.tmp, overrides, "monitor_defs") as (instance, ctx):
        run, over = _owner_killed_after_claiming(ledger_env, instance, ctx)

        release.touch()  # the next attempt completes at once
        run_retry_iteration(ctx, over + timedelta(seconds=5))
        retry = task_runs(instance, "slow_task")[1]
        worker = start_run_worker(instance, retry.run_id, env=ledger_env.worker_env())
        assert worker.wait(timeout=90) == 0
        run_sensor_tick(ctx, over + timedelta(minutes=1))  # the outcome sensor: nothing left

    entry = ledger_env.entries("slow_task")[0]
    assert (entry.status, entry.attempt) == (Status.SUCCESS, 2)
    assert list(entry.run_ids) == [run.run_id, retry.run_id]
    assert entry.failure_kind == FailureKind.TIMEOUT  # the first attempt's, kept
    assert run.run_id in (entry.error or "")
    assert entry.summary["late_job_rejections"] == []


def test_a_retry_whose_parent_died_before_claiming_takes_over_from_the_owner_above_it(
    ledger_env: LedgerEnv, monkeypatch: pytest.MonkeyPatch
):
    # Seen in the soak: the owner's worker was killed after claiming, Dagster's first retry
    # died before claiming (killed while loading; here: never started), and the second
    # retry started before the outcome sensor had seen any of it. The entry was still
    # leased to the grandparent: the second retry must take over, not be refused as a
    # duplicate (which left the entry `retrying` with no run left to retry it).
    release = ledger_env.tmp / "release"
    monkeypatch.setenv("LEDGER_DEFS_RELEASE", str(release))
    overrides = {**RETRIES_ON, **MONITORING_ON}
    with _daemon_up_before_the_due(ledger_env.tmp, overrides, "monitor_defs") as (instance, ctx):
        run, over = _owner_killed_after_claiming(ledger_env, instance, ctx)
        run_retry_iteration(ctx, over + timedelta(seconds=5))
        first_retry = task_runs(instance, "slow_task")[1]
        # The first retry never starts: run monitoring fails it on its start timeout.
        run_monitoring_iteration(ctx, over + timedelta(minutes=3, seconds=20))
        dead = instance.get_run_by_id(first_retry.run_id)
        assert dead is not None and dead.status == dg.DagsterRunStatus.FAILURE
        run_retry_iteration(ctx, over + timedelta(minutes=3, seconds=25))
        second_retry = task_runs(instance, "slow_task")[2]
        assert second_retry.tags[t.DAGSTER_PARENT_RUN_ID] == first_retry.run_id
        assert ledger_env.entries("slow_task")[0].lease_owner == run.run_id  # not seen yet

        release.touch()
        worker = start_run_worker(instance, second_retry.run_id, env=ledger_env.worker_env())
        assert worker.wait(timeout=90) == 0

    entry = ledger_env.entries("slow_task")[0]
    assert (entry.status, entry.attempt) == (Status.SUCCESS, 2)
    assert list(entry.run_ids) == [run.run_id, second_retry.run_id]
    assert f"its automatic retry {second_retry.run_id} takes over" in (entry.error or "")
    assert entry.summary["late_job_rejections"] == []


def test_a_retry_dagster_announced_then_abandoned_does_not_leave_the_entry_retrying(ledger):
    # Dagster tags a failed run will_retry=true, then rewrites it to false when creating the
    # retry fails -- with no new run event. The sweep must notice, or `retrying` is forever.
    views = build_views(
        [TaskSpec(key="strict_task", rule=EverySlots(1), declared_cadence="x")],
        15,
        "UTC",
    )
    job = dg.GraphDefinition(name="noop", node_defs=[]).to_job(name="strict_task_job")
    with dg.instance_for_test() as instance:
        run = instance.create_run_for_job(job, tags=TAGS)
        instance.report_run_failed(run)
        instance.add_run_tags(run.run_id, {t.DAGSTER_WILL_RETRY: "true"})
        entry = _claimed(ledger, run.run_id)
        ledger.fail(entry.id, run.run_id, error="ValueError: bad row", now=LATER)

        assert settle_abandoned_retries(instance, ledger, views, LATER) == []
        assert ledger.get(entry.id).status == Status.RETRYING  # type: ignore[union-attr]

        instance.add_run_tags(run.run_id, {t.DAGSTER_WILL_RETRY: "false"})
        (done,) = settle_abandoned_retries(instance, ledger, views, LATER)
        assert done.action is Action.FAIL_FINAL
        after = ledger.get(entry.id)
        assert after is not None
        assert (after.status, after.error) == (Status.FAILED, "ValueError: bad row")
        assert settle_abandoned_retries(instance, ledger, views, LATER) == []


# --- a retry Dagster announced and never created ---------------------------------------------

_ENDED_AT = DUE.timestamp()
_FAILURE, _CANCELED = dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED


@pytest.mark.parametrize(
    ("status", "will_retry", "after", "expected"),
    [
        (dg.DagsterRunStatus.STARTED, None, timedelta(hours=1), RetryState.RUNNING),
        (_FAILURE, "true", RETRY_LOST_AFTER - timedelta(seconds=1), RetryState.PENDING),
        (_FAILURE, "true", RETRY_LOST_AFTER, RetryState.LOST),
        (_FAILURE, "false", timedelta(seconds=1), RetryState.NOT_RETRIED),
        (_FAILURE, None, timedelta(seconds=1), RetryState.PENDING),  # tag not written yet
        (_FAILURE, None, RETRY_LOST_AFTER, RetryState.NOT_RETRIED),
        (_CANCELED, None, timedelta(seconds=1), RetryState.NOT_RETRIED),
        (dg.DagsterRunStatus.SUCCESS, None, timedelta(seconds=1), RetryState.NOT_RETRIED),
    ],
    ids=[
        "not ended",
        "announced, within the grace",
        "announced, not created by the grace: lost",
        "Dagster said no",
        "decision not written yet",
        "never decided: no retry",
        "canceled runs are not retried",
        "successful runs (a refused retry) are not retried",
    ],
)
def test_what_dagster_will_still_do_about_a_retry(status, will_retry, after, expected):
    tags = {} if will_retry is None else {t.DAGSTER_WILL_RETRY: will_retry}
    state = dagster_retry_state(status, tags, _ENDED_AT, DUE + after)
    assert state is expected


_STRICT_VIEWS = build_views(
    [TaskSpec(key="strict_task", rule=EverySlots(1), declared_cadence="x")],
    15,
    "UTC",
)
_NOOP_JOB = dg.GraphDefinition(name="noop", node_defs=[]).to_job(name="strict_task_job")


def _failed_run(instance: dg.DagsterInstance, *, parent: dg.DagsterRun | None = None):
    """A task run Dagster ended FAILURE and announced a retry for; ``parent``: it is
    Dagster's automatic retry of that run."""
    tags = dict(TAGS)
    if parent is not None:
        root = parent.root_run_id or parent.run_id
        tags |= {
            t.DAGSTER_PARENT_RUN_ID: parent.run_id,
            t.DAGSTER_ROOT_RUN_ID: root,
            t.DAGSTER_RETRY_NUMBER: "1",
        }
    run = instance.create_run_for_job(
        _NOOP_JOB,
        tags=tags,
        parent_run_id=parent.run_id if parent else None,
        root_run_id=(parent.root_run_id or parent.run_id) if parent else None,
    )
    instance.report_run_failed(run)
    instance.add_run_tags(run.run_id, {t.DAGSTER_WILL_RETRY: "true"})
    record = instance.get_run_record_by_id(run.run_id)
    assert record is not None and record.end_time is not None
    return run, datetime.fromtimestamp(record.end_time, UTC)


def test_a_retry_chain_ending_in_a_refused_run_does_not_leave_the_entry_retrying(ledger):
    # The safety net for a retry refused as a duplicate: the chain's last run ended without
    # claiming (CANCELED by the ledger), so Dagster will never retry it. The entry must not wait in
    # `retrying` forever: it becomes dispatch_failed, which the re-dispatch sensor takes up.
    with dg.instance_for_test() as instance:
        run, _ = _failed_run(instance)
        entry = _claimed(ledger, run.run_id)
        ledger.fail(entry.id, run.run_id, error="ValueError: bad row", now=LATER)
        refused, _ = _failed_run(instance, parent=run)
        # The retry ran and was refused: it ends CANCELED, tagged refused (the claim wrapper's
        # end_unclaimed_run), its last status event the cancellation.
        instance.add_run_tags(refused.run_id, {t.TAG_OUTCOME: t.OUTCOME_REFUSED})
        instance.handle_new_event(
            dg.EventLogEntry(
                error_info=None,
                level="debug",
                user_message="",
                run_id=refused.run_id,
                timestamp=LATER.timestamp(),
                dagster_event=dg.DagsterEvent(
                    event_type_value=dg.DagsterEventType.RUN_CANCELED.value,
                    job_name=_NOOP_JOB.name,
                ),
            )
        )
        assert instance.get_run_by_id(refused.run_id).status == dg.DagsterRunStatus.CANCELED

        (done,) = settle_abandoned_retries(instance, ledger, _STRICT_VIEWS, LATER)
        assert done.action is Action.DISPATCH_FAILED
        after = ledger.get(entry.id)
        assert after is not None and after.status == Status.DISPATCH_FAILED
        (failure,) = after.summary["dispatch_failures"]
        assert failure["run_id"] == refused.run_id
        assert "was refused by the ledger without claiming" in failure["error"]
        assert settle_abandoned_retries(instance, ledger, _STRICT_VIEWS, LATER) == []


def test_a_retry_dagster_announced_and_never_created_fails_the_entry_after_the_grace(ledger):
    # Found by the soak in CI: a killed run tagged will_retry=true never got its retry (the
    # retry daemon passed over it). The entry must not wait in `retrying` forever.
    with dg.instance_for_test() as instance:
        run, ended = _failed_run(instance)
        entry = _claimed(ledger, run.run_id)
        ledger.fail(entry.id, run.run_id, error="killed worker", now=AT_DUE)

        soon = ended + RETRY_LOST_AFTER - timedelta(seconds=5)
        assert settle_abandoned_retries(instance, ledger, _STRICT_VIEWS, soon) == []
        assert ledger.get(entry.id).status == Status.RETRYING  # type: ignore[union-attr]

        late = ended + RETRY_LOST_AFTER
        (done,) = settle_abandoned_retries(instance, ledger, _STRICT_VIEWS, late)
        assert (done.action, done.run_id) == (Action.FAIL_FINAL, run.run_id)
        after = ledger.get(entry.id)
        assert after is not None
        assert (after.status, after.error) == (Status.FAILED, "killed worker")
        assert settle_abandoned_retries(instance, ledger, _STRICT_VIEWS, late) == []


def test_a_created_retry_keeps_the_entry_waiting_however_late(ledger):
    with dg.instance_for_test() as instance:
        run, ended = _failed_run(instance)
        entry = _claimed(ledger, run.run_id)
        ledger.fail(entry.id, run.run_id, error="killed worker", now=AT_DUE)
        retry = instance.create_run_for_job(
            _NOOP_JOB,
            tags={**TAGS, t.DAGSTER_PARENT_RUN_ID: run.run_id, t.DAGSTER_RETRY_NUMBER: "1"},
            parent_run_id=run.run_id,
            root_run_id=run.run_id,
        )
        assert retry.status == dg.DagsterRunStatus.NOT_STARTED  # created, not yet launched
        late = ended + 10 * RETRY_LOST_AFTER
        assert settle_abandoned_retries(instance, ledger, _STRICT_VIEWS, late) == []
        assert ledger.get(entry.id).status == Status.RETRYING  # type: ignore[union-attr]


def test_a_lost_retry_of_a_retry_that_died_before_claiming_makes_the_entry_dispatch_failed(
    ledger,
):
    # The claimed run died; its retry died too, before claiming, and Dagster announced a
    # retry of that retry which it never created: the chain's newest run decides.
    with dg.instance_for_test() as instance:
        first, _ = _failed_run(instance)
        entry = _claimed(ledger, first.run_id)
        ledger.fail(entry.id, first.run_id, error="killed worker", now=AT_DUE)
        retry, ended = _failed_run(instance, parent=first)

        soon = ended + RETRY_LOST_AFTER - timedelta(seconds=5)
        assert settle_abandoned_retries(instance, ledger, _STRICT_VIEWS, soon) == []

        (done,) = settle_abandoned_retries(
            instance, ledger, _STRICT_VIEWS, ended + RETRY_LOST_AFTER
        )
        assert (done.action, done.run_id) == (Action.DISPATCH_FAILED, retry.run_id)
        after = ledger.get(entry.id)
        assert after is not None and after.status == Status.DISPATCH_FAILED
        assert after.dispatch_failure_run_ids == {retry.run_id}
        (failure,) = after.summary["dispatch_failures"]
        assert "the retry was lost" in failure["error"]


def test_a_retry_the_retry_daemon_passed_over_does_not_leave_the_entry_waiting(
    ledger_env: LedgerEnv,
):
    # What the CI soak met, through Dagster's real scheduler, run-retry daemon and sensors:
    # the retry daemon reads a RUN_FAILURE event before the run's status is written, passes
    # over the run, moves its cursor on; the run then says will_retry=true forever.
    with _daemon_up_before_the_due(ledger_env.tmp, RETRIES_ON) as (instance, ctx):
        retry_daemon_iteration(ctx, BEFORE_DUE)  # the daemon is up: its cursor is set
        run_scheduler_tick(ctx, AT_DUE)
        (run,) = task_runs(instance, "strict_task")
        # Its worker claimed the entry and was killed; run monitoring fails the run.
        entry = _claimed(ledger_env.ledger, run.run_id)
        died = AT_DUE + timedelta(seconds=30)
        fail_run_as_the_retry_daemon_reads_it(ctx, run.run_id, died, "run worker died")
        failed = instance.get_run_by_id(run.run_id)
        assert failed is not None and failed.status == dg.DagsterRunStatus.FAILURE
        assert failed.tags[t.DAGSTER_WILL_RETRY] == "true"

        retry_daemon_iteration(ctx, died + timedelta(seconds=5))
        retry_daemon_iteration(ctx, died + RETRY_LOST_AFTER)
        assert task_runs(instance, "strict_task") == [failed]  # Dagster never retries it

        run_sensor_tick(ctx, died + timedelta(seconds=10))  # the outcome sensor: an attempt
        assert ledger_env.ledger.get(entry.id).status == Status.RETRYING  # type: ignore[union-attr]
        run_sensor_tick(ctx, died + RETRY_LOST_AFTER - timedelta(seconds=5))
        assert ledger_env.ledger.get(entry.id).status == Status.RETRYING  # type: ignore[union-attr]

        run_sensor_tick(ctx, died + RETRY_LOST_AFTER + timedelta(seconds=30))
        after = ledger_env.ledger.get(entry.id)
        assert after is not None
        assert (after.status, list(after.run_ids)) == (Status.FAILED, [run.run_id])
        assert run.run_id in (after.error or "")


# --- runs launched from the UI carry no dueledger tags --------------------------------------


@pytest.mark.parametrize(
    ("job", "assets"),
    [("ui_task_job", None), ("__ASSET_JOB", {"ui_task"})],
    ids=["launchpad_of_the_task_job", "catalog_materialize_of_the_task_asset"],
)
def test_a_ui_run_that_failed_before_claiming_is_a_dispatch_failed_entry_not_invisible(
    ledger_url: str, job: str, assets: set[str] | None
) -> None:
    # Regression: the sensor skipped runs without dueledger/task, so summary said
    # failed_24h=0 while the Catalog showed the asset red.
    from fixtures.retry_defs import SPECS, defs

    views = build_views(SPECS, 15, "UTC")
    ledger = RunLedger(database_url=ledger_url)
    ledger.migrate()
    job_def = (
        defs.resolve_implicit_global_asset_job_def()
        if job.startswith("__ASSET_JOB")
        else defs.resolve_job_def(job)
    )
    with dg.instance_for_test() as instance:
        run = instance.create_run_for_job(
            job_def,
            tags={"dagster/from_ui": "true"},
            asset_selection=frozenset(dg.AssetKey(a) for a in assets) if assets else None,
        )
        assert run.job_name.startswith(job.removesuffix("_job"))
        instance.report_run_failed(run)

        _cursor, done = reconcile_events(instance, ledger, views, None, utc_now())

    entry = ledger.find("ui_task", f"manual:{run.run_id}")
    assert entry is not None and entry.status == Status.DISPATCH_FAILED
    assert entry.operator == "dagster-ui"
    assert entry.dispatch_failure_run_ids == {run.run_id}
    assert [d.action for d in done] == [Action.DISPATCH_FAILED]
    assert ledger.summary_counts()["dispatch_failed_window"] == 1
    ledger.dispose()
