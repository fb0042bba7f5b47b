"""The plugin authors' API: everything a plugin's code imports from dueledger, in one place.

A plugin (docs/plugins.md) contributes hook listeners (entry points ``dueledger.hooks``) or
whole tasks (entry points ``dueledger.tasks``: a package whose ``defs.yaml`` declares them,
their bodies beside it). Its code imports only from this module, so the code location may
move its internals without breaking an installed plugin -- the one module here that only
hands names on, on purpose::

    from orchestration.plugins import TaskRun, format_due
    from orchestration.plugins import listener, HookContext, allow, deny, BEFORE_TASK_CREATE
"""

from orchestration.services.hooks.firing import fire
from orchestration.services.hooks.registry import Hooks
from orchestration.services.hooks.vocabulary import (
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
    Listener,
    allow,
    degrade,
    deny,
    listener,
)
from orchestration.task_run import TaskRun
from resources.core.due import format_due

__all__ = [
    "AFTER_TASK_CREATE",
    "BEFORE_RENEWAL_FIRST_NOTICE",
    "BEFORE_TASK_CREATE",
    "EVENTS",
    "TASK_AFTER",
    "TASK_BEFORE",
    "TASK_FAILED",
    "TICK_EVERY_FIVE_MINUTES",
    "TICK_EVERY_MINUTE",
    "TICK_EVERY_SLOT",
    "Allow",
    "Degrade",
    "Deny",
    "HookContext",
    "HookRegistry",
    "HookResult",
    "Hooks",
    "Listener",
    "TaskRun",
    "allow",
    "degrade",
    "deny",
    "fire",
    "format_due",
    "listener",
]
