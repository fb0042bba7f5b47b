"""Slot tick tasks: each fires one plugin hook event per slot (see docs/plugins.md).

``tick_every_slot`` fires ``tick.every_slot``; the legacy ``tick_every_minute`` and
``tick_every_five_minutes`` fire ``tick.every_minute`` / ``tick.every_five_minutes``. They are
ordinary tasks (registry entries in ``orchestration/tasks.py``, a due-keyed schedule each,
a ledger entry per slot), so an event fires at most once per slot, its listeners get the
slot's entry, and every outcome is stored on that entry.
"""

from collections.abc import Iterator

import dagster as dg

from orchestration import hooks
from orchestration.registry import require_task
from orchestration.runtime import fire_task_event, task_run
from orchestration.tasks import TASKS
from resources.core.slots import format_due
from resources.ledger import RunLedger

GROUP = "dueledger_hooks"

#: Tick task key -> the hook event its run fires.
SLOT_TICKS: dict[str, str] = {
    "tick_every_slot": hooks.TICK_EVERY_SLOT,
    "tick_every_minute": hooks.TICK_EVERY_MINUTE,
    "tick_every_five_minutes": hooks.TICK_EVERY_FIVE_MINUTES,
}


def build_slot_tick_asset(task_key: str, event: str) -> dg.AssetsDefinition:
    """The asset of one tick task: claim the slot's entry, fire ``event`` once."""

    @dg.asset(
        name=task_key,
        pool=task_key,  # one run of the task at a time (DESIGN: overlap)
        group_name=GROUP,
        output_required=False,
        description=f"Fires the plugin hook event {event} once per slot (ledger-keyed).",
        kinds={"python"},
    )
    def _tick(
        context: dg.AssetExecutionContext, ledger: RunLedger
    ) -> Iterator[dg.MaterializeResult]:
        spec = require_task(TASKS, task_key)
        with task_run(context, ledger, spec) as run:
            if not run.claimed:
                return
            dispatch = fire_task_event(context, ledger, event, run.entry, run.as_of)
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
