"""Where tasks are declared, and which are registered: the ``defs.yaml`` beside each body.

A task is declared once, in the ``defs.yaml`` of the folder that holds its body -- a document
of the ``DueTask`` dg component (``orchestration/component.py``)::

    type: orchestration.component.DueTask
    attributes:
      key: order_cleanup
      rule: {every_slots: 1}
      declared_cadence: every slot
      timeout: 5m
      lease_ttl: 10m
      group_name: hosting_automation

Its body is the function named after the task in the folder's ``tasks.py``. A folder may
declare several tasks (one YAML document each, separated by ``---``). Two places hold such
folders:

- the project's ``assets/`` package: the core tasks, in folder order (``source`` ``core``);
- an installed **task plugin**: a package named by an entry point of group
  ``dueledger.tasks`` whose folder holds its ``defs.yaml``. A plugin task is registered only
  when an allow-list names it -- ``DUELEDGER_PLUGIN_TASKS`` (comma-separated) or ``[tasks]
  allow = [...]`` in the TOML file named by ``DUELEDGER_HOOKS_FILE`` -- by task key,
  entry-point name or distribution name; one that is installed but not allowed is listed
  (``dueledger tasks``) and not registered.

:func:`registered_tasks` is *the* answer to "which tasks are registered": the core tasks, then
the allowed plugin tasks. The code location, the claim path, the sensors and the CLI all ask
it. Reading a declaration needs no Dagster, so `dueledger tasks` and `summary` load none; a
plugin's body module is imported to check it (a plugin's code is what it is), a core task's
only by the code location that builds its asset.

A core declaration that does not hold stops the code location, naming the file, the task and
the field. Nothing of a plugin does: an entry point that is no package, a declaration that
fails validation (the same checks as a core task's), a body that is missing or needs a
resource the code location lacks, a key already registered -- each becomes a
:class:`PluginLoadError`, logged as one JSON line (logger ``dueledger.tasks``) and listed by
``dueledger tasks`` / ``dueledger hooks --json``, and the code location loads without it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import logging
import os
import re
import sys
import threading
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import yaml

from orchestration.services.hooks.vocabulary import ENV_HOOKS_FILE, cut_text, error_text
from orchestration.task_spec import (
    TaskSpec,
    TaskSpecError,
    TaskView,
    build_views,
    find_task,
    validate_spec,
)
from orchestration.timetable import Cron, EverySlots, NthSlotOfDay, Rule
from resources.core.config_files import ConfigFileError, read_config_file
from resources.core.settings import ENV_PLUGIN_TASKS, Settings, load_settings
from resources.core.tags import SOURCE_CORE, SOURCE_PLUGIN_PREFIX
from resources.core.text import printable

#: The dg component type a task's declaration names (``type:`` in its ``defs.yaml``).
COMPONENT_TYPE: Final = "orchestration.component.DueTask"
DEFS_FILE: Final = "defs.yaml"
#: The module of a task's folder that holds its body (the function named after the task).
BODY_MODULE: Final = "tasks"
#: The package whose folders declare the core tasks.
CORE_PACKAGE: Final = "assets"
ENTRY_POINT_GROUP: Final = "dueledger.tasks"
LOGGER: Final = logging.getLogger("dueledger.tasks")
#: The table of the DUELEDGER_HOOKS_FILE that holds the task allow-list.
CONFIG_TABLE: Final = "tasks"
_CONFIG_KEYS: Final = frozenset({"allow"})
#: Where a load error comes from.
ERROR_ENTRY_POINT: Final = "entry_point"
ERROR_CONFIG: Final = "config"
ERROR_ALLOW_LIST: Final = "allow_list"
#: What the code location's Definitions provide (``orchestration.definitions``) plus
#: Dagster's default io_manager: a task body needing any other resource would stop the whole
#: code location from loading.
LOCATION_RESOURCE_KEYS: Final = frozenset({"ledger", "source", "notifier", "rules", "io_manager"})
#: Body parameters that are not resources: the factory's, and the run's config.
_NOT_RESOURCES: Final = frozenset({"context", "run", "hooks", "config"})

#: ``5m``, ``1h30m``, ``90s``, ``7d``: the declaration's durations.
_DURATION = re.compile(r"^(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?$")
_DURATION_FIELDS: Final = ("timeout", "lease_ttl", "catch_up_window", "deadline", "retry_backoff")
_RULES: Final = {"cron": Cron, "every_slots": EverySlots, "nth_slot_of_day": NthSlotOfDay}
#: Attributes of a declaration that go to the task's asset, not its spec.
ASSET_FIELDS: Final = ("group_name", "kinds")
SPEC_FIELDS: Final = (
    "key",
    "rule",
    "declared_cadence",
    "description",
    *_DURATION_FIELDS,
    "max_attempts",
    "manual_trigger",
    "missed_slot_policy",
    "overlap_policy",
    "concurrent_safe",
    "pause_after_failures",
    "timezone",
    "partitions",
)


class DeclarationError(ValueError):
    """A ``defs.yaml`` does not hold a valid task; the message names the file, the task and
    the field, and the fix."""


# --- one declaration --------------------------------------------------------------------------


@dataclass(frozen=True)
class DeclaredTask:
    """A task as declared: its spec, the module that holds its body, its asset's options, and
    the file that declares it."""

    spec: TaskSpec
    module: str
    where: str
    asset_options: Mapping[str, Any] = field(default_factory=dict)

    def body(self) -> Callable[..., Any]:
        """The task's body: the function named after the task in its folder's module."""
        module = importlib.import_module(self.module)
        body = getattr(module, self.spec.key, None)
        if not inspect.isfunction(body):
            defined = sorted(
                n
                for n, v in vars(module).items()
                if inspect.isfunction(v) and v.__module__ == module.__name__ and n[0] != "_"
            )
            found = (
                "a Dagster asset"
                if hasattr(body, "keys")
                else ("nothing" if body is None else repr(body))
            )
            raise DeclarationError(
                f"{self.where}: task {self.spec.key!r}: asset: {self.module} has {found} named "
                f"{self.spec.key!r} (it defines {', '.join(defined) or 'no function'}); write the "
                f"body as `def {self.spec.key}(context, run: TaskRun, ...)` there -- the "
                f"declaration makes its asset, no @dg.asset or task_asset"
            )
        return body


def _duration(value: object, field_name: str) -> timedelta | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return timedelta(seconds=value)
    match = _DURATION.match(str(value).strip()) if isinstance(value, str) else None
    if not match or not any(match.groupdict().values()):
        raise ValueError(
            f"{field_name}: {value!r} is not a duration; write e.g. 90s, 5m, 1h30m or 7d"
        )
    parts = {k: int(v) for k, v in match.groupdict().items() if v}
    return timedelta(
        days=parts.get("d", 0),
        hours=parts.get("h", 0),
        minutes=parts.get("m", 0),
        seconds=parts.get("s", 0),
    )


def _rule(value: object) -> Rule:
    if not isinstance(value, Mapping) or len(value) != 1:
        raise ValueError(
            f"rule: {value!r} must name one rule: {{cron: '0 * * * *'}}, {{every_slots: 4}} "
            f"or {{nth_slot_of_day: 8}}"
        )
    ((kind, arg),) = value.items()
    if kind not in _RULES:
        raise ValueError(f"rule: unknown rule {kind!r}; use one of {', '.join(_RULES)}")
    return _RULES[kind](arg)


def spec_from_attributes(attributes: Mapping[str, Any]) -> tuple[TaskSpec, dict[str, Any]]:
    """A declaration's attributes -> the task's spec and its asset options (unvalidated: the
    caller validates, to word the error for where the declaration lives). Unknown attributes
    and missing required ones are a ValueError naming them."""
    unknown = sorted(set(attributes) - set(SPEC_FIELDS) - set(ASSET_FIELDS))
    if unknown:
        raise ValueError(
            f"unknown attribute(s) {', '.join(unknown)}; a task declares "
            f"{', '.join(SPEC_FIELDS + ASSET_FIELDS)}"
        )
    missing = [f for f in ("key", "rule", "declared_cadence") if f not in attributes]
    if missing:
        raise ValueError(f"missing attribute(s) {', '.join(missing)}")
    values: dict[str, Any] = {k: v for k, v in attributes.items() if k in SPEC_FIELDS}
    values["rule"] = _rule(values["rule"])
    for name in _DURATION_FIELDS:
        if name in values:
            values[name] = _duration(values[name], name)
    asset = {k: v for k, v in attributes.items() if k in ASSET_FIELDS}
    if "kinds" in asset:
        asset["kinds"] = set(asset["kinds"] or ())
    if values.get("description"):
        asset["description"] = str(values["description"]).strip()
    return TaskSpec(**values), asset


def read_declarations(folder: Path, package: str, *, source: str) -> list[DeclaredTask]:
    """The tasks declared in ``folder``/defs.yaml and in its subfolders (``package``: the
    folder's module path); a file that does not hold raises :class:`DeclarationError`."""
    found: list[DeclaredTask] = []
    for path in sorted(folder.rglob(DEFS_FILE)):
        relative = path.parent.relative_to(folder).parts
        module = ".".join((package, *relative, BODY_MODULE))
        where = f"{package.replace('.', '/')}/{'/'.join((*relative, DEFS_FILE))}"
        for document in _documents(path, where):
            attributes = document.get("attributes") or {}
            key = attributes.get("key", "?") if isinstance(attributes, Mapping) else "?"
            try:
                if not isinstance(attributes, Mapping):
                    raise ValueError("attributes: must be a mapping")
                spec, asset = spec_from_attributes(attributes)
                spec = replace(spec, source=source)
            except (TypeError, ValueError) as exc:
                raise DeclarationError(f"{where}: task {key!r}: {exc}") from None
            found.append(DeclaredTask(spec, module, where, asset))
    return found


#: PyYAML's safe loader in libyaml (C) when the wheel has it: every CLI command that lists the
#: tasks reads the declarations, and the pure-Python scanner was a tenth of its CPU.
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _documents(path: Path, where: str) -> Iterator[Mapping[str, Any]]:
    try:
        documents = list(yaml.load_all(path.read_text(encoding="utf-8"), Loader=_SAFE_LOADER))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise DeclarationError(f"{where}: cannot read it: {_error_text(exc)}") from None
    for document in documents:
        if document is None:
            continue
        if not isinstance(document, Mapping) or document.get("type") != COMPONENT_TYPE:
            kind = document.get("type") if isinstance(document, Mapping) else document
            raise DeclarationError(
                f"{where}: a document of type {kind!r}; the folders that hold dueledger tasks "
                f"declare `type: {COMPONENT_TYPE}` only"
            )
        yield document


def _package_folder(package: str) -> Path | None:
    """The folder of ``package`` without running it (a top-level package; a subpackage runs
    its parents' ``__init__``); None when there is no such package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def core_declarations() -> list[DeclaredTask]:
    """The core tasks: every declaration under the ``assets/`` package."""
    folder = _package_folder(CORE_PACKAGE)
    if folder is None:
        return []
    return read_declarations(folder, CORE_PACKAGE, source=SOURCE_CORE)


# --- plugins ------------------------------------------------------------------------------------


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

    task: DeclaredTask
    origin: PluginOrigin
    allowed: bool

    @property
    def spec(self) -> TaskSpec:
        return self.task.spec

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

    declared: tuple[DeclaredTask, ...]
    found: tuple[FoundTask, ...] = ()
    load_errors: tuple[PluginLoadError, ...] = ()
    allow: tuple[str, ...] = ()
    config_file: str | None = None

    @property
    def tasks(self) -> tuple[TaskSpec, ...]:
        return tuple(d.spec for d in self.declared)

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
            f"task {task_key!r} is no longer declared in a defs.yaml under assets/ nor by an "
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


def _origin(ep: importlib.metadata.EntryPoint) -> PluginOrigin:
    dist = getattr(ep, "dist", None)
    try:
        name = dist.name if dist is not None else None
        version = dist.version if dist is not None else None
    except Exception:  # a distribution with broken metadata still has an entry point name
        name = version = None
    return PluginOrigin(ep.name, ep.value, name, version)


def _plugin_declarations(origin: PluginOrigin) -> list[DeclaredTask]:
    """The declarations of the package an entry point names (a ValueError saying why not)."""
    package = origin.target.strip()
    if ":" in package:
        raise ValueError(
            f"entry point {origin.entry_point!r} names {package!r}, not a plugin task package: "
            f"point it at the package whose folder holds the tasks' {DEFS_FILE} (no ':attribute')"
        )
    folder = _package_folder(package)
    if folder is None:
        raise ModuleNotFoundError(f"No module named {package!r}", name=package)
    found = read_declarations(folder, package, source=origin.source)
    if not found:
        raise ValueError(
            f"{package} ({folder}) declares no task: not a plugin task package; write a "
            f"{DEFS_FILE} with `type: {COMPONENT_TYPE}` documents beside its {BODY_MODULE}.py"
        )
    return found


def _check_plugin_task(task: DeclaredTask, origin: PluginOrigin, slot_minutes: int) -> str | None:
    """What is wrong with a plugin task (None: nothing): its spec, as a core task's is
    checked, and its body -- present, and needing only resources the location provides."""
    spec = task.spec
    what = f"{origin.label()}, task {spec.key!r}"
    try:
        validate_spec(spec, slot_minutes)
    except TaskSpecError as exc:
        return f"{what}: {exc.field_name}: {exc.problem} (fix the plugin's {DEFS_FILE})"
    try:
        body = task.body()
    except DeclarationError as exc:
        return f"{what}: {str(exc).split(': ', 2)[-1]}"
    except (Exception, SystemExit) as exc:  # a plugin's import must never stop us
        return f"{what}: asset: importing {task.module} failed: {_error_text(exc)}"
    params = list(inspect.signature(body).parameters)
    if params[:2] != ["context", "run"]:
        return (
            f"{what}: asset: its body must start with (context, run: TaskRun, ...); it takes "
            f"({', '.join(params)})"
        )
    needed = set(params) - _NOT_RESOURCES
    missing = sorted(needed - LOCATION_RESOURCE_KEYS)
    if missing:
        return (
            f"{what}: asset: needs resource(s) {', '.join(missing)} that the code location "
            f"does not provide (available: {', '.join(sorted(LOCATION_RESOURCE_KEYS))})"
        )
    return None


def load_task_registry(
    *,
    slot_minutes: int,
    core: Sequence[DeclaredTask] | None = None,
    environ: Mapping[str, str] | None = None,
    entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
    log_errors: bool = True,
) -> TaskRegistry:
    """The core tasks (``core``, default: the ``assets/`` declarations) and every plugin task
    of group ``dueledger.tasks``, and which plugin tasks are registered.

    Uncached (see :func:`task_registry`). Never raises for a plugin's sake. Entry points are
    read in (name, target) order; a plugin task whose key is a core task's is refused, and
    of two allowed plugin tasks with one key the first registers and the second is refused,
    each with a load error naming both sources.
    """
    environ = os.environ if environ is None else environ
    core = core_declarations() if core is None else core
    errors: list[PluginLoadError] = []
    allow, config_file = allow_list(environ, errors)
    if entry_points is None:
        try:
            entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        except Exception as exc:  # broken metadata of some installed distribution
            errors.append(PluginLoadError(ERROR_ENTRY_POINT, ENTRY_POINT_GROUP, _error_text(exc)))
            entry_points = ()
    for task in core:
        try:
            validate_spec(task.spec, slot_minutes)
        except TaskSpecError as exc:
            raise DeclarationError(f"{task.where}: {exc}") from None
    sources = {d.spec.key: SOURCE_CORE for d in core}
    registered = list(core)
    found: list[FoundTask] = []
    for ep in sorted(entry_points, key=lambda e: (e.name, e.value)):
        origin = _origin(ep)
        try:
            declared = _plugin_declarations(origin)
        except (Exception, SystemExit) as exc:  # a plugin's import must never stop us
            errors.append(
                PluginLoadError(
                    ERROR_ENTRY_POINT, ep.name, _error_text(exc), ep.value, origin.source
                )
            )
            continue
        for task in declared:
            key = task.spec.key
            problem = _check_plugin_task(task, origin, slot_minutes)
            if problem is not None:
                errors.append(
                    PluginLoadError(
                        ERROR_ENTRY_POINT, ep.name, problem, ep.value, origin.source, key
                    )
                )
                continue
            allowed = _allowed(allow, origin, key)
            earlier = sources.get(key) if (allowed or sources.get(key) == SOURCE_CORE) else None
            if earlier is not None:
                where = "assets/" if earlier == SOURCE_CORE else "an earlier plugin"
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
                registered.append(task)
            found.append(FoundTask(task, origin, allowed))
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
    registry = TaskRegistry(tuple(registered), tuple(found), tuple(errors), allow, config_file)
    if log_errors:
        for error in registry.load_errors:
            LOGGER.warning(
                json.dumps({"task_plugin_load_error": error.as_json()}, separators=(",", ":"))
            )
    return registry


@dataclass
class _Cache:
    key: tuple[Any, ...] | None = None
    registry: TaskRegistry | None = None
    views: dict[tuple[int, str], tuple[TaskView, ...]] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)


_CACHE = _Cache()


def task_registry(settings: Settings | None = None, *, log_errors: bool = True) -> TaskRegistry:
    """The registered tasks of this process, loaded once.

    Loaded again only when what decides it changes: the slot length (validation), the
    allow-list variables, or ``sys.path`` (where entry points are found). A new or changed
    declaration, like installing, upgrading or removing a plugin, takes a restart or reload of
    the code location, like any code change. ``log_errors``: log load errors when this call
    is the one that loads.
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
            _CACHE.views.clear()
        return _CACHE.registry


def registered_tasks(settings: Settings | None = None) -> tuple[TaskSpec, ...]:
    """Every registered task: the core tasks, then the allowed plugin tasks. The one answer to
    "is this task registered?" in every process."""
    return task_registry(settings).tasks


def task_views(settings: Settings | None = None) -> list[TaskView]:
    """The registered tasks as views (spec, schedule plan, cadences) for the configured slot
    and time zone: what every reader works from -- the code location, its sensors, the CLI.

    Built once per slot/timezone in a process (the cadence warnings show on that first
    build: building them samples every cron rule's fires); each call returns a new list of
    the same frozen views.
    """
    settings = settings or load_settings()
    registry = task_registry(settings)
    key = (settings.slot_minutes, settings.timezone)
    with _CACHE.lock:
        views = _CACHE.views.get(key)
        if views is None:
            views = _CACHE.views[key] = tuple(
                build_views(registry.tasks, settings.slot_minutes, settings.timezone)
            )
    return list(views)
