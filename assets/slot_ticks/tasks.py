"""Slot tick tasks: each fires one plugin hook event per slot (see docs/plugins.md).

``tick_every_slot`` fires ``tick.every_slot``; the legacy ``tick_every_minute`` and
``tick_every_five_minutes`` fire ``tick.every_minute`` / ``tick.every_five_minutes``. They are
ordinary tasks (declared in defs.yaml beside this file, a due-keyed schedule each, a ledger
entry per slot), so an event fires at most once per slot, its listeners get the slot's entry,
and every outcome is stored on that entry.
"""

from collections.abc import Iterator

import dagster as dg

from orchestration.services.hooks.registry import Hooks
from orchestration.services.hooks.vocabulary import (
    TICK_EVERY_FIVE_MINUTES,
    TICK_EVERY_MINUTE,
    TICK_EVERY_SLOT,
)
from orchestration.services.task_events import fire_task_event
from orchestration.task_run import TaskRun
from resources.core.due import format_due
from resources.ledger import RunLedger

MaterializeResults = Iterator[dg.MaterializeResult]


def _fire(
    event: str, context: dg.AssetExecutionContext, run: TaskRun, ledger: RunLedger, hooks: Hooks
) -> MaterializeResults:
    """Fire ``event`` once for the slot's claimed entry; its outcomes are the metadata."""
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


def tick_every_slot(
    context: dg.AssetExecutionContext, run: TaskRun, ledger: RunLedger, hooks: Hooks
) -> MaterializeResults:
    yield from _fire(TICK_EVERY_SLOT, context, run, ledger, hooks)


def tick_every_minute(
    context: dg.AssetExecutionContext, run: TaskRun, ledger: RunLedger, hooks: Hooks
) -> MaterializeResults:
    yield from _fire(TICK_EVERY_MINUTE, context, run, ledger, hooks)


def tick_every_five_minutes(
    context: dg.AssetExecutionContext, run: TaskRun, ledger: RunLedger, hooks: Hooks
) -> MaterializeResults:
    yield from _fire(TICK_EVERY_FIVE_MINUTES, context, run, ledger, hooks)
