"""The ledger's own checks on ``ledger_health``: ``no_stale_leases``, ``no_lost_retries`` and
``no_unledgered_failed_runs``. Each condition is made for real -- a real ledger (SQLite and
PostgreSQL), real Dagster runs of a task through the real claim wrapper on a real instance --
seen to fail the check, then cleared by the service the fixing sensor runs, and seen to
pass. Then all three through the real sensor daemon path and the Catalog's "Execute".
"""

# No ``from __future__ import annotations``: Dagster reads the test asset's annotations
# (its context type, the RunLedger resource) as objects.
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import pytest
from dagster_graphql.cli import execute_query
from dagster_internals import daemon_instance, daemon_workspace, run_sensor_tick
from sensor_support import LedgerEnv, fixture_module, target, utc_now

from orchestration import task_defs
from orchestration.declarations import registered_tasks
from orchestration.reclaim import reclaim_leases
from orchestration.services import ledger_checks as lc
from orchestration.services.dagster_runs import RETRY_LOST_AFTER
from orchestration.services.hooks.registry import Hooks
from orchestration.services.hooks.vocabulary import HookRegistry
from orchestration.services.outcomes import reconcile_events, settle_abandoned_retries
from orchestration.task_run import TaskRun
from orchestration.task_spec import TaskSpec, build_views
from orchestration.timetable import EverySlots
from resources.core import tags as t
from resources.core.due import floor_to_slot, format_due
from resources.core.entry import Status, Trigger, dedup_key_for_due
from resources.ledger import RunLedger

SLOT = timedelta(minutes=15)
TTL = timedelta(minutes=5)
SPEC = TaskSpec(
    key="checked_task",
    rule=EverySlots(1),
    declared_cadence="every slot",
    timeout=timedelta(minutes=1),
    lease_ttl=timedelta(minutes=2),
)
VIEWS = build_views([SPEC], 15, "UTC")
NO_HOOKS = Hooks.of(HookRegistry())


def _fails(context: dg.AssetExecutionContext, run: TaskRun):
    raise RuntimeError("the source is down")
    yield  # a generator, like every body


@dg.asset(name="checked_task", output_required=False)
def checked_task(context: dg.AssetExecutionContext, ledger: RunLedger):
    """The task: it claims its entry, then its body fails."""
    yield from task_defs.run_task(
        context, ledger, SPEC, _fails, hooks=NO_HOOKS, tasks=registered_tasks()
    )


def scheduled(due: datetime, **extra: str) -> dict[str, str]:
    return {
        t.TAG_TASK: SPEC.key,
        t.TAG_TRIGGER: Trigger.SCHEDULE.value,
        t.TAG_DUE: format_due(due),
        **extra,
    }


def run_task(
    instance: dg.DagsterInstance, ledger: RunLedger, tags: dict[str, str]
) -> dg.DagsterRun:
    """A real run of the task on ``instance``; it fails (in its body, or before claiming
    when ``ledger`` cannot be reached)."""
    result = dg.materialize(
        [checked_task],
        resources={"ledger": ledger},
        instance=instance,
        tags=tags,
        raise_on_error=False,
    )
    assert not result.success
    run = instance.get_run_by_id(result.run_id)
    assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
    return run


def _failure(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str:
    """The text of the run's failure events (why it failed)."""
    records = instance.get_records_for_run(run.run_id).records
    return " ".join(
        str(r.event_log_entry.dagster_event.event_specific_data)
        for r in records
        if r.event_log_entry.dagster_event is not None
        and r.event_log_entry.dagster_event.is_failure
    )


def ended(instance: dg.DagsterInstance, run: dg.DagsterRun) -> datetime:
    """When the run was last touched: its end, or a tag written after it (Dagster's
    ``dagster/will_retry``) -- what the check's ``updated_before`` bound compares."""
    record = instance.get_run_record_by_id(run.run_id)
    assert record is not None and record.end_time is not None
    end = datetime.fromtimestamp(record.end_time, UTC)
    updated = record.update_timestamp
    updated = updated.replace(tzinfo=UTC) if updated.tzinfo is None else updated.astimezone(UTC)
    return max(end, updated)


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    # Run retries on, as in production: Dagster announces (dagster/will_retry) a retry that
    # only its retry daemon -- not running here -- would create.
    with dg.instance_for_test(overrides={"run_retries": {"enabled": True}}) as inst:
        yield inst


@pytest.fixture
def unreachable_ledger(tmp_path) -> RunLedger:
    """A ledger a run cannot open: its directory is a file."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    return RunLedger(database_url=f"sqlite:///{blocker / 'ledger.sqlite'}")


# --- no_stale_leases -----------------------------------------------------------------------


def test_a_lease_that_expired_unreclaimed_fails_the_check_until_it_is_reclaimed(ledger):
    now = utc_now()
    entry = ledger.ensure_entry(
        task_key=SPEC.key,
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(floor_to_slot(now, 15)),
        max_attempts=1,
    )
    # Its run claimed it and died: the lease ran out 1 minute before ``now``.
    claim = ledger.claim(entry.id, "run-died", lease_ttl=TTL, now=now - TTL - timedelta(minutes=1))
    assert claim.claimed
    assert lc.stale_leases(ledger, now - TTL - timedelta(seconds=30)).passed

    fresh = lc.stale_leases(ledger, now)  # the reclaim sensor is due: a warning
    assert (fresh.passed, fresh.severity) == (False, dg.AssetCheckSeverity.WARN)
    late = lc.stale_leases(ledger, now + lc.SENSOR_GRACE)
    assert (late.passed, late.severity) == (False, dg.AssetCheckSeverity.ERROR)
    assert f"entry {entry.id} {entry.label} (run run-died" in late.detail
    assert f"`dueledger runs show {entry.id}`" in late.detail
    assert "`dueledger reclaim --dry-run`" in late.detail
    assert "is it running?" in late.detail
    assert [x["entry_id"] for x in late.found] == [entry.id]

    assert [r.entry_id for r in reclaim_leases(ledger, now)] == [entry.id]
    assert lc.stale_leases(ledger, now + lc.SENSOR_GRACE).passed


# --- no_lost_retries -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("how", "backend"),
    [
        ("retry_announced_never_created", "sqlite"),
        pytest.param("retry_announced_never_created", "postgres", marks=pytest.mark.postgres),
        ("dagster_will_not_retry", "sqlite"),
        ("run_deleted", "sqlite"),
    ],
)
def test_an_entry_whose_retry_never_comes_fails_the_check_until_it_is_settled(
    request, instance, how, backend
):
    ledger = RunLedger(database_url=request.getfixturevalue(f"{backend}_url"))
    ledger.migrate()
    request.addfinalizer(ledger.dispose)
    due = floor_to_slot(utc_now(), 15)
    run = run_task(instance, ledger, scheduled(due, **{t.DAGSTER_MAX_RETRIES: "2"}))
    entry = ledger.find(SPEC.key, dedup_key_for_due(due))
    assert entry is not None and entry.status == Status.RETRYING  # 1 of 3 attempts
    if how == "dagster_will_not_retry":
        # Dagster announced the retry, then could not create it (its code location was
        # away) and took the announcement back: what the run said when it failed no longer
        # holds.
        instance.add_run_tags(run.run_id, {t.DAGSTER_WILL_RETRY: "false"})
    end = ended(instance, run)
    if how == "run_deleted":
        instance.delete_run(run.run_id)

    # While Dagster's retry may still come, nothing is lost.
    if how != "run_deleted":
        assert lc.lost_retries(ledger, instance, end + timedelta(seconds=30)).passed
    later = end + RETRY_LOST_AFTER + timedelta(seconds=1)
    check = lc.lost_retries(ledger, instance, later)
    assert check.passed is False
    assert f"entry {entry.id} {entry.label} (attempt 1)" in check.detail
    assert run.run_id in check.detail
    assert f"`dueledger runs show {entry.id}`" in check.detail
    assert [(x["entry_id"], x["run_id"]) for x in check.found] == [(entry.id, run.run_id)]

    if how == "run_deleted":
        return  # nothing of Dagster's is left for the outcome sensor to settle it by
    settled = settle_abandoned_retries(instance, ledger, VIEWS, later)
    assert [s.entry.id for s in settled if s.entry] == [entry.id]
    assert lc.lost_retries(ledger, instance, later).passed


# --- no_unledgered_failed_runs --------------------------------------------------------------


def test_a_run_that_failed_before_claiming_fails_the_check_until_the_ledger_records_it(
    ledger, instance, unreachable_ledger
):
    due = floor_to_slot(utc_now(), 15)
    # The ledger is unreachable as the run starts: it fails before it can claim anything.
    run = run_task(instance, unreachable_ledger, scheduled(due))
    assert "not-a-directory" in _failure(instance, run)
    assert ledger.find(SPEC.key, dedup_key_for_due(due)) is None
    end = ended(instance, run)

    # Not judged while the outcome sensor has not had its turn.
    assert lc.unledgered_failed_runs(ledger, instance, VIEWS, end + timedelta(seconds=30)).passed
    later = end + lc.SENSOR_GRACE + timedelta(seconds=1)
    check = lc.unledgered_failed_runs(ledger, instance, VIEWS, later)
    assert check.passed is False
    assert f"run {run.run_id} of {SPEC.key} (FAILURE" in check.detail
    assert f"`dueledger runs list --task {SPEC.key}`" in check.detail
    (found,) = check.found
    assert (found["run_id"], found["run_path"]) == (run.run_id, t.run_path(run.run_id))

    _cursor, done = reconcile_events(instance, ledger, VIEWS, None, later)
    assert [d.run_id for d in done] == [run.run_id]
    assert lc.unledgered_failed_runs(ledger, instance, VIEWS, later).passed


def test_a_run_that_failed_after_claiming_is_in_the_ledger(sqlite_ledger, instance):
    ledger = sqlite_ledger
    run = run_task(instance, ledger, scheduled(floor_to_slot(utc_now(), 15)))
    later = ended(instance, run) + lc.SENSOR_GRACE + timedelta(seconds=1)
    check = lc.unledgered_failed_runs(ledger, instance, VIEWS, later)
    assert check.passed, check.detail
    assert "1 run looked at" in check.detail


def test_a_ledger_trace_is_a_recorded_run_or_a_retry_carrying_the_entry():
    entry = _entry(
        run_ids=("claimed",),
        summary={
            "dispatch_failures": [{"run_id": "never-started"}],
            "late_job_rejections": [{"run_id": "duplicate"}],
        },
    )
    retry_tags = {t.DAGSTER_RETRY_NUMBER: "1", t.TAG_ENTRY: str(entry.id)}
    assert lc.run_is_traced(entry, "claimed", {})
    assert lc.run_is_traced(entry, "never-started", {})
    assert lc.run_is_traced(entry, "duplicate", {})
    assert lc.run_is_traced(entry, "dead-retry", retry_tags)
    # A re-execution from the UI copies the tag too, but is no automatic retry.
    assert not lc.run_is_traced(entry, "ui-reexecution", {t.TAG_ENTRY: str(entry.id)})
    assert not lc.run_is_traced(entry, "other", {})
    assert not lc.run_is_traced(None, "claimed", {})


def _entry(**changes: Any):
    from resources.core.entry import Entry

    now = datetime(2026, 11, 30, tzinfo=UTC)
    base: dict[str, Any] = {
        "id": 7,
        "task_key": SPEC.key,
        "trigger": Trigger.SCHEDULE,
        "origin": "due",
        "dedup_key": "due:2026-11-30T00:00:00Z",
        "due": now,
        "status": Status.SUCCESS,
        "attempt": 1,
        "max_attempts": 3,
        "parent_id": None,
        "run_ids": (),
        "lease_owner": None,
        "lease_expires_at": None,
        "heartbeat_at": None,
        "created_at": now,
        "started_at": now,
        "finished_at": now,
        "updated_at": now,
        "operator": None,
        "reason": None,
        "failure_kind": None,
        "error": None,
        "summary": {},
        "manual_retry_at": None,
        "manual_retry_by": None,
    }
    base.update(changes)
    return Entry(**base)


# --- through the sensor daemon and the Catalog ------------------------------------------------

EXECUTE_CHECK = """
mutation Execute($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on Error { message }
  }
}
"""


def _latest(instance: dg.DagsterInstance, name: str) -> Any:
    key = dg.AssetCheckKey(dg.AssetKey(lc.LEDGER_HEALTH_TASK), name)
    record = instance.get_latest_asset_check_evaluation_record(key)
    assert record is not None and record.event is not None
    return record.event.dagster_event.event_specific_data  # type: ignore[union-attr]


def _execute_from_the_catalog(ctx: Any, name: str) -> str:
    """What "Execute" on a check in the Catalog sends: launchRun of the asset job with the
    check alone selected."""
    selector = {
        "repositoryLocationName": "dueledger",
        "repositoryName": "__repository__",
        "jobName": "__ASSET_JOB",
        "assetSelection": [],
        "assetCheckSelection": [{"assetKey": {"path": [lc.LEDGER_HEALTH_TASK]}, "name": name}],
    }
    result = execute_query(ctx, EXECUTE_CHECK, {"params": {"selector": selector}})
    payload = result["data"]["launchRun"]
    assert payload["__typename"] == "LaunchRunSuccess", result
    return str(payload["run"]["runId"])


def test_slot_health_reports_the_ledger_checks_and_the_catalog_executes_them(
    ledger_env: LedgerEnv, unreachable_ledger: RunLedger
) -> None:
    module = fixture_module()
    failing = module._asset(module.FAILING, NO_HOOKS)
    now = utc_now()
    due = floor_to_slot(now, 15)
    ledger = ledger_env.ledger
    stale = ledger.ensure_entry(
        task_key="strict_task",
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(due - SLOT),
        max_attempts=1,
    )
    assert ledger.claim(stale.id, "run-died", lease_ttl=TTL, now=now - 2 * TTL).claimed
    with (
        daemon_instance(
            "sync",
            temp_dir=ledger_env.tmp / "instance",
            overrides={"run_retries": {"enabled": True}},
        ) as instance,
        daemon_workspace(instance, target("health_defs")) as ctx,
    ):
        tags = {t.TAG_TASK: "failing_task", t.TAG_TRIGGER: Trigger.SCHEDULE.value}
        claimed = dg.materialize(
            [failing],
            resources={"ledger": ledger},
            instance=instance,
            tags={**tags, t.TAG_DUE: format_due(due), t.DAGSTER_MAX_RETRIES: "2"},
            raise_on_error=False,
        )
        before_claim = dg.materialize(
            [failing],
            resources={"ledger": unreachable_ledger},
            instance=instance,
            tags={**tags, t.TAG_DUE: format_due(due - SLOT)},
            raise_on_error=False,
        )
        retrying = ledger.find("failing_task", dedup_key_for_due(due))
        assert retrying is not None and retrying.status == Status.RETRYING

        # "Execute" in the Catalog: a run of the check alone, as of now.
        run_id = _execute_from_the_catalog(ctx, lc.CHECK_NO_STALE_LEASES)
        executed = _latest(instance, lc.CHECK_NO_STALE_LEASES)
        assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.SUCCESS  # type: ignore[union-attr]
        assert executed.passed is False and f"entry {stale.id}" in executed.description

        # The sensor daemon, once the sensors that fix these had time to: all three fail.
        late = now + RETRY_LOST_AFTER + timedelta(minutes=1)
        run_sensor_tick(ctx, late)
        stale_check = _latest(instance, lc.CHECK_NO_STALE_LEASES)
        lost_check = _latest(instance, lc.CHECK_NO_LOST_RETRIES)
        unledgered = _latest(instance, lc.CHECK_NO_UNLEDGERED_FAILED_RUNS)
        assert (stale_check.passed, lost_check.passed, unledgered.passed) == (False, False, False)
        assert stale_check.severity == dg.AssetCheckSeverity.ERROR
        assert f"entry {retrying.id}" in lost_check.description
        assert claimed.run_id in lost_check.description
        assert f"run {before_claim.run_id} of failing_task" in unledgered.description
        assert unledgered.metadata["found"].value == 1

        # What ledger_sensor (reclaim) and ledger_sensor (outcomes) do, then the next slot.
        reclaim_leases(ledger, late)
        views = module.views_of(module.STRICT, module.FAILING, module.HEALTH)
        reconcile_events(instance, ledger, views, None, late)
        settle_abandoned_retries(instance, ledger, views, late)
        run_sensor_tick(ctx, late + SLOT)
        for name in lc.LEDGER_CHECK_NAMES:
            assert _latest(instance, name).passed is True, name
    defs = module.health_defs
    for name in lc.LEDGER_CHECK_NAMES:
        key = dg.AssetCheckKey(dg.AssetKey(lc.LEDGER_HEALTH_TASK), name)
        assert defs.get_asset_checks_def(key).check_keys == {key}


def test_the_code_location_declares_the_ledger_checks_on_ledger_health() -> None:
    # Imported here: the code location's module is loaded only by this test of the file.
    from orchestration.definitions import defs

    location = defs()
    for name in lc.LEDGER_CHECK_NAMES:
        key = dg.AssetCheckKey(dg.AssetKey("ledger_health"), name)
        assert key in location.get_asset_checks_def(key).check_keys
    # The task's own run does not run them: they are not steps of ledger_health_job.
    job = location.resolve_job_def("ledger_health_job")
    assert [n.name for n in job.graph.node_dict.values()] == ["ledger_health"]
