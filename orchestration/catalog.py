"""The task catalog as this process sees it: registry + slot + timezone, and resources.

Kept apart from ``definitions.py`` so that the CLI and the tests can ask the same
questions (which tasks, which cadences, which database) without building Definitions.
"""

from __future__ import annotations

import os

import dagster as dg

from orchestration.services.task_plugins import TaskAssetLike, task_registry
from resources.core.registry import TaskSpec, TaskView, build_views
from resources.core.settings import ENV_DATABASE_URL, ENV_SOURCE_URL, Settings, load_settings
from resources.ledger import RunLedger
from resources.notifier import OutboxNotifier
from resources.source_store import SourceStore

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


def plugin_task_assets(settings: Settings | None = None) -> tuple[TaskAssetLike, ...]:
    """The task assets of the registered plugin tasks (``orchestration/services/task_plugins.py``),
    to build against the code location's hooks like the core task assets."""
    return task_registry(settings).plugin_assets


def build_resources(settings: Settings | None = None) -> dict[str, dg.ConfigurableResource]:
    """The platform's resources: ledger, source store, notifier (the domain adds its
    business rules, ``assets.domain_config.domain_resources``).

    Database URLs given through the environment stay ``dg.EnvVar`` references, so a
    production password never appears in the UI's resource config; the local default is
    a plain SQLite path under DAGSTER_HOME.
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
