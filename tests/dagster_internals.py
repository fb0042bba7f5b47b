# Why this module imports private Dagster APIs (``dagster._*``):
# tests must drive the REAL daemon code paths -- the scheduler tick loop
# (``dagster._scheduler.scheduler.launch_scheduled_runs``), sensor iterations
# (``dagster._daemon.sensor.execute_sensor_iteration``) and their debug crash points
# (TICK_CREATED / RUN_CREATED / RUN_LAUNCHED / TICK_SUCCESS) -- under a frozen clock.
# No public Dagster API does that (``build_schedule_context`` / ``evaluate_tick`` only run
# the user function; they skip ticks, run_key dedup and crash recovery).
# This is the ONLY module of the project allowed to import ``dagster._*``; it mirrors what
# Dagster's own dagster_tests/scheduler_tests/test_scheduler_failure_recovery.py does.
# Checked against dagster 1.13.27; private signatures change between releases.
# Import order matters: `import dagster._scheduler.scheduler` before `dagster._daemon` is
# loaded raises a circular ImportError in 1.13.27 (isort's order, _daemon first, is safe).
"""Drive Dagster's real scheduler and sensor daemon code in tests.

Typical use::

    target = CodeTarget.from_module("orchestration.definitions")
    with daemon_instance("mocked") as instance, daemon_workspace(instance, target) as ctx:
        run_scheduler_tick(ctx, due)  # one scheduler daemon iteration at frozen time `due`
        exit_code = run_scheduler_tick_in_subprocess(
            instance, target, due, debug_crash_flags=crash_flags("my_schedule", "RUN_CREATED")
        )  # same, in a spawned process that SIGKILLs itself at the crash point
        run_scheduler_tick(ctx, due)  # the daemon "coming back"
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import os
import signal
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.instance.ref import InstanceRef
from dagster._core.instance_for_test import instance_for_test
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.remote_representation.external import RemoteSchedule, RemoteSensor
from dagster._core.scheduler.instigation import InstigatorTick, TickStatus
from dagster._core.test_utils import (
    cleanup_test_instance,
    create_test_daemon_workspace_context,
    freeze_time,
)
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster._daemon.daemon import get_default_daemon_logger
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
    QueuedRunCoordinatorDaemon,
)
from dagster._daemon.sensor import execute_sensor_iteration
from dagster._scheduler.scheduler import ScheduleIterationTimes, launch_scheduled_runs
from dagster._utils.error import SerializableErrorInfo

__all__ = [
    "CodeTarget",
    "CrashPoint",
    "DaemonTickError",
    "InstigatorTick",
    "TickStatus",
    "crash_flags",
    "daemon_instance",
    "daemon_workspace",
    "instigator_ticks",
    "run_scheduler_tick",
    "run_scheduler_tick_in_subprocess",
    "run_sensor_tick",
    "run_sensor_tick_in_subprocess",
]

# Crash points honoured by check_for_debug_crash in dagster 1.13.27:
#   scheduler (dagster/_scheduler/scheduler.py): TICK_CREATED, TICK_HELD, RUN_CREATED,
#     RUN_LAUNCHED, RUN_ADDED, TICK_SUCCESS
#   sensor (dagster/_daemon/sensor.py): TICK_CREATED, TICK_HELD, RUN_CREATED, RUN_LAUNCHED,
#     RUN_IDS_RESERVED, ... (see that file)
CrashPoint = Literal[
    "TICK_CREATED",
    "TICK_HELD",
    "RUN_CREATED",
    "RUN_LAUNCHED",
    "RUN_ADDED",
    "TICK_SUCCESS",
    "RUN_IDS_RESERVED",
]
DebugCrashFlags = Mapping[str, Mapping[str, Any]]

DEFAULT_LOCATION_NAME = "dueledger"
_SPAWN = multiprocessing.get_context("spawn")


class DaemonTickError(RuntimeError):
    """A daemon iteration reported errors (the real daemon would only log them)."""

    def __init__(self, errors: list[SerializableErrorInfo]):
        self.errors = errors
        super().__init__("\n".join(e.to_string() for e in errors))


@dataclass(frozen=True)
class CodeTarget:
    """Where the daemon loads the code location from (picklable, so it crosses `spawn`).

    Exactly one of ``module_name`` / ``python_file``; ``attribute`` names the Definitions.
    """

    module_name: str | None = None
    python_file: str | None = None
    attribute: str = "defs"
    working_directory: str | None = None
    location_name: str = DEFAULT_LOCATION_NAME

    def __post_init__(self) -> None:
        if (self.module_name is None) == (self.python_file is None):
            raise ValueError("CodeTarget needs exactly one of module_name / python_file")

    @classmethod
    def from_module(
        cls,
        module_name: str,
        attribute: str = "defs",
        *,
        working_directory: str | os.PathLike[str] | None = None,
        location_name: str = DEFAULT_LOCATION_NAME,
    ) -> CodeTarget:
        """Load ``module_name.attribute`` (module must be importable, e.g. installed)."""
        return cls(
            module_name=module_name,
            attribute=attribute,
            working_directory=str(working_directory) if working_directory else None,
            location_name=location_name,
        )

    @classmethod
    def from_file(
        cls,
        python_file: str | os.PathLike[str],
        attribute: str = "defs",
        *,
        location_name: str = DEFAULT_LOCATION_NAME,
    ) -> CodeTarget:
        """Load ``attribute`` from a Python file by path."""
        path = Path(python_file).resolve()
        return cls(
            python_file=str(path),
            attribute=attribute,
            working_directory=str(path.parent),
            location_name=location_name,
        )

    def load_target(self) -> InProcessWorkspaceLoadTarget:
        origin = LoadableTargetOrigin(
            executable_path=None,
            python_file=self.python_file,
            module_name=self.module_name,
            working_directory=self.working_directory,
            attribute=self.attribute,
        )
        return InProcessWorkspaceLoadTarget(
            InProcessCodeLocationOrigin(origin, location_name=self.location_name)
        )


_LAUNCHERS = {
    # Records launches, executes nothing; a launched run stays STARTING.
    "mocked": {"module": "dagster._core.test_utils", "class": "MockedRunLauncher"},
    # Executes the run in the calling process, synchronously, before launch_run returns.
    "sync": {
        "module": "dagster._core.launcher.sync_in_memory_run_launcher",
        "class": "SyncInMemoryRunLauncher",
    },
}


@contextmanager
def daemon_instance(
    launcher: Literal["mocked", "sync"] = "mocked",
    *,
    temp_dir: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Iterator[DagsterInstance]:
    """A persistent (on-disk SQLite) test instance that spawned processes can open too.

    ``launcher="mocked"``: ``MockedRunLauncher`` (launch recorded, run left STARTING).
    ``launcher="sync"``: ``SyncInMemoryRunLauncher`` (run executes in-process, synchronously).
    The run coordinator is ``DefaultRunCoordinator`` -- NOT Dagster's default
    ``QueuedRunCoordinator`` -- so a submitted run is launched immediately.
    Sets ``$DAGSTER_HOME`` to the instance directory while open (``instance_for_test``).
    """
    config: dict[str, Any] = {
        "run_coordinator": {
            "module": "dagster._core.run_coordinator",
            "class": "DefaultRunCoordinator",
        },
        "run_launcher": _LAUNCHERS[launcher],
    }
    config.update(overrides or {})
    if temp_dir is not None:
        Path(temp_dir).mkdir(parents=True, exist_ok=True)  # instance_for_test won't create it
    with instance_for_test(
        overrides=config, temp_dir=str(temp_dir) if temp_dir else None
    ) as instance:
        yield instance


@contextmanager
def daemon_workspace(
    instance: DagsterInstance, target: CodeTarget
) -> Iterator[WorkspaceProcessContext]:
    """The workspace context the daemons use, loading ``target`` in-process (no gRPC).

    Raises ``DagsterCodeLocationLoadError``-like errors at once if the code fails to load
    (the real daemons would only log that and do nothing).
    """
    with create_test_daemon_workspace_context(target.load_target(), instance) as ctx:
        for entry in ctx.create_request_context().get_code_location_entries().values():
            if entry.load_error is not None:
                raise RuntimeError(
                    f"code location {entry.origin.location_name!r} failed to load:\n"
                    + entry.load_error.to_string()
                )
        yield ctx


def _utc(now: dt.datetime) -> dt.datetime:
    if now.tzinfo is None:
        raise ValueError("`now` must be timezone-aware")
    return now.astimezone(dt.UTC)


def _errors(values: list[Any], raise_on_error: bool) -> list[SerializableErrorInfo]:
    errors = [v for v in values if isinstance(v, SerializableErrorInfo)]
    if errors and raise_on_error:
        raise DaemonTickError(errors)
    return errors


def run_scheduler_tick(
    workspace_context: WorkspaceProcessContext,
    now: dt.datetime,
    *,
    debug_crash_flags: DebugCrashFlags | None = None,
    iteration_times: dict[str, ScheduleIterationTimes] | None = None,
    raise_on_error: bool = True,
) -> list[SerializableErrorInfo]:
    """One scheduler-daemon iteration at frozen time ``now`` (all running schedules).

    Exhausts ``launch_scheduled_runs`` synchronously (no thread pool), as Dagster's own
    ``evaluate_schedules`` test helper does. ``iteration_times`` is the daemon's in-memory
    state between iterations: default ``None`` = a fresh dict = a freshly (re)started
    daemon, so dedup is decided by the database alone; pass the same dict across calls to
    model one long-lived daemon process. Returns the errors the daemon reported (raises
    ``DaemonTickError`` instead when ``raise_on_error``).

    Beware: a ``default_status=RUNNING`` schedule with no stored state gets its state (start
    time = ``now``) on its first tick, and only dues at or after that start are evaluated:
    a first tick at ``due + 5s`` evaluates nothing. Tick once before the due (the daemon was
    already up), or tick exactly at the due.
    """
    now_utc = _utc(now)
    with freeze_time(now_utc):
        values = list(
            launch_scheduled_runs(
                workspace_context,
                get_default_daemon_logger("SchedulerDaemon"),
                now_utc,
                iteration_times={} if iteration_times is None else iteration_times,
                debug_crash_flags=debug_crash_flags,
            )
        )
    return _errors(values, raise_on_error)


def run_sensor_tick(
    workspace_context: WorkspaceProcessContext,
    now: dt.datetime,
    *,
    debug_crash_flags: DebugCrashFlags | None = None,
    raise_on_error: bool = True,
) -> list[SerializableErrorInfo]:
    """One sensor-daemon iteration at frozen time ``now`` (all running sensors).

    Exhausts ``execute_sensor_iteration`` synchronously. A sensor is skipped while
    ``now`` is within its ``minimum_interval_seconds`` of its previous tick start.
    Returns / raises errors like ``run_scheduler_tick``.
    """
    now_utc = _utc(now)
    with freeze_time(now_utc):
        values = list(
            execute_sensor_iteration(
                workspace_context,
                get_default_daemon_logger("SensorDaemon"),
                threadpool_executor=None,
                submit_threadpool_executor=None,
                debug_crash_flags=debug_crash_flags,
            )
        )
    return _errors(values, raise_on_error)


def crash_flags(
    instigator_name: str, point: CrashPoint, sig: signal.Signals = signal.SIGKILL
) -> dict[str, dict[str, signal.Signals]]:
    """``debug_crash_flags`` making the daemon kill itself with ``sig`` at ``point``."""
    return {instigator_name: {point: sig}}


def _tick_in_child(
    kind: str,
    instance_ref: InstanceRef,
    target: CodeTarget,
    now: dt.datetime,
    debug_crash_flags: DebugCrashFlags | None,
) -> None:
    # Runs in the spawned process: a fresh interpreter, like a restarted daemon.
    with DagsterInstance.from_ref(instance_ref) as instance:
        try:
            with daemon_workspace(instance, target) as ctx:
                tick = run_scheduler_tick if kind == "schedule" else run_sensor_tick
                tick(ctx, now, debug_crash_flags=debug_crash_flags)
        finally:
            cleanup_test_instance(instance)


def _run_in_child(
    kind: str,
    instance: DagsterInstance,
    target: CodeTarget,
    now: dt.datetime,
    debug_crash_flags: DebugCrashFlags | None,
    timeout: float,
) -> int:
    process = _SPAWN.Process(
        target=_tick_in_child,
        args=(kind, instance.get_ref(), target, _utc(now), debug_crash_flags),
    )
    process.start()
    process.join(timeout=timeout)
    if process.is_alive():
        process.kill()
        process.join(timeout=10)
        raise TimeoutError(f"{kind} tick subprocess still running after {timeout}s; killed")
    assert process.exitcode is not None
    return process.exitcode


def run_scheduler_tick_in_subprocess(
    instance: DagsterInstance,
    target: CodeTarget,
    now: dt.datetime,
    *,
    debug_crash_flags: DebugCrashFlags | None = None,
    timeout: float = 60.0,
) -> int:
    """``run_scheduler_tick`` in a fresh spawned process; returns its exit code.

    ``-signal.SIGKILL`` (-9) when a crash flag fired, 0 on success, 1 if the tick raised
    (including reported daemon errors). ``instance`` must be persistent on disk
    (``daemon_instance``); the child opens it via ``instance.get_ref()``. Runs launched by
    the child with ``launcher="sync"`` execute in the child.
    """
    return _run_in_child("schedule", instance, target, now, debug_crash_flags, timeout)


def run_sensor_tick_in_subprocess(
    instance: DagsterInstance,
    target: CodeTarget,
    now: dt.datetime,
    *,
    debug_crash_flags: DebugCrashFlags | None = None,
    timeout: float = 60.0,
) -> int:
    """``run_sensor_tick`` in a fresh spawned process; exit code as for schedules."""
    return _run_in_child("sensor", instance, target, now, debug_crash_flags, timeout)


def instigator_ticks(
    workspace_context: WorkspaceProcessContext, name: str, *, limit: int | None = None
) -> list[InstigatorTick]:
    """Ticks (newest first) of the schedule or sensor called ``name`` in the workspace."""
    request_context = workspace_context.create_request_context()
    for entry in request_context.get_code_location_entries().values():
        location = entry.code_location
        if location is None:
            continue
        for repo in location.get_repositories().values():
            instigator: RemoteSchedule | RemoteSensor | None = None
            if repo.has_schedule(name):
                instigator = repo.get_schedule(name)
            elif repo.has_sensor(name):
                instigator = repo.get_sensor(name)
            if instigator is not None:
                return list(
                    workspace_context.instance.get_ticks(
                        instigator.get_remote_origin_id(), instigator.selector_id, limit=limit
                    )
                )
    raise KeyError(f"no schedule or sensor named {name!r} in the workspace")


# --- added for the ledger-keeping sensors ------------------------------------------------------
# Private imports again, for the same reason as above: the tests drive Dagster's real run-retry
# daemon, run-monitoring daemon and run-worker command, write daemon heartbeats, and need a
# run launcher that fails on demand. Checked against dagster 1.13.27.
import subprocess  # noqa: E402
import sys  # noqa: E402

from dagster._core.test_utils import MockedRunLauncher  # noqa: E402
from dagster._daemon.auto_run_reexecution.auto_run_reexecution import (  # noqa: E402
    consume_new_runs_for_automatic_reexecution,
)
from dagster._daemon.monitoring.run_monitoring import (  # noqa: E402
    execute_run_monitoring_iteration,
)
from dagster._daemon.types import DaemonHeartbeat  # noqa: E402
from dagster._grpc.types import ExecuteRunArgs  # noqa: E402
from dagster._serdes import serialize_value  # noqa: E402
from dagster._time import get_current_datetime  # noqa: E402


def dagster_now() -> dt.datetime:
    """Dagster's clock: the frozen time inside ``run_*_tick`` (``freeze_time``), else now.

    A test code location passes this as its sensors' ``clock``, so a sensor evaluated by
    the daemon at a frozen time sees that time (production sensors read the wall clock).
    """
    return get_current_datetime()


def run_retry_iteration(
    workspace_context: WorkspaceProcessContext, now: dt.datetime, *, raise_on_error: bool = True
) -> list[SerializableErrorInfo]:
    """One pass of Dagster's automatic run-retry daemon at frozen time ``now``.

    The real daemon (``EventLogConsumerDaemon``) feeds newly failed runs to
    ``consume_new_runs_for_automatic_reexecution``; here every FAILURE run is fed, which is
    safe because a run already retried is not retried again (``dagster/auto_retry_run_id``).
    Retry runs are submitted through the instance's run coordinator and launcher.
    """

    now_utc = _utc(now)
    instance = workspace_context.instance
    with freeze_time(now_utc):
        records = instance.get_run_records(filters=RunsFilter(statuses=[DagsterRunStatus.FAILURE]))
        values = list(
            consume_new_runs_for_automatic_reexecution(
                workspace_context, records, get_default_daemon_logger("EventLogConsumerDaemon")
            )
        )
    return _errors(values, raise_on_error)


# Added when a CI soak stalled on a retry Dagster announced and never created: the real
# run-retry daemon class, and one interleaving of Dagster's own writes (private, 1.13.27).
from dagster._daemon.auto_run_reexecution.event_log_consumer import (  # noqa: E402
    EventLogConsumerDaemon,
)


def retry_daemon_iteration(workspace_context: WorkspaceProcessContext, now: dt.datetime) -> None:
    """One iteration of the real ``EventLogConsumerDaemon`` (the run-retry daemon) at frozen
    time ``now``: it reads RUN_FAILURE events after its persisted cursor, feeds their runs to
    ``consume_new_runs_for_automatic_reexecution``, then stores the new cursor. Its first
    iteration only sets the cursor at the newest event."""
    with freeze_time(_utc(now)):
        list(EventLogConsumerDaemon().run_iteration(workspace_context))


def fail_run_as_the_retry_daemon_reads_it(
    workspace_context: WorkspaceProcessContext, run_id: str, now: dt.datetime, message: str
) -> None:
    """Fail a run the way run monitoring does (``report_run_failed``), with one iteration of
    the run-retry daemon in the middle of it.

    ``DagsterInstance.handle_new_event`` stores the RUN_FAILURE event, then writes the run's
    status, then its ``dagster/will_retry`` tag. Here the daemon iteration runs right after
    the event is stored -- what a thread switch or a slow database gives inside a busy
    ``dagster-daemon``, where run monitoring and the retry daemon are threads of one process.
    """
    instance = workspace_context.instance
    storage = instance.run_storage
    handle_run_event = storage.handle_run_event

    def daemon_reads_first(*args: Any, **kwargs: Any) -> Any:
        list(EventLogConsumerDaemon().run_iteration(workspace_context))
        return handle_run_event(*args, **kwargs)

    run = instance.get_run_by_id(run_id)
    assert run is not None, run_id
    storage.handle_run_event = daemon_reads_first  # type: ignore[method-assign]
    try:
        with freeze_time(_utc(now)):
            instance.report_run_failed(run, message)
    finally:
        del storage.handle_run_event


def run_monitoring_iteration(
    workspace_context: WorkspaceProcessContext, now: dt.datetime, *, raise_on_error: bool = True
) -> list[SerializableErrorInfo]:
    """One pass of Dagster's run-monitoring daemon at frozen time ``now`` (START_TIMEOUT,
    max runtime). The instance needs ``run_monitoring: {enabled: true, ...}``."""
    now_utc = _utc(now)
    with freeze_time(now_utc):
        values = list(
            execute_run_monitoring_iteration(
                workspace_context, get_default_daemon_logger("MonitoringDaemon")
            )
        )
    return _errors(values, raise_on_error)


def start_run_worker(
    instance: DagsterInstance, run_id: str, *, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start the run worker for an existing run, as Dagster's run launchers do:
    ``python -m dagster api execute_run <ExecuteRunArgs>`` in a new process (a real,
    killable worker). The run must be NOT_STARTED or STARTING (e.g. launched by
    ``MockedRunLauncher``)."""
    run = instance.get_run_by_id(run_id)
    if run is None or run.job_code_origin is None:
        raise ValueError(f"run {run_id} does not exist or has no code origin")
    args = ExecuteRunArgs(
        job_origin=run.job_code_origin, run_id=run_id, instance_ref=instance.get_ref()
    )
    return subprocess.Popen(
        [sys.executable, "-m", "dagster", "api", "execute_run", serialize_value(args)],
        env=dict(os.environ if env is None else env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def dequeue_iteration(workspace_context: WorkspaceProcessContext) -> list[str]:
    """One pass of Dagster's run queue daemon (QueuedRunCoordinatorDaemon): launches the
    queued runs its limits allow -- ``concurrency.runs`` and pools -- and returns the ids
    of the runs it launched. The instance needs the QueuedRunCoordinator."""
    instance = workspace_context.instance
    queued = {r.run_id for r in instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.QUEUED]))}
    daemon = QueuedRunCoordinatorDaemon(interval_seconds=1)
    list(daemon.run_iteration(workspace_context))
    still = {r.run_id for r in instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.QUEUED]))}
    return sorted(queued - still)


def write_daemon_heartbeat(
    instance: DagsterInstance, daemon_type: str, timestamp: float, daemon_id: str = "test"
) -> None:
    """Record a heartbeat of ``daemon_type`` (e.g. ``"SCHEDULER"``) at ``timestamp``, as
    the running daemon does every few seconds."""
    instance.add_daemon_heartbeat(DaemonHeartbeat(timestamp, daemon_type, daemon_id, None))


class FailingRunLauncher(MockedRunLauncher):
    """``MockedRunLauncher`` whose ``launch_run`` raises while the file ``fail_marker``
    exists: a run launcher error on demand (Dagster then marks the run FAILURE).

    Use in ``daemon_instance(overrides=failing_launcher_config(path))``.
    """

    def __init__(self, inst_data: Any = None, fail_marker: str = "") -> None:
        self.fail_marker = fail_marker
        super().__init__(inst_data=inst_data)

    def launch_run(self, context: Any) -> Any:
        if self.fail_marker and Path(self.fail_marker).exists():
            raise RuntimeError(f"test launcher refuses to launch (marker {self.fail_marker})")
        return super().launch_run(context)

    @classmethod
    def config_type(cls) -> Any:
        from dagster import Field

        return {"fail_marker": Field(str)}

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Mapping[str, Any]) -> Any:
        return cls(inst_data=inst_data, fail_marker=config_value["fail_marker"])


def failing_launcher_config(marker: str | os.PathLike[str]) -> dict[str, Any]:
    """``daemon_instance`` overrides selecting :class:`FailingRunLauncher`."""
    return {
        "run_launcher": {
            "module": "dagster_internals",
            "class": "FailingRunLauncher",
            "config": {"fail_marker": str(marker)},
        }
    }


# --- added for the bounded soak -----------------------------------------------------------------
# The soak runs the real `dagster-daemon run` process; at the end of its window it must stop
# every schedule of the code location so no further due fires while the last runs settle.
# Dagster's scheduler keys schedule state by selector id (location + repository + name), so
# stopping through an in-process load of the same code location stops the daemon's schedules.


def stop_schedules(
    instance: DagsterInstance, target: CodeTarget, *, keep: Collection[str] = ()
) -> list[str]:
    """Stop every schedule of ``target``'s code location but those named in ``keep``;
    returns the names of those stopped."""
    stopped: list[str] = []
    with daemon_workspace(instance, target) as ctx:
        request_context = ctx.create_request_context()
        for entry in request_context.get_code_location_entries().values():
            location = entry.code_location
            if location is None:
                continue
            for repo in location.get_repositories().values():
                for schedule in repo.get_schedules():
                    if schedule.name in keep:
                        continue
                    instance.stop_schedule(
                        schedule.get_remote_origin_id(), schedule.selector_id, schedule
                    )
                    stopped.append(schedule.name)
    return stopped


def started_schedules(instance: DagsterInstance) -> list[str]:
    """Names of the schedules the scheduler daemon has recorded as running (a schedule that
    is RUNNING by default gets its state at the daemon's first iteration)."""
    from dagster._core.scheduler.instigation import InstigatorStatus, InstigatorType

    running = {
        InstigatorStatus.RUNNING,
        InstigatorStatus.DECLARED_IN_CODE,
        InstigatorStatus.AUTOMATICALLY_RUNNING,
    }
    return [
        state.instigator_name
        for state in instance.all_instigator_state(instigator_type=InstigatorType.SCHEDULE)
        if state.status in running
    ]


def schedule_start_times(instance: DagsterInstance) -> dict[str, float]:
    """When each running schedule started (``ScheduleInstigatorData.start_timestamp``, epoch
    s). The scheduler fires cron times from there on; a schedule RUNNING by default gets the
    timestamp of the daemon iteration that first recorded it (one value for all of them)."""
    from dagster._core.scheduler.instigation import InstigatorType, ScheduleInstigatorData

    running = set(started_schedules(instance))
    return {
        state.instigator_name: float(state.instigator_data.start_timestamp or 0.0)
        for state in instance.all_instigator_state(instigator_type=InstigatorType.SCHEDULE)
        if state.instigator_name in running
        and isinstance(state.instigator_data, ScheduleInstigatorData)
    }


def start_schedules(instance: DagsterInstance, target: CodeTarget, names: Collection[str]) -> None:
    """Start the named schedules of ``target``'s code location, as the UI's toggle does
    (``instance.start_schedule``: a RUNNING state whose start time is now)."""
    with daemon_workspace(instance, target) as ctx:
        request_context = ctx.create_request_context()
        for entry in request_context.get_code_location_entries().values():
            location = entry.code_location
            if location is None:
                continue
            for repo in location.get_repositories().values():
                for schedule in repo.get_schedules():
                    if schedule.name in names:
                        instance.start_schedule(schedule)


# --- added for the overlap policies: a run worker in a thread of the test process -----------------
# Two runs of one task must be at work at once for the ledger to decide their overlap; starting
# a real run worker process per run costs seconds of CPU each on 2 cores. Dagster's own
# worker (`dagster api execute_run`) rebuilds the job from the run's code origin and calls
# ``execute_run``; this does the same in a thread. Private (1.13.27): `recon_job_from_origin`.
import threading  # noqa: E402

from dagster._core.execution.api import execute_run  # noqa: E402
from dagster._utils.hosted_user_process import recon_job_from_origin  # noqa: E402


def execute_run_in_thread(instance: DagsterInstance, run_id: str) -> threading.Thread:
    """Execute the existing run ``run_id`` (launched by ``MockedRunLauncher``: STARTING) as its
    run worker would, in a new daemon thread of this process; join it to wait for the end.
    Dagster sets up no signal handlers outside the main thread, so the run is ended by its own
    code (or the ledger), as an in-process executor's step is."""
    run = instance.get_run_by_id(run_id)
    if run is None or run.job_code_origin is None:
        raise ValueError(f"run {run_id} does not exist or has no code origin")
    job = recon_job_from_origin(run.job_code_origin)
    thread = threading.Thread(
        target=execute_run, args=(job, run, instance), name=f"run-{run_id[:8]}", daemon=True
    )
    thread.start()
    return thread
