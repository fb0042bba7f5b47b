"""`dueledger`: the operators' command line.

Every command takes ``--json``. Exit codes (part of the public contract): 0 ok,
2 invalid input, 3 refused by a rule with nothing changed, 1 unexpected. With ``--json`` an
error is printed as ``{"error": message}`` on stdout as well.
"""

from __future__ import annotations

import warnings

import click

from orchestration.cli.alerts import alerts_cmd
from orchestration.cli.guard import (
    ACTION_SAMPLE_DATA,
    ACTION_SAMPLE_DATA_REPLACE,
    require_command_role,
)
from orchestration.cli.hooks import hooks_cmd
from orchestration.cli.metrics import metrics_group
from orchestration.cli.ops import liveness_cmd, reclaim_cmd
from orchestration.cli.runs import runs_group
from orchestration.cli.scheduling import catch_up_cmd, dues_cmd, pause_cmd, resume_cmd
from orchestration.cli.summary import summary_cmd
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


class _Commands(click.Group):
    """The command group; a usage error (a bad option value, an unknown option) under
    ``--json`` also prints ``{"error": message}`` on stdout, like every other error."""

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


# `runs list|show|retry` and `summary` live in orchestration/cli/runs.py.
main.add_command(runs_group)
main.add_command(summary_cmd)
# `reclaim` and `liveness` live in orchestration/cli/ops.py.
main.add_command(reclaim_cmd)
main.add_command(liveness_cmd)
# `hooks` (plugin listeners and load errors) lives in orchestration/cli/hooks.py.
main.add_command(hooks_cmd)
# `alerts` (alert channels and deliveries) lives in orchestration/cli/alerts.py.
main.add_command(alerts_cmd)
# `metrics serve|write` (Prometheus metrics from the ledger) lives in orchestration/cli/metrics.py.
main.add_command(metrics_group)
# `dues`, `pause`, `resume`, `catch-up` (a task's schedule, steered) live in cli/scheduling.py.
for _command in (dues_cmd, pause_cmd, resume_cmd, catch_up_cmd):
    main.add_command(_command)
