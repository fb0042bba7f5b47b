"""The plugin authors' API: everything a plugin imports from dueledger, in one place.

A plugin (docs/plugins.md) contributes hook listeners (entry points ``dueledger.hooks``)
or whole tasks (entry points ``dueledger.tasks``). It imports only from this module, so
the code location may move its internals (``orchestration/services/``,
``resources/core/``) without breaking an installed plugin::

    from orchestration.plugins import TaskSpec, EverySlots, PluginTask, task_asset, TaskRun
    from orchestration.plugins import listener, HookContext, allow, deny, BEFORE_TASK_CREATE
"""

from orchestration.services.hooks import (
    AFTER_TASK_CREATE,
    BEFORE_RENEWAL_FIRST_NOTICE,
    BEFORE_TASK_CREATE,
    EVENTS,
    TASK_AFTER,
    TASK_BEFORE,
    TASK_FAILED,
    TICK_EVERY_FIVE_MINUTES,
    TICK_EVERY_MINUTE,
    TICK_EVERY_SLOT,
    Allow,
    Degrade,
    Deny,
    HookContext,
    HookRegistry,
    HookResult,
    Hooks,
    Listener,
    allow,
    degrade,
    deny,
    fire,
    listener,
)
from orchestration.services.runtime import TaskRun
from orchestration.services.task_plugins import PluginTask
from orchestration.task_asset import task_asset
from orchestration.task_spec import PARTITIONS_DAILY, TaskSpec
from orchestration.timetable import Cron, EverySlots, NthSlotOfDay
from resources.core.due import format_due

__all__ = [
    "AFTER_TASK_CREATE",
    "BEFORE_RENEWAL_FIRST_NOTICE",
    "BEFORE_TASK_CREATE",
    "EVENTS",
    "PARTITIONS_DAILY",
    "TASK_AFTER",
    "TASK_BEFORE",
    "TASK_FAILED",
    "TICK_EVERY_FIVE_MINUTES",
    "TICK_EVERY_MINUTE",
    "TICK_EVERY_SLOT",
    "Allow",
    "Cron",
    "Degrade",
    "Deny",
    "EverySlots",
    "HookContext",
    "HookRegistry",
    "HookResult",
    "Hooks",
    "Listener",
    "NthSlotOfDay",
    "PluginTask",
    "TaskRun",
    "TaskSpec",
    "allow",
    "degrade",
    "deny",
    "fire",
    "format_due",
    "listener",
    "task_asset",
]
