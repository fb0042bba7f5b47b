"""The hook vocabulary: events, outcomes, the results a listener returns, the context it
is given, listeners themselves, and a loaded registry (pure data, no I/O)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Final, Protocol

# --- events -------------------------------------------------------------------------------
BEFORE_TASK_CREATE: Final = "before_task_create"
AFTER_TASK_CREATE: Final = "after_task_create"
TASK_BEFORE: Final = "task_before"
TASK_AFTER: Final = "task_after"
TASK_FAILED: Final = "task_failed"
TICK_EVERY_SLOT: Final = "tick.every_slot"
TICK_EVERY_MINUTE: Final = "tick.every_minute"
TICK_EVERY_FIVE_MINUTES: Final = "tick.every_five_minutes"
#: Fired by billing_maintenance before the first renewal notice of a service's expiry.
BEFORE_RENEWAL_FIRST_NOTICE: Final = "before_renewal_first_notice"
CREATE_EVENTS: Final = (BEFORE_TASK_CREATE, AFTER_TASK_CREATE)
TASK_EVENTS: Final = (TASK_BEFORE, TASK_AFTER, TASK_FAILED)
SLOT_EVENTS: Final = (TICK_EVERY_SLOT, TICK_EVERY_MINUTE, TICK_EVERY_FIVE_MINUTES)
DOMAIN_EVENTS: Final = (BEFORE_RENEWAL_FIRST_NOTICE,)
EVENTS: Final = (*CREATE_EVENTS, *TASK_EVENTS, *SLOT_EVENTS, *DOMAIN_EVENTS)
#: Events that ask before something is done: a blocking listener's deny stops it (the run
#: is not created, the notice is not sent). A deny of any other event changes nothing.
GATE_EVENTS: Final = (BEFORE_TASK_CREATE, BEFORE_RENEWAL_FIRST_NOTICE)

# --- outcomes (what one listener call came to) --------------------------------------------
OUTCOME_ALLOW: Final = "allow"
OUTCOME_DENY: Final = "deny"  # honored: a blocking listener denied a GATE_EVENTS event
OUTCOME_DENY_IGNORED: Final = "deny_ignored"  # a non-blocking listener, or not a gate event
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
    """Do not do it: create the run, send the notice (honored only from a blocking
    listener, for the events in GATE_EVENTS)."""

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
    """Refuse what the event announces (a run, a notice), saying why (honored from
    ``blocking=True`` listeners only, for the events in GATE_EVENTS)."""
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
    - ``data``: the facts of a domain event (read-only, JSON values), e.g. for
      ``before_renewal_first_notice`` the service, customer, expiry, stage and channels;
      empty for the other events.
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
    data: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.event not in EVENTS:
            raise ValueError(f"unknown hook event {self.event!r}; known: {', '.join(EVENTS)}")
        object.__setattr__(self, "tags", MappingProxyType(dict(self.tags)))
        object.__setattr__(self, "data", MappingProxyType(dict(self.data)))

    def for_event(self, event: str, **changes: Any) -> HookContext:
        """The same context for another event (e.g. ``after_task_create`` after ``before``)."""
        base = {"tags": dict(self.tags), "data": dict(self.data)}
        return replace(self, **{**base, **changes, "event": event})

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
            "data": dict(self.data) or None,
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


#: Where a plugin's imports used to live, before ``orchestration.plugins`` was its one API.
MOVED_PLUGIN_MODULES: Final = frozenset(
    {
        "orchestration.hooks",
        "orchestration.registry",
        "orchestration.task_plugins",
        "orchestration.task_asset",
        "orchestration.tasks",
        "orchestration.services.runtime",
        "orchestration.services.task_plugins",
    }
)


def error_text(exc: BaseException) -> str:
    """A plugin's exception in one bounded line; an import of a module that moved says where
    its names are now."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ModuleNotFoundError) and exc.name in MOVED_PLUGIN_MODULES:
        text += "; import from orchestration.plugins instead (the plugin API, docs/plugins.md)"
    return cut_text(text)


def cut_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 12] + " [truncated]"


def bounded_text(text: str | None, limit: int = MAX_TEXT_CHARS) -> str | None:
    return None if text is None else cut_text(str(text), limit)


def emit(log: HookLog | None, level: int, payload: Mapping[str, Any]) -> None:
    """One JSON object per line, to the ``dueledger.hooks`` logger and the Dagster log."""
    line = json.dumps(payload, default=str, separators=(",", ":"))
    LOGGER.log(level, line)
    if log is not None:
        try:
            (log.warning if level >= logging.WARNING else log.info)(line)
        except Exception:  # a closed or odd log must not turn a hook line into a failure
            LOGGER.debug("could not write a hook line to the Dagster log", exc_info=True)
