"""The ledger sensor's duties against the ledger's size: ``bench/scale.py``'s O(changes) rows.

For each size (10,000 and 100,000 entries by default) a ledger is bulk-loaded with a year of
history (``bench/ledger_queries.py``'s builder, every entry settled: success, failed,
dispatch_failed), then each round makes the same few changes in a new slot and times one
tick of each duty of ``ledger_sensor``, built as a sensor of its own (named below) and
evaluated as Dagster evaluates it (its function, the real ``RunLedger`` resource, a real
Dagster instance):

- ``ledger_outcome_sensor``: ``CHANGES`` task runs Dagster ended FAILURE since its cursor
  (each becomes its entry's dispatch failure);
- ``lease_reclaim_sensor``: ``CHANGES`` running entries whose lease expired;
- ``redispatch_sensor``: ``CHANGES`` entries of the current slot ``dispatch_failed``;
- ``slot_health_sensor``: its once-per-slot evaluation (the entries changed since its
  previous one, the tasks due since then, the checks that may have changed).

A sensor that reads only what changed costs the same on both sizes (ratio about 1); one
that scans the ledger costs ten times more on ten times the entries -- as the reference row,
a full scan of the entries table, shows in the same run.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import _paths  # noqa: F401  (first: puts the project and tests/ on sys.path)

# isort: split

import dagster as dg
import sqlalchemy as sa
from ledger_queries import START, TASKS, TRIGGER_MIX, _row, _weighted

from orchestration.task_spec import EverySlots, TaskSpec, build_views
from resources.core import tags as t
from resources.core.due import Due
from resources.core.entry import FailureKind, Status, Trigger
from resources.ledger import RunLedger
from resources.ledger.schema import entries
from sensors.health import build_slot_health_sensor
from sensors.outcomes import build_outcome_sensor
from sensors.reclaim import build_reclaim_sensor
from sensors.redispatch import build_redispatch_sensor

CHANGES = 10
SLOT_MINUTES = 15
#: The history: every entry settled, as on a ledger whose sensors keep up.
SETTLED_MIX = [(Status.SUCCESS, 950), (Status.FAILED, 40), (Status.DISPATCH_FAILED, 10)]
SENSOR_NAMES = (
    "ledger_outcome_sensor",
    "lease_reclaim_sensor",
    "redispatch_sensor",
    "slot_health_sensor",
)
SCAN = "full scan of the entries table (reference)"
INSERT_CHUNK = 20_000


def build_history(url: str, n: int, seed: int = 11) -> datetime:
    """Migrate and bulk-load ``n`` settled entries; returns the instant after the last due."""
    RunLedger(database_url=url).migrate()
    engine = sa.create_engine(url)
    rng = random.Random(seed)
    triggers, statuses = _weighted(TRIGGER_MIX), _weighted(SETTLED_MIX)
    with engine.begin() as conn:
        for start in range(0, n, INSERT_CHUNK):
            stop = min(n, start + INSERT_CHUNK)
            rows = [_row(i, rng, triggers, statuses) for i in range(start, stop)]
            conn.execute(sa.insert(entries), rows)
    with engine.connect() as conn:
        conn.execute(sa.text("ANALYZE"))
        conn.commit()
    engine.dispose()
    last_due = START + timedelta(minutes=SLOT_MINUTES) * (n // len(TASKS))
    return last_due + timedelta(days=1)


@dataclass
class SizeResult:
    entries: int
    ms: dict[str, list[float]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _views():
    specs = [TaskSpec(key=k, rule=EverySlots(1), declared_cadence="every slot") for k in TASKS]
    return build_views(specs, SLOT_MINUTES, "UTC")


def _make_changes(
    ledger: RunLedger, instance: dg.DagsterInstance, now: datetime
) -> tuple[Due, list[str]]:
    """The round's changes (see the module docstring); returns the slot's due and run ids."""
    due = Due.of_slot(now, SLOT_MINUTES)
    earlier = Due(due.at - timedelta(minutes=SLOT_MINUTES))
    for task in TASKS[:CHANGES]:  # dispatch_failed in this slot: re-dispatch work
        entry = ledger.ensure_entry(
            task_key=task, trigger=Trigger.SCHEDULE, dedup_key=due.key, due=due.at, now=due.at
        )
        ledger.record_dispatch_failure(entry.id, error="launch refused", run_id=None, now=due.at)
    for i, task in enumerate(TASKS[CHANGES : 2 * CHANGES]):  # expired leases: reclaim work
        entry = ledger.ensure_entry(
            task_key=task, trigger=Trigger.SCHEDULE, dedup_key=due.key, due=due.at, now=due.at
        )
        ledger.claim(entry.id, f"lease-{due.text}-{i}", lease_ttl=timedelta(seconds=1), now=due.at)
    run_ids = []
    for task in TASKS[:CHANGES]:  # runs Dagster ended before they claimed: outcome work
        job = dg.GraphDefinition(name="noop", node_defs=[]).to_job(name=f"{task}_job")
        tags = {
            t.TAG_TASK: task,
            t.TAG_TRIGGER: Trigger.SCHEDULE.value,
            t.TAG_DUE: earlier.text,
        }
        run = instance.create_run_for_job(job, tags=tags)
        instance.report_run_failed(run)
        run_ids.append(run.run_id)
    return due, run_ids


def measure_size(url: str, n: int, rounds: int, log: Callable[[str], None]) -> SizeResult:
    """Build the ledger at ``url`` with ``n`` entries and time ``rounds`` rounds (plus one
    untimed warm-up round) of every sensor's tick."""
    start = time.perf_counter()
    after = build_history(url, n)
    log(f"  {n:,} entries built in {time.perf_counter() - start:.0f} s")
    ledger = RunLedger(database_url=url)
    views = _views()
    clock: list[datetime] = [after]

    def now() -> datetime:
        return clock[0]

    # Each duty of ledger_sensor as a sensor of its own, so each is timed alone.
    built = (
        build_outcome_sensor(views, clock=now),
        build_reclaim_sensor(clock=now),
        build_redispatch_sensor(views, clock=now),
        build_slot_health_sensor(views, clock=now),
    )
    sensors = {s.name: s for s in built}
    result = SizeResult(n, {name: [] for name in (*SENSOR_NAMES, SCAN)})
    cursors: dict[str, str | None] = {}
    engine = ledger._get_engine()  # the resource's own engine, as the sensors use it
    scan = sa.select(sa.func.count()).select_from(entries).where(entries.c.error.like("%zz%"))
    with dg.instance_for_test() as instance:
        for r in range(rounds + 1):
            now = after + timedelta(minutes=SLOT_MINUTES * r + 4)
            clock[0] = now
            due, _ = _make_changes(ledger, instance, now)
            for name in SENSOR_NAMES:
                with dg.build_sensor_context(
                    instance=instance, cursor=cursors.get(name), resources={"ledger": ledger}
                ) as context:
                    began = time.perf_counter()
                    outcome: Any = sensors[name](context)
                    elapsed = (time.perf_counter() - began) * 1000
                cursors[name] = getattr(outcome, "cursor", None) or cursors.get(name)
                if r:
                    result.ms[name].append(elapsed)
            began = time.perf_counter()
            with engine.connect() as conn:
                conn.execute(scan).scalar_one()
            if r:
                result.ms[SCAN].append((time.perf_counter() - began) * 1000)
            result.problems += _check_round(ledger, due, n, r)
    ledger.dispose()
    medians = ", ".join(f"{k} {statistics.median(v):.1f} ms" for k, v in result.ms.items())
    log(f"  {n:,} entries: {medians}")
    return result


def _check_round(ledger: RunLedger, due: Due, n: int, r: int) -> list[str]:
    """The round's changes were all handled: re-dispatched, reclaimed, recorded."""
    problems = []
    for task in TASKS[:CHANGES]:
        entry = ledger.find(task, due.key)
        if entry is None or entry.status != Status.QUEUED:
            problems.append(f"{n} entries, round {r}: {task}@{due} not re-dispatched")
        earlier = ledger.find(task, Due(due.at - timedelta(minutes=SLOT_MINUTES)).key)
        if earlier is None or not earlier.summary.get("dispatch_failures"):
            problems.append(f"{n} entries, round {r}: {task}'s failed run not reconciled")
    for task in TASKS[CHANGES : 2 * CHANGES]:
        entry = ledger.find(task, due.key)
        if entry is None or entry.failure_kind != FailureKind.LEASE_RECLAIMED:
            problems.append(f"{n} entries, round {r}: {task}@{due} lease not reclaimed")
    return problems


def sqlite_url(work: Path, n: int) -> str:
    return f"sqlite:///{work / f'scale-ledger-{n}.sqlite'}"
