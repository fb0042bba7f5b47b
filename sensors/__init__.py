"""Sensors that keep the ledger true (reclaim, outcome reconciliation, audits).

One module per sensor family; ``build_sensors`` makes what the code location registers:

- ``ledger_outcome_sensor`` (outcomes.py): entries follow runs Dagster ended FAILURE/CANCELED;
  it also creates the pools that hold one run of a ``queue`` task at a time;
- ``redispatch_sensor`` (redispatch.py): dispatch_failed -> re-dispatch in its slot, one
  sensor for every task (run keys ``<task>@<due>#redispatch-<n>``); every eighth of a slot,
  30 s to 2 minutes;
- ``lease_reclaim_sensor`` (reclaim.py): expired leases -> failed (lease_reclaimed);
- ``<task>_catch_up_sensor`` (catch_up.py, catch_up tasks only): missed dues, once each;
- ``slot_health_sensor`` (health.py): one warning per slot when anything is wrong;
- ``ledger_policy_sensor`` (policies.py): paused dues recorded skipped, pause on failure,
  missed deadlines.

"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

import dagster as dg

from orchestration.task_spec import MissedSlotPolicy, TaskView
from resources.core.instants import utc_now
from sensors.catch_up import build_catch_up_sensor
from sensors.health import build_slot_health_sensor
from sensors.outcomes import build_outcome_sensor
from sensors.policies import build_policy_sensor
from sensors.reclaim import build_reclaim_sensor
from sensors.redispatch import build_redispatch_sensor


def build_sensors(
    views: Sequence[TaskView],
    *,
    clock: Callable[[], datetime] = utc_now,
    redispatch_interval_seconds: int | None = None,
) -> list[dg.SensorDefinition]:
    """Every ledger-keeping sensor for these tasks; ``clock`` is their "now" (injected in tests).

    ``redispatch_interval_seconds`` overrides the re-dispatch sensor's interval (default: an
    eighth of the slot, 30 s to 2 minutes,
    ``resources.core.redispatch.redispatch_interval_seconds``). No sensor is per task but
    the catch-up sensors of ``catch_up`` tasks: the others cost the same for 10 or 500 tasks.
    """
    sensors = [
        build_outcome_sensor(views, clock=clock),
        build_reclaim_sensor(clock=clock),
        build_slot_health_sensor(views, clock=clock),
        build_policy_sensor(views, clock=clock),
    ]
    if views:
        sensors.append(
            build_redispatch_sensor(
                views, clock=clock, minimum_interval_seconds=redispatch_interval_seconds
            )
        )
    sensors += [
        build_catch_up_sensor(v, clock=clock)
        for v in views
        if v.spec.missed_slot_policy == MissedSlotPolicy.CATCH_UP
    ]
    return sensors
