"""The hooks a code location fires: one :class:`Hooks` object, built once where the process
starts (``orchestration/definitions.py``, the CLI) and passed to every shell that fires an
event. It loads the plugin listeners on first use, not at import or definition load."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from orchestration.services.hooks.creation import CreationGate, announce_creation, gate_creation
from orchestration.services.hooks.firing import Dispatch, fire
from orchestration.services.hooks.loading import load_hooks
from orchestration.services.hooks.records import HookRecorder, fire_and_record
from orchestration.services.hooks.vocabulary import HookContext, HookLog, HookRegistry


class Hooks:
    """The plugin listeners of one process, loaded once (``load``, default: entry points and
    ``DUELEDGER_HOOKS_FILE``), and the events fired against them.

    Build it once where the process starts (the code location's ``definitions.py``, a CLI
    command) and pass it to what fires events; library code never looks one up.
    """

    def __init__(self, load: Callable[[], HookRegistry] = load_hooks) -> None:
        self._load = load
        self._registry: HookRegistry | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls) -> Hooks:
        """Listeners from the ``dueledger.hooks`` entry points and ``DUELEDGER_HOOKS_FILE``."""
        return cls(load_hooks)

    @classmethod
    def of(cls, registry: HookRegistry) -> Hooks:
        """Listeners built in code (a plugin's own tests, a location without plugins)."""
        return cls(lambda: registry)

    @property
    def registry(self) -> HookRegistry:
        """The loaded listeners, loaded on first use (thread-safe, once)."""
        with self._lock:
            if self._registry is None:
                self._registry = self._load()
            return self._registry

    def wants(self, event: str) -> bool:
        """Does any listener want ``event``? (Lets a caller skip building a context.)"""
        return bool(self.registry.for_event(event))

    def fire(self, context: HookContext, *, log: HookLog | None = None) -> Dispatch:
        """Every listener of ``context.event``, each isolated (see ``firing.fire``)."""
        return fire(context, registry=self.registry, log=log)

    def fire_and_record(
        self, context: HookContext, ledger: HookRecorder, *, log: HookLog | None = None
    ) -> Dispatch:
        """:meth:`fire`, then store the outcomes on ``context.entry_id``'s ledger entry."""
        return fire_and_record(context, ledger, registry=self.registry, log=log)

    def gate_creation(
        self, tags: Mapping[str, str], *, run_id: str | None = None, log: HookLog | None = None
    ) -> CreationGate:
        """``before_task_create`` for a request with these tags (see ``creation``)."""
        return gate_creation(tags, run_id=run_id, registry=self.registry, log=log)

    def announce_creation(
        self,
        gate: CreationGate,
        *,
        entry_id: int | None = None,
        run_id: str | None = None,
        log: HookLog | None = None,
    ) -> CreationGate:
        """``after_task_create`` for an allowed request (see ``creation``)."""
        return announce_creation(
            gate, entry_id=entry_id, run_id=run_id, registry=self.registry, log=log
        )
