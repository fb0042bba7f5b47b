"""Test helpers for plugin hooks: registries of listeners built in code, a hooks object whose
listeners a test swaps, and task assets built against the environment's hooks.

Runtime code takes a ``Hooks`` object from where its process starts; these helpers are the
test side of that (they used to live in ``orchestration/hooks.py``).
"""

from __future__ import annotations

import dagster as dg

from orchestration.hooks import HookRegistry, Hooks, Listener
from orchestration.task_asset import TaskAsset


def registry_of(*listeners: Listener) -> HookRegistry:
    """A registry of listeners built in code (names must be unique)."""
    names = [x.name for x in listeners]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"listener names must be unique; repeated: {', '.join(dupes)}")
    return HookRegistry(tuple(listeners))


class SwappableHooks(Hooks):
    """Hooks whose listeners a test installs (``install``) and takes away (``reset``), so
    definitions built once at import fire whatever the current test installed."""

    def __init__(self) -> None:
        super().__init__(HookRegistry)
        self._installed = HookRegistry()

    @property
    def registry(self) -> HookRegistry:
        return self._installed

    def install(self, *listeners: Listener) -> None:
        self._installed = registry_of(*listeners)

    def reset(self) -> None:
        self._installed = HookRegistry()


def build(task: TaskAsset) -> dg.AssetsDefinition:
    """A task's asset as the code location builds it: with the environment's hooks
    (entry points and ``DUELEDGER_HOOKS_FILE``, loaded on first use)."""
    return task.build(Hooks.from_environment())
