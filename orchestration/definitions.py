"""The dueledger code location: assembles Definitions; decides nothing.

Loaded by `dagster dev` through workspace.yaml (module orchestration.definitions,
attribute defs).
"""

import dagster as dg

from assets.automation import TASK_ASSETS
from assets.domain_assets import DOMAIN_ASSETS
from assets.domain_config import domain_resources
from assets.ledger_health import ledger_health
from assets.slot_ticks import SLOT_TICK_ASSETS
from orchestration.catalog import build_resources, location_hooks, plugin_task_definitions
from orchestration.checks import build_ledger_checks, build_task_checks
from orchestration.factory import build_task_definitions
from orchestration.services.task_plugins import TaskAssetLike
from orchestration.services.views import task_views
from resources.core.instants import utc_now
from resources.core.settings import load_settings
from sensors import SENSORS

_settings = load_settings()
# The code location's plugin hooks, built once; listeners load on first use, not here.
_hooks = location_hooks(_settings)
_views = task_views(_settings)
# The schedules' metadata lists each task's next dues as of this load.
_jobs, _schedules = build_task_definitions(_views, hooks=_hooks, loaded_at=utc_now())
_task_assets: list[TaskAssetLike] = [*TASK_ASSETS, *DOMAIN_ASSETS, ledger_health, *SLOT_TICK_ASSETS]

defs = dg.Definitions(
    # Core task assets, then those of the allowed plugin tasks (entry points
    # `dueledger.tasks`), which the registry built against these hooks while checking them.
    assets=[
        *(task.build(_hooks) for task in _task_assets),
        *plugin_task_definitions(_hooks, _settings),
    ],
    asset_checks=[*build_task_checks(_views), *build_ledger_checks(_views)],
    jobs=_jobs,
    schedules=_schedules,
    sensors=SENSORS,
    resources={**build_resources(_settings), **domain_resources()},
    # Every run's steps in its run worker's process, the task jobs' and the implicit asset
    # job's alike (the Catalog's "Materialize"): one process per run, not two.
    executor=dg.in_process_executor,
)
