"""Loading plugin listeners: entry points of group ``dueledger.hooks``, then the TOML file
named by ``DUELEDGER_HOOKS_FILE``. Nothing here raises for a plugin's sake: what cannot be
loaded becomes a :class:`LoadError`."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, TypeVar

from orchestration.services.hooks.vocabulary import (
    ENTRY_POINT_GROUP,
    ENV_HOOKS_FILE,
    SOURCE_CONFIG,
    SOURCE_ENTRY_POINT,
    HookLog,
    HookRegistry,
    Listener,
    LoadError,
    bounded_text,
    emit,
    error_text,
)
from resources.core.config_files import ConfigFileError, read_config_file
from resources.core.text import printable


def _resolve(target: str) -> Any:
    """``package.module:attribute.path`` -> the object (import errors propagate)."""
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError(f"target {target!r} must look like 'package.module:attribute'")
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    return obj


def is_plugin_factory(obj: Any, item_type: type) -> bool:
    """Is ``obj`` a zero-argument callable that returns a plugin's items (not an
    ``item_type`` itself)? Entry points of hook listeners and of plugin tasks may name one."""
    if isinstance(obj, item_type) or not callable(obj):
        return False
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return False
    return not any(
        p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        for p in params
    )


_Item = TypeVar("_Item")


def plugin_items(obj: Any, item_type: type[_Item], what: str, expected: str) -> list[_Item]:
    """A plugin's object -> its items: one ``item_type``, an iterable of them, or a
    zero-argument factory returning either (hook listeners and plugin tasks alike). Anything
    else is a TypeError saying what ``what`` gave and ``expected`` (the fix)."""
    if is_plugin_factory(obj, item_type):
        obj = obj()
    if isinstance(obj, item_type):
        return [obj]
    if isinstance(obj, Iterable) and not isinstance(obj, str | bytes | Mapping):
        items = list(obj)
        bad = [x for x in items if not isinstance(x, item_type)]
        if not bad:
            return items
        obj = bad[0]
    raise TypeError(f"{what} gave {obj!r}, {expected}")


def _as_listeners(obj: Any, what: str) -> list[Listener]:
    return plugin_items(
        obj,
        Listener,
        what,
        "not a listener; decorate the function with @orchestration.plugins.listener(...) "
        "or return a list of listeners",
    )


# ``tasks`` is the plugin tasks' allow-list table (orchestration/declarations.py reads it).
_CONFIG_KEYS: Final = {"listeners", "disable_entry_points", "overrides", "tasks"}
_LISTENER_KEYS: Final = {"target", "events", "blocking", "timeout_seconds", "name"}
_OVERRIDE_KEYS: Final = {"blocking", "timeout_seconds", "events"}


@dataclass
class _Loader:
    listeners: list[Listener] = field(default_factory=list)
    errors: list[LoadError] = field(default_factory=list)

    def error(self, source: str, name: str, target: str | None, problem: str) -> None:
        self.errors.append(LoadError(source, name, target, bounded_text(problem) or ""))

    def add(self, item: Listener, source: str, what: str) -> None:
        if any(x.name == item.name for x in self.listeners):
            self.error(source, item.name, item.target, f"{what}: listener name already registered")
            return
        self.listeners.append(item)


def _read_config(path: Path, loader: _Loader) -> dict[str, Any]:
    where = f"{ENV_HOOKS_FILE}={printable(str(path))}"
    try:
        # Bounded and regular files only: /dev/zero or a pipe must not hang the process.
        data = tomllib.loads(read_config_file(path, where))
    except FileNotFoundError:
        loader.error(SOURCE_CONFIG, str(path), None, f"{where}: file does not exist")
        return {}
    except ConfigFileError as exc:
        loader.error(SOURCE_CONFIG, str(path), None, str(exc))
        return {}
    except tomllib.TOMLDecodeError as exc:
        loader.error(SOURCE_CONFIG, str(path), None, f"{where}: {error_text(exc)}")
        return {}
    unknown = sorted(set(data) - _CONFIG_KEYS)
    if unknown:
        loader.error(
            SOURCE_CONFIG,
            str(path),
            None,
            f"{where}: unknown key(s) {', '.join(unknown)} ignored; "
            f"known: {', '.join(sorted(_CONFIG_KEYS))}",
        )
    return data


def _config_listeners(path: Path, data: Mapping[str, Any], loader: _Loader) -> None:
    entries = data.get("listeners", [])
    if not isinstance(entries, list):
        loader.error(SOURCE_CONFIG, str(path), None, "'listeners' must be an array of tables")
        return
    for index, item in enumerate(entries):
        label = f"{path} listeners[{index}]"
        if not isinstance(item, Mapping) or not isinstance(item.get("target"), str):
            loader.error(SOURCE_CONFIG, label, None, "each listener needs target = 'module:attr'")
            continue
        target = item["target"]
        name = item.get("name")
        try:
            unknown = sorted(set(item) - _LISTENER_KEYS)
            if unknown:
                raise ValueError(f"unknown key(s) {', '.join(unknown)}")
            obj = _resolve(target)
            if (
                callable(obj)
                and not isinstance(obj, Listener)
                and not is_plugin_factory(obj, Listener)
            ):
                # A plain function: the file says which events it listens to.
                if "events" not in item:
                    raise ValueError("a plain function needs events = [...] in the file")
                obj = Listener(name=name or target, events=tuple(item["events"]), fn=obj)
            found = _as_listeners(obj, f"target {target!r}")
            for one in found:
                changes: dict[str, Any] = {"source": SOURCE_CONFIG, "target": one.target or target}
                for key in ("events", "blocking", "timeout_seconds"):
                    if key in item:
                        changes[key] = tuple(item[key]) if key == "events" else item[key]
                if name and len(found) == 1:
                    changes["name"] = name
                loader.add(replace(one, **changes), SOURCE_CONFIG, label)
        except (Exception, SystemExit) as exc:  # a listener file's import must not stop us
            loader.error(SOURCE_CONFIG, name or label, target, error_text(exc))


def _entry_point_listeners(
    entry_points: Iterable[importlib.metadata.EntryPoint], disabled: set[str], loader: _Loader
) -> None:
    for ep in entry_points:
        if ep.name in disabled:
            continue
        try:
            found = _as_listeners(ep.load(), f"entry point {ep.name!r} ({ep.value})")
        except (Exception, SystemExit) as exc:  # a plugin's import must never stop us
            loader.error(SOURCE_ENTRY_POINT, ep.name, ep.value, error_text(exc))
            continue
        for one in found:
            # Entry-point listeners are named "<entry point>:<listener>": two plugins may
            # both call a function "audit".
            qualified = replace(
                one,
                name=f"{ep.name}:{one.name}",
                source=SOURCE_ENTRY_POINT,
                target=one.target or ep.value,
            )
            loader.add(qualified, SOURCE_ENTRY_POINT, f"entry point {ep.name!r}")


def _apply_overrides(data: Mapping[str, Any], loader: _Loader, path: Path) -> None:
    overrides = data.get("overrides", {})
    if not isinstance(overrides, Mapping):
        loader.error(SOURCE_CONFIG, str(path), None, "'overrides' must be a table")
        return
    for name, change in overrides.items():
        index = next((i for i, x in enumerate(loader.listeners) if x.name == name), None)
        if index is None or not isinstance(change, Mapping):
            problem = "no loaded listener by that name (names: `dueledger hooks`)"
            loader.error(SOURCE_CONFIG, f"overrides.{name}", None, problem)
            continue
        try:
            unknown = sorted(set(change) - _OVERRIDE_KEYS)
            if unknown:
                raise ValueError(f"unknown key(s) {', '.join(unknown)}")
            values: dict[str, Any] = {
                k: tuple(v) if k == "events" else v for k, v in change.items()
            }
            loader.listeners[index] = replace(loader.listeners[index], **values)
        except Exception as exc:
            loader.error(SOURCE_CONFIG, f"overrides.{name}", None, error_text(exc))


def load_hooks(
    *,
    environ: Mapping[str, str] | None = None,
    entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
    log: HookLog | None = None,
    log_errors: bool = True,
) -> HookRegistry:
    """Load every listener: entry points of group ``dueledger.hooks``, then the config file.

    Never raises for a plugin's sake: an entry point that fails to import, an object that is
    not a listener, an unknown event name, a duplicate name or a bad config file each become
    a :class:`LoadError` (logged as one JSON line each) and loading goes on.

    The config file (``DUELEDGER_HOOKS_FILE``, TOML) may add listeners by target, leave out
    entry points by name, and override a loaded listener's ``blocking``/``timeout_seconds``/
    ``events`` (see docs/plugins.md).
    """
    environ = os.environ if environ is None else environ
    loader = _Loader()
    raw_path = (environ.get(ENV_HOOKS_FILE) or "").strip()
    path = Path(raw_path).expanduser() if raw_path else None
    data = _read_config(path, loader) if path is not None else {}
    disabled = data.get("disable_entry_points", [])
    if not isinstance(disabled, list) or not all(isinstance(x, str) for x in disabled):
        loader.error(SOURCE_CONFIG, str(path), None, "disable_entry_points must be a string list")
        disabled = []
    if entry_points is None:
        try:
            entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        except Exception as exc:  # broken metadata of some installed distribution
            loader.error(SOURCE_ENTRY_POINT, ENTRY_POINT_GROUP, None, error_text(exc))
            entry_points = ()
    _entry_point_listeners(entry_points, set(disabled), loader)
    if path is not None:
        _config_listeners(path, data, loader)
        _apply_overrides(data, loader, path)
    registry = HookRegistry(
        tuple(loader.listeners), tuple(loader.errors), str(path) if path else None
    )
    for problem in registry.load_errors if log_errors else ():
        emit(log, logging.WARNING, {"hook_load_error": problem.as_json()})
    return registry
