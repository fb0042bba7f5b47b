"""Slot tick tasks: each fires one plugin hook event per slot (see docs/plugins.md).

``tick_every_slot`` fires ``tick.every_slot``; the legacy ``tick_every_minute`` and
``tick_every_five_minutes`` fire ``tick.every_minute`` / ``tick.every_five_minutes``. They are
ordinary tasks (registry entries in ``orchestration/tasks.py``, a due-keyed schedule each,
a ledger entry per slot), so an event fires at most once per slot, its listeners get the
slot's entry, and every outcome is stored on that entry.
"""

from collections.abc import Iterator

import dagster as dg

from orchestration.services.hooks import (
    TICK_EVERY_FIVE_MINUTES,
    TICK_EVERY_MINUTE,
    TICK_EVERY_SLOT,
    Hooks,
)
from orchestration.services.runtime import TaskRun
from orchestration.services.task_events import fire_task_event
from orchestration.task_asset import TaskAsset, task_asset
from resources.core.due import format_due
from resources.ledger import RunLedger

GROUP = "dueledger_hooks"

#: Tick task key -> the hook event its run fires.
SLOT_TICKS: dict[str, str] = {
    "tick_every_slot": TICK_EVERY_SLOT,
    "tick_every_minute": TICK_EVERY_MINUTE,
    "tick_every_five_minutes": TICK_EVERY_FIVE_MINUTES,
}


def build_slot_tick_asset(task_key: str, event: str) -> TaskAsset:
    """The asset of one tick task: claim the slot's entry, fire ``event`` once."""

    @task_asset(
        task_key,
        group_name=GROUP,
        description=f"Fires the plugin hook event {event} once per slot (ledger-keyed).",
        kinds={"python"},
    )
    def _tick(
        context: dg.AssetExecutionContext, run: TaskRun, ledger: RunLedger, hooks: Hooks
    ) -> Iterator[dg.MaterializeResult]:
        dispatch = fire_task_event(context, ledger, hooks, event, run.entry, run.as_of)
        outcomes = dispatch.outcomes if dispatch is not None else ()
        yield dg.MaterializeResult(
            metadata={
                "event": event,
                "slot": format_due(run.as_of),
                "ledger_entry": run.entry.id,
                "listeners": len(outcomes),
                "outcomes": ", ".join(f"{o.listener}={o.outcome}" for o in outcomes),
            }
        )

    return _tick


SLOT_TICK_ASSETS = [build_slot_tick_asset(key, event) for key, event in SLOT_TICKS.items()]
