"""`dueledger`: the operators' command line.

Every command takes ``--json``. Exit codes (part of the public contract): 0 ok,
2 invalid input, 3 refused by a rule with nothing changed, 1 unexpected. With ``--json`` an
error is printed as ``{"error": message}`` on stdout as well.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Final

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
    today_utc,
)
from resources.core.errors import InvalidInput, Refused
from resources.core.instants import iso
from resources.core.operators import ROLE_ADMIN, ROLE_RETRIER
from resources.core.settings import load_settings, mask_url

#: The commands defined in their own modules, loaded when named: a command imports only what
#: it uses (a ledger read loads neither Dagster nor the task declarations nor the other
#: commands), as click's documentation shows for lazily loaded subcommands.
LAZY_COMMANDS: Final = {
    "runs": "orchestration.cli.runs:runs_group",
    "summary": "orchestration.cli.summary:summary_cmd",
    "reclaim": "orchestration.cli.ops:reclaim_cmd",
    "liveness": "orchestration.cli.ops:liveness_cmd",
    "hooks": "orchestration.cli.hooks:hooks_cmd",
    "alerts": "orchestration.cli.alerts:alerts_cmd",
    "metrics": "orchestration.cli.metrics:metrics_group",
    "dues": "orchestration.cli.scheduling:dues_cmd",
    "pause": "orchestration.cli.scheduling:pause_cmd",
    "resume": "orchestration.cli.scheduling:resume_cmd",
    "catch-up": "orchestration.cli.scheduling:catch_up_cmd",
}


class _Commands(click.Group):
    """The command group; a usage error (a bad option value, an unknown option) under
    ``--json`` also prints ``{"error": message}`` on stdout, like every other error. The
    commands of :data:`LAZY_COMMANDS` are imported when they are named (or listed)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = LAZY_COMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, _, name = target.partition(":")
        command = getattr(importlib.import_module(module), name)
        assert isinstance(command, click.Command), target
        return command

    def invoke(self, ctx: click.Context) -> object:
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            if "--json" in rest:
                print_json({"error": exc.format_message()})
            raise


@click.group(cls=_Commands)
def main() -> None:
    """dueledger: exactly once per due time, auditably — on Dagster."""
    # A cadence finer than the slot (task_spec.CadenceWarning) is shown where it matters
    # (`tasks`, the `dues` header) as the effective cadence; printed as Python warnings it
    # named other tasks, with source lines. Matched by its text: this runs before every
    # command, and the commands that only read the ledger do not load the task modules.
    warnings.filterwarnings("ignore", message=r"task '.*' declares .* but runs ")


@main.command("tasks")
@json_option
@handle_errors
def tasks_cmd(as_json: bool) -> None:
    """List registered tasks (core and allowed plugin tasks) with declared and effective
    cadence, their policies, who paused a task since when and why, and where each comes
    from; plugin tasks not allowed and plugin load errors are listed after the table (with
    --json: on stderr; `dueledger hooks --json` has them)."""
    import warnings

    # Imported when this command runs, so the other commands do not load them.
    from orchestration.declarations import task_registry, task_views
    from orchestration.pause import open_pauses

    settings = load_settings()
    # Load errors are printed below; their log lines would only repeat them on stderr.
    registry = task_registry(settings, log_errors=False)
    with warnings.catch_warnings():
        # The cadence warnings are shown as a column here, not as Python warnings.
        warnings.simplefilter("ignore", UserWarning)
        views = task_views(settings)
    rows = [v.as_json() for v in views]
    # Who paused which task, since when and why (`dueledger pause`, the UI's schedule toggle,
    # a pause after failures): the ledger's open pauses.
    paused: dict[str, list[dict[str, object]]] = {}
    for pause in open_pauses(open_ledger(settings)):
        paused.setdefault(pause.task_key, []).append(
            {
                "by": pause.by,
                "since": iso(pause.start),
                "reason": pause.reason,
                "source": pause.source,
            }
        )
    for row in rows:
        row["paused"] = paused.get(str(row["key"]), [])
    # Not registered, so not rows of the list (the contract: the registered tasks); said on
    # stderr under --json, and machine-readable in `dueledger hooks --json` (task_plugins).
    notes = [f"not allowed: {registry.why_unregistered(f.spec.key)}" for f in registry.not_allowed]
    for problem in registry.load_errors:
        target = f" ({problem.target})" if problem.target else ""
        notes.append(f"plugin load error: {problem.source} {problem.name}{target}: {problem.error}")
    if as_json:
        print_json(rows)
        for note in notes:
            click.echo(note, err=True)
        return
    click.echo(
        table(
            rows,
            [
                "key",
                "rule",
                "declared_cadence",
                "effective_cadence",
                "timeout_seconds",
                "lease_ttl_seconds",
                "max_attempts",
                "retry_backoff_seconds",
                "manual_trigger",
                "missed_slot_policy",
                "overlap_policy",
                "source",
            ],
        )
    )
    for row in rows:
        for note in row["warnings"]:  # type: ignore[attr-defined]
            click.echo(f"warning: {note}")
        for pause in row["paused"]:  # type: ignore[attr-defined]
            click.echo(
                f"paused: {row['key']} by {pause['by']} since {pause['since']} "
                f"({pause['source']}): {pause['reason']}"
            )
    for note in notes:
        click.echo(note)


@main.command("launch")
@click.argument("task")
@click.option(
    "--operator",
    required=True,
    help="Who launches: you (with an allow-list only an admin may name someone else).",
)
@click.option("--reason", required=True, help="Why the run is launched.")
@click.option("--request-id", default=None, help="Idempotency key (default: a new UUID).")
@click.option(
    "--queue",
    "queue",
    is_flag=True,
    help="Under overlap skip or buffer_one, wait for a running run of the task to end "
    "instead of being refused (exit 3).",
)
@json_option
@handle_errors
def launch_cmd(
    task: str, operator: str, reason: str, request_id: str | None, queue: bool, as_json: bool
) -> None:
    """Launch TASK now, in the manual namespace (never swallowed by a scheduled due). Under
    overlap skip a launch that finds the task running is refused naming the running entry."""
    # Imported when this command runs, so the other commands do not load it.
    from orchestration.cli.runs import acting_operator, load_operators, require_role
    from orchestration.declarations import task_registry
    from orchestration.manual_launch import launch_manual
    from orchestration.services.hooks.registry import Hooks
    from resources.core.operators import ROLE_RETRIER

    settings = local_settings()
    registry = task_registry(settings)
    if any(found.spec.key == task for found in registry.not_allowed):
        raise Refused(f"{registry.why_unregistered(task)}. Nothing was launched.")
    ledger = open_ledger(settings)
    # Who launches (identity from the environment with an allow-list), then roles:
    # launching needs `retrier`; a refusal is audited. (An empty --operator is left to
    # launch_manual: invalid input, exit 2.)
    if operator.strip():
        operators = load_operators()
        operator = acting_operator(ledger, operators, operator, action="launch")
        require_role(ledger, operators, operator, ROLE_RETRIER, action="launch")
    result = launch_manual(
        registry.tasks,
        task,
        operator=operator,
        reason=reason,
        request_id=request_id,
        instance=dagster_instance(),
        ledger=ledger,
        # This process's plugin listeners, loaded for this one launch.
        hooks=Hooks.from_environment(),
        queue=queue,
    )
    if as_json:
        print_json(result.as_json())
        return
    verb = (
        "already launched"
        if result.existing
        else "re-dispatched (its earlier launch had failed)"
        if result.redispatched
        else "launched"
    )
    click.echo(
        f"{verb}: task {result.task_key} run {result.run_id} ({result.run_status}), "
        f"ledger entry {result.entry_id}, request id {result.request_id}"
    )


@main.command("sample-data")
@click.option("--services", default=200, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--seed",
    default=7,
    show_default=True,
    type=click.IntRange(min=0),
    help="Random seed (a non-negative integer); the same seed gives the same data.",
)
@click.option(
    "--as-of",
    default=None,
    help="Anchor instant (ISO-8601, UTC); default: today 00:00Z, so a day's data is stable.",
)
@click.option(
    "--replace",
    is_flag=True,
    help="Delete the sample data in the store and generate it anew (automation_log is kept).",
)
@click.option(
    "--yes-delete-everything",
    "delete_everything",
    is_flag=True,
    help="With --replace: also when the store is PostgreSQL or holds rows sample-data did "
    "not generate; every customer, service, invoice, payment, order and ticket is deleted.",
)
@json_option
@handle_errors
def sample_data_cmd(
    services: int,
    seed: int,
    as_of: str | None,
    replace: bool,
    delete_everything: bool,
    as_json: bool,
) -> None:
    """Generate deterministic hosting sample data into the source store."""
    # Imported when this command runs, so the other commands do not load it.
    from orchestration.cli.guard import (
        ACTION_SAMPLE_DATA,
        ACTION_SAMPLE_DATA_REPLACE,
        require_command_role,
    )
    from resources.sample_data import ReplaceRefused, StoreNotEmpty, generate_sample_data
    from resources.source_store import open_source_engine

    settings = local_settings()
    anchor = parse_instant(as_of, "--as-of") if as_of else today_utc()
    if delete_everything and not replace:
        raise InvalidInput(
            "--yes-delete-everything only applies to --replace; add --replace to delete the "
            "store's data and generate it anew, or drop --yes-delete-everything"
        )
    engine = open_source_engine(settings.source_url)  # a URL that cannot work: exit 2
    # With an allow-list: writing data needs `retrier`, deleting it (--replace) `admin`.
    try:
        grant = require_command_role(
            settings,
            ACTION_SAMPLE_DATA_REPLACE if replace else ACTION_SAMPLE_DATA,
            ROLE_ADMIN if replace else ROLE_RETRIER,
        )
    except BaseException:
        engine.dispose()
        raise
    try:
        counts = generate_sample_data(
            engine,
            services=services,
            seed=seed,
            as_of=anchor,
            replace=replace,
            delete_everything=delete_everything,
        )
    except ReplaceRefused as exc:
        raise Refused(exc.message("--replace --yes-delete-everything")) from exc
    except StoreNotEmpty as exc:
        raise Refused(str(exc).replace("replace=True", "--replace")) from exc
    except ValueError as exc:
        raise Refused(str(exc)) from exc
    finally:
        engine.dispose()
    where = mask_url(settings.source_url)  # never print the store's password
    grant.audit(f"sample data as of {anchor.isoformat()} in {where}: {counts}")
    if as_json:
        print_json({"source_url": where, "as_of": anchor.isoformat(), **counts})
        return
    click.echo(f"sample data as of {anchor.isoformat()} in {where}: {counts}")
