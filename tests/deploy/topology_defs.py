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
from assets.automation import TASK_ASSETS

from orchestration.declarations import task_views
from orchestration.definitions import build_resources
from orchestration.services.hooks import Hooks
from orchestration.task_defs import task_jobs_and_schedules
from sensors import build_sensors

TASKS = ("order_cleanup", "service_lifecycle_maintenance")

_hooks = Hooks.from_environment()
_views = [v for v in task_views() if v.spec.key in TASKS]
_jobs, _schedules = task_jobs_and_schedules(_views, hooks=_hooks)

defs = dg.Definitions(
    assets=[task.build(_hooks) for task in TASK_ASSETS if task.task_key in TASKS],
    jobs=_jobs,
    schedules=_schedules,
    sensors=build_sensors(_views),
    resources=build_resources(),
    executor=dg.in_process_executor,
)
