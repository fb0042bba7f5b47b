"""The dueledger code location: assembles Definitions; decides nothing.

Loaded by `dg dev` / `dagster dev` through workspace.yaml and ``[tool.dg]`` (module
orchestration.definitions, attribute defs). Every task comes from its declaration -- the
``defs.yaml`` beside its body under ``assets/``, or an allowed plugin's
(``orchestration/declarations.py``) -- through the one factory (``orchestration/task_defs.py``).
"""

import os
from collections.abc import Callable

import dagster as dg

from assets.domain_config import domain_resources
from orchestration.checks import build_ledger_checks, build_task_checks
from orchestration.declarations import registered_tasks, task_registry, task_views
from orchestration.services.hooks.registry import Hooks
from orchestration.task_defs import task_definitions
from orchestration.task_spec import TaskSpec
from resources.core.settings import ENV_DATABASE_URL, ENV_SOURCE_URL, Settings, load_settings
from resources.ledger import RunLedger
from resources.notifier import OutboxNotifier
from resources.source_store import SourceStore
from sensors import build_sensors


def build_resources(settings: Settings | None = None) -> dict[str, dg.ConfigurableResource]:
    """The platform's resources: ledger, source store, notifier (the domain adds its business
    rules, ``assets.domain_config.domain_resources``).

    Database URLs given through the environment stay ``dg.EnvVar`` references, so a
    production password never appears in the UI's resource config; the local default is a
    plain SQLite path under DAGSTER_HOME.
    """
    settings = settings or load_settings()
    ledger_url = (
        dg.EnvVar(ENV_DATABASE_URL) if os.environ.get(ENV_DATABASE_URL) else settings.ledger_url
    )
    source_url = (
        dg.EnvVar(ENV_SOURCE_URL) if os.environ.get(ENV_SOURCE_URL) else settings.source_url
    )
    return {
        "ledger": RunLedger(database_url=ledger_url),
        "source": SourceStore(url=source_url),
        # Notifications go to the source store's outbox by default (a relay delivers
        # them); swap in resources.notifier.SmtpNotifier(...) to send email directly.
        "notifier": OutboxNotifier(),
    }


def build_definitions(
    settings: Settings, *, keep: Callable[[TaskSpec], bool] = lambda spec: True
) -> dg.Definitions:
    """The code location over the registered tasks ``keep`` keeps (all of them here; the scale
    benchmark keeps only its generated plugin tasks): each task's asset, job and schedule,
    the asset checks, the ledger sensors and the resources."""
    declared_views = [
        (declared, view)
        for declared, view in zip(
            task_registry(settings).declared, task_views(settings), strict=True
        )
        if keep(declared.spec)
    ]
    views = [view for _, view in declared_views]
    # The code location's plugin hooks, built once; listeners load on first use, not here.
    hooks = Hooks.from_environment()
    return dg.Definitions.merge(
        *(
            task_definitions(declared, view, hooks=hooks, registered=registered_tasks)
            for declared, view in declared_views
        ),
        dg.Definitions(
            asset_checks=[*build_task_checks(views), *build_ledger_checks(views)],
            sensors=build_sensors(views, interval_seconds=settings.keeper_interval_seconds),
            resources={**build_resources(settings), **domain_resources()},
            # Every run's steps in its run worker's process, the task jobs' and the implicit
            # asset job's alike (the Catalog's "Materialize"): one process per run, not two.
            executor=dg.in_process_executor,
        ),
    )


@dg.definitions
def defs() -> dg.Definitions:
    """The code location over every registered task, built when Dagster loads it (a code
    server, a run worker, `dg`), not when this module is imported: whoever only needs
    ``build_definitions`` or ``build_resources`` (a test's own location, the scale
    benchmark's) pays for one build, not two."""
    return build_definitions(load_settings())
