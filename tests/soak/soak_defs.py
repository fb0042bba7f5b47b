"""Code location of the bounded soak (tests/soak/test_soak.py): 12 tasks on a 1-minute slot.

Everything but the task bodies is production code: TaskSpecs through
``orchestration.task_spec.build_views``, jobs and schedules from
``orchestration.task_defs``, every ledger-keeping sensor from
``sensors.build_sensors`` (wall clock), the run path
``orchestration.task_defs.run_task`` and the exactly-once notification path
``resources.notifier.dispatch_notifications``.
Each claimed run sends ``MESSAGES`` notifications for its due, one at a time with a short
pause (so a worker killed at a random moment dies before, during or after its side
effects), each on two channels:

- ``sms`` goes to the ``notification_outbox`` in the same transaction as its idempotency
  row (exactly once);
- ``email`` is an *external* channel: ``SoakChannel.deliver`` records every delivery it is
  handed in ``soak_deliveries``, a table with no unique constraint, committed on its own
  connection like a remote system would. If dueledger ever delivered the same
  notification twice, that table would show it.

Before claiming (and up to a second before it), every run worker records its pid in
``soak_workers`` so the test's killer can ``kill -9`` it.
Source store: ``DUELEDGER_SOURCE_URL``; ledger: ``DUELEDGER_DATABASE_URL``.
"""

import os
import random
import time
from datetime import UTC, datetime, timedelta
from functools import cache

import dagster as dg
import pandas as pd
import sqlalchemy as sa

from orchestration.services.hooks.registry import Hooks
from orchestration.task_defs import run_task, task_jobs_and_schedules
from orchestration.task_run import TaskRun
from orchestration.task_spec import TaskSpec, build_views
from orchestration.timetable import EverySlots
from resources.core.settings import ENV_SOURCE_URL
from resources.ledger import RunLedger
from resources.notifier import Notifier, dispatch_notifications
from resources.source_store import make_engine
from sensors import build_sensors

SLOT_MINUTES = 1
#: 12 tasks x 5 slots = 60 dues, a quarter of their workers killed: enough interleavings for
#: every invariant, and a drain that keeps the whole suite inside its time budget (20 tasks
#: made the soak about 22 of the suite's 52 minutes).
TASK_COUNT = 12
MESSAGES = 3
OBJECT_TYPE = "soak"
CHANNELS = ("sms", "email")
# A run's body takes about 2 s, but on a small machine 12 run workers a minute (each a fresh
# Python process that imports Dagster and pandas) keep the CPU busy, so the max runtime
# leaves room; the lease (renewed every LEASE_TTL / 4) must outlive it (validate_spec).
TIMEOUT = timedelta(seconds=45)
LEASE_TTL = timedelta(seconds=50)

SPECS = tuple(
    TaskSpec(
        key=f"soak_{i:02d}",
        rule=EverySlots(1),
        declared_cadence="every slot",
        timeout=TIMEOUT,
        lease_ttl=LEASE_TTL,
        # Short: the fault budgets hold, and retries still wait at their claim.
        retry_backoff=timedelta(seconds=2),
        max_attempts=3,
    )
    for i in range(TASK_COUNT)
)
VIEWS = build_views(SPECS, SLOT_MINUTES, "UTC")
#: The plugin hooks of this code location (none are installed for the soak; loaded on first use).
HOOKS = Hooks.from_environment()

soak_metadata = sa.MetaData()
soak_workers = sa.Table(
    "soak_workers",
    soak_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("task_key", sa.String(64), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
)
soak_deliveries = sa.Table(
    "soak_deliveries",
    soak_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    # Deliberately no unique constraint: a second delivery of one effect must be visible.
    sa.Column("effect_id", sa.Integer, nullable=False),
    sa.Column("rule", sa.String(64), nullable=False),
    sa.Column("object_id", sa.BigInteger, nullable=False),
    sa.Column("time_point", sa.DateTime, nullable=False),
    sa.Column("channel", sa.String(20), nullable=False),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=False),
)


@cache
def _engine(url: str) -> sa.Engine:
    return make_engine(url)


def source_engine() -> sa.Engine:
    return _engine(os.environ[ENV_SOURCE_URL])


class SoakChannel(Notifier):
    """The fake external email gateway: records every delivery it is handed."""

    source_url: str
    run_id: str

    def external_channels(self) -> frozenset[str]:
        return frozenset({"email"})

    def deliver(self, messages: pd.DataFrame) -> list[str | None]:
        now = datetime.now(UTC)
        rows = [
            {
                "effect_id": int(m.effect_id),
                "rule": m.rule,
                "object_id": int(m.object_id),
                "time_point": m.time_point,
                "channel": m.channel,
                "run_id": self.run_id,
                "delivered_at": now,
            }
            for m in messages.itertuples(index=False)
        ]
        with _engine(self.source_url).begin() as conn:
            conn.execute(sa.insert(soak_deliveries), rows)
        return [None] * len(rows)


def _messages(spec: TaskSpec, due: datetime, number: int) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "rule": spec.key,
                "object_type": OBJECT_TYPE,
                "object_id": number,
                "time_point": due.astimezone(UTC).replace(tzinfo=None),
                "channel": channel,
                "customer_id": number,
                "recipient": f"customer{number}@example.org",
                "subject": f"{spec.key} due {due:%H:%M}",
                "body": f"notification {number} of {spec.key} for {due.isoformat()}",
            }
            for channel in CHANNELS
        ]
    )


def _register_worker(run_id: str, task_key: str) -> None:
    with source_engine().begin() as conn:
        conn.execute(
            sa.insert(soak_workers).values(
                run_id=run_id, task_key=task_key, pid=os.getpid(), started_at=datetime.now(UTC)
            )
        )


def _asset(spec: TaskSpec) -> dg.AssetsDefinition:
    @dg.asset(name=spec.asset, output_required=False)
    def _task(context: dg.AssetExecutionContext, ledger: RunLedger):
        _register_worker(context.run_id, spec.key)
        pause = random.Random(context.run_id)
        # Some work before the claim, so a random kill can also land before any claim.
        time.sleep(pause.uniform(0.0, 1.0))

        def work(context: dg.AssetExecutionContext, run: TaskRun):
            channel = SoakChannel(source_url=os.environ[ENV_SOURCE_URL], run_id=context.run_id)
            sent = 0
            for number in range(MESSAGES):
                time.sleep(pause.uniform(0.3, 0.8))
                out = dispatch_notifications(
                    source_engine(),
                    channel,
                    _messages(spec, run.as_of, number),
                    at=run.as_of,
                    task_key=spec.key,
                    entry_key=run.entry_key,
                    guard=run.guard,
                )
                sent += int((out["outcome"] == "sent").sum())
            yield dg.MaterializeResult(metadata={"sent": sent, "attempt": run.entry.attempt})

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
