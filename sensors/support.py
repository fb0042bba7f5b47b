"""What every ledger-keeping sensor shares: one decorator, and the run request for a due.

A ledger sensor runs by default (the ledger is only kept true while it runs), gets the
``RunLedger`` resource, and is a function of its evaluation's "now", read once from an
injected clock (tests pass a frozen clock; nothing below reads the wall clock).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import dagster as dg

from orchestration.task_spec import TaskView, partition_key_for
from resources.core import tags as t
from resources.core.due import Due
from resources.core.entry import Trigger
from resources.core.instants import Clock
from resources.ledger import RunLedger

#: A ledger sensor's body: (its evaluation context, the ledger, now) -> what Dagster takes.
SensorBody = Callable[[dg.SensorEvaluationContext, RunLedger, datetime], Any]


def ledger_sensor(
    name: str,
    *,
    description: str,
    clock: Clock,
    minimum_interval_seconds: int,
    job_name: str | None = None,
    jobs: Sequence[dg.UnresolvedAssetJobDefinition] | None = None,
) -> Callable[[SensorBody], dg.SensorDefinition]:
    """Make ``body`` the sensor ``name``: running by default, evaluated at most every
    ``minimum_interval_seconds``, given the ledger and ``clock()`` (one read per tick).
    It may request runs of ``job_name``, or of ``jobs`` (the very job objects the code
    location registers: Dagster refuses two definitions of one job)."""

    def wrap(body: SensorBody) -> dg.SensorDefinition:
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
