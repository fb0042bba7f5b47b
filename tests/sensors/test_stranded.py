"""Stranded launches: an entry whose launching command died before its run was created is
recorded as ``dispatch_failed`` by the reclaim sensor's tick (the real sensor daemon path),
with the command that re-dispatches it; entries that have a run, or are young, are left.
"""

from __future__ import annotations

import json
from datetime import timedelta

import dagster as dg
from click.testing import CliRunner
from dagster_internals import daemon_instance, daemon_workspace, run_sensor_tick
from sensor_support import LedgerEnv, target, utc_now

from orchestration.cli import main
from orchestration.reclaim import STRANDED_AFTER
from orchestration.services.launch import manual_run_id
from resources.core.entry import (
    Entry,
    FailureKind,
    Status,
    Trigger,
    dedup_key_for_request,
    dedup_key_for_retry,
)

TASK = "sleepy_task"  # the task of tests/fixtures/ledger_defs.py's lease_defs


@dg.op
def _noop() -> None:
    return None


@dg.job
def _stand_in_job() -> None:
    _noop()


def _manual(env: LedgerEnv, request_id: str, age: timedelta, attempts: int = 3) -> Entry:
    return env.ledger.ensure_entry(
        max_attempts=attempts,
        task_key=TASK,
        trigger=Trigger.MANUAL,
        dedup_key=dedup_key_for_request(request_id),
        operator="ops",
        reason="lost launch",
        now=utc_now() - age,
    )


def test_a_launch_whose_run_was_never_created_is_recorded_with_its_redo(
    ledger_env: LedgerEnv,
) -> None:
    old = STRANDED_AFTER + timedelta(minutes=5)
    lost = _manual(ledger_env, "req-lost", old)
    young = _manual(ledger_env, "req-young", timedelta(minutes=2))
    launched = _manual(ledger_env, "req-launched", old)
    # A retry committed (parent stamped, child recorded) whose launch never happened.
    parent = _manual(ledger_env, "req-parent", old + timedelta(minutes=5), attempts=1)
    assert ledger_env.ledger.claim(parent.id, "run-p", lease_ttl=timedelta(minutes=1)).claimed
    ledger_env.ledger.fail(parent.id, "run-p", error="boom", kind=FailureKind.TIMEOUT)
    assert ledger_env.ledger.mark_manual_retry(parent.id, operator="ops", statuses=(Status.FAILED,))
    child = ledger_env.ledger.ensure_entry(
        task_key=TASK,
        trigger=Trigger.MANUAL_RETRY,
        dedup_key=dedup_key_for_retry(parent.id),
        parent_id=parent.id,
        operator="ops",
        reason="again",
        now=utc_now() - old,
    )
    with (
        daemon_instance("mocked", temp_dir=ledger_env.tmp / "instance") as instance,
        daemon_workspace(instance, target("lease_defs")) as ctx,
    ):
        # The launched request's run exists (it may wait in Dagster's queue): not stranded.
        _stand_in_job.execute_in_process(
            instance=instance, run_id=manual_run_id(TASK, "req-launched")
        )
        run_sensor_tick(ctx, utc_now())
        after = {e.id: e for e in ledger_env.entries(TASK)}
        for entry_id in (lost.id, child.id):
            assert after[entry_id].status == Status.DISPATCH_FAILED
            assert after[entry_id].failure_kind == FailureKind.DISPATCH
            assert after[entry_id].run_ids == ()
            (failure,) = after[entry_id].summary["dispatch_failures"]
            assert "no Dagster run was created" in failure["error"]
        assert "--request-id req-lost" in (after[lost.id].error or "")
        assert f"runs retry {parent.id} --operator" in (after[child.id].error or "")
        assert after[young.id].status == Status.QUEUED
        assert after[launched.id].status == Status.QUEUED
        assert after[parent.id].status == Status.FAILED

        # A later tick changes nothing more: a recorded failure is not recorded twice.
        run_sensor_tick(ctx, utc_now() + timedelta(seconds=31))
        again = {e.id: e for e in ledger_env.entries(TASK)}
        assert again[lost.id].summary == after[lost.id].summary
        assert again[child.id].summary == after[child.id].summary


def test_dueledger_reclaim_sweeps_them_too_and_dry_run_changes_nothing(
    ledger_env: LedgerEnv,
) -> None:
    """Deployments without the daemon: the CLI runs the same sweep."""
    lost = _manual(ledger_env, "req-cli", STRANDED_AFTER + timedelta(minutes=1))
    dry = CliRunner().invoke(main, ["reclaim", "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    (item,) = json.loads(dry.stdout)["stranded"]
    assert (item["entry_id"], item["dedup_key"]) == (lost.id, "manual:req-cli")
    assert ledger_env.ledger.get(lost.id).status == Status.QUEUED  # type: ignore[union-attr]
    done = CliRunner().invoke(main, ["reclaim", "--json"])
    assert done.exit_code == 0, done.output
    assert [s["entry_id"] for s in json.loads(done.stdout)["stranded"]] == [lost.id]
    assert ledger_env.ledger.get(lost.id).status == Status.DISPATCH_FAILED  # type: ignore[union-attr]
    again = CliRunner().invoke(main, ["reclaim", "--json"])
    assert json.loads(again.stdout)["stranded"] == []
