"""The registered tasks as views (spec, schedule plan, cadences) for the configured slot and
time zone: what every reader of the task registry works from -- the code location, its
sensors, the CLI. No Dagster: `dueledger tasks` and `summary` load none.
"""

from __future__ import annotations

from orchestration.services.task_plugins import task_registry
from orchestration.task_spec import TaskSpec, TaskView, build_views
from resources.core.settings import Settings, load_settings

#: Views already built in this process, by (slot minutes, timezone, registered tasks).
#: Building them samples every cron rule's fires (most of a second of CPU for the registry),
#: and the code location asks for them more than once as it loads (jobs and schedules, the
#: sensors); the tasks and the settings are fixed for the process, so each combination is
#: built once.
_VIEWS: dict[tuple[int, str, tuple[TaskSpec, ...]], tuple[TaskView, ...]] = {}


def task_views(settings: Settings | None = None) -> list[TaskView]:
    """Validated tasks -- the registered ones: core, then allowed plugin tasks -- with their
    plans and cadences for the configured slot/timezone.

    Built once per slot/timezone in a process (the cadence warnings show on that first
    build); every call returns a new list of the same frozen views.
    """
    settings = settings or load_settings()
    tasks = task_registry(settings).tasks
    key = (settings.slot_minutes, settings.timezone, tasks)
    views = _VIEWS.get(key)
    if views is None:
        views = _VIEWS[key] = tuple(build_views(tasks, settings.slot_minutes, settings.timezone))
    return list(views)
