"""Code location of the multi-daemon and multi-host tests (test_active_active.py,
test_netns_topology.py): ``CLUSTER_TASKS`` tasks on a 1-minute slot, each run writing the
history's claim log and effect sink (tests/history/collect.py).

Everything but the task body is production code: specs through ``build_views``, jobs and
schedules from ``build_task_definitions``, every ledger-keeping sensor from ``build_sensors``,
the claim wrapper ``task_run`` and the fenced effect transaction. A claimed run logs its claim
(one row per process: ``worker`` is ``$CLUSTER_HOST:pid``, so two processes of one Dagster
run are told apart), then makes ``EFFECTS`` side effects, each in its own fenced transaction
keyed like the domain's effects, with a pause before each (``CLUSTER_WORK_SECONDS``, so a
fault can land in the middle). Lean on purpose: no pandas, the in-process executor, so a run
worker costs what Dagster itself costs.

Environment: ``DUELEDGER_DATABASE_URL`` (ledger, claim log and sink, one database: the fence
is atomic with the effect), ``CLUSTER_TASKS``, ``CLUSTER_WORK_SECONDS``,
``CLUSTER_LEASE_SECONDS`` (the timeout is three quarters of it), ``CLUSTER_SLOW_SECONDS`` (the
first task's extra pause), ``CLUSTER_HOST``, and ``CLUSTER_WORKER_EXECUTABLE``
(test_netns_topology: the run workers' Python, a wrapper that starts them in their own network
namespace).
"""

import multiprocessing
import os
import random
import time
from datetime import UTC, datetime, timedelta
from functools import cache

import cluster_paths  # noqa: F401  first: the project and tests/ on sys.path
import dagster as dg
import sqlalchemy as sa
from history.collect import (
    history_claims,
    history_effect_keys,
    history_effects,
    insert_ignoring_conflict,
)

from orchestration.services.hooks.registry import Hooks
from orchestration.task_defs import run_task, task_jobs_and_schedules
from orchestration.task_run import TaskRun
from orchestration.task_spec import TaskSpec, build_views
from orchestration.timetable import EverySlots
from resources.core.settings import ENV_DATABASE_URL
from resources.effects import effect_transaction
from resources.ledger import RunLedger
from sensors import build_sensors

SLOT_MINUTES = 1
TASK_COUNT = int(os.environ.get("CLUSTER_TASKS", "6"))
EFFECTS = 2
WORK_SECONDS = float(os.environ.get("CLUSTER_WORK_SECONDS", "1.0"))
LEASE_TTL = timedelta(seconds=float(os.environ.get("CLUSTER_LEASE_SECONDS", "40")))
TIMEOUT = LEASE_TTL * 3 / 4
#: The first task pauses this much longer before its last effect: a fault can land mid-run.
SLOW_SECONDS = float(os.environ.get("CLUSTER_SLOW_SECONDS", "0"))

SPECS = tuple(
    TaskSpec(
        key=f"cluster_{i:02d}",
        rule=EverySlots(1),
        declared_cadence="every slot",
        timeout=TIMEOUT,
        lease_ttl=LEASE_TTL,
        # Short: the fault budgets hold, and retries still wait at their claim.
        retry_backoff=timedelta(seconds=2),
        max_attempts=2,
    )
    for i in range(TASK_COUNT)
)
VIEWS = build_views(SPECS, SLOT_MINUTES, "UTC")
HOOKS = Hooks.from_environment()

if os.environ.get("CLUSTER_WORKER_EXECUTABLE"):
    # The code server starts each run worker with multiprocessing's spawn; this wrapper
    # starts it in the run workers' own network namespace -- their own "host" -- so a
    # partition can cut them off from PostgreSQL alone (tests/deploy/netns.py writes it).
    multiprocessing.set_executable(os.environ["CLUSTER_WORKER_EXECUTABLE"])


@cache
def _engine(url: str) -> sa.Engine:
    return sa.create_engine(url, pool_pre_ping=True)


def _worker() -> str:
    return f"{os.environ.get('CLUSTER_HOST', 'local')}:{os.getpid()}"


def _due(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _asset(spec: TaskSpec) -> dg.AssetsDefinition:
    @dg.asset(name=spec.asset, output_required=False)
    def _task(context: dg.AssetExecutionContext, ledger: RunLedger):
        pace = random.Random(context.run_id)
        time.sleep(pace.uniform(0.0, 0.5))

        def work(context: dg.AssetExecutionContext, run: TaskRun):
            engine = _engine(os.environ[ENV_DATABASE_URL])
            token = run.entry.claim_generation
            with engine.begin() as conn:
                conn.execute(
                    sa.insert(history_claims).values(
                        entry_id=run.entry.id,
                        run_id=context.run_id,
                        token=token,
                        worker=_worker(),
                        at=datetime.now(UTC),
                    )
                )
            for number in range(EFFECTS):
                time.sleep(pace.uniform(0.5, 1.5) * WORK_SECONDS)
                if spec is SPECS[0] and number == EFFECTS - 1:
                    time.sleep(SLOW_SECONDS)
                name = f"notify-{number}"
                with effect_transaction(engine, run.guard, name) as conn:
                    key = {"task": spec.key, "due": _due(run.as_of), "effect": name}
                    if insert_ignoring_conflict(conn, history_effect_keys, **key):
                        conn.execute(
                            sa.insert(history_effects).values(
                                **key,
                                entry_id=run.entry.id,
                                run_id=context.run_id,
                                token=token,
                                worker=_worker(),
                                at=datetime.now(UTC),
                            )
                        )
            yield dg.MaterializeResult(metadata={"attempt": run.entry.attempt})

        # A second process of one run (two daemons dequeued it) ends quietly inside run_task:
        # the run's other process holds the claim.
        yield from run_task(context, ledger, spec, work, hooks=HOOKS, tasks=SPECS)

    return _task


_jobs, _schedules = task_jobs_and_schedules(VIEWS, hooks=HOOKS)

defs = dg.Definitions(
    assets=[_asset(spec) for spec in SPECS],
    jobs=_jobs,
    schedules=_schedules,
    sensors=build_sensors(VIEWS),
    resources={"ledger": RunLedger()},
    executor=dg.in_process_executor,
)
