"""Test helpers for plugin hooks: registries of listeners built in code, a hooks object whose
listeners a test swaps, and task assets built against the environment's hooks.

Runtime code takes a ``Hooks`` object from where its process starts; these helpers are the
test side of that (they used to live in ``orchestration/services/hooks.py``).
"""

from __future__ import annotations

import time
from pathlib import Path

import dagster as dg

from orchestration.declarations import registered_tasks, task_registry
from orchestration.services.hooks.registry import Hooks
from orchestration.services.hooks.vocabulary import (
    ENV_HOOKS_FILE,
    HookContext,
    HookRegistry,
    HookResult,
    Listener,
    deny,
)
from orchestration.task_defs import task_asset


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


def build(task_key: str, hooks: Hooks | None = None) -> dg.AssetsDefinition:
    """A declared task's asset as the code location builds it: its declaration and body, with
    ``hooks`` (default: the environment's -- entry points and ``DUELEDGER_HOOKS_FILE``, loaded
    on first use)."""
    (declared,) = [d for d in task_registry().declared if d.spec.key == task_key]
    return task_asset(
        declared.spec,
        declared.body(),
        hooks=hooks or Hooks.from_environment(),
        registered=registered_tasks,
        **declared.asset_options,
    )


# --- plain listener functions a hooks file names by target ("hook_support:...") -------------

#: Every context the ``heard_*`` listeners got, in order (cleared by ``hooks_file``).
HEARD: list[HookContext] = []


def heard_allow(ctx: HookContext) -> None:
    """Remembers the context; no objection."""
    HEARD.append(ctx)


def heard_deny(ctx: HookContext) -> HookResult:
    """Remembers the context; denies, naming the customer."""
    HEARD.append(ctx)
    return deny(f"customer {ctx.data.get('customer_id')} renews by contract")


def raising(ctx: HookContext) -> None:
    """A listener whose own system is down."""
    raise RuntimeError("crm unreachable")


def sleeping(ctx: HookContext) -> None:
    """A listener that answers after 1 s (longer than the timeouts the tests give it)."""
    HEARD.append(ctx)
    time.sleep(1.0)


def hooks_file(path: Path, *listeners: dict[str, object]) -> dict[str, str]:
    """Write a ``DUELEDGER_HOOKS_FILE`` with these ``[[listeners]]`` tables; the environment
    variable to set. Clears ``HEARD``."""
    HEARD.clear()
    lines = []
    for item in listeners:
        lines.append("[[listeners]]")
        for key, value in item.items():
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, str):
                text = f'"{value}"'
            elif isinstance(value, list | tuple):
                text = "[" + ", ".join(f'"{v}"' for v in value) + "]"
            else:
                text = str(value)
            lines.append(f"{key} = {text}")
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return {ENV_HOOKS_FILE: str(path)}
