"""Sensors that keep the ledger true (reclaim, outcome reconciliation, audits).

One module per duty; ``build_sensors`` makes what the code location registers:

- ``ledger_sensor`` (keeper.py), every 60 s on 15-minute slots, runs each duty in turn:
  - outcomes (outcomes.py): entries follow runs Dagster ended FAILURE/CANCELED;
  - reclaim (reclaim.py): expired leases -> failed (lease_reclaimed), stranded launches ->
    dispatch_failed, alert deliveries retried;
  - policies (policies.py): pauses kept in step with the schedules' toggles, pause on
    failure, missed deadlines, the pools that hold one run of a ``queue`` task at a time;
  - slot health (health.py): one warning per slot when anything is wrong, and the checks;
  - re-dispatch (redispatch.py): dispatch_failed -> re-dispatch in its slot (run keys
    ``<task>@<due>#redispatch-<n>``);
  - waiters (waiters.py): the run of a ``buffer_one`` due that waited for its turn without
    one, once its task is free (run keys ``<task>@<due>#waiter``);
- ``<task>_catch_up_sensor`` (catch_up.py, catch_up tasks only): missed dues, once each.

Each duty but waiters can also be built as a sensor of its own (``build_outcome_sensor``,
...), as tests do to tick one duty.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

import dagster as dg

from orchestration.task_spec import MissedSlotPolicy, TaskView
from resources.core.instants import utc_now
from resources.core.settings import DEFAULT_SLOT_MINUTES
from sensors.catch_up import build_catch_up_sensor
from sensors.keeper import build_keeper_sensor, keeper_interval_seconds


def build_sensors(
    views: Sequence[TaskView],
    *,
    clock: Callable[[], datetime] = utc_now,
    interval_seconds: int | None = None,
) -> list[dg.SensorDefinition]:
    """Every ledger-keeping sensor for these tasks; ``clock`` is their "now" (injected in tests).

    ``interval_seconds``: how often ``ledger_sensor`` runs its duties (default: a quarter of
    the tasks' slot, 30-60 s: 60 s on 15-minute slots). No sensor is per task but the
    catch-up sensors of ``catch_up`` tasks: the others cost the same for 10 or 500 tasks.
    """
    if interval_seconds is None:
        slot = views[0].slot_minutes if views else DEFAULT_SLOT_MINUTES
        interval_seconds = keeper_interval_seconds(slot)
    sensors = [build_keeper_sensor(views, clock=clock, minimum_interval_seconds=interval_seconds)]
    sensors += [
        build_catch_up_sensor(v, clock=clock)
        for v in views
        if v.spec.missed_slot_policy == MissedSlotPolicy.CATCH_UP
    ]
    return sensors
