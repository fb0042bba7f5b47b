"""Code location of the production topology test (tests/deploy/test_topology.py).

Production pieces only, fewer of them: the real ``order_cleanup`` and
``service_lifecycle_maintenance`` tasks from the registry (their assets, jobs, schedules and
resources exactly as ``orchestration.definitions`` builds them) and every ledger-keeping
sensor for them. The slot comes from ``DUELEDGER_SLOT_MINUTES`` (the test sets 1, so a due
arrives within a minute); the ledger and the source store from ``DUELEDGER_DATABASE_URL`` /
``DUELEDGER_SOURCE_URL``. The in-process executor keeps a run to one process (only to keep
the suite fast: the default executor starts a second process per run).
"""

import dagster as dg

from orchestration.declarations import registered_tasks, task_registry, task_views
from orchestration.definitions import build_resources
from orchestration.services.hooks.registry import Hooks
from orchestration.task_defs import task_definitions
from sensors import build_sensors

TASKS = ("order_cleanup", "service_lifecycle_maintenance")

_hooks = Hooks.from_environment()
_pairs = [
    (declared, view)
    for declared, view in zip(task_registry().declared, task_views(), strict=True)
    if declared.spec.key in TASKS
]
defs = dg.Definitions.merge(
    *(task_definitions(d, v, hooks=_hooks, registered=registered_tasks) for d, v in _pairs),
    dg.Definitions(
        sensors=build_sensors([v for _, v in _pairs]),
        resources=build_resources(),
        executor=dg.in_process_executor,
    ),
)
