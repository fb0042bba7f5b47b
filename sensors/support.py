"""What every ledger-keeping sensor shares: one decorator, the duty a sensor body is, and
the run request for a due.

A ledger sensor runs by default (the ledger is only kept true while it runs), gets the
``RunLedger`` resource, and is a function of its evaluation's "now", read once from an
injected clock (tests pass a frozen clock; nothing below reads the wall clock).

A :class:`Duty` is one job of keeping the ledger true (outcomes, reclaim, policies, slot
health, re-dispatch): a body that reads only its evaluation's instance, log and cursor, so
one sensor can run several duties, each with a cursor of its own (``sensors/keeper.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import dagster as dg

from orchestration.task_spec import TaskView, partition_key_for
from resources.core import tags as t
from resources.core.due import Due
from resources.core.entry import Trigger
from resources.core.instants import Clock
from resources.ledger import RunLedger


class DutyContext(Protocol):
    """What a duty reads of its sensor's evaluation (a ``dg.SensorEvaluationContext`` is
    one): the Dagster instance, the log, and the cursor the duty left last time."""

    @property
    def instance(self) -> dg.DagsterInstance: ...

    @property
    def log(self) -> Any: ...

    @property
    def cursor(self) -> str | None: ...


#: A ledger sensor's body: (its evaluation context, the ledger, now) -> what Dagster takes:
#: a ``dg.SensorResult`` or a ``dg.SkipReason``.
SensorBody = Callable[[DutyContext, RunLedger, datetime], Any]


@dataclass(frozen=True)
class Duty:
    """One job of keeping the ledger true: ``name`` (its cursor's key and the word its
    results are reported under), its ``body`` and what it does (``description``)."""

    name: str
    body: SensorBody
    description: str


def ledger_sensor(
    name: str,
    *,
    description: str,
    clock: Clock,
    minimum_interval_seconds: int,
    job_name: str | None = None,
    jobs: Sequence[dg.UnresolvedAssetJobDefinition] | None = None,
) -> Callable[
    [Callable[[dg.SensorEvaluationContext, RunLedger, datetime], Any]], dg.SensorDefinition
]:
    """Make ``body`` the sensor ``name``: running by default, evaluated at most every
    ``minimum_interval_seconds``, given the ledger and ``clock()`` (one read per tick).
    It may request runs of ``job_name``, or of ``jobs`` (the very job objects the code
    location registers: Dagster refuses two definitions of one job)."""

    def wrap(
        body: Callable[[dg.SensorEvaluationContext, RunLedger, datetime], Any],
    ) -> dg.SensorDefinition:
        @dg.sensor(
            name=name,
            job_name=job_name,
            jobs=jobs or None,
            minimum_interval_seconds=minimum_interval_seconds,
            default_status=dg.DefaultSensorStatus.RUNNING,
            description=description,
        )
        def _sensor(context: dg.SensorEvaluationContext, ledger: RunLedger) -> Any:
            return body(context, ledger, clock())

        return _sensor

    return wrap


def duty_sensor(
    name: str,
    duty: Duty,
    *,
    clock: Clock,
    minimum_interval_seconds: int,
    jobs: Sequence[dg.UnresolvedAssetJobDefinition] | None = None,
) -> dg.SensorDefinition:
    """``duty`` alone as the sensor ``name`` (see :func:`ledger_sensor`)."""
    return ledger_sensor(
        name,
        description=duty.description,
        clock=clock,
        minimum_interval_seconds=minimum_interval_seconds,
        jobs=jobs,
    )(duty.body)


def due_run_request(
    view: TaskView, due: Due | datetime, run_key: str, *, job_name: str | None = None
) -> dg.RunRequest:
    """A sensor's request for the task's run of ``due``: tagged like the scheduled run
    (same ledger key ``due:<due>``, same partition) but ``dueledger/trigger=sensor``.
    ``job_name``: the task's job, for a sensor that targets several."""
    due = Due.coerce(due)
    tags = {
        t.TAG_TASK: view.spec.key,
        t.TAG_TRIGGER: Trigger.SENSOR.value,
        t.TAG_DUE: due.text,
    }
    partition_key = partition_key_for(view.spec, due)
    if partition_key is not None:
        tags[t.DAGSTER_PARTITION] = partition_key
    return dg.RunRequest(run_key=run_key, tags=tags, partition_key=partition_key, job_name=job_name)
