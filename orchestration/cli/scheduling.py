"""`dueledger dues | pause | resume | catch-up`: a task's schedule as operators steer it.

- `dues TASK [--next N | --from --to]`: the dues the task's schedule produces, with the DST
  rule's notes and the pauses that skip them (viewer);
- `pause TASK --reason`, `resume TASK --reason`: a pause with its audit (role ``retrier``, as
  `runs retry`);
- `catch-up TASK --from --to [--only missed|failed] --operator --reason [--dry-run]`: a range
  of dues run once each (``retrier``; a dry run needs ``viewer``).

Inputs are checked before anything is read (exit 2 naming the option), roles next (exit 3,
audited), then the ledger. Every command takes ``--json``.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import click

from orchestration.catch_up import CATCH_UP_RETENTION, MAX_CATCH_UP_DUES, ONLY_CHOICES
from orchestration.cli.runs import (
    acting_operator,
    load_operators,
    parse_task,
    require_role,
    viewer_gate,
)
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
from orchestration.pause import task_pauses
from orchestration.task_spec import TaskView
from resources.core.due import floor_to_slot, format_due
from resources.core.errors import InvalidInput, Refused
from resources.core.instants import iso
from resources.core.operators import ROLE_RETRIER, ROLE_VIEWER

ACTION_DUES: Final = "dues"
ACTION_PAUSE: Final = "pause"
ACTION_RESUME: Final = "resume"
ACTION_CATCH_UP_PLAN: Final = "catch_up_plan"
DEFAULT_NEXT: Final = 10


def _key(task: str) -> str:
    key = parse_task(task)
    assert key is not None  # a given text is a task key or invalid input
    return key


def _view(task: str) -> TaskView:
    """The registered task ``task`` (exit 2 when there is none)."""
    # Imported when a command needs the tasks, so the other commands do not load them.
    from orchestration.declarations import task_views

    key = _key(task)
    views = task_views()
    for view in views:
        if view.spec.key == key:
            return view
    known = ", ".join(v.spec.key for v in views)
    raise InvalidInput(f"unknown task {task!r}; registered tasks: {known}")


def _range(start: str, end: str) -> tuple[datetime, datetime]:
    low, high = parse_instant(start, "--from"), parse_instant(end, "--to")
    if low >= high:
        raise InvalidInput(f"--from {start} must be before --to {end}")
    return low, high


def _now() -> datetime:
    return datetime.now(UTC)


@click.command("dues")
@click.argument("task")
@click.option(
    "--next",
    "count",
    type=int,
    default=None,
    help="The next N dues (default 10; at most 1000, looking at most 800 days ahead).",
)
@click.option(
    "--from", "start", default=None, help="Dues at or after (ISO-8601; UTC if no offset)."
)
@click.option("--to", "end", default=None, help="Dues before (ISO-8601; UTC if no offset).")
@click.option("--operator", default=None, help="Who is looking (default: your login name).")
@json_option
@handle_errors
def dues_cmd(
    task: str,
    count: int | None,
    start: str | None,
    end: str | None,
    operator: str | None,
    as_json: bool,
) -> None:
    """The dues TASK's schedule produces: UTC, in the rule's time zone, what the DST rule did
    (a skipped local time runs once at the next valid instant, a repeated one once at its
    first occurrence) and which a pause skips. --next N (1-1000, within 800 days) or
    --from/--to (a range of at most 800 days holding at most 1000 dues; else exit 2)."""
    # Imported when this command runs, so the other commands do not load it.
    from orchestration.timetable import DUES_HORIZON, MAX_DUES_LISTED, TooManyDues

    if count is not None and (start is not None or end is not None):
        raise InvalidInput("give either --next N or --from and --to, not both")
    if (start is None) != (end is None):
        raise InvalidInput("--from and --to go together (or give --next N)")
    if count is not None and not 1 <= count <= MAX_DUES_LISTED:
        raise InvalidInput(f"--next {count} must be a whole number from 1 to {MAX_DUES_LISTED}")
    view = _view(task)
    window = _range(start, end) if start is not None and end is not None else None
    ledger = viewer_gate(operator, ACTION_DUES)
    pauses = task_pauses(ledger, view.spec.key)
    if window is not None:
        if window[1] - window[0] > DUES_HORIZON:
            raise InvalidInput(
                f"--from {start} --to {end} spans more than {DUES_HORIZON.days} days; one "
                f"listing looks at most {DUES_HORIZON.days} days: narrow the range"
            )
        try:
            listed = view.dues(window[0], end=window[1], pauses=pauses)
        except TooManyDues as exc:
            raise InvalidInput(
                f"--from {start} --to {end}: {exc}; narrow the range or split it"
            ) from None
    else:
        listed = view.next_dues(_now(), count or DEFAULT_NEXT, pauses)
    open_pauses = [p for p in pauses if p.end is None]
    data: dict[str, Any] = {
        "task_key": view.spec.key,
        "rule": view.spec.rule.describe(),
        "timezone": view.rule_zone,
        "declared_cadence": view.spec.declared_cadence,
        "effective_cadence": view.effective.label,
        "slot_minutes": view.slot_minutes,
        "overlap_policy": view.spec.overlap_policy,
        "paused": [_pause_json(p) for p in open_pauses],
        "dues": [d.as_json() for d in listed],
    }
    if as_json:
        print_json(data)
        return
    spec = view.spec
    click.echo(
        f"{spec.key}: {data['rule']} in {view.rule_zone}; declared {spec.declared_cadence}, "
        f"effective {view.effective.label} on {view.slot_minutes}-minute slots"
    )
    for pause in open_pauses:
        click.echo(f"paused by {pause.by} since {iso(pause.start)}: {pause.reason}")
    rows = [
        {
            "due": d["due"],
            "local": d["local"],
            "skipped": d["pause"]["skip_reason"] if d["pause"] else "",
            "dst": d["dst"] or "",
        }
        for d in data["dues"]
    ]
    click.echo(table(rows, ["due", "local", "skipped", "dst"]))


def _pause_json(pause: Any) -> dict[str, Any]:
    return {
        "id": pause.id,
        "by": pause.by,
        "since": iso(pause.start),
        "reason": pause.reason,
        "source": pause.source,
    }


def _acting(ledger: Any, operator: str | None, action: str, role: str) -> str:
    operators = load_operators()
    name = acting_operator(ledger, operators, operator, action=action)
    require_role(ledger, operators, name, role, action=action)
    return name


@click.command("pause")
@click.argument("task")
@click.option("--reason", required=True, help="Why the task is paused (recorded and shown).")
@click.option("--operator", default=None, help="Who pauses: you (default: your login name).")
@json_option
@handle_errors
def pause_cmd(task: str, reason: str, operator: str | None, as_json: bool) -> None:
    """Pause TASK: its schedule runs nothing (stopped in Dagster within 60 s: the UI's switch
    reads off) and each of its dues is recorded skipped (paused by NAME: REASON) until
    `dueledger resume` or a start in the UI. Role retrier; exit 3 when paused."""
    # Imported when this command runs, so the other commands do not load it.
    from orchestration.declarations import task_registry
    from orchestration.pause import pause_task

    key = _key(task)
    settings = local_settings()
    ledger = open_ledger(settings)
    name = _acting(ledger, operator, ACTION_PAUSE, ROLE_RETRIER)
    pause = pause_task(ledger, task_registry(settings).tasks, key, operator=name, reason=reason)
    if as_json:
        print_json({"task_key": key, "paused": True, **_pause_json(pause)})
        return
    click.echo(f"paused: {key} by {pause.by} since {iso(pause.start)}: {pause.reason}")


@click.command("resume")
@click.argument("task")
@click.option("--reason", required=True, help="Why the task is resumed (recorded).")
@click.option("--operator", default=None, help="Who resumes: you (default: your login name).")
@json_option
@handle_errors
def resume_cmd(task: str, reason: str, operator: str | None, as_json: bool) -> None:
    """Resume TASK: close its pauses (`dueledger pause`, a pause after failures, a stop in the
    Dagster UI); its schedule runs again from now on (started in Dagster within 60 s). Role
    retrier; exit 3 when not paused."""
    # Imported when this command runs, so the other commands do not load it.
    from orchestration.declarations import task_registry
    from orchestration.pause import resume_task

    key = _key(task)
    settings = local_settings()
    ledger = open_ledger(settings)
    name = _acting(ledger, operator, ACTION_RESUME, ROLE_RETRIER)
    closed = resume_task(ledger, task_registry(settings).tasks, key, operator=name, reason=reason)
    if as_json:
        print_json({"task_key": key, "resumed": [_pause_json(p) for p in closed]})
        return
    for pause in closed:
        click.echo(f"resumed: {key} ({pause.source} pause by {pause.by}: {pause.reason})")


@click.command("catch-up")
@click.argument("task")
@click.option("--from", "start", required=True, help="First due (ISO-8601; UTC if no offset).")
@click.option("--to", "end", required=True, help="Dues before this (ISO-8601); at most now.")
@click.option(
    "--only",
    type=click.Choice(ONLY_CHOICES),
    default=None,
    help="missed: launch dues with no entry; failed: retry failed ones (default: both).",
)
@click.option("--operator", required=True, help="Who runs the catch-up: you.")
@click.option("--reason", required=True, help="Why (recorded on every entry and retry).")
@click.option("--dry-run", is_flag=True, help="List what it would do; change nothing.")
@json_option
@handle_errors
def catch_up_cmd(
    task: str,
    start: str,
    end: str,
    only: str | None,
    operator: str,
    reason: str,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Run TASK's dues in [--from, --to) once each: a due:<due> entry and a run for each
    missed due, a manual retry for each failed one (never a second entry for a due). Runs
    wait their turn whatever the overlap policy. At most 1,000 dues, 31 days back (exit 2)."""
    # Imported when this command runs, so the other commands do not load it.
    from orchestration.catch_up import (
        LAUNCH_CLAIM_TTL,
        CatchUpResult,
        plan_catch_up,
        run_catch_up,
    )
    from orchestration.declarations import task_registry
    from orchestration.missed_dues import run_dues, unqueued_runs
    from orchestration.services.launch import DagsterCliLauncher
    from orchestration.timetable import plan_dues
    from resources.core.arguments import check_reason

    view = _view(task)
    low, high = _range(start, end)
    now = _now()
    if low < now - CATCH_UP_RETENTION:
        raise InvalidInput(
            f"--from {start} is beyond the task's retention ({CATCH_UP_RETENTION.days} days "
            f"back): the ledger and Dagster's run history are the evidence of what ran"
        )
    if low > now:
        raise InvalidInput(f"--from {start} is in the future: only dues whose slot has started")
    high = min(high, floor_to_slot(now, view.slot_minutes) + timedelta(minutes=view.slot_minutes))
    try:
        reason = check_reason(reason, "why the dues are caught up")
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    count = len(plan_dues(view.plan, view.slot_minutes, low, high))
    if count > MAX_CATCH_UP_DUES:
        raise InvalidInput(
            f"--from/--to hold {count} dues of {view.spec.key}; at most {MAX_CATCH_UP_DUES} per "
            f"catch-up: split the range"
        )
    if not view.spec.manual_trigger:
        raise Refused(
            f"task {view.spec.key!r} is not manually triggerable, so it cannot be caught up by "
            f"hand; set manual_trigger: true where the task is declared (its defs.yaml) if that "
            f"is safe. "
            f"Nothing was launched."
        )
    settings = local_settings()
    ledger = open_ledger(settings)
    role = ROLE_VIEWER if dry_run else ROLE_RETRIER
    name = _acting(ledger, operator, "catch_up" if not dry_run else ACTION_CATCH_UP_PLAN, role)
    instance = dagster_instance()
    # A run created but never queued this long after its launch began stands for its due
    # and never starts: the plan names it (its launcher was killed between the two writes).
    unqueued = unqueued_runs(instance, view.spec.key, low, now - LAUNCH_CLAIM_TTL)
    with_runs = run_dues(instance, view.spec.key, low)
    steps = plan_catch_up(view, ledger, with_runs, low, high, only, unqueued)
    if not dry_run:
        steps = run_catch_up(
            view,
            steps,
            ledger=ledger,
            instance=instance,
            specs=task_registry(settings).tasks,
            operator=name,
            reason=reason,
            operators=load_operators(),
            launcher=DagsterCliLauncher(),
        )
    result = CatchUpResult(view.spec.key, low, high, only, dry_run, steps).as_json()
    lost = None
    if result["held_elsewhere"] and not (result["launched"] or result["retried"]):
        # Another catch-up won every due this one would have launched: it lost the race.
        lost = (
            f"another catch-up is launching the {result['held_elsewhere']} dues of "
            f"{view.spec.key} this one would have launched; nothing was launched here"
        )
    if as_json:
        print_json({**result, "error": lost} if lost else result)
    else:
        verb = "would" if dry_run else "did"
        held = f", {result['held_elsewhere']} held by another catch-up" * bool(
            result["held_elsewhere"]
        )
        click.echo(
            f"catch-up of {view.spec.key} from {format_due(low)} to {format_due(high)} ({verb}): "
            f"{result['launched']} launched, {result['retried']} retried{held}, "
            f"{result['unchanged']} left as they are"
        )
        click.echo(table(result["dues"], ["due", "status", "action", "entry_id", "run_id", "note"]))
    if lost:
        click.echo(f"error: {lost}", err=True)
        sys.exit(3)
