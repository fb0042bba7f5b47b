"""redispatch_sensor: one sensor re-dispatches every task's dispatch_failed due in its slot.

Evaluated as a function against a real SQLite ledger (what it reads, which keys it asks
for), and through the real sensor daemon with two tasks whose launches failed at the same
due -- the case that once kept one sensor per task: Dagster looks a sensor's run
keys up by sensor name, so both tasks' first re-dispatch must not share a key.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
import sqlalchemy as sa
from dagster_internals import (
    daemon_instance,
    daemon_workspace,
    failing_launcher_config,
    run_scheduler_tick,
    run_sensor_tick,
)
from sensor_support import LedgerEnv, target, task_runs

from orchestration.task_spec import EverySlots, TaskSpec, build_views
from resources.core import tags as t
from resources.core.due import Due
from resources.core.entry import Status, Trigger
from resources.core.redispatch import REDISPATCH_STATUSES
from resources.ledger import RunLedger
from resources.ledger.schema import entries
from sensors.redispatch import build_redispatch_sensor

DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
BEFORE_DUE = DUE - timedelta(minutes=1)
AT_DUE = DUE + timedelta(seconds=5)
IN_SLOT = DUE + timedelta(minutes=4)
NEXT_SLOT = DUE + timedelta(minutes=15)


def _spec(key: str) -> TaskSpec:
    return TaskSpec(key=key, rule=EverySlots(1), declared_cadence="every slot")


VIEWS = build_views([_spec("alpha"), _spec("beta"), _spec("gamma")], 15, "UTC")


def _failed_dispatch(ledger: RunLedger, task: str, due: datetime, *, failures: int = 1):
    entry = ledger.ensure_entry(
        task_key=task, trigger=Trigger.SCHEDULE, dedup_key=Due(due).key, due=due, now=due
    )
    for n in range(failures):
        if n:
            assert ledger.redispatch(entry.id, now=due)
        entry = ledger.record_dispatch_failure(
            entry.id, error=f"launch {n} refused", run_id=f"{task}-run-{n}", now=due
        )
    return entry


def _evaluate(ledger: RunLedger, now: datetime, views=VIEWS) -> dg.SensorResult:
    sensor = build_redispatch_sensor(views, clock=lambda: now)
    with (
        dg.instance_for_test() as instance,
        dg.build_sensor_context(instance=instance, resources={"ledger": ledger}) as context,
    ):
        result = sensor(context)
    assert isinstance(result, dg.SensorResult)
    return result


def test_one_sensor_redispatches_each_task_of_the_slot_with_a_key_naming_the_task(ledger):
    alpha = _failed_dispatch(ledger, "alpha", DUE)
    beta = _failed_dispatch(ledger, "beta", DUE, failures=2)
    _failed_dispatch(ledger, "gamma", DUE - timedelta(minutes=15))  # an earlier slot: left
    _failed_dispatch(ledger, "not_here", DUE)  # not this location's task: left
    result = _evaluate(ledger, IN_SLOT)
    asked = {r.job_name: r.run_key for r in result.run_requests or []}
    assert asked == {
        "alpha_job": "alpha@2026-11-30T22:45:00Z#redispatch-1",
        "beta_job": "beta@2026-11-30T22:45:00Z#redispatch-2",
    }
    for request in result.run_requests or []:
        assert request.tags[t.TAG_DUE] == "2026-11-30T22:45:00Z"
        assert request.tags[t.TAG_TRIGGER] == Trigger.SENSOR
    assert ledger.get(alpha.id).status == ledger.get(beta.id).status == Status.QUEUED
    statuses = {e.task_key: e.status for e in ledger.list_entries(limit=10)[0]}
    assert statuses["gamma"] == statuses["not_here"] == Status.DISPATCH_FAILED

    # Evaluated again (a tick whose requests were lost): the same keys, no new failure.
    again = _evaluate(ledger, IN_SLOT + timedelta(minutes=2))
    assert {r.job_name: r.run_key for r in again.run_requests or []} == asked


def test_a_sensor_of_one_task_keeps_the_unqualified_key(ledger):
    _failed_dispatch(ledger, "alpha", DUE)
    result = _evaluate(ledger, IN_SLOT, views=VIEWS[:1])
    (request,) = result.run_requests or []
    assert request.run_key == "2026-11-30T22:45:00Z#redispatch-1"


def test_nothing_to_redispatch_is_a_skip_that_says_why(ledger):
    _failed_dispatch(ledger, "alpha", DUE, failures=4)  # more than the 3 per slot
    result = _evaluate(ledger, IN_SLOT)
    assert not result.run_requests
    assert "alpha@2026-11-30T22:45:00Z: re-dispatch budget used" in _skip_text(result)
    empty = _evaluate(ledger, NEXT_SLOT + timedelta(minutes=1))
    assert "no entry of this slot's due (2026-11-30T23:00:00Z)" in _skip_text(empty)


def _skip_text(result: dg.SensorResult) -> str:
    reason = result.skip_reason
    return reason.skip_message or "" if reason is not None else ""


def test_the_slot_read_returns_only_that_due_and_those_statuses(ledger):
    wanted = _failed_dispatch(ledger, "alpha", DUE)
    _failed_dispatch(ledger, "beta", DUE - timedelta(minutes=15))
    done = ledger.ensure_entry(
        task_key="gamma", trigger=Trigger.SCHEDULE, dedup_key=Due(DUE).key, due=DUE, now=DUE
    )
    ledger.claim(done.id, "run-g", lease_ttl=timedelta(minutes=5), now=DUE)
    manual = ledger.ensure_entry(
        task_key="alpha", trigger=Trigger.MANUAL, dedup_key="manual:r1", due=DUE, now=DUE
    )
    assert manual.status == Status.QUEUED  # queued, this due, but not the due's key
    found = ledger.entries_of_due(Due(DUE), REDISPATCH_STATUSES)
    assert [e.id for e in found] == [wanted.id]
    with pytest.raises(ValueError, match="statuses must name"):
        ledger.entries_of_due(Due(DUE), ["nope"])


def test_the_slot_read_is_an_index_range_on_status_and_due(tmp_path):
    # O(entries that may need a re-dispatch), whatever the ledger's size: SQLite's plan
    # searches the (status, due) index, never scans the table. (bench/scale.py times the
    # same read on 10,000 and 100,000 entries on both databases.)
    ledger = RunLedger(database_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    ledger.migrate()
    at = DUE.replace(tzinfo=None)
    query = (
        sa.select(entries.c.id)
        .where(
            entries.c.status.in_(list(REDISPATCH_STATUSES)),
            entries.c.due == at,
            entries.c.origin == "due",
            entries.c.dedup_key == Due(DUE).key,
        )
        .order_by(entries.c.id)
    )
    engine = ledger._get_engine()
    compiled = query.compile(dialect=engine.dialect, compile_kwargs={"render_postcompile": True})
    params = tuple(compiled.params[k] for k in compiled.positiontup or ())
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}", params).all()
    plan = " | ".join(str(r[-1]) for r in rows)
    ledger.dispose()
    assert "ix_dueledger_entries_status_due" in plan, plan
    assert "SCAN dueledger_entries" not in plan, plan


@pytest.mark.daemon
def test_two_tasks_failing_at_one_due_are_both_redispatched_by_the_real_daemon(
    ledger_env: LedgerEnv,
):
    marker = ledger_env.tmp / "launcher-fails"
    marker.touch()
    overrides = {"run_retries": {"enabled": True, "max_retries": 0}}
    overrides.update(failing_launcher_config(marker))
    home = ledger_env.tmp / "instance"
    with (
        daemon_instance("mocked", temp_dir=home, overrides=overrides) as inst,
        daemon_workspace(inst, target("dispatch_pair_defs")) as ctx,
    ):
        run_scheduler_tick(ctx, BEFORE_DUE)
        run_sensor_tick(ctx, BEFORE_DUE)
        run_scheduler_tick(ctx, AT_DUE, raise_on_error=False)  # both launches fail
        marker.unlink()
        run_sensor_tick(ctx, DUE + timedelta(minutes=2))  # outcome sensor: dispatch_failed
        run_sensor_tick(ctx, DUE + timedelta(minutes=4))  # re-dispatch sensor: both
        run_sensor_tick(ctx, DUE + timedelta(minutes=6))  # again: nothing new
        for task in ("strict_task", "twin_task"):
            first, again = task_runs(inst, task)
            assert first.status == dg.DagsterRunStatus.FAILURE
            assert again.tags[t.DAGSTER_RUN_KEY] == f"{task}@2026-11-30T22:45:00Z#redispatch-1"
            assert again.job_name == f"{task}_job"
            assert again.status == dg.DagsterRunStatus.STARTING  # launched
            (entry,) = ledger_env.entries(task)
            assert (entry.status, entry.dedup_key) == (Status.QUEUED, "due:2026-11-30T22:45:00Z")
