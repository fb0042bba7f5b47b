"""The one launch path (orchestration/services/launch.py): run ids and the error mapping.

The Dagster command lines themselves run for real in test_cli.py, test_cli_runs.py and
test_ui_reexecution.py; here ``subprocess.run`` is replaced to reach every way a launch
can fail without a broken Dagster.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from orchestration.declarations import registered_tasks
from orchestration.manual_launch import launch_manual
from orchestration.services import launch
from orchestration.services.hooks.registry import Hooks
from orchestration.services.launch import (
    LAUNCH_TIMEOUT_SECONDS,
    STDIN_DRIVER,
    DagsterCliLauncher,
    LaunchFailed,
    manual_run_id,
    reexecute_run,
    retry_run_id,
    run_id_from_reexecution,
    submit_run,
)
from resources.core import tags as t
from resources.core.arguments import MAX_REASON_CHARS
from resources.core.entry import FailureKind, Status
from resources.ledger import RunLedger

FakeRun = Callable[..., subprocess.CompletedProcess[str]]


def test_run_ids_are_the_ones_earlier_releases_derived() -> None:
    # Pins the uuid5 namespaces: a changed run id would let a repeated request run twice.
    assert manual_run_id("order_cleanup", "r1") == "9d90c556-a415-5b1a-b577-0b5140c08461"
    assert retry_run_id(42) == "f32319a1-ea66-500d-899f-5f559f41d36f"


@dataclass
class Call:
    """One Dagster command line as `subprocess.run` was given it."""

    cmd: list[str]
    #: What the command read on stdin: the console script's name, then its arguments.
    script: str
    args: list[str]


def _replace_run(monkeypatch: pytest.MonkeyPatch, fake: FakeRun) -> list[Call]:
    calls: list[Call] = []

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        script, *args = json.loads(kwargs["input"])
        calls.append(Call(cmd, script, args))
        assert kwargs["timeout"] == LAUNCH_TIMEOUT_SECONDS
        return fake(cmd, **kwargs)

    monkeypatch.setattr(launch.subprocess, "run", run)
    return calls


def test_a_new_run_is_submitted_with_dagster_job_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _replace_run(monkeypatch, lambda cmd, **_: subprocess.CompletedProcess(cmd, 0))
    tags = {"dueledger/task": "order_cleanup"}
    assert submit_run("order_cleanup_job", "run-1", tags) == "run-1"
    [call] = calls
    assert call.cmd == [sys.executable, "-c", STDIN_DRIVER]
    assert (call.script, call.args[:2]) == ("dagster", ["job", "launch"])
    args = call.args
    assert args[args.index("-j") + 1] == "order_cleanup_job"
    assert args[args.index("--run-id") + 1] == "run-1"
    assert json.loads(args[args.index("--tags") + 1]) == tags


def test_the_retry_launcher_uses_the_same_submit_and_its_workspace(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = _replace_run(monkeypatch, lambda cmd, **_: subprocess.CompletedProcess(cmd, 0))
    workspace = tmp_path / "workspace.yaml"
    launcher = DagsterCliLauncher(workspace)
    assert launcher.launch_new("order_cleanup_job", "run-2", {}) == "run-2"
    [call] = calls
    assert call.args[call.args.index("-w") + 1] == str(workspace)


def test_no_value_travels_on_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # A 40,000-character reason once failed the launch with "Argument list too long"; a
    # reason at the limit, or any text, still must not be in argv (the OS caps its length,
    # `ps` shows it to every user of the machine).
    calls = _replace_run(monkeypatch, lambda cmd, **_: subprocess.CompletedProcess(cmd, 0))
    reason = "é\x00" + "r" * (MAX_REASON_CHARS - 2)
    tags = {t.TAG_OPERATOR: "alice", t.TAG_REASON: reason}
    submit_run("order_cleanup_job", "run-1", tags)
    with pytest.raises(LaunchFailed, match="no readable result"):
        reexecute_run("parent-run", tags)
    assert [c.script for c in calls] == ["dagster", "dagster-graphql"]
    for call in calls:
        assert call.cmd == [sys.executable, "-c", STDIN_DRIVER]
        assert not any("alice" in arg or "rrrr" in arg for arg in call.cmd)
    launched = json.loads(calls[0].args[calls[0].args.index("--tags") + 1])
    assert launched[t.TAG_REASON] == reason
    variables = json.loads(calls[1].args[calls[1].args.index("-v") + 1])
    assert {"key": t.TAG_REASON, "value": reason} in variables["params"]["extraTags"]


@pytest.mark.parametrize(
    ("fake", "message"),
    [
        (
            lambda cmd, **_: subprocess.CompletedProcess(cmd, 2, "", "a\nb\nno such job\n"),
            r"^`dagster job launch` exited 2: a \| b \| no such job$",
        ),
        (
            lambda cmd, **_: subprocess.CompletedProcess(cmd, 1, "only stdout\n", ""),
            r"exited 1: only stdout$",
        ),
        (
            lambda cmd, **kw: (_ for _ in ()).throw(subprocess.TimeoutExpired(cmd, kw["timeout"])),
            rf"^`dagster job launch` did not finish within {LAUNCH_TIMEOUT_SECONDS}s$",
        ),
        (
            lambda cmd, **_: (_ for _ in ()).throw(FileNotFoundError("no python")),
            r"^`dagster job launch` could not be started: no python$",
        ),
        (
            lambda cmd, **_: subprocess.CompletedProcess(cmd, -9, "", ""),
            r"^`dagster job launch` was killed by signal 9$",
        ),
    ],
    ids=["non-zero exit", "stdout when stderr is empty", "timeout", "cannot start", "killed"],
)
def test_every_way_a_submit_fails_is_one_launch_failed(
    monkeypatch: pytest.MonkeyPatch, fake: FakeRun, message: str
) -> None:
    _replace_run(monkeypatch, fake)
    with pytest.raises(LaunchFailed, match=message):
        submit_run("order_cleanup_job", "run-1", {})


def test_a_re_execution_that_writes_no_result_is_a_launch_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _replace_run(monkeypatch, lambda cmd, **_: subprocess.CompletedProcess(cmd, 0))
    with pytest.raises(LaunchFailed, match="dagster-graphql gave no readable result"):
        reexecute_run("parent-run", {"dueledger/trigger": "manual_retry"})
    [call] = calls
    assert call.script == "dagster-graphql"
    variables = json.loads(call.args[call.args.index("-v") + 1])
    assert variables["params"]["parentRunId"] == "parent-run"
    assert variables["params"]["extraTags"] == [
        {"key": "dueledger/trigger", "value": "manual_retry"}
    ]


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"errors": [{"message": "bad query"}]}, "launchRunReexecution failed: bad query"),
        (
            {"data": {"launchRunReexecution": {"__typename": "PythonError", "message": "boom"}}},
            "returned PythonError: boom",
        ),
        ({"data": {}}, "returned nothing"),
    ],
)
def test_a_re_execution_dagster_refused_is_a_launch_failed(
    result: dict[str, Any], message: str
) -> None:
    with pytest.raises(LaunchFailed, match=message):
        run_id_from_reexecution(result)


def test_a_successful_re_execution_gives_its_run_id() -> None:
    payload = {"__typename": "LaunchRunSuccess", "run": {"runId": "new-run", "status": "QUEUED"}}
    assert run_id_from_reexecution({"data": {"launchRunReexecution": payload}}) == "new-run"


def test_a_manual_launch_that_times_out_leaves_its_entry_dispatch_failed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A timeout once escaped as subprocess.TimeoutExpired and was mapped by each caller.
    def hang(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    _replace_run(monkeypatch, hang)
    ledger = RunLedger(database_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    ledger.migrate()
    with dg.instance_for_test() as instance, pytest.raises(LaunchFailed, match="did not finish"):
        launch_manual(
            registered_tasks(),
            "order_cleanup",
            operator="ops",
            reason="x",
            request_id="r",
            instance=instance,
            ledger=ledger,
            hooks=Hooks.from_environment(),
        )
    entry = ledger.find("order_cleanup", "manual:r")
    assert entry is not None
    assert (entry.status, entry.failure_kind) == (Status.DISPATCH_FAILED, FailureKind.DISPATCH)
    assert entry.error is not None and "did not finish within" in entry.error
    ledger.dispose()


def test_launching_a_dispatch_failed_request_again_re_dispatches_it(tmp_path: Path) -> None:
    ledger = RunLedger(database_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    ledger.migrate()
    submitted: list[str] = []

    def down(job: str, run_id: str, tags: dict[str, str]) -> str:
        raise LaunchFailed("the run launcher is down")

    def up(job: str, run_id: str, tags: dict[str, str]) -> str:
        submitted.append(run_id)
        return run_id

    args: dict[str, Any] = {"operator": "ops", "reason": "x", "request_id": "r"}
    with dg.instance_for_test() as instance:
        with pytest.raises(LaunchFailed):
            launch_manual(
                registered_tasks(),
                "order_cleanup",
                instance=instance,
                ledger=ledger,
                hooks=Hooks.from_environment(),
                submit=down,
                **args,
            )
        [failed] = ledger.list_entries(limit=5)[0]
        assert failed.status == Status.DISPATCH_FAILED
        result = launch_manual(
            registered_tasks(),
            "order_cleanup",
            instance=instance,
            ledger=ledger,
            hooks=Hooks.from_environment(),
            submit=up,
            **args,
        )
    assert submitted == [manual_run_id("order_cleanup", "r")]
    assert result.entry_id == failed.id
    # It says so: the caller learns the request was re-dispatched, not launched anew.
    assert result.as_json()["redispatched"] is True and result.as_json()["existing"] is False
    entry = ledger.get(failed.id)
    assert entry is not None and entry.status == Status.QUEUED  # its run can claim it
    assert ledger.claim(entry.id, submitted[0], lease_ttl=timedelta(minutes=5)).claimed


def test_the_operator_and_reason_are_recorded_stripped(tmp_path: Path) -> None:
    ledger = RunLedger(database_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    ledger.migrate()
    tags: list[dict[str, str]] = []
    with dg.instance_for_test() as instance:
        result = launch_manual(
            registered_tasks(),
            "order_cleanup",
            operator="  alice ",
            reason=" checked \n",
            request_id="r",
            instance=instance,
            ledger=ledger,
            hooks=Hooks.from_environment(),
            submit=lambda job, run_id, given: tags.append(given) or run_id,
        )
    entry = ledger.get(result.entry_id)
    assert entry is not None and (entry.operator, entry.reason) == ("alice", "checked")
    assert (tags[0][t.TAG_OPERATOR], tags[0][t.TAG_REASON]) == ("alice", "checked")
