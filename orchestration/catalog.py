"""The task catalog as this process sees it: registry + slot + timezone, and resources.

Kept apart from ``definitions.py`` so that the CLI and the tests can ask the same
questions (which tasks, which cadences, which database) without building Definitions.
"""

from __future__ import annotations

import os
from typing import Any

import dagster as dg

from orchestration.services.hooks import Hooks
from orchestration.services.task_plugins import TaskRegistry, task_registry
from resources.core.settings import ENV_DATABASE_URL, ENV_SOURCE_URL, Settings, load_settings
from resources.ledger import RunLedger
from resources.notifier import OutboxNotifier
from resources.source_store import SourceStore


def location_hooks(settings: Settings | None = None) -> Hooks:
    """The code location's hooks: the environment's listeners (loaded on first use), the
    very object the registry built the plugin tasks' assets against."""
    return task_registry(settings).hooks or Hooks.from_environment()


def plugin_task_definitions(hooks: Hooks, settings: Settings | None = None) -> list[Any]:
    """The Dagster assets of the registered plugin tasks, firing ``hooks``."""
    return plugin_definitions(task_registry(settings), hooks)


def plugin_definitions(registry: TaskRegistry, hooks: Hooks) -> list[Any]:
    """``registry``'s plugin tasks' Dagster assets, firing ``hooks``: the ones the loader
    built to check them when ``hooks`` are the registry's own -- a code location builds
    each plugin task's asset once, not twice (at 500 plugin tasks the second build was a
    tenth of the load) -- else built now."""
    return [
        f.built
        if f.built is not None and hooks is registry.hooks
        else f.asset.build(hooks, spec=f.spec)
        for f in registry.found
        if f.allowed
    ]


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
