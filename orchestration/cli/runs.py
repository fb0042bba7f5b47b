"""`dueledger runs list|show|retry` and `dueledger summary`: the operators' view of the ledger.

Inputs are validated before anything is read (exit 2 naming the valid values); the role
check comes next (exit 3, audited); then the ledger. Every command takes ``--json``.
Viewer commands take an optional ``--operator`` (default: your login name), checked
against ``DUELEDGER_OPERATORS`` like the others (see resources/core/operators.py).
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final

import click

from orchestration.cli.support import (
    dagster_instance,
    handle_errors,
    json_option,
    local_settings,
    open_ledger,
    parse_instant,
    print_json,
    table,
)
from resources.core import tags as t
from resources.core.arguments import check_reason
from resources.core.entry import DEFAULT_LIST_LIMIT, STATUSES, TRIGGERS, Entry
from resources.core.errors import InvalidInput
from resources.core.operators import (
    ROLE_ADMIN,
    ROLE_VIEWER,
    Decision,
    Operators,
    check_operator_name,
    operators_from_env,
)
from resources.core.settings import ENV_IDENTITY
from resources.ledger import Ledger

MAX_LIST_LIMIT: Final = 500
MAX_CURSOR_CHARS: Final = 200
ACTION_LIST: Final = "runs_list"
ACTION_SHOW: Final = "runs_show"
ACTION_SUMMARY: Final = "summary"
#: The audit check of who a command acts as (the caller's identity comes from the environment).
CHECK_IDENTITY: Final = "operator_is_caller"

# A task key as the registry allows it (snake_case); anything else cannot name a task.
_TASK_KEY = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
_ENTRY_ID = re.compile(r"^[0-9]{1,18}$")

_LIST_COLUMNS = (
    "id",
    "task_key",
    "trigger",
    "status",
    "attempt",
    "due",
    "created_at",
    "failure_kind",
    "parent_id",
)


# --- input validation (pure) -----------------------------------------------------------------


def parse_statuses(text: str | None) -> tuple[str, ...] | None:
    """``a,b`` -> ``("a", "b")``; an unknown or empty status is invalid input."""
    if text is None:
        return None
    items = [s.strip() for s in text.split(",")]
    unknown = [s for s in items if s not in STATUSES]
    if unknown or not items:
        shown = ", ".join(repr(s) for s in unknown) or repr(text)
        raise InvalidInput(
            f"--status {shown} is not a ledger status; valid statuses: {', '.join(STATUSES)} "
            f"(comma-separated for several)"
        )
    return tuple(dict.fromkeys(items))


def parse_trigger(text: str | None) -> str | None:
    if text is None:
        return None
    if text not in TRIGGERS:
        raise InvalidInput(
            f"--trigger {text!r} is not a trigger; valid triggers: {', '.join(TRIGGERS)}"
        )
    return text


def parse_task(text: str | None) -> str | None:
    if text is None:
        return None
    if not _TASK_KEY.match(text) or len(text) > 200:
        raise InvalidInput(
            f"--task {text!r} is not a task key (snake_case, e.g. order_cleanup; "
            f"see `dueledger tasks`)"
        )
    return text


def parse_limit(text: str | None) -> int:
    if text is None:
        return DEFAULT_LIST_LIMIT
    try:
        limit = int(text)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise InvalidInput(f"--limit {text!r} must be a whole number from 1 to {MAX_LIST_LIMIT}")
    return limit


def parse_cursor(text: str | None) -> str | None:
    if text is None:
        return None
    if not text or len(text) > MAX_CURSOR_CHARS or not re.fullmatch(r"[A-Za-z0-9_-]+", text):
        raise InvalidInput(
            f"--cursor {text[:60]!r} is not a cursor returned by a previous page "
            f"(use the next_cursor value as given)"
        )
    return text


def parse_entry_id(text: str) -> int:
    if not _ENTRY_ID.match(text.strip()) or int(text) < 1:
        raise InvalidInput(f"entry id {text!r} must be a positive whole number")
    return int(text)


def parse_window(since: str | None, until: str | None) -> tuple[datetime | None, datetime | None]:
    start = parse_instant(since, "--since") if since is not None else None
    end = parse_instant(until, "--until") if until is not None else None
    if start is not None and end is not None and start >= end:
        raise InvalidInput(f"--since {since} must be before --until {until}")
    return start, end


# --- roles -------------------------------------------------------------------------------------


def caller_identity() -> str:
    """Who runs this command: ``$DUELEDGER_IDENTITY`` (set by a service that runs dueledger
    for its users, e.g. a chat bot or a job runner), else the OS login name."""
    named = os.environ.get(ENV_IDENTITY, "").strip()
    if named:
        return _operator(named, ENV_IDENTITY)  # a bad name is reported as the variable's
    try:
        return _operator(getpass.getuser())
    except (InvalidInput, OSError, KeyError):
        return "local"


def viewer_name(operator: str | None) -> str:
    """Who is looking: ``--operator``, else the caller's identity (local default only)."""
    if operator is not None:
        return _operator(operator)
    return caller_identity()


def acting_operator(
    ledger: Ledger,
    operators: Operators,
    given: str | None,
    *,
    action: str,
    entry_id: int | None = None,
    reason: str | None = None,
) -> str:
    """The operator a command acts and is recorded as.

    Without an allow-list (the local default) it is ``--operator`` as given, else the caller.
    With one it is the caller's identity (:func:`caller_identity`): ``--operator`` may name
    only yourself, unless you are an admin acting for someone -- then the command acts with
    that operator's roles and an audit record names you both. Anything else is refused
    (exit 3, audited under the caller's name); nothing else is changed.
    """
    if operators.local:
        return viewer_name(given)
    caller = caller_identity()
    if given is None or _operator(given) == caller:
        return caller
    named = _operator(given)
    # Imported when this command runs, so the other commands do not load it.
    from orchestration.retry import audit_operator_refusal

    admin = operators.check(caller, ROLE_ADMIN)
    if not admin.passed:
        decision = Decision(
            CHECK_IDENTITY,
            False,
            f"--operator {named!r} is not you: you are {caller!r} ({_identity_source()}); "
            f"drop --operator, or ask an admin to act for {named!r}",
        )
        raise audit_operator_refusal(
            ledger, decision, operator=caller, action=action, entry_id=entry_id, reason=reason
        )
    ledger.write_audit(
        operator=caller,
        action=action,
        entry_id=entry_id,
        reason=reason,
        checks=[
            Decision(
                CHECK_IDENTITY, True, f"admin {caller!r} ({_identity_source()}) acts for {named!r}"
            ).as_json()
        ],
        outcome=f"acting for: {caller} runs {action} as {named}",
    )
    return named


def _identity_source() -> str:
    return f"from {ENV_IDENTITY}" if os.environ.get(ENV_IDENTITY, "").strip() else "OS login"


def _operator(name: str, what: str = "--operator") -> str:
    try:
        return check_operator_name(name, what)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def load_operators() -> Operators:
    return operators_from_env()


def require_role(
    ledger: Ledger,
    operators: Operators,
    operator: str,
    role: str,
    *,
    action: str,
    entry_id: int | None = None,
    reason: str | None = None,
) -> None:
    """Refuse (exit 3, audited) unless ``operator`` holds ``role``."""
    decision = operators.check(operator, role)
    if not decision.passed:
        # Imported only to refuse: an allowed read does not load the retry rule.
        from orchestration.retry import audit_operator_refusal

        raise audit_operator_refusal(
            ledger, decision, operator=operator, action=action, entry_id=entry_id, reason=reason
        )


def viewer_gate(operator: str | None, action: str, entry_id: int | None = None) -> Ledger:
    """Settings, ledger, identity and the viewer check shared by the read-only commands."""
    if operator is not None:
        _operator(operator)  # a malformed name is exit 2 before anything is read
    settings = local_settings()
    ledger = open_ledger(settings)
    operators = load_operators()
    name = acting_operator(ledger, operators, operator, action=action, entry_id=entry_id)
    require_role(ledger, operators, name, ROLE_VIEWER, action=action, entry_id=entry_id)
    return ledger


# --- dagster run statuses (runs show) --------------------------------------------------------


def attempts_with_dagster_status(run_ids: Sequence[str]) -> list[dict[str, Any]]:
    """Each run id with its current Dagster status; runs Dagster no longer has are marked."""
    import dagster as dg

    if not run_ids:
        return []
    try:
        instance = dagster_instance()
    except Exception as exc:  # no instance here: still show the ledger's side
        return [
            {
                "attempt": n,
                "run_id": rid,
                "dagster_status": None,
                "found": None,
                "note": f"Dagster instance unavailable: {type(exc).__name__}: {exc}",
            }
            for n, rid in enumerate(run_ids, start=1)
        ]
    with instance:
        records = {
            r.dagster_run.run_id: r
            for r in instance.get_run_records(dg.RunsFilter(run_ids=list(run_ids)))
        }
    out = []
    for n, rid in enumerate(run_ids, start=1):
        record = records.get(rid)
        if record is None:
            out.append(
                {
                    "attempt": n,
                    "run_id": rid,
                    "dagster_status": None,
                    "found": False,
                    "note": "run not found in the Dagster instance (deleted or another instance)",
                }
            )
            continue
        run = record.dagster_run
        out.append(
            {
                "attempt": n,
                "run_id": rid,
                "dagster_status": run.status.value,
                "found": True,
                "parent_run_id": run.parent_run_id,
                "root_run_id": run.root_run_id,
                "trigger": run.tags.get(t.TAG_TRIGGER),
                "created_at": record.create_timestamp.astimezone(UTC).isoformat(),
            }
        )
    return out


# --- commands ----------------------------------------------------------------------------------


@click.group("runs")
def runs_group() -> None:
    """Find, inspect and retry ledger entries."""


@runs_group.command("list")
@click.option("--task", default=None, help="Only this task key.")
@click.option("--status", default=None, help=f"Comma-separated: {', '.join(STATUSES)}.")
@click.option("--trigger", default=None, help=f"One of: {', '.join(TRIGGERS)}.")
@click.option("--since", default=None, help="Created at or after (ISO-8601; UTC if no offset).")
@click.option("--until", default=None, help="Created before (ISO-8601; UTC if no offset).")
@click.option("--limit", default=None, help=f"Page size, 1-{MAX_LIST_LIMIT} (default 50).")
@click.option("--cursor", default=None, help="next_cursor of the previous page.")
@click.option("--operator", default=None, help="Who is looking (default: your login name).")
@json_option
@handle_errors
def list_cmd(
    task: str | None,
    status: str | None,
    trigger: str | None,
    since: str | None,
    until: str | None,
    limit: str | None,
    cursor: str | None,
    operator: str | None,
    as_json: bool,
) -> None:
    """Ledger entries, newest first, one page at a time (keyset pagination)."""
    filters: dict[str, Any] = {
        "task_key": parse_task(task),
        "statuses": parse_statuses(status),
        "trigger": parse_trigger(trigger),
        "limit": parse_limit(limit),
        "cursor": parse_cursor(cursor),
    }
    filters["since"], filters["until"] = parse_window(since, until)
    ledger = viewer_gate(operator, ACTION_LIST)
    try:
        page, next_cursor = ledger.list_entries(**filters)
    except ValueError as exc:  # only a cursor that decodes to nonsense gets here
        raise InvalidInput(str(exc)) from None
    rows = [e.to_json() for e in page]
    if as_json:
        print_json({"entries": rows, "next_cursor": next_cursor})
        return
    click.echo(table([_list_row(r) for r in rows], _LIST_COLUMNS))
    click.echo(f"next page: --cursor {next_cursor}" if next_cursor else "(last page)")


def _list_row(row: dict[str, Any]) -> dict[str, object]:
    return {**row, "attempt": f"{row['attempt']}/{row['max_attempts']}"}


@runs_group.command("show")
@click.argument("entry_id")
@click.option("--operator", default=None, help="Who is looking (default: your login name).")
@json_option
@handle_errors
def show_cmd(entry_id: str, operator: str | None, as_json: bool) -> None:
    """One entry: attempts with their Dagster status, parent, children, audit."""
    entry_no = parse_entry_id(entry_id)
    ledger = viewer_gate(operator, ACTION_SHOW, entry_no)
    entry = ledger.get(entry_no)
    if entry is None:
        raise InvalidInput(
            f"ledger entry {entry_no} does not exist (list entries with `dueledger runs list`)"
        )
    parent = ledger.get(entry.parent_id) if entry.parent_id is not None else None
    data = {
        **entry.to_json(),
        "parent": parent.to_json() if parent is not None else None,
        "children": [c.to_json() for c in ledger.children(entry.id)],
        "audit": ledger.audit_for(entry.id),
        "attempts": attempts_with_dagster_status(entry.run_ids),
    }
    if as_json:
        print_json(data)
        return
    click.echo(_show_text(entry, data))


def _show_text(entry: Entry, data: dict[str, Any]) -> str:
    lines = [f"entry {entry.id}: {entry.task_key} {entry.dedup_key}"]
    for key in (
        "status",
        "trigger",
        "due",
        "attempt",
        "max_attempts",
        "failure_kind",
        "operator",
        "reason",
        "parent_id",
        "manual_retry_by",
        "manual_retry_at",
        "created_at",
        "updated_at",
    ):
        if data.get(key) is not None:
            lines.append(f"  {key}: {data[key]}")
    if entry.error:
        lines.append("  error: " + entry.error.replace("\n", "\n    "))
    lines.append("attempts:")
    for a in data["attempts"] or [{"run_id": "(none)"}]:
        status = a.get("dagster_status") or a.get("note") or ""
        lines.append(f"  {a.get('attempt', '')} {a['run_id']} {status}".rstrip())
    if data["children"]:
        lines.append("children:")
        lines += [f"  {c['id']} {c['status']} {c['dedup_key']}" for c in data["children"]]
    summary = data["summary"]
    for key in ("late_job_rejections", "dispatch_failures"):
        if summary.get(key):
            lines.append(f"{key.replace('_', ' ')}:")
            lines += [f"  {item}" for item in summary[key]]
    if data["audit"]:
        lines.append("audit:")
        lines += [
            f"  {a['at']} {a['operator']} {a['action']}: {a['outcome']}" for a in data["audit"]
        ]
    return "\n".join(lines)


@runs_group.command("retry")
@click.argument("entry_id")
@click.option(
    "--operator",
    required=True,
    help="Who retries: you (with an allow-list only an admin may name someone else).",
)
@click.option("--reason", required=True, help="Why (recorded in the audit).")
@click.option(
    "--acknowledge-side-effects",
    is_flag=True,
    help="Retry a dispatch_failed or lease_reclaimed entry (admin role).",
)
@json_option
@handle_errors
def retry_cmd(
    entry_id: str, operator: str, reason: str, acknowledge_side_effects: bool, as_json: bool
) -> None:
    """Retry a failed entry once: a child entry and a re-execution of its last run."""

    # Imported when this command runs, so the other commands do not load it.
    from orchestration.declarations import task_registry
    from orchestration.retry import ACTION_MANUAL_RETRY, LAUNCH_REEXECUTION, retry_entry
    from orchestration.services.launch import DagsterCliLauncher

    entry_no = parse_entry_id(entry_id)
    _operator(operator)  # a malformed name is exit 2 before anything is read
    try:
        reason = check_reason(reason, "why the entry is retried")
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    settings = local_settings()
    ledger = open_ledger(settings)
    operators = load_operators()
    name = acting_operator(
        ledger, operators, operator, action=ACTION_MANUAL_RETRY, entry_id=entry_no, reason=reason
    )
    registry = task_registry(settings)
    with dagster_instance() as instance:
        result = retry_entry(
            ledger,
            entry_no,
            specs=registry.tasks,
            operator=name,
            reason=reason.strip(),
            operators=operators,
            acknowledge_side_effects=acknowledge_side_effects,
            instance=instance,
            launcher=DagsterCliLauncher(),
            # A task from a plugin that is gone is refused naming the plugin.
            explain_unregistered=registry.why_unregistered,
        )
    if as_json:
        print_json(result.as_json())
        return
    how = (
        f"re-execution of run {result.parent_run_id}"
        if result.parent_run_id and result.method == LAUNCH_REEXECUTION
        else "new run"
    )
    if result.redispatched:
        click.echo(
            f"retry of entry {result.record.parent.id} had failed to launch: re-dispatched its "
            f"child entry {result.record.child.id} as run {result.run_id} ({how}, "
            f"{result.run_status}); audit record {result.record.audit_id}"
        )
        return
    click.echo(
        f"retry of entry {result.record.parent.id}: child entry {result.record.child.id}, "
        f"run {result.run_id} ({how}, {result.run_status}); audit record "
        f"{result.record.audit_id}"
    )
