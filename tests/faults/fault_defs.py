"""Code location for the daemon-level fault tests: the real ``order_cleanup`` task only.

Same asset, job, schedule and resources as ``orchestration.definitions`` (ledger and source
store from ``DUELEDGER_DATABASE_URL`` / ``DUELEDGER_SOURCE_URL``), without the other tasks,
so a sync-launched daemon iteration executes one run, and with the in-process executor so
that run does not spawn a step process (both only to keep the suite fast).
"""

import dagster as dg
from assets.automation import order_cleanup

from orchestration.declarations import task_views
from orchestration.definitions import build_resources
from orchestration.services.hooks import Hooks
from orchestration.task_defs import task_jobs_and_schedules

TASK = "order_cleanup"
SCHEDULE = "order_cleanup_schedule"

_hooks = Hooks.from_environment()
_jobs, _schedules = task_jobs_and_schedules(
    [v for v in task_views() if v.spec.key == TASK], hooks=_hooks
)

defs = dg.Definitions(
    assets=[order_cleanup.build(_hooks)],
    jobs=_jobs,
    schedules=_schedules,
    resources=build_resources(),
    executor=dg.in_process_executor,
)
