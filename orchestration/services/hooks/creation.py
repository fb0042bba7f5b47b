"""Creation hooks: ``before_task_create`` decides whether a request becomes a run (a deny
from a blocking listener, degrades adding tags), ``after_task_create`` hears that it did."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from orchestration.services.hooks.firing import Dispatch, fire
from orchestration.services.hooks.records import encode_outcomes
from orchestration.services.hooks.vocabulary import (
    AFTER_TASK_CREATE,
    BEFORE_TASK_CREATE,
    TAG_HOOKS,
    HookContext,
    HookLog,
    HookRegistry,
)
from resources.core import tags as t


def creation_context(tags: Mapping[str, str], *, run_id: str | None = None) -> HookContext:
    """The ``before_task_create`` context of a request, from its dueledger tags."""
    due = tags.get(t.TAG_DUE)
    return HookContext(
        event=BEFORE_TASK_CREATE,
        task_key=tags.get(t.TAG_TASK, ""),
        trigger=tags.get(t.TAG_TRIGGER),
        due=due,
        slot=due,
        run_id=run_id,
        tags=tags,
    )


@dataclass(frozen=True)
class CreationGate:
    """The creation hooks' verdict on one request: denied or not, and the run's tags."""

    before: Dispatch
    tags: Mapping[str, str]
    after: Dispatch | None = None

    @property
    def denied(self) -> bool:
        return self.before.denied

    @property
    def reason(self) -> str | None:
        return self.before.deny_reason

    def run_tags(self) -> dict[str, str]:
        """The tags to create the run with: the request's, honored degrades, and the
        creation outcomes (``dueledger/hooks``) for the run to store on its entry."""
        encoded = encode_outcomes([d for d in (self.before, self.after) if d is not None])
        return {**self.tags, TAG_HOOKS: encoded} if encoded else dict(self.tags)


def gate_creation(
    tags: Mapping[str, str],
    *,
    run_id: str | None = None,
    registry: HookRegistry,
    log: HookLog | None = None,
) -> CreationGate:
    """Fire ``before_task_create`` for a request with these tags: the verdict and the tags
    it may be created with (honored degrades added; nothing added when denied)."""
    before = fire(creation_context(tags, run_id=run_id), registry=registry, log=log)
    final = dict(tags) if before.denied else {**tags, **before.extra_tags}
    return CreationGate(before, final)


def announce_creation(
    gate: CreationGate,
    *,
    entry_id: int | None = None,
    run_id: str | None = None,
    registry: HookRegistry,
    log: HookLog | None = None,
) -> CreationGate:
    """Fire ``after_task_create`` for an allowed request; the gate with its outcomes."""
    context = gate.before.context.for_event(
        AFTER_TASK_CREATE,
        tags=gate.tags,
        entry_id=entry_id,
        run_id=run_id or gate.before.context.run_id,
    )
    return replace(gate, after=fire(context, registry=registry, log=log))
