"""Code location for the daemon-level fault tests: the real ``order_cleanup`` task only.

Same asset, job, schedule and resources as ``orchestration.definitions`` (ledger and source
store from ``DUELEDGER_DATABASE_URL`` / ``DUELEDGER_SOURCE_URL``), without the other tasks,
so a sync-launched daemon iteration executes one run, and with the in-process executor so
that run does not spawn a step process (both only to keep the suite fast).
"""

import dagster as dg

from orchestration.declarations import registered_tasks, task_registry, task_views
from orchestration.definitions import build_resources
from orchestration.services.hooks.registry import Hooks
from orchestration.task_defs import task_definitions

TASK = "order_cleanup"
SCHEDULE = "order_cleanup_schedule"

((_declared, _view),) = [
    (d, v)
    for d, v in zip(task_registry().declared, task_views(), strict=True)
    if d.spec.key == TASK
]
defs = dg.Definitions.merge(
    task_definitions(_declared, _view, hooks=Hooks.from_environment(), registered=registered_tasks),
    dg.Definitions(resources=build_resources(), executor=dg.in_process_executor),
)
