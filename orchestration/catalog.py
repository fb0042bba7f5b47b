"""The task catalog as this process sees it: registry + slot + timezone, and resources.

Kept apart from ``definitions.py`` so that the CLI and the tests can ask the same
questions (which tasks, which cadences, which database) without building Definitions.
"""

from __future__ import annotations

import os

import dagster as dg

from orchestration.services.task_plugins import TaskAssetLike, task_registry
from resources.core.settings import ENV_DATABASE_URL, ENV_SOURCE_URL, Settings, load_settings
from resources.ledger import RunLedger
from resources.notifier import OutboxNotifier
from resources.source_store import SourceStore


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
