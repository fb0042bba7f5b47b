"""``ledger_sensor``: the one sensor that keeps the ledger true, every quarter of a slot from
30 to 60 s (60 s on 15-minute slots; ``DUELEDGER_KEEPER_INTERVAL_SECONDS`` sets it).

Each tick runs the duties in turn -- outcomes (``sensors/outcomes.py``), reclaim
(``reclaim.py``), policies (``policies.py``), slot health (``health.py``), re-dispatch
(``redispatch.py``) and waiters (``waiters.py``) -- and returns what they return together:
the run requests of re-dispatch and waiters, slot health's check evaluations, and one cursor
holding each duty's own (``{"outcomes": ..., "slot_health": ...}``).

Why one sensor: Dagster's sensor daemon stores a tick for every evaluation of every sensor
(``_get_evaluation_tick`` in ``dagster/_daemon/sensor.py``; run-status sensors too), and five
sensors every 30-112 s stored about 10,850 ticks a day against the schedules' 650, and kept
an idle ``dagster dev`` busy. One sensor every 60 s stores 1,440.

A duty that raises does not stop the others: its error is logged with its traceback, its
cursor stays where it was (its work is redone next tick; every duty's writes are
compare-and-set), and the tick's reason begins ``FAILED <duty>: <error>``. The tick itself
still returns the other duties' run requests, checks and cursors: failing it would throw
those away, and one broken duty would then hold every other duty's cursor back.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import dagster as dg

from orchestration.task_defs import task_job
from orchestration.task_spec import TaskView
from resources.core.instants import Clock, utc_now
from resources.ledger import RunLedger
from sensors.health import slot_health_duty
from sensors.outcomes import outcome_duty
from sensors.policies import policy_duty
from sensors.reclaim import reclaim_duty
from sensors.redispatch import redispatch_duty
from sensors.support import Duty, ledger_sensor
from sensors.waiters import waiter_duty

KEEPER_SENSOR: Final = "ledger_sensor"
#: How often the keeper runs on 15-minute slots: each duty's delay is at most this
#: (docs/operations.md). ``keeper_interval_seconds`` gives it for any slot.
KEEPER_INTERVAL_SECONDS: Final = 60
_SHORTEST_INTERVAL: Final = 30


def keeper_interval_seconds(slot_minutes: int) -> int:
    """The keeper's default interval: a quarter of a slot, from 30 to 60 s -- 60 s on 5-minute
    slots and longer, 30 s on 1-minute slots, where a 60 s keeper would hardly ever
    re-dispatch a failed launch within its slot. ``DUELEDGER_KEEPER_INTERVAL_SECONDS``
    overrides it."""
    return max(_SHORTEST_INTERVAL, min(KEEPER_INTERVAL_SECONDS, slot_minutes * 60 // 4))


@dataclass(frozen=True)
class _DutyView:
    """A duty's view of the tick: the keeper's instance and log, the duty's own cursor."""

    instance: dg.DagsterInstance
    log: Any
    cursor: str | None


def keeper_duties(views: Sequence[TaskView]) -> list[Duty]:
    """The duties of the keeper, in the order each tick runs them: outcomes and reclaim
    first (they end entries), then the policies that read those ends (pause after failures),
    then slot health (which reports them), then re-dispatch, then the waiters whose task an
    ended entry freed this very tick."""
    duties = [outcome_duty(views), reclaim_duty(), policy_duty(views), slot_health_duty(views)]
    if views:
        duties += [redispatch_duty(views), waiter_duty(views)]
    return duties


def _cursors(text: str | None) -> dict[str, str]:
    """Each duty's cursor, from the keeper's; none when unset or garbled."""
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def build_keeper_sensor(
    views: Sequence[TaskView],
    *,
    clock: Clock = utc_now,
    minimum_interval_seconds: int = KEEPER_INTERVAL_SECONDS,
) -> dg.SensorDefinition:
    """``ledger_sensor``: every duty of :func:`keeper_duties` each tick."""
    duties = keeper_duties(views)
    said = " ".join(f"{d.name}: {d.description}" for d in duties)

    @ledger_sensor(
        KEEPER_SENSOR,
        clock=clock,
        minimum_interval_seconds=minimum_interval_seconds,
        jobs=[task_job(v) for v in views],
        description=f"Keeps the ledger true, one duty after another each tick. {said}",
    )
    def ledger_sensor_body(
        context: dg.SensorEvaluationContext, ledger: RunLedger, now: datetime
    ) -> dg.SensorResult:
        cursors = _cursors(context.cursor)
        requests: list[dg.RunRequest] = []
        events: list[Any] = []
        reasons: list[str] = []
        failed: list[str] = []
        for duty in duties:
            view = _DutyView(context.instance, context.log, cursors.get(duty.name))
            try:
                result = duty.body(view, ledger, now)
            except Exception as exc:
                context.log.error(
                    f"{KEEPER_SENSOR}: duty {duty.name} failed; the other duties ran, and it "
                    f"runs again next tick:\n{traceback.format_exc()}"
                )
                failed.append(f"FAILED {duty.name}: {type(exc).__name__}: {exc}")
                continue
            if isinstance(result, dg.SkipReason):
                reasons.append(f"{duty.name}: {result.skip_message}")
                continue
            if result.cursor is not None:
                cursors[duty.name] = result.cursor
            requests += list(result.run_requests or [])
            events += list(result.asset_events or [])
            if result.skip_reason is not None:
                reasons.append(f"{duty.name}: {result.skip_reason.skip_message}")
        said_tick = "; ".join([*failed, *reasons])
        cursor = json.dumps(cursors, sort_keys=True)
        if requests:
            context.log.info(said_tick)
            return dg.SensorResult(run_requests=requests, asset_events=events, cursor=cursor)
        return dg.SensorResult(skip_reason=said_tick, asset_events=events, cursor=cursor)

    return ledger_sensor_body
