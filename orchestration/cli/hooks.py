"""`dueledger hooks`: the plugins this environment loads, and what failed to load.

It loads listeners exactly as a code location does (entry points of group
``dueledger.hooks``, then ``DUELEDGER_HOOKS_FILE``), and the task plugins (entry points of
group ``dueledger.tasks`` and their allow-list). A plugin that fails to load is listed under
its load error; that is a report, not a failure of the command (exit 0).
"""

from __future__ import annotations

import click

from orchestration.cli.support import handle_errors, json_option, print_json, table


@click.command("hooks")
@json_option
@handle_errors
def hooks_cmd(as_json: bool) -> None:
    """List plugin hook listeners (events, blocking flag, timeout) and load errors, and the
    task plugins: every plugin task found, whether it is allowed, and their load errors."""
    # Imported when this command runs, so the other commands do not load it.
    from orchestration.declarations import ENTRY_POINT_GROUP, task_registry
    from orchestration.services.hooks.loading import load_hooks
    from orchestration.services.hooks.vocabulary import ENV_HOOKS_FILE

    # Load errors are printed below; their log lines would only repeat them on stderr.
    registry = load_hooks(log_errors=False)
    tasks = task_registry(log_errors=False)
    if as_json:
        print_json({**registry.as_json(), "task_plugins": tasks.as_json()})
        return
    rows: list[dict[str, object]] = [
        {
            "name": x.name,
            "events": ",".join(x.events),
            "blocking": x.blocking,
            "timeout_seconds": f"{x.timeout_seconds:g}",
            "source": x.source,
            "target": x.target,
        }
        for x in registry.listeners
    ]
    if rows:
        click.echo(
            table(rows, ["name", "events", "blocking", "timeout_seconds", "source", "target"])
        )
    else:
        click.echo("no listeners loaded")
    click.echo(f"config file ({ENV_HOOKS_FILE}): {registry.config_file or 'none'}")
    for problem in registry.load_errors:
        target = f" ({problem.target})" if problem.target else ""
        click.echo(f"load error: {problem.source} {problem.name}{target}: {problem.error}")
    allow = ", ".join(tasks.allow) or "nothing"
    click.echo(f"task plugins (entry points {ENTRY_POINT_GROUP}), allowed: {allow}")
    for found in tasks.found:
        state = "registered" if found.allowed else "not allowed"
        click.echo(f"  {found.spec.key}: {found.origin.label()}: {state}")
    for failed in tasks.load_errors:
        where = f" ({failed.target})" if failed.target else ""
        click.echo(f"task plugin load error: {failed.source} {failed.name}{where}: {failed.error}")
