"""The one launch path of dueledger's own runs: `dueledger launch` and `dueledger runs retry`.

Both put a run on the Dagster instance through Dagster's public command lines against
``workspace.yaml``, so no webserver is needed and the run is queued on the instance's run
coordinator, not waited for:

- a **new run** of a job with a given run id and tags (`submit_run`): ``dagster job launch``;
- a **re-execution** of an existing run (`reexecute_run`): ``dagster-graphql`` runs the
  mutation the UI's "Re-execute" button sends, ``launchRunReexecution``, in-process
  (instance from DAGSTER_HOME, code from the workspace), so Dagster sets the lineage tags.

Neither command line carries a value: each runs as ``python -c`` with a small fixed
program (`STDIN_DRIVER`) that reads the command's arguments as JSON from stdin and calls
its console script. A run's tags (an operator's reason is up to 2,000 characters) and the
GraphQL variables so never meet the OS limit on the length of a command line, nor show in
``ps`` to other users of the machine.

Every way a launch can fail (the command cannot start, exits non-zero, is killed, outlives
``LAUNCH_TIMEOUT_SECONDS``, or answers with an error) becomes one `LaunchFailed` whose
message names the command and what it said. The run ids dueledger chooses itself are
derived here too, from uuid5 namespaces that must never change: a run id is how a second
launch of the same request finds the first one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from resources.core.settings import PROJECT_ROOT

#: How long one Dagster command line may take to put a run on the instance.
LAUNCH_TIMEOUT_SECONDS: Final = 300

#: Re-dispatches of one manual request looked for (its run ended before claiming, and the
#: request was launched again); past this, launch a new request.
MAX_MANUAL_REDISPATCHES: Final = 100

#: Namespace for run ids of manual launches (uuid5 of task key and request id).
_MANUAL_RUN_ID_NAMESPACE: Final = uuid.UUID("6f1c3c1e-6a8e-4c55-9f59-5a1d0e1f2a11")
#: Namespace for run ids of manual retries launched as a new run (uuid5 of the child entry).
_RETRY_RUN_ID_NAMESPACE: Final = uuid.UUID("0d3c7b4e-5a0f-4c7e-9d36-2b8f1f6e7a52")

#: ALL_STEPS: the retry is a new logical execution (a new ledger entry), so the task's job
#: runs whole; FROM_FAILURE would refuse a parent whose Dagster run itself succeeded (e.g.
#: a lease that was reclaimed while the run finished late).
REEXECUTION_STRATEGY: Final = "ALL_STEPS"

#: What ``python -c`` runs for each Dagster command line: read ``[script, *args]`` as JSON
#: from stdin and call that console script's entry point with them as its ``sys.argv``, as
#: the installed ``dagster`` / ``dagster-graphql`` executables do.
STDIN_DRIVER: Final = """\
import json, sys
from importlib.metadata import entry_points
script, *args = json.load(sys.stdin)
(entry_point,) = entry_points(group="console_scripts", name=script)
sys.argv = [script, *args]
sys.exit(entry_point.load()())
"""

#: The mutation the Dagster UI sends for "Re-execute"; run here by `dagster-graphql`.
REEXECUTE_MUTATION: Final = """
mutation DueledgerReexecute($params: ReexecutionParams!) {
  launchRunReexecution(reexecutionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on Error { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""


#: What `dueledger catch-up` submits: several new runs in one `dagster-graphql` process (the
#: mutation a client of the UI's API sends; run tags are ours, the job's are not applied).
LAUNCH_MANY_MUTATION: Final = """
mutation DueledgerLaunchMany($params: [ExecutionParams!]!) {
  launchMultipleRuns(executionParamsList: $params) {
    __typename
    ... on LaunchMultipleRunsResult {
      launchMultipleRunsResult {
        __typename
        ... on LaunchRunSuccess { run { runId } }
        ... on Error { message }
        ... on RunConfigValidationInvalid { errors { message } }
      }
    }
    ... on Error { message }
  }
}
"""
#: The code location `workspace.yaml` loads (its ``location_name``).
LOCATION_NAME: Final = "dueledger"


class LaunchFailed(RuntimeError):
    """Dagster did not accept the run; the caller marks its entry dispatch_failed."""


# --- run ids -----------------------------------------------------------------------------------


def manual_run_id(task_key: str, request_id: str, dispatch: int = 0) -> str:
    """The Dagster run id of a manual launch: the same request gives the same run.

    ``dispatch`` n > 0: the request's n-th re-dispatch, after its run ended before it
    claimed the entry (canceled in the queue, failed to start). Dagster keeps a run id
    forever, so each dispatch has its own, derived the same way by every process: a repeated
    or racing launch of the same dispatch finds one run.
    """
    name = f"{task_key}\x00{request_id}"
    if dispatch:
        name += f"\x00redispatch-{int(dispatch)}"
    return str(uuid.uuid5(_MANUAL_RUN_ID_NAMESPACE, name))


def retry_run_id(child_entry_id: int) -> str:
    """Run id of a retry launched as a new run (the same child gives the same run)."""
    return str(uuid.uuid5(_RETRY_RUN_ID_NAMESPACE, f"retry-child:{child_entry_id}"))


# --- the Dagster command lines -----------------------------------------------------------------


def _workspace(workspace: Path | None) -> Path:
    return workspace or PROJECT_ROOT / "workspace.yaml"


def dagster_command(script: str, args: list[str]) -> tuple[list[str], str]:
    """The command line and the stdin that run console script ``script`` with ``args``.

    The command line is fixed (this interpreter, ``-c``, `STDIN_DRIVER`); every argument
    travels on stdin as JSON, escaped to ASCII so any text (a NUL, a lone surrogate) arrives
    as it was given.
    """
    return [sys.executable, "-c", STDIN_DRIVER], json.dumps([script, *args])


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """What the launcher child runs before Dagster's command: on Linux, ask the kernel to
    SIGKILL it when the process that started it dies (``PR_SET_PDEATHSIG``), so a dueledger
    command killed halfway leaves no launcher submitting runs behind it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    # Looked up here, not in the child: between fork and exec the child only calls it.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1

    def arm() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # it died before the request was armed
            os._exit(1)

    return arm


def _run_dagster_cli(script: str, args: list[str], what: str) -> subprocess.CompletedProcess[str]:
    """Run Dagster's console script ``script`` with ``args`` on stdin; any way it fails
    raises LaunchFailed naming ``what``. The child dies with this process."""
    cmd, stdin = dagster_command(script, args)
    try:
        proc = subprocess.run(
            cmd,
            input=stdin,
            preexec_fn=_die_with_parent(os.getpid()),
            cwd=PROJECT_ROOT,
            env=dict(os.environ),
            capture_output=True,
            text=True,
            timeout=LAUNCH_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise LaunchFailed(f"{what} did not finish within {LAUNCH_TIMEOUT_SECONDS}s") from exc
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        raise LaunchFailed(f"{what} could not be started: {exc}") from exc
    if proc.returncode < 0:
        raise LaunchFailed(f"{what} was killed by signal {-proc.returncode}")
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise LaunchFailed(f"{what} exited {proc.returncode}: " + " | ".join(tail))
    return proc


def submit_run(
    job_name: str, run_id: str, tags: Mapping[str, str], *, workspace: Path | None = None
) -> str:
    """Submit run ``run_id`` of ``job_name`` with ``tags`` through `dagster job launch`:
    Dagster's public way to put a run on the instance's run coordinator (queued until the
    daemon dequeues it) without a webserver. Returns ``run_id``; raises LaunchFailed.
    """
    _run_dagster_cli(
        "dagster",
        [
            "job",
            "launch",
            "-w",
            str(_workspace(workspace)),
            "-j",
            job_name,
            "--run-id",
            run_id,
            "--tags",
            json.dumps(dict(tags)),
        ],
        "`dagster job launch`",
    )
    return run_id


def reexecution_variables(parent_run_id: str, extra_tags: Mapping[str, str]) -> dict[str, Any]:
    """Variables of REEXECUTE_MUTATION: the parent's tags, ours on top (Dagster's upsert)."""
    return {
        "params": {
            "parentRunId": parent_run_id,
            "strategy": REEXECUTION_STRATEGY,
            "extraTags": [{"key": k, "value": v} for k, v in extra_tags.items()],
            "useParentRunTags": True,
        }
    }


def run_id_from_reexecution(result: Mapping[str, Any]) -> str:
    """The run id from a ``launchRunReexecution`` response, or LaunchFailed saying why not."""
    if result.get("errors"):
        messages = "; ".join(str(e.get("message")) for e in result["errors"])
        raise LaunchFailed(f"launchRunReexecution failed: {messages}")
    payload = (result.get("data") or {}).get("launchRunReexecution") or {}
    if payload.get("__typename") == "LaunchRunSuccess":
        return str(payload["run"]["runId"])
    detail = payload.get("message") or "; ".join(
        str(e.get("message")) for e in payload.get("errors", [])
    )
    raise LaunchFailed(
        f"launchRunReexecution returned {payload.get('__typename', 'nothing')}: {detail}"
    )


def reexecute_run(
    parent_run_id: str, extra_tags: Mapping[str, str], *, workspace: Path | None = None
) -> str:
    """Launch a re-execution of ``parent_run_id`` with ``extra_tags`` over the parent's
    tags; return the new run's id. Raises LaunchFailed.
    """
    variables = reexecution_variables(parent_run_id, extra_tags)
    with tempfile.TemporaryDirectory(prefix="dueledger-retry-") as tmp:
        out = Path(tmp) / "result.json"
        _run_dagster_cli(
            "dagster-graphql",
            [
                "-w",
                str(_workspace(workspace)),
                "-t",
                REEXECUTE_MUTATION,
                "-v",
                json.dumps(variables),
                "-o",
                str(out),
            ],
            "dagster-graphql launchRunReexecution",
        )
        try:
            result = json.loads(out.read_text())
        except (OSError, ValueError) as exc:
            raise LaunchFailed(f"dagster-graphql gave no readable result: {exc}") from exc
    return run_id_from_reexecution(result)


def launch_runs(
    job_name: str, tag_sets: Sequence[Mapping[str, str]], *, workspace: Path | None = None
) -> list[str | LaunchFailed]:
    """Launch one run of ``job_name`` per tag set through one ``launchMultipleRuns``; returns,
    in order, each run's id or the LaunchFailed saying why it was not created. The command
    itself failing raises LaunchFailed (no run was created)."""
    selector = {
        "repositoryLocationName": LOCATION_NAME,
        "repositoryName": "__repository__",
        "jobName": job_name,
    }
    params = [
        {
            "selector": selector,
            "runConfigData": {},
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]},
        }
        for tags in tag_sets
    ]
    with tempfile.TemporaryDirectory(prefix="dueledger-launch-") as tmp:
        out = Path(tmp) / "result.json"
        _run_dagster_cli(
            "dagster-graphql",
            [
                "-w",
                str(_workspace(workspace)),
                "-t",
                LAUNCH_MANY_MUTATION,
                "-v",
                json.dumps({"params": params}),
                "-o",
                str(out),
            ],
            "dagster-graphql launchMultipleRuns",
        )
        try:
            result = json.loads(out.read_text())
        except (OSError, ValueError) as exc:
            raise LaunchFailed(f"dagster-graphql gave no readable result: {exc}") from exc
    payload = (result.get("data") or {}).get("launchMultipleRuns") or {}
    items = payload.get("launchMultipleRunsResult")
    if result.get("errors") or not isinstance(items, list) or len(items) != len(tag_sets):
        detail = payload.get("message") or result.get("errors") or payload
        raise LaunchFailed(f"launchMultipleRuns failed: {detail}")
    outcomes: list[str | LaunchFailed] = []
    for item in items:
        if item.get("__typename") == "LaunchRunSuccess":
            outcomes.append(str(item["run"]["runId"]))
        else:
            why = item.get("message") or "; ".join(
                str(e.get("message")) for e in item.get("errors", [])
            )
            outcomes.append(LaunchFailed(f"launchRun returned {item.get('__typename')}: {why}"))
    return outcomes


# --- the launcher a retry is given -------------------------------------------------------------


class Launcher(Protocol):
    """How a retry's Dagster run is started (tests pass a recording one)."""

    def reexecute(self, parent_run_id: str, extra_tags: Mapping[str, str]) -> str:
        """Launch a re-execution of ``parent_run_id``; return the new run's id."""
        ...

    def launch_new(self, job_name: str, run_id: str, tags: Mapping[str, str]) -> str:
        """Launch a new run ``run_id`` of ``job_name``; return its id."""
        ...


class DagsterCliLauncher:
    """The real `Launcher`: `reexecute_run` and `submit_run` against ``workspace``."""

    def __init__(self, workspace: Path | None = None) -> None:
        self.workspace = _workspace(workspace)

    def reexecute(self, parent_run_id: str, extra_tags: Mapping[str, str]) -> str:
        return reexecute_run(parent_run_id, extra_tags, workspace=self.workspace)

    def launch_new(self, job_name: str, run_id: str, tags: Mapping[str, str]) -> str:
        return submit_run(job_name, run_id, tags, workspace=self.workspace)
