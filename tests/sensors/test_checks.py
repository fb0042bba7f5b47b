"""The ``latest_due_accounted_for`` asset check: what the ledger says about a task's latest
due whose slot is over (SQLite and PostgreSQL), and the check as ledger_sensor (slot health) reports
it through the real sensor daemon path, visible as the asset's latest check evaluation.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
from dagster_internals import daemon_instance, daemon_workspace, run_sensor_tick
from sensor_support import LedgerEnv, fixture_module, target, utc_now

from orchestration.checks import build_task_checks
from orchestration.services import accounting as acc
from resources.core.due import Due, floor_to_slot
from resources.core.entry import Trigger, dedup_key_for_due, dedup_key_for_retry
from resources.ledger import RunLedger

SLOT = timedelta(minutes=15)
NOW = datetime(2026, 11, 30, 23, 5, tzinfo=UTC)  # the latest finished slot's due: 22:45
LATEST = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
TTL = timedelta(minutes=5)


def strict_view():
    module = fixture_module()
    (view,) = module.views_of(module.STRICT)
    return view


def _entry(ledger: RunLedger, due: datetime, attempts: int = 1):
    return ledger.ensure_entry(
        task_key="strict_task",
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(due),
        max_attempts=attempts,
        now=due,
    )


def _account(ledger: RunLedger, now: datetime = NOW) -> acc.DueAccount:
    return acc.account_latest_due(strict_view(), ledger, now)


def test_a_new_task_has_nothing_to_account_for(ledger: RunLedger) -> None:
    account = _account(ledger)
    assert (account.due, account.state, account.passed) == (Due(LATEST), acc.STATE_NEW, True)


def test_a_missed_due_fails_naming_it(ledger: RunLedger) -> None:
    _entry(ledger, LATEST - SLOT)  # the task ran here before: 22:45 is missed
    account = _account(ledger)
    assert (account.state, account.passed) == (acc.STATE_MISSED, False)
    assert "due 2026-11-30T22:45:00Z was missed" in account.detail


def test_success_running_and_a_successful_manual_retry_pass(ledger: RunLedger) -> None:
    entry = _entry(ledger, LATEST)
    assert ledger.claim(entry.id, "run-1", lease_ttl=TTL, now=NOW - timedelta(minutes=1)).claimed
    assert (_account(ledger).state, _account(ledger).passed) == (acc.STATE_RUNNING, True)
    stale = _account(ledger, NOW + timedelta(minutes=5))  # lease ran out at 23:09
    assert (stale.state, stale.passed) == (acc.STATE_STALE_LEASE, False)
    ledger.fail(entry.id, "run-1", error="boom\nstack", now=NOW)
    failed = _account(ledger)
    assert (failed.state, failed.passed, failed.entry_id) == (acc.STATE_FAILED, False, entry.id)
    assert "failed (error): boom" in failed.detail
    child = ledger.ensure_entry(
        task_key="strict_task",
        trigger=Trigger.MANUAL_RETRY,
        dedup_key=dedup_key_for_retry(entry.id),
        parent_id=entry.id,
        operator="ops",
        reason="again",
    )
    assert ledger.claim(child.id, "run-2", lease_ttl=TTL).claimed
    assert ledger.succeed(child.id, "run-2")
    retried = _account(ledger)
    assert (retried.state, retried.passed) == (acc.STATE_SUCCESS, True)
    assert f"manual retry {child.id} succeeded" in retried.detail


def test_a_dispatch_failure_fails(ledger: RunLedger) -> None:
    entry = _entry(ledger, LATEST)
    ledger.record_dispatch_failure(entry.id, error="launcher down")
    account = _account(ledger)
    assert (account.state, account.passed) == (acc.STATE_DISPATCH_FAILED, False)


def test_slot_health_reports_the_check_and_the_catalog_sees_it_fail(ledger_env: LedgerEnv) -> None:
    """Through the sensor daemon: a missed due makes strict_task's check fail."""
    now = utc_now()
    slot = floor_to_slot(now, 15)
    latest = slot - SLOT
    # strict_task ran for the due before, not for the latest finished one.
    ledger_env.ledger.ensure_entry(
        task_key="strict_task",
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(latest - SLOT),
        max_attempts=1,
        now=latest - SLOT,
    )
    key = dg.AssetCheckKey(dg.AssetKey("strict_task"), acc.CHECK_NAME)
    with (
        daemon_instance("mocked", temp_dir=ledger_env.tmp / "instance") as instance,
        daemon_workspace(instance, target("audit_defs")) as ctx,
    ):
        run_sensor_tick(ctx, now)
        record = instance.get_latest_asset_check_evaluation_record(key)
        assert record is not None and record.event is not None
        evaluation = record.event.dagster_event.event_specific_data  # type: ignore[union-attr]
        assert evaluation.passed is False
        assert f"due {Due(latest)} was missed" in (evaluation.description or "")
        assert evaluation.metadata["state"].value == acc.STATE_MISSED
    # The check is declared on the asset, so the Catalog lists it with this evaluation.
    assert key in fixture_module().audit_defs.get_asset_checks_def(key).check_keys


def test_executing_one_tasks_check_evaluates_that_check_alone(ledger: RunLedger) -> None:
    # Every task's check is one multi-asset check definition (a node of Dagster's asset
    # graph per check made the location's load grow twice as fast); "Execute" on
    # one task's check in the Catalog must still evaluate that one, from the ledger.
    module = fixture_module()
    views = module.views_of(module.STRICT, module.TWIN)
    (checks,) = build_task_checks(views)
    strict = dg.AssetCheckKey(dg.AssetKey("strict_task"), acc.CHECK_NAME)
    twin = dg.AssetCheckKey(dg.AssetKey("twin_task"), acc.CHECK_NAME)
    assert checks.check_keys == {strict, twin}
    assert "strict_task's latest due" in (checks.get_spec_for_check_key(strict).description or "")
    stubs = [dg.AssetSpec(v.spec.asset) for v in views]
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [*stubs, checks],
            selection=dg.AssetSelection.checks(strict),
            resources={"ledger": ledger},
            instance=instance,
        )
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.asset_check_key == strict
    assert evaluation.metadata["task"].value == "strict_task"


def test_every_task_asset_of_the_code_location_has_the_check() -> None:
    # Imported here: the code location's module is loaded only by this test of the file.
    from orchestration.declarations import registered_tasks
    from orchestration.definitions import defs

    location = defs()
    for spec in registered_tasks():
        key = dg.AssetCheckKey(dg.AssetKey(spec.asset), acc.CHECK_NAME)
        assert key in location.get_asset_checks_def(key).check_keys
