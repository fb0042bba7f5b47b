"""Overlap policies through Dagster's real machinery, ledger on SQLite and
PostgreSQL.

Each test loads one task of tests/fixtures/policy_defs.py in the daemon's workspace, on an
instance queued like ``dagster.yaml.local`` (QueuedRunCoordinator, a pool of one slot per
``queue`` task). Runs are created the ways a user makes them -- the real scheduler's tick, the
UI's GraphQL ``launchRun`` (no dueledger tags), a run tagged as the backfill daemon tags its
runs -- dequeued by Dagster's real run-queue daemon, and executed as a run worker executes them
(``execute_run``, in a thread: two runs of the task must be at work at once). The first run of
the task waits after claiming until the test writes the release file; what the ledger decides
about the runs that arrive meanwhile is the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from policy_support import DUE, POLICY_DEFS, SLOT, World, policy_world

from orchestration.manual_launch import launch_manual
from orchestration.services.hooks.registry import Hooks
from resources.core import tags as t
from resources.core.entry import FailureKind, Status, Trigger
from resources.core.errors import Refused
from resources.ledger import RunLedger

pytestmark = pytest.mark.daemon


@pytest.fixture
def world(
    request: pytest.FixtureRequest,
    ledger_in_environment: RunLedger,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[World]:
    with policy_world(request.param, ledger_in_environment, tmp_path, monkeypatch) as found:
        yield found


@pytest.mark.parametrize("world", ["skip_task"], indirect=True)
def test_skip_records_every_run_that_finds_the_task_running_as_skipped(world: World) -> None:
    first = world.start(world.due(0))
    world.wait_claimed(1)
    busy = world.ledger.in_progress("skip_task")[0]
    # The schedule's next due is decided at its tick: no run, the tick says why, and the
    # ledger records the due skipped -- once, however often the tick is evaluated.
    for _ in range(2):
        assert world.tick(1) == []
    skipped = world.ledger.find("skip_task", _due_key(1))
    assert skipped is not None and skipped.status == Status.SKIPPED
    assert skipped.error == f"overlap: entry {busy.id} running"
    reason = world.tick_reason()
    assert f"entry {skipped.id} records it; no run was requested" in reason
    assert f"overlap: entry {busy.id} running" in reason
    # A UI launch and a backfill run arrive while the first runs: decided at their claim.
    arrivals = [
        world.ui_launch(),
        world.ui_launch({t.DAGSTER_BACKFILL: "bf1", t.DAGSTER_PARTITION: "2026-11-30"}),
    ]
    for run_id in arrivals:
        world.start(run_id).join(timeout=60)
        assert world.outcome(run_id) == ("CANCELED", t.OUTCOME_SKIPPED)
        entry = world.entry_of(run_id)
        assert entry.status == Status.SKIPPED
        assert entry.error == f"overlap: entry {busy.id} running"
    triggers = sorted(world.entry_of(r).trigger for r in arrivals)
    assert triggers == [Trigger.BACKFILL, Trigger.MANUAL]
    # `dueledger launch` is refused naming the running entry; --queue waits its turn.
    with pytest.raises(Refused, match=f"running \\(entry {busy.id}"):
        launch_manual(
            [_spec("skip_task")],
            "skip_task",
            operator="alice",
            reason="now",
            request_id="r1",
            instance=world.instance,
            ledger=world.ledger,
            hooks=Hooks(),
            submit=_never,
        )
    world.release()
    first.join(timeout=60)
    assert world.ledger.get(busy.id).status == Status.SUCCESS  # type: ignore[union-attr]
    assert world.effects() == [busy.id]  # nothing of the skipped runs ran


@pytest.mark.parametrize("world", ["skip_task"], indirect=True)
def test_a_queued_manual_launch_waits_for_its_turn(world: World) -> None:
    first = world.start(world.due(0))
    world.wait_claimed(1)
    submitted: list[dict[str, str]] = []
    result = launch_manual(
        [_spec("skip_task")],
        "skip_task",
        operator="alice",
        reason="after the due",
        request_id="r2",
        instance=world.instance,
        ledger=world.ledger,
        hooks=Hooks(),
        submit=lambda job, run_id, tags: submitted.append(dict(tags)),
        queue=True,
    )
    # The run `dagster job launch` would submit, with the tags it was given.
    run_id = world.ui_launch(submitted[0])
    waiting = world.start(run_id)
    waiting.join(timeout=3)
    assert waiting.is_alive()  # waits: not skipped
    world.release()
    first.join(timeout=60)
    waiting.join(timeout=60)
    assert world.outcome(run_id) == ("SUCCESS", None)
    assert world.ledger.get(result.entry_id).status == Status.SUCCESS  # type: ignore[union-attr]


@pytest.mark.parametrize("world", ["buffer_task"], indirect=True)
def test_buffer_one_holds_one_waiter_without_a_run_and_skips_the_rest(world: World) -> None:
    first = world.start(world.due(0))
    world.wait_claimed(1)
    busy = world.ledger.in_progress("buffer_task")[0]
    # The next due finds the task at work: its tick requests no run (so no run worker waits)
    # and holds the due as the task's waiter -- once, however often the tick is evaluated.
    for _ in range(2):
        assert world.tick(1) == []
    waiting = world.ledger.find("buffer_task", _due_key(1))
    assert waiting is not None and waiting.status == Status.QUEUED
    assert not waiting.run_ids
    reason = world.tick_reason()
    assert f"entry {waiting.id} is queued as the task's waiter, with no run yet" in reason
    assert f"overlap: entry {busy.id} running" in reason
    # A UI launch meanwhile is skipped at its claim, the due after at its tick.
    third_run = world.ui_launch()
    world.start(third_run).join(timeout=60)
    assert world.outcome(third_run) == ("CANCELED", t.OUTCOME_SKIPPED)
    assert world.entry_of(third_run).error == f"overlap: entry {waiting.id} already waiting"
    assert world.tick(2) == []
    late = world.ledger.find("buffer_task", _due_key(2))
    assert late is not None and late.status == Status.SKIPPED
    assert late.error == f"overlap: entry {waiting.id} already waiting"
    # While the task is at work, ledger_sensor launches nothing.
    assert world.keep(2) == []
    world.release()
    first.join(timeout=60)
    # Once it is free, ledger_sensor launches the waiter's run, and only one: asked again
    # before that run claims, it gets the same run key and Dagster finds the run it made.
    (waiter_run,) = world.keep(3)
    assert world.keep(4) == []
    world.start(waiter_run).join(timeout=60)
    assert world.outcome(waiter_run) == ("SUCCESS", None)
    assert world.entry_of(waiter_run).id == waiting.id
    assert world.ledger.get(waiting.id).status == Status.SUCCESS  # type: ignore[union-attr]
    assert world.keep(5) == []  # the waiter is gone
    assert len(world.effects()) == 2  # the first run and its one waiter
    # Dagster runs: the first due's, the UI launch, the waiter's; none for the skipped due.
    assert len(world.instance.get_runs()) == 3


@pytest.mark.parametrize("world", ["replace_task"], indirect=True)
def test_replace_ends_the_running_run_and_fences_its_side_effects(world: World) -> None:
    old_run = world.due(0)
    old = world.start(old_run)
    world.wait_claimed(1)
    replaced = world.ledger.in_progress("replace_task")[0]
    new_run = world.ui_launch()
    new = world.start(new_run)
    world.wait_claimed(2)
    after = world.ledger.get(replaced.id)
    assert after is not None and after.status == Status.FAILED
    assert after.failure_kind == FailureKind.REPLACED
    newer = world.entry_of(new_run)
    assert f"replaced by entry {newer.id} (run {new_run})" in (after.error or "")
    assert world.outcome(old_run, finished=False)[1] == t.OUTCOME_REPLACED
    world.release()
    old.join(timeout=60)
    new.join(timeout=60)
    # The old run woke up after the new one claimed: its effect was refused by the fence.
    assert world.effects() == [newer.id]
    assert world.ledger.get(newer.id).status == Status.SUCCESS  # type: ignore[union-attr]
    rejections = (world.ledger.get(replaced.id) or after).summary["late_job_rejections"]
    assert any(r["action"] == "side_effect" for r in rejections)


@pytest.mark.parametrize("world", ["allow_task"], indirect=True)
def test_allow_runs_two_runs_of_a_concurrent_safe_task_at_once(world: World) -> None:
    first = world.start(world.due(0))
    second = world.start(world.due(1))
    world.wait_claimed(2)  # both hold their entries at the same time
    assert len(world.ledger.in_progress("allow_task")) == 2
    world.release()
    first.join(timeout=60)
    second.join(timeout=60)
    assert len(world.effects()) == 2


def _due_key(slots: int) -> str:
    return f"due:{(DUE + slots * SLOT).strftime('%Y-%m-%dT%H:%M:%SZ')}"


def _until(probe: Any, timeout: float = 60.0) -> None:
    deadline = datetime.now(UTC) + timedelta(seconds=timeout)
    while not probe():
        assert datetime.now(UTC) < deadline, "timed out"


def _spec(key: str) -> Any:
    # Imported here: the fixture module is loaded by the daemon's workspace by path.
    import importlib.util

    spec = importlib.util.spec_from_file_location("policy_defs_specs", POLICY_DEFS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {s.key: s for s in (module.SKIP, module.BUFFER, module.REPLACE, module.ALLOW)}[key]


def _never(job: str, run_id: str, tags: Any) -> None:
    raise AssertionError("a refused launch submits nothing")
