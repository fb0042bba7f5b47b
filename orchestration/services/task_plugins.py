"""Plugin tasks: tasks an installed package contributes through the entry-point group
``dueledger.tasks``, registered only when an allow-list names them.

A plugin package declares an entry point in group ``dueledger.tasks`` that names a
:class:`PluginTask` (a :class:`~resources.core.registry.TaskSpec` and the task's asset, made
with ``orchestration.task_asset.task_asset``), a list of them, or a zero-argument function
returning either. The code location registers a plugin task only when
``DUELEDGER_PLUGIN_TASKS`` (comma-separated) or ``[tasks] allow = [...]`` in the TOML file
named by ``DUELEDGER_HOOKS_FILE`` names it: by task key, entry-point name or distribution
name. A task that is installed but not allowed is listed (``dueledger tasks``) and not
registered.

:func:`registered_tasks` is *the* answer to "which tasks are registered": the core tasks of
``orchestration/tasks.py`` followed by the allowed plugin tasks. The task assets, the claim
wrapper, the catalog (jobs, schedules, sensors, checks) and the CLI all ask it.

Nothing here raises for a plugin's sake: an entry point that fails to import, an object that
is not a plugin task, a spec that fails validation (the same ``validate_spec`` as the core
tasks), an asset that does not fit its spec, a key that is already registered -- each
becomes a :class:`PluginLoadError`, logged as one JSON line (logger ``dueledger.tasks``) and
listed by ``dueledger tasks`` / ``dueledger hooks --json``, and the code location loads
without that task. This module imports no Dagster itself; the plugins it loads do (their
assets are Dagster assets), which is why it sits in the services layer, not in the core.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import re
import sys
import threading
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Protocol, runtime_checkable

from orchestration.services.hooks import ENV_HOOKS_FILE, Hooks
from orchestration.services.hooks.loading import plugin_items
from orchestration.services.hooks.model import cut_text, error_text
from orchestration.task_spec import TaskSpec, TaskSpecError, find_task, validate_spec
from orchestration.tasks import TASKS
from resources.core.config_files import ConfigFileError, read_config_file
from resources.core.settings import ENV_PLUGIN_TASKS, Settings, load_settings
from resources.core.tags import SOURCE_CORE, SOURCE_PLUGIN_PREFIX
from resources.core.text import printable

ENTRY_POINT_GROUP: Final = "dueledger.tasks"
LOGGER: Final = logging.getLogger("dueledger.tasks")
#: The table of the DUELEDGER_HOOKS_FILE that holds the task allow-list.
CONFIG_TABLE: Final = "tasks"
_CONFIG_KEYS: Final = frozenset({"allow"})
#: Where a load error comes from.
ERROR_ENTRY_POINT: Final = "entry_point"
ERROR_CONFIG: Final = "config"
ERROR_ALLOW_LIST: Final = "allow_list"
#: What the code location's Definitions provide (``orchestration.catalog.build_resources``
#: and ``assets.domain_config.domain_resources``) plus Dagster's default io_manager: a
#: plugin asset needing any other resource would stop the whole code location from loading.
LOCATION_RESOURCE_KEYS: Final = frozenset({"ledger", "source", "notifier", "rules", "io_manager"})


@runtime_checkable
class TaskAssetLike(Protocol):
    """What ``orchestration.task_asset.task_asset`` makes (a ``TaskAsset``): the loader
    checks the shape without importing the Dagster shell."""

    @property
    def task_key(self) -> str: ...

    def build(self, hooks: Hooks, *, spec: TaskSpec | None = None) -> Any: ...


@dataclass(frozen=True)
class PluginTask:
    """One task a plugin contributes: its spec and its asset.

    ``asset`` is made with ``@task_asset(spec.key, ...)`` exactly like a core task's; the
    spec is validated like a core spec (``registry.validate_spec``).
    """

    spec: TaskSpec
    asset: TaskAssetLike


@dataclass(frozen=True)
class PluginOrigin:
    """Where a plugin task came from: its entry point and the distribution shipping it."""

    entry_point: str
    target: str
    distribution: str | None = None
    version: str | None = None

    @property
    def name(self) -> str:
        """The plugin's name: its distribution (what is installed), else its entry point."""
        return self.distribution or self.entry_point

    @property
    def source(self) -> str:
        """``plugin:<name>``, the value of a task's ``source`` and of ``dueledger/source``."""
        return f"{SOURCE_PLUGIN_PREFIX}{self.name}"

    def label(self) -> str:
        return f"{self.source} (entry point {self.entry_point!r}, {self.target})"


@dataclass(frozen=True)
class PluginLoadError:
    """Something of a task plugin or of the allow-list that could not be used (never fatal)."""

    source: str  # entry_point, config or allow_list
    name: str  # the entry point, the config file or the allow-list name
    error: str
    target: str | None = None
    plugin: str | None = None  # plugin:<name>, when known
    task_key: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "name": self.name,
            "target": self.target,
            "plugin": self.plugin,
            "task_key": self.task_key,
            "error": self.error,
        }


@dataclass(frozen=True)
class FoundTask:
    """A valid plugin task, registered or not (``allowed``)."""

    spec: TaskSpec
    asset: TaskAssetLike
    origin: PluginOrigin
    allowed: bool
    #: The Dagster asset the loader built to check it, against the registry's ``hooks``.
    built: Any = field(default=None, compare=False, repr=False)

    def as_json(self) -> dict[str, Any]:
        return {
            "key": self.spec.key,
            "source": self.origin.source,
            "entry_point": self.origin.entry_point,
            "target": self.origin.target,
            "distribution": self.origin.distribution,
            "version": self.origin.version,
            "allowed": self.allowed,
        }


@dataclass(frozen=True)
class TaskRegistry:
    """The registered tasks of this process (core, then allowed plugin tasks), every plugin
    task found, and what could not be loaded."""

    tasks: tuple[TaskSpec, ...]
    found: tuple[FoundTask, ...] = ()
    load_errors: tuple[PluginLoadError, ...] = ()
    allow: tuple[str, ...] = ()
    config_file: str | None = None
    #: The environment's listeners (loaded on first use) the plugin assets were built against.
    hooks: Hooks | None = field(default=None, compare=False, repr=False)

    @property
    def plugin_assets(self) -> tuple[TaskAssetLike, ...]:
        """The assets of the registered plugin tasks, to build into the code location."""
        return tuple(f.asset for f in self.found if f.allowed)

    @property
    def not_allowed(self) -> tuple[FoundTask, ...]:
        """Plugin tasks installed but not registered: the allow-list does not name them."""
        return tuple(f for f in self.found if not f.allowed)

    def source_of(self, task_key: str) -> str | None:
        """``core`` or ``plugin:<name>`` of a registered task; None when it is not one."""
        spec = find_task(self.tasks, task_key)
        return spec.source if spec is not None else None

    def why_unregistered(self, task_key: str, recorded_source: str | None = None) -> str:
        """Why ``task_key`` is not registered, as one sentence naming its plugin when known.

        ``recorded_source`` is the ``dueledger/source`` its runs carried (the plugin may be
        gone from this environment, so only its runs still name it).
        """
        waiting = next((f for f in self.not_allowed if f.spec.key == task_key), None)
        if waiting is not None:
            origin = waiting.origin
            return (
                f"task {task_key!r} comes from {origin.label()}, which is installed but not "
                f"allowed: add {origin.entry_point!r} or {task_key!r} to {ENV_PLUGIN_TASKS} "
                f"(or to [tasks] allow in the {ENV_HOOKS_FILE} file) and reload the code location"
            )
        plugin = recorded_source if _is_plugin_source(recorded_source) else None
        broken = next(
            (
                e
                for e in self.load_errors
                if e.source == ERROR_ENTRY_POINT
                and ((plugin and e.plugin == plugin) or (e.task_key == task_key))
            ),
            None,
        )
        if broken is not None:
            return (
                f"task {task_key!r} comes from {broken.plugin or plugin}, which failed to load "
                f"in this code location ({broken.error}); `dueledger tasks` lists load errors"
            )
        if plugin is not None:
            return (
                f"task {task_key!r} came from {plugin}, which this code location no longer "
                f"has: the plugin was uninstalled or no longer provides the task; reinstall "
                f"and allow it ({ENV_PLUGIN_TASKS}) to run the task again"
            )
        return (
            f"task {task_key!r} is no longer registered in orchestration/tasks.py nor by an "
            f"allowed plugin (`dueledger tasks` lists what is)"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "entry_point_group": ENTRY_POINT_GROUP,
            "allow_env": ENV_PLUGIN_TASKS,
            "allow": list(self.allow),
            "config_file": self.config_file,
            "tasks": [f.as_json() for f in self.found],
            "load_errors": [e.as_json() for e in self.load_errors],
        }


def _is_plugin_source(source: str | None) -> bool:
    return bool(source) and str(source).startswith(SOURCE_PLUGIN_PREFIX)


def _names_of(error: PluginLoadError) -> set[str]:
    """The (normalised) names an allow-list could use for the plugin of a load error."""
    if error.source != ERROR_ENTRY_POINT:
        return set()
    names = {error.name, error.task_key or ""}
    if error.plugin:
        names.add(error.plugin[len(SOURCE_PLUGIN_PREFIX) :])
    return {_norm(n) for n in names if n}


def _norm(name: str) -> str:
    """Compare names the way package names compare: case and ``-_.`` runs do not matter."""
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def _error_text(exc: BaseException) -> str:
    return cut_text(error_text(exc), 500)


# --- the allow-list -------------------------------------------------------------------------------


def _config_allow(path: Path, errors: list[PluginLoadError]) -> list[str]:
    """``[tasks] allow = [...]`` of the DUELEDGER_HOOKS_FILE (a missing table: nothing)."""
    where = f"{ENV_HOOKS_FILE}={printable(str(path))}"
    try:
        data = tomllib.loads(read_config_file(path, where))  # bounded: /dev/zero fails fast
    except FileNotFoundError:
        errors.append(PluginLoadError(ERROR_CONFIG, str(path), f"{where}: file does not exist"))
        return []
    except (ConfigFileError, tomllib.TOMLDecodeError) as exc:
        text = str(exc) if isinstance(exc, ConfigFileError) else f"{where}: {_error_text(exc)}"
        errors.append(PluginLoadError(ERROR_CONFIG, str(path), text))
        return []
    table = data.get(CONFIG_TABLE, {})
    if not isinstance(table, Mapping):
        errors.append(PluginLoadError(ERROR_CONFIG, str(path), f"{where}: [tasks] must be a table"))
        return []
    unknown = sorted(set(table) - _CONFIG_KEYS)
    if unknown:
        errors.append(
            PluginLoadError(
                ERROR_CONFIG,
                str(path),
                f"{where}: unknown key(s) {', '.join(unknown)} in [tasks] ignored; known: allow",
            )
        )
    allow = table.get("allow", [])
    if not isinstance(allow, list) or not all(isinstance(x, str) for x in allow):
        errors.append(
            PluginLoadError(
                ERROR_CONFIG, str(path), f"{where}: [tasks] allow must be a string list"
            )
        )
        return []
    return allow


def allow_list(
    environ: Mapping[str, str], errors: list[PluginLoadError]
) -> tuple[tuple[str, ...], str | None]:
    """The names the allow-list holds (``DUELEDGER_PLUGIN_TASKS`` and ``[tasks] allow``), and
    the config file read (None: none is set)."""
    names = [x.strip() for x in (environ.get(ENV_PLUGIN_TASKS) or "").split(",")]
    raw_path = (environ.get(ENV_HOOKS_FILE) or "").strip()
    path = Path(raw_path).expanduser() if raw_path else None
    if path is not None:
        names += [x.strip() for x in _config_allow(path, errors)]
    return tuple(dict.fromkeys(x for x in names if x)), str(path) if path else None


def _allowed(allow: Iterable[str], origin: PluginOrigin, task_key: str) -> bool:
    wanted = {_norm(x) for x in allow}
    names = {task_key, origin.entry_point, *([origin.distribution] if origin.distribution else [])}
    return any(_norm(n) in wanted for n in names)


# --- checking what a plugin gives -------------------------------------------------------------


def _as_plugin_tasks(obj: Any, what: str) -> list[PluginTask]:
    return plugin_items(
        obj,
        PluginTask,
        what,
        "not a plugin task; return orchestration.plugins.PluginTask(spec, asset) or a list of them",
    )


def _check_asset(task: PluginTask, built: Any) -> str | None:
    """What is wrong with the Dagster asset a plugin task's asset builds (None: nothing)."""
    spec = task.spec
    keys = [k.to_user_string() for k in getattr(built, "keys", ())]
    if keys != [spec.asset]:
        return (
            f"builds asset(s) {keys} but the spec's asset is {spec.asset!r}; name the task "
            f"asset after the task (no key_prefix)"
        )
    partitioned = getattr(built, "partitions_def", None) is not None
    if partitioned != (spec.partitions is not None):
        return (
            f"the spec says partitions={spec.partitions!r} but the asset is "
            f"{'partitioned' if partitioned else 'not partitioned'}"
        )
    missing = sorted(set(getattr(built, "required_resource_keys", ())) - LOCATION_RESOURCE_KEYS)
    if missing:
        return (
            f"needs resource(s) {', '.join(missing)} that the code location does not provide "
            f"(available: {', '.join(sorted(LOCATION_RESOURCE_KEYS))})"
        )
    return None


def _checked(
    task: PluginTask, origin: PluginOrigin, slot_minutes: int, hooks: Hooks
) -> tuple[TaskSpec, Any] | str:
    """The task's spec (its source set) and its asset built against ``hooks`` when spec and
    asset are valid, else the load error text naming the plugin, the task and the field."""
    spec = task.spec
    if not isinstance(spec, TaskSpec):
        return f"plugin task of {origin.label()}: spec: {spec!r} is not a TaskSpec"
    what = f"{origin.label()}, task {spec.key!r}"
    try:
        # The loader sets the source; a plugin cannot claim to be core.
        spec = replace(spec, source=origin.source)
        validate_spec(spec, slot_minutes)
    except TaskSpecError as exc:
        return f"{what}: {exc.field_name}: {exc.problem} (fix the plugin's TaskSpec)"
    except Exception as exc:  # a spec odd enough to break validation itself
        return f"{what}: spec: {_error_text(exc)}"
    asset = task.asset
    if not isinstance(asset, TaskAssetLike):
        return (
            f"{what}: asset: {asset!r} is not a task asset; make it with "
            f"@orchestration.task_asset.task_asset({spec.key!r}, ...)"
        )
    if asset.task_key != spec.key:
        return f"{what}: asset: it is the asset of task {asset.task_key!r}, not {spec.key!r}"
    try:
        # Built to check it, against the registry's hooks; the code location uses this build.
        built = asset.build(hooks, spec=spec)
    except Exception as exc:
        return f"{what}: asset: building it failed: {_error_text(exc)}"
    problem = _check_asset(task, built)
    return f"{what}: asset: {problem}" if problem else (spec, built)


# --- loading ----------------------------------------------------------------------------------


def _origin(ep: importlib.metadata.EntryPoint) -> PluginOrigin:
    dist = getattr(ep, "dist", None)
    try:
        name = dist.name if dist is not None else None
        version = dist.version if dist is not None else None
    except Exception:  # a distribution with broken metadata still has an entry point name
        name = version = None
    return PluginOrigin(ep.name, ep.value, name, version)


def load_task_registry(
    *,
    slot_minutes: int,
    core: Sequence[TaskSpec] = TASKS,
    environ: Mapping[str, str] | None = None,
    entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
    log_errors: bool = True,
) -> TaskRegistry:
    """Load every plugin task of group ``dueledger.tasks`` and decide which are registered.

    Uncached (see :func:`task_registry`). Never raises for a plugin's sake. Entry points are
    read in (name, target) order; a plugin task whose key is a core task's is refused, and
    of two allowed plugin tasks with one key the first registers and the second is refused,
    each with a load error naming both sources.
    """
    environ = os.environ if environ is None else environ
    hooks = Hooks.from_environment()
    errors: list[PluginLoadError] = []
    allow, config_file = allow_list(environ, errors)
    if entry_points is None:
        try:
            entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        except Exception as exc:  # broken metadata of some installed distribution
            errors.append(PluginLoadError(ERROR_ENTRY_POINT, ENTRY_POINT_GROUP, _error_text(exc)))
            entry_points = ()
    sources = {spec.key: SOURCE_CORE for spec in core}
    registered = list(core)
    found: list[FoundTask] = []
    for ep in sorted(entry_points, key=lambda e: (e.name, e.value)):
        origin = _origin(ep)
        try:
            items = _as_plugin_tasks(ep.load(), f"entry point {ep.name!r} ({ep.value})")
        except (Exception, SystemExit) as exc:  # a plugin's import must never stop us
            errors.append(
                PluginLoadError(
                    ERROR_ENTRY_POINT, ep.name, _error_text(exc), ep.value, origin.source
                )
            )
            continue
        for item in items:
            outcome = _checked(item, origin, slot_minutes, hooks)
            key = str(getattr(item.spec, "key", "?"))
            if isinstance(outcome, str):
                errors.append(
                    PluginLoadError(
                        ERROR_ENTRY_POINT, ep.name, outcome, ep.value, origin.source, key
                    )
                )
                continue
            checked, built = outcome
            allowed = _allowed(allow, origin, key)
            earlier = sources.get(key) if (allowed or sources.get(key) == SOURCE_CORE) else None
            if earlier is not None:
                where = "orchestration/tasks.py" if earlier == SOURCE_CORE else "an earlier plugin"
                errors.append(
                    PluginLoadError(
                        ERROR_ENTRY_POINT,
                        ep.name,
                        f"{origin.label()}, task {key!r}: key: already registered by {earlier} "
                        f"({where}); the plugin's task is not loaded -- rename it in the plugin",
                        ep.value,
                        origin.source,
                        key,
                    )
                )
                continue
            if allowed:
                sources[key] = origin.source
                registered.append(checked)
            found.append(FoundTask(checked, item.asset, origin, allowed, built))
    for name in allow:
        # A name of a plugin that failed to load has its own load error already.
        known = any(_allowed([name], f.origin, f.spec.key) for f in found) or any(
            _norm(name) in _names_of(e) for e in errors
        )
        if not known:
            errors.append(
                PluginLoadError(
                    ERROR_ALLOW_LIST,
                    name,
                    f"the allow-list ({ENV_PLUGIN_TASKS} / [tasks] allow) names {name!r}, which "
                    f"is no installed task plugin, entry point or plugin task",
                )
            )
    registry = TaskRegistry(
        tuple(registered), tuple(found), tuple(errors), allow, config_file, hooks
    )
    if log_errors:
        for problem in registry.load_errors:
            LOGGER.warning(
                json.dumps({"task_plugin_load_error": problem.as_json()}, separators=(",", ":"))
            )
    return registry


@dataclass
class _Cache:
    key: tuple[Any, ...] | None = None
    registry: TaskRegistry | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)


_CACHE = _Cache()


def task_registry(settings: Settings | None = None, *, log_errors: bool = True) -> TaskRegistry:
    """The registered tasks of this process, loaded once.

    Loaded again only when what decides it changes: the slot length (validation), the
    allow-list variables, or ``sys.path`` (where entry points are found). Installing,
    upgrading or removing a plugin takes a restart or reload of the code location, like any
    code change. ``log_errors``: log load errors when this call is the one that loads.
    """
    settings = settings or load_settings()
    key = (
        settings.slot_minutes,
        os.environ.get(ENV_PLUGIN_TASKS),
        os.environ.get(ENV_HOOKS_FILE),
        tuple(sys.path),
    )
    with _CACHE.lock:
        if _CACHE.key != key or _CACHE.registry is None:
            _CACHE.registry = load_task_registry(
                slot_minutes=settings.slot_minutes, log_errors=log_errors
            )
            _CACHE.key = key
        return _CACHE.registry


def registered_tasks(settings: Settings | None = None) -> tuple[TaskSpec, ...]:
    """Every registered task: the core tasks (orchestration/tasks.py), then the allowed
    plugin tasks. The one answer to "is this task registered?" in every process."""
    return task_registry(settings).tasks


__all__ = [
    "ENTRY_POINT_GROUP",
    "LOCATION_RESOURCE_KEYS",
    "FoundTask",
    "PluginLoadError",
    "PluginOrigin",
    "PluginTask",
    "TaskAssetLike",
    "TaskRegistry",
    "allow_list",
    "load_task_registry",
    "registered_tasks",
    "task_registry",
]
