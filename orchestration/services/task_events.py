"""Plugin hook events around a task run (``task_before``, ``task_after``, ``task_failed``) and
the creation outcomes a schedule/sensor run carries: fired with the run's claimed entry as
context, stored on the entry, and never a reason for the task to fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from orchestration.manual_launch import EntryRequest
from orchestration.services.hooks.firing import Dispatch
from orchestration.services.hooks.records import decode_outcomes, record
from orchestration.services.hooks.registry import Hooks
from orchestration.services.hooks.vocabulary import TAG_HOOKS, HookContext
from resources.core.due import floor_to_slot, format_due
from resources.core.entry import Entry, Trigger
from resources.core.settings import load_settings
from resources.ledger import Ledger

if TYPE_CHECKING:
    import dagster as dg


def fire_task_event(
    context: dg.AssetExecutionContext,
    ledger: Ledger,
    hooks: Hooks,
    event: str,
    entry: Entry,
    as_of: datetime | None,
    **extra: Any,
) -> Dispatch | None:
    """Fire a hook event for this run (task, trigger and due from its claimed ``entry``)
    and store its outcomes on the entry; None when no listener wants the event. Never
    raises: whatever goes wrong is logged, and the task goes on."""
    try:
        if not hooks.wants(event):
            return None  # the common case: no context to build, nothing to store
        hook_context = _hook_context(
            event, context.run.run_id, entry, as_of, context.run.tags, **extra
        )
        return hooks.fire_and_record(hook_context, ledger, log=context.log)
    except Exception as exc:
        context.log.warning(f"hook event {event} not fired: {type(exc).__name__}: {exc}")
        return None


def record_creation_hooks(
    context: dg.AssetExecutionContext, ledger: Ledger, request: EntryRequest, entry: Entry
) -> None:
    """A schedule/sensor run's creation outcomes (``dueledger/hooks`` tag) onto its entry,
    once: at the first attempt (automatic retries copy the tag)."""
    if request.trigger not in (Trigger.SCHEDULE, Trigger.SENSOR) or entry.attempt != 1:
        return
    items = decode_outcomes(context.run.tags.get(TAG_HOOKS))
    if items:
        record(ledger, entry.id, items, log=context.log)


def _hook_context(
    event: str,
    run_id: str,
    entry: Entry,
    as_of: datetime | None,
    tags: Mapping[str, str],
    **extra: Any,
) -> HookContext:
    due = format_due(entry.due) if entry.due is not None else None
    slot = due
    if slot is None and as_of is not None:
        slot = format_due(floor_to_slot(as_of, load_settings().slot_minutes))
    return HookContext(
        event=event,
        task_key=entry.task_key,
        trigger=entry.trigger,
        due=due,
        slot=slot,
        entry_id=entry.id,
        attempt=entry.attempt,
        run_id=run_id,
        tags=tags,
        **extra,
    )
