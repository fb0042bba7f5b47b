"""Plugin hooks: listeners around task creation and execution that cannot break scheduling.

A plugin ships *listeners* (functions of one :class:`HookContext`) for named events:

- ``before_task_create``: before a schedule/sensor/manual request for a task run is
  emitted. A listener returns :func:`allow`, :func:`deny` (reason) or :func:`degrade`
  (extra run tags). A deny is honored only from a listener declared ``blocking=True``;
  from any other listener it is recorded as ``deny_ignored`` and the run goes ahead.
- ``after_task_create``: the request was emitted (schedule/sensor) or the run submitted
  (manual launch).
- ``task_before`` / ``task_after`` / ``task_failed``: around the task body, after the run
  claimed its ledger entry (a duplicate or late run fires nothing: it does nothing).
- ``tick.every_slot``, ``tick.every_minute``, ``tick.every_five_minutes``: once per slot,
  fired by the slot tick tasks (``assets/slot_ticks.py``). The two legacy names keep their
  names but, like every dueledger schedule, fire at most once per slot.

Registration: entry points in group ``dueledger.hooks`` (see :func:`load_hooks`) plus an
optional TOML file named by ``DUELEDGER_HOOKS_FILE``. A plugin that fails to load is
recorded as a load error (logs, `dueledger hooks`), never raised.

Isolation: every listener call runs in its own thread, inside its own try/except, joined
with the listener's timeout. An exception, an invalid return value or a timeout becomes an
outcome (``error`` / ``invalid`` / ``timeout``) and the next listener runs; the scheduler and
the task go on. A timed-out listener thread cannot be killed in Python: it is abandoned (a
daemon thread) and whatever it does later is ignored. Timeouts fail open: a blocking
listener that times out or raises does not deny.

Every outcome is logged as one JSON object per line (logger ``dueledger.hooks``, and the
Dagster run/tick log when there is one) and stored, bounded, on the run's ledger entry
(``summary.hooks``). This module does not import Dagster; ``orchestration/factory.py``,
``orchestration/manual.py`` and ``orchestration/runtime.py`` are the thin shells that fire
the events.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import json
import logging
import os
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Protocol

from resources.core import tags as t

# --- events -------------------------------------------------------------------------------
BEFORE_TASK_CREATE: Final = "before_task_create"
AFTER_TASK_CREATE: Final = "after_task_create"
TASK_BEFORE: Final = "task_before"
TASK_AFTER: Final = "task_after"
TASK_FAILED: Final = "task_failed"
TICK_EVERY_SLOT: Final = "tick.every_slot"
TICK_EVERY_MINUTE: Final = "tick.every_minute"
TICK_EVERY_FIVE_MINUTES: Final = "tick.every_five_minutes"
CREATE_EVENTS: Final = (BEFORE_TASK_CREATE, AFTER_TASK_CREATE)
TASK_EVENTS: Final = (TASK_BEFORE, TASK_AFTER, TASK_FAILED)
SLOT_EVENTS: Final = (TICK_EVERY_SLOT, TICK_EVERY_MINUTE, TICK_EVERY_FIVE_MINUTES)
EVENTS: Final = (*CREATE_EVENTS, *TASK_EVENTS, *SLOT_EVENTS)

# --- outcomes (what one listener call came to) --------------------------------------------
OUTCOME_ALLOW: Final = "allow"
OUTCOME_DENY: Final = "deny"  # honored: a blocking listener denied before_task_create
OUTCOME_DENY_IGNORED: Final = "deny_ignored"  # a non-blocking listener, or not a create event
OUTCOME_DEGRADE: Final = "degrade"
OUTCOME_DEGRADE_IGNORED: Final = "degrade_ignored"  # degrade outside before_task_create
OUTCOME_ERROR: Final = "error"
OUTCOME_TIMEOUT: Final = "timeout"
OUTCOME_INVALID: Final = "invalid"  # the listener returned something that is not a result
OUTCOMES: Final = (
    OUTCOME_ALLOW,
    OUTCOME_DENY,
    OUTCOME_DENY_IGNORED,
    OUTCOME_DEGRADE,
    OUTCOME_DEGRADE_IGNORED,
    OUTCOME_ERROR,
    OUTCOME_TIMEOUT,
    OUTCOME_INVALID,
)

# --- registration -------------------------------------------------------------------------
ENTRY_POINT_GROUP: Final = "dueledger.hooks"
ENV_HOOKS_FILE: Final = "DUELEDGER_HOOKS_FILE"
SOURCE_CODE: Final = "code"
SOURCE_ENTRY_POINT: Final = "entry_point"
SOURCE_CONFIG: Final = "config"

DEFAULT_TIMEOUT_SECONDS: Final = 5.0
#: Listeners run one after another; this caps what one listener can add to a schedule
#: evaluation or a task run.
MAX_TIMEOUT_SECONDS: Final = 60.0

#: Run tag carrying the creation outcomes of a schedule/sensor request into the run, which
#: stores them on its ledger entry at its first claim (no entry exists at creation time).
TAG_HOOKS: Final = "dueledger/hooks"
#: Tags a degrade may not add: the contract's and Dagster's namespaces, except a priority.
PROTECTED_TAG_PREFIXES: Final = ("dueledger/", "dagster/")
DEGRADE_ALLOWED_SYSTEM_TAGS: Final = ("dagster/priority",)
MAX_DEGRADE_TAGS: Final = 10
MAX_TAG_KEY_CHARS: Final = 100
MAX_TAG_VALUE_CHARS: Final = 200
#: Bounds of what is stored per outcome (the ledger keeps the newest 20 outcomes).
MAX_TEXT_CHARS: Final = 500
MAX_TAG_HOOKS_OUTCOMES: Final = 10

LOGGER: Final = logging.getLogger("dueledger.hooks")


class HookLog(Protocol):
    """What a Dagster context log and a ``logging.Logger`` have in common."""

    def info(self, msg: str, *args: Any, **kwargs: Any) -> Any: ...

    def warning(self, msg: str, *args: Any, **kwargs: Any) -> Any: ...


# --- results a listener returns -----------------------------------------------------------


@dataclass(frozen=True)
class Allow:
    """Go ahead (returning None means the same)."""


@dataclass(frozen=True)
class Deny:
    """Do not create the run (honored only from a blocking listener, for before_task_create)."""

    reason: str


@dataclass(frozen=True)
class Degrade:
    """Create the run with extra tags (for before_task_create; never changes existing tags)."""

    tags: Mapping[str, str]
    reason: str = ""


HookResult = Allow | Deny | Degrade


def allow() -> Allow:
    """The listener has no objection."""
    return Allow()


def deny(reason: str) -> Deny:
    """Refuse the run creation, saying why (honored from ``blocking=True`` listeners only)."""
    return Deny(str(reason))


def degrade(tags: Mapping[str, str] | None = None, *, reason: str = "", **more: str) -> Degrade:
    """Create the run with extra tags, e.g. ``degrade({"dagster/priority": "-1"})``."""
    return Degrade({**(tags or {}), **more}, reason)


# --- what a listener is given -------------------------------------------------------------


@dataclass(frozen=True)
class HookContext:
    """Everything a listener gets. Fields that do not exist yet are None.

    - ``due``: the run's due (``YYYY-MM-DDTHH:MM:SSZ``), for schedule/sensor/backfill runs.
    - ``slot``: the slot the run belongs to: its due, or for a run without one the slot of
      its "as of" instant; None at creation of a manual launch.
    - ``entry_id`` / ``attempt``: the ledger entry and attempt number, once the run claimed
      it (a manual launch has an entry at ``after_task_create``; a scheduled one does not).
    - ``run_id``: the Dagster run id (known up front for manual launches; a schedule's
      run id is assigned by Dagster after the request is emitted, so None there).
    - ``tags``: the request's or run's tags (read-only).
    - ``error`` / ``status`` / ``failure_kind``: for ``task_failed`` (and ``status`` for
      ``task_after``): what happened and the ledger entry's status afterwards.
    """

    event: str
    task_key: str
    trigger: str | None
    due: str | None = None
    slot: str | None = None
    entry_id: int | None = None
    attempt: int | None = None
    run_id: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    error: str | None = None
    status: str | None = None
    failure_kind: str | None = None

    def __post_init__(self) -> None:
        if self.event not in EVENTS:
            raise ValueError(f"unknown hook event {self.event!r}; known: {', '.join(EVENTS)}")
        object.__setattr__(self, "tags", MappingProxyType(dict(self.tags)))

    def for_event(self, event: str, **changes: Any) -> HookContext:
        """The same context for another event (e.g. ``after_task_create`` after ``before``)."""
        return replace(self, **{"tags": dict(self.tags), **changes, "event": event})

    def as_json(self) -> dict[str, Any]:
        """The context without its tags (for log lines and ledger records)."""
        return {
            "event": self.event,
            "task_key": self.task_key,
            "trigger": self.trigger,
            "due": self.due,
            "slot": self.slot,
            "entry_id": self.entry_id,
            "attempt": self.attempt,
            "run_id": self.run_id,
        }


ListenerFn = Callable[[HookContext], "HookResult | None"]


@dataclass(frozen=True)
class Listener:
    """A listener: a function of a :class:`HookContext`, the events it wants, and how much
    it may matter (``blocking``: its deny is honored) and take (``timeout_seconds``)."""

    name: str
    events: tuple[str, ...]
    fn: ListenerFn
    blocking: bool = False
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    source: str = SOURCE_CODE
    target: str | None = None

    def __post_init__(self) -> None:
        _check_events(self.events, self.name)
        object.__setattr__(self, "events", tuple(dict.fromkeys(self.events)))
        if not isinstance(self.blocking, bool):
            raise ValueError(f"listener {self.name!r}: blocking must be true or false")
        timeout = self.timeout_seconds
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout <= MAX_TIMEOUT_SECONDS
        ):
            raise ValueError(
                f"listener {self.name!r}: timeout_seconds must be in (0, {MAX_TIMEOUT_SECONDS}], "
                f"got {timeout!r}"
            )
        if not callable(self.fn):
            raise ValueError(f"listener {self.name!r}: {self.fn!r} is not callable")

    def __call__(self, context: HookContext) -> HookResult | None:
        """Call the function directly (handy in a plugin's own tests); no isolation."""
        return self.fn(context)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "events": list(self.events),
            "blocking": self.blocking,
            "timeout_seconds": self.timeout_seconds,
            "source": self.source,
            "target": self.target,
        }


def _check_events(events: Iterable[str], name: str) -> None:
    events = tuple(events)
    if not events:
        raise ValueError(f"listener {name!r}: declares no events; known: {', '.join(EVENTS)}")
    unknown = [e for e in events if e not in EVENTS]
    if unknown:
        raise ValueError(
            f"listener {name!r}: unknown event {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(EVENTS)}"
        )


def listener(
    *events: str,
    name: str | None = None,
    blocking: bool = False,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> Callable[[ListenerFn], Listener]:
    """Decorator making a function a :class:`Listener` for ``events``::

    @listener("before_task_create", blocking=True, timeout_seconds=2)
    def change_freeze(ctx: HookContext) -> HookResult:
        return deny("change freeze") if ctx.task_key == "billing_maintenance" else allow()
    """

    def wrap(fn: ListenerFn) -> Listener:
        return Listener(
            name=name or str(getattr(fn, "__name__", repr(fn))),
            events=tuple(events),
            fn=fn,
            blocking=blocking,
            timeout_seconds=timeout_seconds,
            target=f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', '?')}",
        )

    return wrap


# --- the registry -------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadError:
    """A plugin or config entry that could not be loaded (never fatal)."""

    source: str
    name: str
    target: str | None
    error: str

    def as_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "name": self.name,
            "target": self.target,
            "error": self.error,
        }


@dataclass(frozen=True)
class HookRegistry:
    """The listeners of this process and what could not be loaded."""

    listeners: tuple[Listener, ...] = ()
    load_errors: tuple[LoadError, ...] = ()
    config_file: str | None = None

    def for_event(self, event: str) -> tuple[Listener, ...]:
        return tuple(x for x in self.listeners if event in x.events)

    def as_json(self) -> dict[str, Any]:
        return {
            "entry_point_group": ENTRY_POINT_GROUP,
            "config_file": self.config_file,
            "events": list(EVENTS),
            "listeners": [x.as_json() for x in self.listeners],
            "load_errors": [e.as_json() for e in self.load_errors],
        }


def registry_of(*listeners: Listener) -> HookRegistry:
    """A registry of listeners built in code (names must be unique)."""
    names = [x.name for x in listeners]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"listener names must be unique; repeated: {', '.join(dupes)}")
    return HookRegistry(tuple(listeners))


def _error_text(exc: BaseException) -> str:
    return _cut(f"{type(exc).__name__}: {exc}")


def _cut(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 12] + " [truncated]"


def _bounded(text: str | None, limit: int = MAX_TEXT_CHARS) -> str | None:
    return None if text is None else _cut(str(text), limit)


def _resolve(target: str) -> Any:
    """``package.module:attribute.path`` -> the object (import errors propagate)."""
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError(f"target {target!r} must look like 'package.module:attribute'")
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    return obj


def _is_factory(obj: Any) -> bool:
    """A zero-argument callable that returns listeners (not a listener function)."""
    if isinstance(obj, Listener) or not callable(obj):
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


def _as_listeners(obj: Any, what: str) -> list[Listener]:
    """A plugin's object -> listeners: a Listener, an iterable of them, or a zero-argument
    factory returning either."""
    if _is_factory(obj):
        obj = obj()
    if isinstance(obj, Listener):
        return [obj]
    if isinstance(obj, Iterable) and not isinstance(obj, str | bytes | Mapping):
        items = list(obj)
        bad = [x for x in items if not isinstance(x, Listener)]
        if not bad:
            return items
        obj = bad[0]
    raise TypeError(
        f"{what} gave {obj!r}, not a listener; decorate the function with "
        f"@orchestration.hooks.listener(...) or return a list of listeners"
    )


_CONFIG_KEYS: Final = {"listeners", "disable_entry_points", "overrides"}
_LISTENER_KEYS: Final = {"target", "events", "blocking", "timeout_seconds", "name"}
_OVERRIDE_KEYS: Final = {"blocking", "timeout_seconds", "events"}


@dataclass
class _Loader:
    listeners: list[Listener] = field(default_factory=list)
    errors: list[LoadError] = field(default_factory=list)

    def error(self, source: str, name: str, target: str | None, problem: str) -> None:
        self.errors.append(LoadError(source, name, target, _bounded(problem) or ""))

    def add(self, item: Listener, source: str, what: str) -> None:
        if any(x.name == item.name for x in self.listeners):
            self.error(source, item.name, item.target, f"{what}: listener name already registered")
            return
        self.listeners.append(item)


def _read_config(path: Path, loader: _Loader) -> dict[str, Any]:
    where = f"{ENV_HOOKS_FILE}={path}"
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        loader.error(SOURCE_CONFIG, str(path), None, f"{where}: file does not exist")
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        loader.error(SOURCE_CONFIG, str(path), None, f"{where}: {_error_text(exc)}")
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
            if callable(obj) and not isinstance(obj, Listener) and not _is_factory(obj):
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
        except Exception as exc:
            loader.error(SOURCE_CONFIG, name or label, target, _error_text(exc))


def _entry_point_listeners(
    entry_points: Iterable[importlib.metadata.EntryPoint], disabled: set[str], loader: _Loader
) -> None:
    for ep in entry_points:
        if ep.name in disabled:
            continue
        try:
            found = _as_listeners(ep.load(), f"entry point {ep.name!r} ({ep.value})")
        except (Exception, SystemExit) as exc:  # a plugin's import must never stop us
            loader.error(SOURCE_ENTRY_POINT, ep.name, ep.value, _error_text(exc))
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
            loader.error(SOURCE_CONFIG, f"overrides.{name}", None, _error_text(exc))


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
            loader.error(SOURCE_ENTRY_POINT, ENTRY_POINT_GROUP, None, _error_text(exc))
            entry_points = ()
    _entry_point_listeners(entry_points, set(disabled), loader)
    if path is not None:
        _config_listeners(path, data, loader)
        _apply_overrides(data, loader, path)
    registry = HookRegistry(
        tuple(loader.listeners), tuple(loader.errors), str(path) if path else None
    )
    for problem in registry.load_errors if log_errors else ():
        _emit(log, logging.WARNING, {"hook_load_error": problem.as_json()})
    return registry


_active: HookRegistry | None = None
_active_lock = threading.Lock()


def active_hooks() -> HookRegistry:
    """This process's registry, loaded on first use (not at import or definition load)."""
    global _active
    with _active_lock:
        if _active is None:
            _active = load_hooks()
        return _active


def reload_hooks() -> HookRegistry:
    """Load the listeners again (a long-lived process picking up a changed config file)."""
    global _active
    registry = load_hooks()
    with _active_lock:
        _active = registry
    return registry


def set_active_hooks(registry: HookRegistry | None) -> HookRegistry | None:
    """Install listeners built in code (None: load from entry points/config on next use).

    Returns the registry it replaces, so a caller can put it back.
    """
    global _active
    with _active_lock:
        previous, _active = _active, registry
    return previous


# --- running listeners in isolation -------------------------------------------------------


@dataclass(frozen=True)
class ListenerOutcome:
    """What one listener call came to, as recorded on the ledger entry and logged."""

    event: str
    listener: str
    source: str
    blocking: bool
    outcome: str
    at: str
    elapsed_ms: int
    reason: str | None = None
    tags: Mapping[str, str] | None = None
    ignored_tags: tuple[str, ...] = ()
    error: str | None = None

    def record(self, context: HookContext) -> dict[str, Any]:
        """The JSON object stored in the entry's ``summary.hooks`` (and logged)."""
        return {
            "at": self.at,
            "event": self.event,
            "listener": self.listener,
            "source": self.source,
            "blocking": self.blocking,
            "outcome": self.outcome,
            "reason": self.reason,
            "tags": dict(self.tags) if self.tags else None,
            "ignored_tags": list(self.ignored_tags) or None,
            "error": self.error,
            "elapsed_ms": self.elapsed_ms,
            "task_key": context.task_key,
            "trigger": context.trigger,
            "due": context.due,
            "slot": context.slot,
            "run_id": context.run_id,
            "attempt": context.attempt,
        }


@dataclass(frozen=True)
class Dispatch:
    """All outcomes of one event; for ``before_task_create`` also the decision."""

    context: HookContext
    outcomes: tuple[ListenerOutcome, ...] = ()

    @property
    def denied(self) -> bool:
        return any(o.outcome == OUTCOME_DENY for o in self.outcomes)

    @property
    def deny_reason(self) -> str | None:
        """Who denied and why, one clause per honored deny; None when allowed."""
        clauses = [f"{o.listener}: {o.reason}" for o in self.outcomes if o.outcome == OUTCOME_DENY]
        return "; ".join(clauses) or None

    @property
    def extra_tags(self) -> dict[str, str]:
        """Tags the honored degrades add (the first listener to add a key wins)."""
        merged: dict[str, str] = {}
        for o in self.outcomes:
            if o.outcome == OUTCOME_DEGRADE and o.tags:
                for key, value in o.tags.items():
                    merged.setdefault(key, value)
        return merged

    def records(self) -> list[dict[str, Any]]:
        return [o.record(self.context) for o in self.outcomes]


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _emit(log: HookLog | None, level: int, payload: Mapping[str, Any]) -> None:
    """One JSON object per line, to the ``dueledger.hooks`` logger and the Dagster log."""
    line = json.dumps(payload, default=str, separators=(",", ":"))
    LOGGER.log(level, line)
    if log is not None:
        try:
            (log.warning if level >= logging.WARNING else log.info)(line)
        except Exception:  # a closed or odd log must not turn a hook line into a failure
            LOGGER.debug("could not write a hook line to the Dagster log", exc_info=True)


def _split_tags(
    tags: Mapping[str, str], existing: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """The degrade tags that may be added, and the keys that may not (and why)."""
    accepted: dict[str, str] = {}
    ignored: list[str] = []
    for key, value in tags.items():
        if not isinstance(key, str) or not isinstance(value, str):
            ignored.append(f"{key!r}: keys and values must be strings")
        elif key in existing:
            ignored.append(f"{key}: already set on the request; a degrade only adds tags")
        elif key.startswith(PROTECTED_TAG_PREFIXES) and key not in DEGRADE_ALLOWED_SYSTEM_TAGS:
            ignored.append(f"{key}: the dueledger/ and dagster/ namespaces are reserved")
        elif len(key) > MAX_TAG_KEY_CHARS or len(value) > MAX_TAG_VALUE_CHARS:
            ignored.append(f"{key[:40]}: longer than {MAX_TAG_KEY_CHARS}/{MAX_TAG_VALUE_CHARS}")
        elif len(accepted) >= MAX_DEGRADE_TAGS:
            ignored.append(f"{key}: more than {MAX_DEGRADE_TAGS} tags")
        else:
            accepted[key] = value
    return accepted, ignored


def _call(item: Listener, context: HookContext) -> tuple[str, Any]:
    """Call the listener in a daemon thread, joined with its timeout.

    Returns ("ok", value), ("error", exception) or ("timeout", None). A thread still
    running after its timeout cannot be killed in Python: it is abandoned and its result,
    whenever it comes, is dropped.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = item.fn(context)
        except BaseException as exc:  # SystemExit in a listener must not end anything either
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"dueledger-hook-{item.name}", daemon=True)
    thread.start()
    thread.join(item.timeout_seconds)
    if thread.is_alive():
        return "timeout", None
    if "error" in box:
        return "error", box["error"]
    return "ok", box.get("value")


def _judge(item: Listener, context: HookContext, value: Any) -> dict[str, Any]:
    """What a listener's return value means for this event (outcome fields)."""
    creating = context.event == BEFORE_TASK_CREATE
    if value is None or isinstance(value, Allow):
        return {"outcome": OUTCOME_ALLOW}
    if isinstance(value, Deny):
        reason = _bounded(value.reason) or "no reason given"
        if creating and item.blocking:
            return {"outcome": OUTCOME_DENY, "reason": reason}
        why = "not a blocking listener" if creating else f"a deny has no effect on {context.event}"
        return {"outcome": OUTCOME_DENY_IGNORED, "reason": f"{reason} ({why})"}
    if isinstance(value, Degrade):
        if not creating:
            reason = f"a degrade has no effect on {context.event}"
            return {"outcome": OUTCOME_DEGRADE_IGNORED, "reason": reason}
        if not isinstance(value.tags, Mapping):
            return {"outcome": OUTCOME_INVALID, "error": "degrade(tags) needs a mapping"}
        accepted, ignored = _split_tags(value.tags, context.tags)
        return {
            "outcome": OUTCOME_DEGRADE,
            "reason": _bounded(value.reason) or None,
            "tags": accepted,
            "ignored_tags": tuple(_bounded(x) or "" for x in ignored),
        }
    hint = "return allow(), deny(reason), degrade(tags) or None"
    return {"outcome": OUTCOME_INVALID, "error": _bounded(f"returned {value!r}; {hint}")}


def run_listener(item: Listener, context: HookContext) -> ListenerOutcome:
    """One listener, isolated: whatever it does becomes an outcome; nothing is raised."""
    at = _now_iso()
    started = time.monotonic()
    status, value = _call(item, context)
    elapsed_ms = int((time.monotonic() - started) * 1000)
    base = ListenerOutcome(
        event=context.event,
        listener=item.name,
        source=item.source,
        blocking=item.blocking,
        outcome=OUTCOME_ERROR,
        at=at,
        elapsed_ms=elapsed_ms,
    )
    if status == "timeout":
        wait = f"{item.timeout_seconds:g}s"
        return replace(
            base,
            outcome=OUTCOME_TIMEOUT,
            error=f"no answer within {wait}; the listener thread was abandoned",
        )
    if status == "error":
        return replace(base, error=_error_text(value))
    return replace(base, **_judge(item, context, value))


def fire(
    context: HookContext, *, registry: HookRegistry | None = None, log: HookLog | None = None
) -> Dispatch:
    """Run every listener of ``context.event`` in registration order, each isolated; log
    one JSON line per outcome. Never raises for a listener's sake."""
    registry = active_hooks() if registry is None else registry
    outcomes: list[ListenerOutcome] = []
    for item in registry.for_event(context.event):
        try:
            outcome = run_listener(item, context)
        except Exception as exc:  # e.g. no thread could be started: still only an outcome
            outcome = ListenerOutcome(
                event=context.event,
                listener=item.name,
                source=item.source,
                blocking=item.blocking,
                outcome=OUTCOME_ERROR,
                at=_now_iso(),
                elapsed_ms=0,
                error=_error_text(exc),
            )
        outcomes.append(outcome)
        quiet = outcome.outcome in (OUTCOME_ALLOW, OUTCOME_DEGRADE)
        _emit(
            log,
            logging.INFO if quiet else logging.WARNING,
            {"hook": context.event, **outcome.record(context), "entry_id": context.entry_id},
        )
    return Dispatch(context, tuple(outcomes))


class HookRecorder(Protocol):
    """The part of the ledger hooks write to (``RunLedger.record_hook_result``)."""

    def record_hook_result(self, entry_id: int, result: dict[str, Any]) -> None: ...


def record(
    ledger: HookRecorder,
    entry_id: int,
    items: Iterable[Mapping[str, Any]],
    *,
    log: HookLog | None = None,
) -> None:
    """Store outcome records on the entry (``summary.hooks``, the ledger keeps the newest
    20). A ledger error is logged, never raised: hooks must not fail the task."""
    for item in items:
        try:
            ledger.record_hook_result(entry_id, dict(item))
        except Exception as exc:
            _emit(
                log,
                logging.WARNING,
                {"hook_record_error": _error_text(exc), "entry_id": entry_id, **dict(item)},
            )


def fire_and_record(
    context: HookContext,
    ledger: HookRecorder,
    *,
    registry: HookRegistry | None = None,
    log: HookLog | None = None,
) -> Dispatch:
    """:func:`fire`, then store the outcomes on ``context.entry_id``'s ledger entry."""
    dispatch = fire(context, registry=registry, log=log)
    if context.entry_id is not None and dispatch.outcomes:
        record(ledger, context.entry_id, dispatch.records(), log=log)
    return dispatch


# --- creation: the decision and how its outcomes travel into the run ----------------------


def encode_outcomes(dispatches: Sequence[Dispatch]) -> str | None:
    """Creation outcomes as the ``dueledger/hooks`` tag value (None when there are none).

    Bounded: at most the last 10 outcomes, texts cut to 200 characters.
    """
    items = [r for d in dispatches for r in d.records()][-MAX_TAG_HOOKS_OUTCOMES:]
    if not items:
        return None
    for item in items:
        for key in ("reason", "error"):
            item[key] = _bounded(item[key], 200)
        item["ignored_tags"] = [_bounded(x, 200) for x in item["ignored_tags"] or []] or None
    return json.dumps(items, separators=(",", ":"))


def decode_outcomes(value: str | None) -> list[dict[str, Any]]:
    """Inverse of :func:`encode_outcomes`; anything unreadable gives [] (never raises)."""
    if not value:
        return []
    try:
        items = json.loads(value)
    except ValueError:
        return []
    if not isinstance(items, list):
        return []
    return [x for x in items if isinstance(x, dict)][:MAX_TAG_HOOKS_OUTCOMES]


def creation_context(tags: Mapping[str, str], *, run_id: str | None = None) -> HookContext:
    """The ``before_task_create`` context of a request, from its dueledger tags."""
    due = tags.get(t.TAG_DUE)
    return HookContext(
        event=BEFORE_TASK_CREATE,
        task_key=tags.get(t.TAG_TASK, ""),
        trigger=tags.get(t.TAG_TRIGGER),
        due=due,
        slot=due,
        run_id=run_id,
        tags=tags,
    )


@dataclass(frozen=True)
class CreationGate:
    """The creation hooks' verdict on one request: denied or not, and the run's tags."""

    before: Dispatch
    tags: Mapping[str, str]
    after: Dispatch | None = None

    @property
    def denied(self) -> bool:
        return self.before.denied

    @property
    def reason(self) -> str | None:
        return self.before.deny_reason

    def run_tags(self) -> dict[str, str]:
        """The tags to create the run with: the request's, honored degrades, and the
        creation outcomes (``dueledger/hooks``) for the run to store on its entry."""
        encoded = encode_outcomes([d for d in (self.before, self.after) if d is not None])
        return {**self.tags, TAG_HOOKS: encoded} if encoded else dict(self.tags)


def gate_creation(
    tags: Mapping[str, str],
    *,
    run_id: str | None = None,
    registry: HookRegistry | None = None,
    log: HookLog | None = None,
) -> CreationGate:
    """Fire ``before_task_create`` for a request with these tags: the verdict and the tags
    it may be created with (honored degrades added; nothing added when denied)."""
    before = fire(creation_context(tags, run_id=run_id), registry=registry, log=log)
    final = dict(tags) if before.denied else {**tags, **before.extra_tags}
    return CreationGate(before, final)


def announce_creation(
    gate: CreationGate,
    *,
    entry_id: int | None = None,
    run_id: str | None = None,
    registry: HookRegistry | None = None,
    log: HookLog | None = None,
) -> CreationGate:
    """Fire ``after_task_create`` for an allowed request; the gate with its outcomes."""
    context = gate.before.context.for_event(
        AFTER_TASK_CREATE,
        tags=gate.tags,
        entry_id=entry_id,
        run_id=run_id or gate.before.context.run_id,
    )
    return replace(gate, after=fire(context, registry=registry, log=log))
