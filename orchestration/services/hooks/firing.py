"""Running listeners in isolation: each call in its own daemon thread, inside its own
try/except, joined with the listener's timeout; whatever happens becomes an outcome."""

from __future__ import annotations

import io
import logging
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from orchestration.services.hooks.vocabulary import (
    BEFORE_TASK_CREATE,
    DEGRADE_ALLOWED_SYSTEM_TAGS,
    GATE_EVENTS,
    MAX_DEGRADE_TAGS,
    MAX_TAG_KEY_CHARS,
    MAX_TAG_VALUE_CHARS,
    OUTCOME_ALLOW,
    OUTCOME_DEGRADE,
    OUTCOME_DEGRADE_IGNORED,
    OUTCOME_DENY,
    OUTCOME_DENY_IGNORED,
    OUTCOME_ERROR,
    OUTCOME_INVALID,
    OUTCOME_TIMEOUT,
    PROTECTED_TAG_PREFIXES,
    Allow,
    Degrade,
    Deny,
    HookContext,
    HookLog,
    HookRegistry,
    Listener,
    bounded_text,
    emit,
    error_text,
)
from resources.core.instants import iso, utc_now

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
            "data": dict(context.data) or None,
        }


@dataclass(frozen=True)
class Dispatch:
    """All outcomes of one event; for a gate event (``before_task_create``,
    ``before_renewal_first_notice``) also the decision."""

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
    return iso(utc_now(), micro=True)


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


#: How much one listener call may print; the rest is dropped (said once, on stderr).
MAX_LISTENER_OUTPUT_CHARS = 64 * 1024

_listening = threading.local()


class _ListenerStdout(io.TextIOBase):
    """``sys.stdout`` once a listener has run in this process: what a listener's thread prints
    goes to stderr, bounded, never into the output of the command or run around it (a
    `--json` command's stdout is one JSON document); every other thread writes through."""

    def __init__(self, stdout: Any) -> None:
        self.stdout = stdout

    def write(self, text: str) -> int:
        left: int | None = getattr(_listening, "left", None)
        if left is None:
            return int(self.stdout.write(text))
        if left > 0:
            sys.stderr.write(text[:left])
            if len(text) > left:
                sys.stderr.write(
                    f"\n[dueledger: a hook listener printed more than "
                    f"{MAX_LISTENER_OUTPUT_CHARS} characters; the rest was dropped]\n"
                )
        _listening.left = max(0, left - len(text))
        return len(text)

    def flush(self) -> None:
        self.stdout.flush()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return int(self.stdout.fileno())

    def isatty(self) -> bool:
        return bool(self.stdout.isatty())

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self.stdout, "encoding", "utf-8"))

    def __getattr__(self, name: str) -> Any:
        # ``buffer``, ``mode``, ``name``...: the real stream's, for code that asks for them.
        return getattr(self.stdout, name)


def _route_listener_output() -> None:
    if not isinstance(sys.stdout, _ListenerStdout):
        sys.stdout = _ListenerStdout(sys.stdout)


def _call(item: Listener, context: HookContext) -> tuple[str, Any]:
    """Call the listener and judge what it returned, in a daemon thread joined with its
    timeout: the listener's value is plugin code too (a ``__repr__``, a ``reason`` whose
    ``__str__`` sleeps), so it is read inside the timed call, never after it.

    Returns ("ok", outcome fields), ("error", error text) or ("timeout", None). A thread
    still running after its timeout cannot be killed in Python: it is abandoned and its
    result, whenever it comes, is dropped.
    """
    box: dict[str, Any] = {}
    _route_listener_output()

    def target() -> None:
        _listening.left = MAX_LISTENER_OUTPUT_CHARS
        try:
            box["value"] = _judge(item, context, item.fn(context))
        except BaseException as exc:  # SystemExit in a listener must not end anything either
            try:
                box["error"] = error_text(exc)
            except BaseException:  # an exception whose text cannot be read
                box["error"] = type(exc).__name__

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
    gate = context.event in GATE_EVENTS
    if value is None or isinstance(value, Allow):
        return {"outcome": OUTCOME_ALLOW}
    if isinstance(value, Deny):
        reason = bounded_text(value.reason) or "no reason given"
        if gate and item.blocking:
            return {"outcome": OUTCOME_DENY, "reason": reason}
        why = "not a blocking listener" if gate else f"a deny has no effect on {context.event}"
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
            "reason": bounded_text(value.reason) or None,
            "tags": accepted,
            "ignored_tags": tuple(bounded_text(x) or "" for x in ignored),
        }
    hint = "return allow(), deny(reason), degrade(tags) or None"
    return {"outcome": OUTCOME_INVALID, "error": bounded_text(f"returned {value!r}; {hint}")}


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
        return replace(base, error=value)
    return replace(base, **value)


def fire(context: HookContext, *, registry: HookRegistry, log: HookLog | None = None) -> Dispatch:
    """Run every listener of ``context.event`` in registration order, each isolated; log
    one JSON line per outcome. Never raises for a listener's sake."""
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
                error=error_text(exc),
            )
        outcomes.append(outcome)
        quiet = outcome.outcome in (OUTCOME_ALLOW, OUTCOME_DEGRADE)
        emit(
            log,
            logging.INFO if quiet else logging.WARNING,
            {"hook": context.event, **outcome.record(context), "entry_id": context.entry_id},
        )
    return Dispatch(context, tuple(outcomes))
