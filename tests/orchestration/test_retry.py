"""Manual retry rules on real SQLite and PostgreSQL ledgers.

Each rule is shown allowing and refusing; a refusal changes nothing but the audit. The
launch is tested with a recording launcher (the Dagster CLIs are exercised for real in
test_cli_runs.py and test_ui_reexecution.py).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from orchestration.reclaim import reclaim_expired
from orchestration.retry import (
    CHECK_ACKNOWLEDGED,
    CHECK_MANUAL_TRIGGER,
    CHECK_NOT_RETRIED,
    CHECK_REGISTERED,
    CHECK_ROLE_ADMIN,
    CHECK_ROLE_RETRIER,
    CHECK_STATUS,
    LAUNCH_NEW_RUN,
    LAUNCH_REEXECUTION,
    RetryResult,
    record_retry,
    retry_backoff_wait,
    retry_entry,
)
from orchestration.services.launch import LaunchFailed, retry_run_id
from orchestration.task_spec import TaskSpec
from orchestration.timetable import EverySlots
from resources.core import tags as t
from resources.core.entry import (
    Entry,
    FailureKind,
    Status,
    Trigger,
    dedup_key_for_due,
    dedup_key_for_request,
)
from resources.core.errors import InvalidInput, Refused
from resources.core.operators import Operators, load_operators, parse_operators
from resources.core.settings import PROJECT_ROOT
from resources.ledger import RunLedger

# --- named instants ----------------------------------------------------------------------------
DUE = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
RAN = DUE + timedelta(seconds=2)
TTL = timedelta(minutes=5)
LEASE_LONG_EXPIRED = RAN + TTL + timedelta(minutes=30)
NEXT_MORNING = DUE + timedelta(hours=10)

TASK = "order_cleanup"
LOCKED = "locked_task"
SPECS = (
    TaskSpec(key=TASK, rule=EverySlots(1), declared_cadence="every slot", max_attempts=2),
    TaskSpec(
        key=LOCKED,
        rule=EverySlots(1),
        declared_cadence="every slot",
        manual_trigger=False,
    ),
)
LOCAL = load_operators(None)
TEAM = parse_operators(
    '[operators]\nalice = ["admin"]\nbob = ["retrier"]\ncarol = ["viewer"]\n', "team.toml"
)


# --- parents in every state, through the public API only ------------------------------------


def _entry(ledger: RunLedger, task: str = TASK, due: datetime = DUE) -> Entry:
    return ledger.ensure_entry(
        task_key=task,
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(due),
        max_attempts=1,
        now=due,
    )


def _get(ledger: RunLedger, entry: Entry) -> Entry:
    found = ledger.get(entry.id)
    assert found is not None
    return found


def queued(ledger: RunLedger, task: str = TASK) -> Entry:
    return _entry(ledger, task)


def running(ledger: RunLedger, task: str = TASK) -> Entry:
    entry = _entry(ledger, task)
    assert ledger.claim(entry.id, "run-1", lease_ttl=TTL, now=RAN).claimed
    return _get(ledger, entry)


def retrying(ledger: RunLedger, task: str = TASK) -> Entry:
    entry = ledger.ensure_entry(
        task_key=task, trigger=Trigger.SCHEDULE, dedup_key=dedup_key_for_due(DUE), now=DUE
    )
    assert ledger.claim(entry.id, "run-1", lease_ttl=TTL, now=RAN).claimed
    ledger.fail(entry.id, "run-1", error="boom", now=RAN)
    return _get(ledger, entry)


def succeeded(ledger: RunLedger, task: str = TASK) -> Entry:
    entry = running(ledger, task)
    assert ledger.succeed(entry.id, "run-1", now=RAN)
    return _get(ledger, entry)


def failed(ledger: RunLedger, task: str = TASK) -> Entry:
    entry = running(ledger, task)
    ledger.fail(entry.id, "run-1", error="upstream file missing", now=RAN)
    return _get(ledger, entry)


def reclaimed(ledger: RunLedger, task: str = TASK) -> Entry:
    entry = running(ledger, task)
    assert reclaim_expired(ledger, now=LEASE_LONG_EXPIRED)
    return _get(ledger, entry)


def dispatch_failed(ledger: RunLedger, task: str = TASK) -> Entry:
    entry = _entry(ledger, task)
    ledger.record_dispatch_failure(entry.id, error="launcher down", now=RAN)
    return _get(ledger, entry)


def already_retried(ledger: RunLedger, task: str = TASK) -> Entry:
    entry = failed(ledger, task)
    record_retry(ledger, entry.id, specs=SPECS, operator="dora", reason="first", operators=LOCAL)
    return _get(ledger, entry)


def state(entry: Entry) -> tuple[Any, ...]:
    """Everything a refused retry must leave as it was."""
    return (
        entry.status,
        entry.attempt,
        entry.failure_kind,
        entry.error,
        entry.run_ids,
        entry.manual_retry_at,
        entry.manual_retry_by,
        entry.updated_at,
    )


def retry(
    ledger: RunLedger,
    parent: Entry,
    *,
    operator: str = "alice",
    operators: Operators = LOCAL,
    ack: bool = False,
    specs: tuple[TaskSpec, ...] = SPECS,
) -> Any:
    return record_retry(
        ledger,
        parent.id,
        specs=specs,
        operator=operator,
        reason="upstream fixed at 07:10",
        operators=operators,
        acknowledge_side_effects=ack,
        now=NEXT_MORNING,
    )


# --- allowed ---------------------------------------------------------------------------------


def test_a_failed_entry_gets_one_child_a_stamp_and_an_audit_record(ledger: RunLedger) -> None:
    parent = failed(ledger)
    record = retry(ledger, parent)

    child = record.child
    assert (child.trigger, child.origin, child.dedup_key) == (
        Trigger.MANUAL_RETRY,
        "retry",
        f"retry:{parent.id}",
    )
    assert (child.parent_id, child.status, child.due) == (parent.id, Status.QUEUED, DUE)
    assert (child.operator, child.reason) == ("alice", "upstream fixed at 07:10")
    assert child.max_attempts == 2  # from the registry as it is now, not the parent's 1

    after = _get(ledger, parent)
    # The parent keeps its status and error, and says who retried it and when.
    assert (after.status, after.failure_kind, after.error) == (
        Status.FAILED,
        "error",
        "upstream file missing",
    )
    assert (after.manual_retry_by, after.manual_retry_at) == ("alice", NEXT_MORNING)
    assert ledger.children(parent.id) == [child]

    [audit] = ledger.audit_for(parent.id)
    assert audit["id"] == record.audit_id
    assert (audit["operator"], audit["action"], audit["reason"]) == (
        "alice",
        "manual_retry",
        "upstream fixed at 07:10",
    )
    assert (audit["entry_id"], audit["child_entry_id"]) == (parent.id, child.id)
    assert audit["outcome"] == f"allowed: created child entry {child.id}"
    assert [c["check"] for c in audit["checks"]] == [
        CHECK_ROLE_RETRIER,
        CHECK_STATUS,
        CHECK_NOT_RETRIED,
        CHECK_ACKNOWLEDGED,
        CHECK_REGISTERED,
        CHECK_MANUAL_TRIGGER,
    ]
    assert all(c["passed"] for c in audit["checks"])
    assert ledger.audit_for(child.id) == [audit]


@pytest.mark.parametrize("make", [reclaimed, dispatch_failed], ids=["lease_reclaimed", "dispatch"])
def test_side_effect_parents_are_retried_when_an_admin_acknowledges(
    ledger: RunLedger, make: Callable[[RunLedger], Entry]
) -> None:
    parent = make(ledger)
    record = retry(ledger, parent, operator="alice", operators=TEAM, ack=True)
    checks = {c.name: c.passed for c in record.checks}
    assert checks[CHECK_ACKNOWLEDGED] and checks[CHECK_ROLE_ADMIN]
    after = _get(ledger, parent)
    assert after.status == parent.status and after.manual_retry_by == "alice"
    # A retried dispatch_failed entry can no longer be re-dispatched: its child runs instead.
    assert not ledger.redispatch(parent.id)


def test_a_retrier_may_retry_an_ordinary_failure(ledger: RunLedger) -> None:
    record = retry(ledger, failed(ledger), operator="bob", operators=TEAM)
    assert record.child.operator == "bob"


def test_a_failed_child_can_itself_be_retried_once(ledger: RunLedger) -> None:
    parent = failed(ledger)
    child = retry(ledger, parent).child
    assert ledger.claim(child.id, "run-2", lease_ttl=TTL).claimed
    for _ in range(child.max_attempts):
        ledger.fail(child.id, "run-2", error="still broken")
        ledger.claim(child.id, "run-2", lease_ttl=TTL)
    assert _get(ledger, child).status == Status.FAILED
    grandchild = retry(ledger, _get(ledger, child)).child
    assert grandchild.parent_id == child.id and grandchild.dedup_key == f"retry:{child.id}"


# --- refused ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    make: Callable[..., Entry]
    rule: str
    operator: str = "alice"
    operators: Operators = LOCAL
    ack: bool = False
    task: str = TASK
    specs: tuple[TaskSpec, ...] = SPECS
    extra: dict[str, Any] = field(default_factory=dict)


REFUSALS = {
    "queued": Refusal(queued, CHECK_STATUS),
    "running": Refusal(running, CHECK_STATUS),
    "retrying": Refusal(retrying, CHECK_STATUS),
    "success": Refusal(succeeded, CHECK_STATUS),
    "success even acknowledged": Refusal(succeeded, CHECK_STATUS, ack=True),
    "second retry": Refusal(already_retried, CHECK_NOT_RETRIED),
    "lease_reclaimed unacknowledged": Refusal(reclaimed, CHECK_ACKNOWLEDGED),
    "dispatch_failed unacknowledged": Refusal(dispatch_failed, CHECK_ACKNOWLEDGED),
    "acknowledged by a retrier": Refusal(
        reclaimed, CHECK_ROLE_ADMIN, operator="bob", operators=TEAM, ack=True
    ),
    "task no longer registered": Refusal(failed, CHECK_REGISTERED, task="retired_task"),
    "task not manually triggerable": Refusal(failed, CHECK_MANUAL_TRIGGER, task=LOCKED),
    "task made non-manual since": Refusal(
        failed,
        CHECK_MANUAL_TRIGGER,
        specs=(
            TaskSpec(
                key=TASK,
                rule=EverySlots(1),
                declared_cadence="every slot",
                manual_trigger=False,
            ),
        ),
    ),
    "unknown operator": Refusal(failed, CHECK_ROLE_RETRIER, operator="mallory", operators=TEAM),
    "viewer": Refusal(failed, CHECK_ROLE_RETRIER, operator="carol", operators=TEAM),
}


@pytest.mark.parametrize("case", REFUSALS.values(), ids=REFUSALS.keys())
def test_every_refusal_names_its_rule_changes_nothing_and_is_audited(
    ledger: RunLedger, case: Refusal
) -> None:
    parent = case.make(ledger, case.task)
    audit_before = ledger.audit_for(parent.id)
    children_before = ledger.children(parent.id)

    with pytest.raises(Refused, match=f"refused by rule {case.rule}: .*Nothing was changed"):
        retry(
            ledger,
            parent,
            operator=case.operator,
            operators=case.operators,
            ack=case.ack,
            specs=case.specs,
        )

    assert state(_get(ledger, parent)) == state(parent)
    assert ledger.children(parent.id) == children_before
    new = ledger.audit_for(parent.id)[len(audit_before) :]
    assert len(new) == 1
    assert new[0]["outcome"].startswith(f"refused: {case.rule}: ")
    assert (new[0]["operator"], new[0]["child_entry_id"]) == (case.operator, None)
    refusing = [c for c in new[0]["checks"] if not c["passed"]]
    assert refusing[0]["check"] == case.rule
    # A success is not retried; the refusal says how to run the task again instead.
    advice = "use Materialize on its asset in the Catalog or the launchpad of its job"
    assert (advice in new[0]["outcome"]) is (parent.status == Status.SUCCESS)


def test_an_unknown_entry_is_invalid_input_and_audited(ledger: RunLedger) -> None:
    with pytest.raises(InvalidInput, match="ledger entry 424242 does not exist"):
        record_retry(ledger, 424242, specs=SPECS, operator="alice", reason="typo?", operators=LOCAL)
    [audit] = ledger.audit_for(424242)
    assert audit["outcome"] == "invalid: ledger entry 424242 does not exist"


# --- two retries at once: exactly one child ----------------------------------------------------

SPAWN = multiprocessing.get_context("spawn")
RACERS = 4


def _racing_retry(url: str, parent_id: int, operator: str, barrier: Any, results: Any) -> None:
    ledger = RunLedger(database_url=url)
    ledger.get(parent_id)  # connect before the barrier: race on the retry, not on start-up
    barrier.wait()
    try:
        record = record_retry(
            ledger,
            parent_id,
            specs=SPECS,
            operator=operator,
            reason="race",
            operators=load_operators(None),
        )
        results.put(("created", record.child.id))
    except Refused as exc:
        results.put(("refused", str(exc)))
    except Exception as exc:  # surfaced by the assertion below
        results.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        ledger.dispose()


def test_concurrent_retries_of_one_parent_leave_exactly_one_child(
    ledger: RunLedger, ledger_url: str
) -> None:
    parent = failed(ledger)
    barrier, results = SPAWN.Barrier(RACERS), SPAWN.Queue()
    procs = [
        SPAWN.Process(
            target=_racing_retry, args=(ledger_url, parent.id, f"op{i}", barrier, results)
        )
        for i in range(RACERS)
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)

    kinds = sorted(kind for kind, _ in outcomes)
    assert kinds == ["created"] + ["refused"] * (RACERS - 1), outcomes
    assert all(CHECK_NOT_RETRIED in msg for kind, msg in outcomes if kind == "refused")
    [child] = ledger.children(parent.id)
    winner = _get(ledger, parent).manual_retry_by
    assert child.operator == winner
    audit = ledger.audit_for(parent.id)
    assert sorted(a["outcome"].split(":")[0] for a in audit) == ["allowed"] + ["refused"] * (
        RACERS - 1
    )


def test_parallel_cli_processes_on_postgresql_make_one_child(
    postgres_url: str, tmp_path: Path
) -> None:
    """End to end: `dueledger runs retry` as separate OS processes racing on PostgreSQL."""
    ledger = RunLedger(database_url=postgres_url)
    ledger.migrate()
    parent = failed(ledger)
    home = tmp_path / "dagster_home"  # the winner really launches a run: keep it here
    home.mkdir()
    # An existing instance, as in any deployment: Dagster's own first-use storage set-up
    # is not safe against processes racing on a fresh SQLite DAGSTER_HOME.
    shutil.copyfile(PROJECT_ROOT / "dagster.yaml.local", home / "dagster.yaml")
    dg.DagsterInstance.from_config(str(home)).dispose()
    env = {**os.environ, "DUELEDGER_DATABASE_URL": postgres_url, "DAGSTER_HOME": str(home)}
    env.pop("DUELEDGER_OPERATORS", None)
    cmd = [sys.executable, "-m", "orchestration.cli", "runs", "retry", str(parent.id)]
    procs = [
        subprocess.Popen(
            [*cmd, "--operator", f"op{i}", "--reason", "race", "--json"],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    done = [(p.wait(timeout=240), p.stdout.read() if p.stdout else "") for p in procs]
    codes = sorted(code for code, _ in done)
    assert codes == [0, 3, 3], done
    winner = json.loads(next(out for code, out in done if code == 0))
    [child] = ledger.children(parent.id)
    assert winner["entry_id"] == child.id and winner["launch"] == LAUNCH_NEW_RUN
    for code, out in done:
        if code == 3:
            assert CHECK_NOT_RETRIED in json.loads(out)["error"]
    ledger.dispose()


# --- launching the retry's run -----------------------------------------------------------------


class RecordingLauncher:
    """Stands in for Dagster's CLIs (an external channel): records what would be launched."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[tuple[str, str, dict[str, str]]] = []
        self.fail = fail

    def reexecute(self, parent_run_id: str, extra_tags: Mapping[str, str]) -> str:
        self.calls.append(("reexecute", parent_run_id, dict(extra_tags)))
        if self.fail:
            raise LaunchFailed(self.fail)
        return "reexecuted-run"

    def launch_new(self, job_name: str, run_id: str, tags: Mapping[str, str]) -> str:
        self.calls.append(("launch_new", job_name, {"run_id": run_id, **tags}))
        if self.fail:
            raise LaunchFailed(self.fail)
        return run_id


@dg.asset
def probe() -> int:
    return 1


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def _failed_with_run(ledger: RunLedger, run_id: str) -> Entry:
    entry = _entry(ledger)
    assert ledger.claim(entry.id, run_id, lease_ttl=TTL, now=RAN).claimed
    ledger.fail(entry.id, run_id, error="boom", now=RAN)
    return _get(ledger, entry)


def test_the_retry_re_executes_the_parents_last_run_with_dueledger_tags(
    ledger: RunLedger, instance: dg.DagsterInstance
) -> None:
    run_id = dg.materialize([probe], instance=instance).run_id
    parent = _failed_with_run(ledger, run_id)
    launcher = RecordingLauncher()
    result = retry_entry(
        ledger,
        parent.id,
        specs=SPECS,
        operator="alice",
        reason="upstream fixed",
        operators=LOCAL,
        acknowledge_side_effects=False,
        instance=instance,
        launcher=launcher,
    )
    [(kind, parent_run, tags)] = launcher.calls
    assert (kind, parent_run) == ("reexecute", run_id)
    assert tags == {
        t.TAG_TASK: TASK,
        t.TAG_TRIGGER: Trigger.MANUAL_RETRY.value,
        t.TAG_PARENT_ENTRY: str(parent.id),
        t.TAG_OPERATOR: "alice",
        t.TAG_REASON: "upstream fixed",
        t.TAG_DUE: "2026-11-30T22:45:00Z",
        t.DAGSTER_MAX_RETRIES: "1",
        t.DAGSTER_MAX_RUNTIME: "600",
    }
    out = result.as_json()
    assert (out["entry_id"], out["run_id"], out["launch"]) == (
        result.record.child.id,
        "reexecuted-run",
        LAUNCH_REEXECUTION,
    )
    assert (out["parent_run_id"], out["root_run_id"]) == (run_id, run_id)
    launch_audit = ledger.audit_for(parent.id)[-1]
    assert launch_audit["action"] == "manual_retry_launch"
    assert launch_audit["outcome"].startswith(
        f"launched: run reexecuted-run (re-execution of run {run_id})"
    )


def test_without_a_dagster_run_to_re_execute_a_new_linked_run_is_launched(
    ledger: RunLedger, instance: dg.DagsterInstance
) -> None:
    parent = _failed_with_run(ledger, "run-deleted-from-dagster")
    launcher = RecordingLauncher()
    result = retry_entry(
        ledger,
        parent.id,
        specs=SPECS,
        operator="alice",
        reason="again",
        operators=LOCAL,
        acknowledge_side_effects=False,
        instance=instance,
        launcher=launcher,
    )
    [(kind, job, tags)] = launcher.calls
    assert (kind, job) == ("launch_new", f"{TASK}_job")
    assert tags["run_id"] == retry_run_id(result.record.child.id)
    assert (
        tags[t.DAGSTER_PARENT_RUN_ID] == tags[t.DAGSTER_ROOT_RUN_ID] == "run-deleted-from-dagster"
    )
    assert tags[t.TAG_TRIGGER] == Trigger.MANUAL_RETRY
    assert result.method == LAUNCH_NEW_RUN


def test_a_dispatch_failed_parent_without_runs_gets_an_unlinked_new_run(
    ledger: RunLedger, instance: dg.DagsterInstance
) -> None:
    parent = dispatch_failed(ledger)
    launcher = RecordingLauncher()
    retry_entry(
        ledger,
        parent.id,
        specs=SPECS,
        operator="alice",
        reason="launcher is back",
        operators=LOCAL,
        acknowledge_side_effects=True,
        instance=instance,
        launcher=launcher,
    )
    [(_, _, tags)] = launcher.calls
    assert t.DAGSTER_PARENT_RUN_ID not in tags and t.DAGSTER_ROOT_RUN_ID not in tags


def retry_by(
    ledger: RunLedger,
    parent: Entry,
    instance: dg.DagsterInstance,
    launcher: RecordingLauncher,
    *,
    operator: str = "alice",
    reason: str = "again",
    operators: Operators = LOCAL,
) -> RetryResult:
    """`dueledger runs retry PARENT` as the CLI calls it (no acknowledgement)."""
    return retry_entry(
        ledger,
        parent.id,
        specs=SPECS,
        operator=operator,
        reason=reason,
        operators=operators,
        acknowledge_side_effects=False,
        instance=instance,
        launcher=launcher,
    )


def test_a_failed_launch_leaves_the_child_dispatch_failed_and_says_what_next(
    ledger: RunLedger, instance: dg.DagsterInstance
) -> None:
    parent = failed(ledger)
    with pytest.raises(LaunchFailed, match=rf"repeat `dueledger runs retry {parent.id}`"):
        retry_by(ledger, parent, instance, RecordingLauncher(fail="code server unreachable"))
    [child] = ledger.children(parent.id)
    assert (child.status, child.failure_kind) == (Status.DISPATCH_FAILED, FailureKind.DISPATCH)
    assert [a["outcome"].split(":")[0] for a in ledger.audit_for(parent.id)] == [
        "allowed",
        "dispatch_failed",
    ]
    # Retrying the child itself is possible too, acknowledging side effects (an admin's call).
    grandchild = retry(ledger, child, ack=True)
    assert grandchild.child.parent_id == child.id


def test_repeating_a_retry_whose_launch_failed_re_dispatches_the_same_child(
    ledger: RunLedger, instance: dg.DagsterInstance
) -> None:
    # Regression: the retry's child was left dispatch_failed and `runs retry PARENT` was
    # refused as "already retried": the way out was an admin retrying the child.
    parent = failed(ledger)
    with pytest.raises(LaunchFailed):
        retry_by(ledger, parent, instance, RecordingLauncher(fail="code server unreachable"))
    [child] = ledger.children(parent.id)
    again = "the code server is back"
    # Another failed launch keeps it dispatch_failed, with both errors.
    with pytest.raises(LaunchFailed):
        retry_by(ledger, parent, instance, RecordingLauncher(fail="still unreachable"))
    launcher = RecordingLauncher()
    result = retry_by(ledger, parent, instance, launcher, operator="bob", reason=again)

    assert result.redispatched and result.as_json()["redispatched"] is True
    assert result.record.child.id == child.id
    assert ledger.children(parent.id) == [ledger.get(child.id)]
    after = ledger.get(child.id)
    assert after is not None and (after.status, after.attempt) == (Status.QUEUED, 0)
    errors = [f["error"] for f in after.summary["dispatch_failures"]]
    assert len(errors) == 2 and "still unreachable" in errors[-1]
    # The run carries the retry as recorded (alice's), the audit names who re-dispatched.
    ((_, _, tags),) = launcher.calls
    assert (tags[t.TAG_OPERATOR], tags[t.TAG_PARENT_ENTRY]) == ("alice", str(parent.id))
    redispatches = [
        a for a in ledger.audit_for(parent.id) if a["action"] == "manual_retry_redispatch"
    ]
    assert [(a["operator"], a["outcome"].split(":")[0]) for a in redispatches] == [
        ("alice", "allowed"),
        ("bob", "allowed"),
    ]
    # Once launched, the child is no longer dispatch_failed: a retry is refused as usual.
    with pytest.raises(Refused, match="already retried"):
        retry_by(ledger, parent, instance, RecordingLauncher())


def test_re_dispatching_a_retry_child_still_needs_the_retrier_role(
    ledger: RunLedger, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    parent = failed(ledger)
    with pytest.raises(LaunchFailed):
        retry_by(ledger, parent, instance, RecordingLauncher(fail="down"))
    allow_list = tmp_path / "operators.toml"
    allow_list.write_text('[operators]\nvera = ["viewer"]\n')
    launcher = RecordingLauncher()
    with pytest.raises(Refused, match="retrier"):
        retry_by(
            ledger,
            parent,
            instance,
            launcher,
            operator="vera",
            operators=load_operators(str(allow_list)),
        )
    assert launcher.calls == []
    [child] = ledger.children(parent.id)
    assert child.status == Status.DISPATCH_FAILED


def test_a_manual_parent_has_no_due_tag(ledger: RunLedger, instance: dg.DagsterInstance) -> None:
    entry = ledger.ensure_entry(
        task_key=TASK,
        trigger=Trigger.MANUAL,
        dedup_key=dedup_key_for_request("req-1"),
        max_attempts=1,
    )
    assert ledger.claim(entry.id, "run-m", lease_ttl=TTL).claimed
    ledger.fail(entry.id, "run-m", error="boom")
    launcher = RecordingLauncher()
    result = retry_entry(
        ledger,
        entry.id,
        specs=SPECS,
        operator="alice",
        reason="again",
        operators=LOCAL,
        acknowledge_side_effects=False,
        instance=instance,
        launcher=launcher,
    )
    assert result.record.child.due is None
    assert t.TAG_DUE not in launcher.calls[0][2]


def test_the_local_default_is_recorded_in_the_checks(ledger: RunLedger) -> None:
    local = load_operators(None)
    record = retry(ledger, failed(ledger), operator="anyone", operators=local)
    assert record.checks[0].detail == "single local operator (DUELEDGER_OPERATORS not set)"


# --- retry backoff: Dagster's retry run waits at its claim -------------------------------------

BACKOFF_SPEC = TaskSpec(
    key=TASK,
    rule=EverySlots(1),
    declared_cadence="every slot",
    max_attempts=3,
    retry_backoff=timedelta(seconds=60),
)
DAGSTER_RETRY = {t.DAGSTER_RETRY_NUMBER: "1"}


def _failed_attempts(ledger: RunLedger, attempts: int, failed_at: datetime):
    entry = ledger.ensure_entry(
        task_key=TASK,
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(DUE),
        max_attempts=3,
        now=DUE,
    )
    for n in range(1, attempts + 1):
        assert ledger.claim(entry.id, f"run-{n}", lease_ttl=TTL, now=failed_at).claimed
        ledger.fail(entry.id, f"run-{n}", error="boom", retry_coming=True, now=failed_at)
    after = ledger.get(entry.id)
    assert after is not None and after.status == Status.RETRYING and after.attempt == attempts
    return after


@pytest.mark.parametrize(
    ("attempts", "waited", "waits"),
    [
        pytest.param(1, 59, True, id="attempt 2 within 60 s of attempt 1's failure"),
        pytest.param(1, 60, False, id="attempt 2 at 60 s"),
        pytest.param(2, 119, True, id="attempt 3 within 120 s: the wait doubles"),
        pytest.param(2, 120, False, id="attempt 3 at 120 s"),
    ],
)
def test_dagsters_retry_waits_the_backoff_doubling_per_attempt(ledger, attempts, waited, waits):
    entry = _failed_attempts(ledger, attempts, RAN)
    said = retry_backoff_wait(BACKOFF_SPEC, entry, DAGSTER_RETRY, RAN + timedelta(seconds=waited))
    assert (said is not None) is waits
    if waits:
        wait = 60 * 2 ** (attempts - 1)
        assert said is not None and f"attempt {attempts + 1}/3 starts at" in said
        assert f"{wait} s after attempt {attempts} failed" in said


def test_no_wait_for_a_manual_run_a_task_without_backoff_or_an_entry_not_retrying(ledger):
    entry = _failed_attempts(ledger, 1, RAN)
    soon = RAN + timedelta(seconds=1)
    # A UI re-execution or a launch carries no dagster/retry_number: a person asked for now.
    assert retry_backoff_wait(BACKOFF_SPEC, entry, {}, soon) is None
    none = dataclasses.replace(BACKOFF_SPEC, retry_backoff=timedelta(0))
    assert retry_backoff_wait(none, entry, DAGSTER_RETRY, soon) is None
    failed = dataclasses.replace(entry, status=Status.FAILED)
    assert retry_backoff_wait(BACKOFF_SPEC, failed, DAGSTER_RETRY, soon) is None


@pytest.mark.parametrize(
    "value",
    [timedelta(seconds=-1), timedelta(hours=1, seconds=1), None, 60],
    ids=["negative", "over an hour", "null", "a bare number"],
)
def test_a_bad_retry_backoff_is_refused_naming_the_field(value):
    from orchestration.task_spec import TaskSpecError, validate_spec

    bad = dataclasses.replace(BACKOFF_SPEC, retry_backoff=value)
    with pytest.raises(TaskSpecError, match=r"retry_backoff: must be a duration in \[0, 1:00:00\]"):
        validate_spec(bad, 15)


def test_a_declaration_writes_retry_backoff_as_a_duration_and_it_is_in_the_jobs_metadata():
    from orchestration.declarations import spec_from_attributes
    from orchestration.task_spec import build_views

    spec, _ = spec_from_attributes(
        {"key": TASK, "rule": {"every_slots": 1}, "declared_cadence": "slot", "retry_backoff": "2m"}
    )
    assert spec.retry_backoff == timedelta(minutes=2)
    (view,) = build_views([spec], 15, "UTC")
    assert view.as_json()["retry_backoff_seconds"] == 120
    default, _ = spec_from_attributes(
        {"key": TASK, "rule": {"every_slots": 1}, "declared_cadence": "slot"}
    )
    assert default.retry_backoff == timedelta(seconds=60)
