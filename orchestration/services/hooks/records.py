"""Where outcomes are kept: on the run's ledger entry (``summary.hooks``), and for a
schedule/sensor request in the ``dueledger/hooks`` tag until its run can store them."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from orchestration.services.hooks.firing import Dispatch, fire
from orchestration.services.hooks.vocabulary import (
    MAX_TAG_HOOKS_OUTCOMES,
    HookContext,
    HookLog,
    HookRegistry,
    bounded_text,
    emit,
    error_text,
)


class HookRecorder(Protocol):
    """The part of the ledger hooks write to (``Ledger.record_hook_result``)."""

    def record_hook_result(self, entry_id: int, result: dict[str, Any]) -> None: ...


def record(
    ledger: HookRecorder,
    entry_id: int,
    items: Iterable[Mapping[str, Any]],
    *,
    log: HookLog | None = None,
) -> None:
    """Store outcome records on the entry (``summary.hooks``, the ledger keeps the newest
    20). A ledger error is logged, never raised: hooks must not fail the task."""
    for item in items:
        try:
            ledger.record_hook_result(entry_id, dict(item))
        except Exception as exc:
            emit(
                log,
                logging.WARNING,
                {"hook_record_error": error_text(exc), "entry_id": entry_id, **dict(item)},
            )


def fire_and_record(
    context: HookContext,
    ledger: HookRecorder,
    *,
    registry: HookRegistry,
    log: HookLog | None = None,
) -> Dispatch:
    """:func:`fire`, then store the outcomes on ``context.entry_id``'s ledger entry."""
    dispatch = fire(context, registry=registry, log=log)
    if context.entry_id is not None and dispatch.outcomes:
        record(ledger, context.entry_id, dispatch.records(), log=log)
    return dispatch


def encode_outcomes(dispatches: Sequence[Dispatch]) -> str | None:
    """Creation outcomes as the ``dueledger/hooks`` tag value (None when there are none).

    Bounded: at most the last 10 outcomes, texts cut to 200 characters.
    """
    items = [r for d in dispatches for r in d.records()][-MAX_TAG_HOOKS_OUTCOMES:]
    if not items:
        return None
    for item in items:
        for key in ("reason", "error"):
            item[key] = bounded_text(item[key], 200)
        item["ignored_tags"] = [bounded_text(x, 200) for x in item["ignored_tags"] or []] or None
    return json.dumps(items, separators=(",", ":"))


def decode_outcomes(value: str | None) -> list[dict[str, Any]]:
    """Inverse of :func:`encode_outcomes`; anything unreadable gives [] (never raises)."""
    if not value:
        return []
    try:
        items = json.loads(value)
    except ValueError:
        return []
    if not isinstance(items, list):
        return []
    return [x for x in items if isinstance(x, dict)][:MAX_TAG_HOOKS_OUTCOMES]
