"""Shared plumbing for the `dueledger` CLI commands: --json, exit codes, tables, settings.

Exit codes (part of the public contract): 0 ok, 2 invalid input, 3 refused by a rule
with nothing changed, 1 unexpected. With ``--json`` an error is printed as
``{"error": message}`` on stdout.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from resources.core.errors import InvalidInput, Refused
from resources.core.settings import PROJECT_ROOT, Settings, SettingsError, load_settings

if TYPE_CHECKING:
    import dagster as dg

    from resources.ledger import Ledger

F = TypeVar("F", bound=Callable[..., Any])

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def print_json(data: object) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def table(rows: Sequence[dict[str, object]], columns: Sequence[str]) -> str:
    """A plain fixed-width table for humans."""
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def handle_errors(fn: F) -> F:
    """Map user errors to exit codes; with --json also print {"error": ...}."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json"))

        def fail(code: int, message: str) -> None:
            if as_json:
                print_json({"error": message})
            click.echo(f"error: {message}", err=True)
            sys.exit(code)

        try:
            return fn(*args, **kwargs)
        except (InvalidInput, SettingsError) as exc:
            fail(2, str(exc))
        except Refused as exc:
            fail(3, str(exc))
        except click.exceptions.Exit:
            raise
        except Exception as exc:  # the contract: anything unexpected is exit 1
            fail(1, f"{type(exc).__name__}: {exc}")

    return wrapper  # type: ignore[return-value]


def local_settings() -> Settings:
    """Settings for this process; makes sure the local DAGSTER_HOME exists.

    When DAGSTER_HOME is not set the project-local `.dagster_home` is used and seeded
    with the project's dagster.yaml, exactly as `scripts/dev.sh` does.
    """
    settings = load_settings()
    if not os.environ.get("DAGSTER_HOME"):
        os.environ["DAGSTER_HOME"] = str(settings.dagster_home)
    settings.dagster_home.mkdir(parents=True, exist_ok=True)
    target = settings.dagster_home / "dagster.yaml"
    template = PROJECT_ROOT / "dagster.yaml.local"
    if not target.exists() and template.exists():
        # Copied whole, then renamed: a concurrent command never reads half a file.
        partial = target.with_name(f".dagster.yaml.{os.getpid()}")
        shutil.copyfile(template, partial)
        os.replace(partial, target)
    return settings


def dagster_instance() -> dg.DagsterInstance:
    """The Dagster instance of ``$DAGSTER_HOME``, its storage initialised under a file lock.

    Dagster's SQLite storage creates its tables and Alembic stamp on first use; two
    processes doing that at once (eight ``dueledger launch`` on a fresh home) leave two
    Alembic heads and every later command fails. The first use is therefore serialised
    with ``flock`` on a file in DAGSTER_HOME; after it, the lock costs one open.
    """
    # Imported when a command needs the instance, so the other commands do not load it.
    import dagster as dg

    home = Path(os.environ.get("DAGSTER_HOME") or load_settings().dagster_home)
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".dueledger-instance.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        instance = dg.DagsterInstance.get()
        instance.get_run_records(limit=1)  # run storage
        instance.all_instigator_state()  # schedule storage
        instance.fetch_run_status_changes(dg.DagsterEventType.RUN_SUCCESS, limit=1)  # events
    return instance


def open_ledger(settings: Settings) -> Ledger:
    # Imported when this command runs, so the other commands do not load it.
    from resources.ledger import Ledger

    ledger = Ledger.open(settings.ledger_url)
    # Not set up by Dagster here: the CLI process migrates the ledger on its first use.
    ledger.ensure_migrated()
    return ledger


def today_utc() -> datetime:
    now = datetime.now(UTC)
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


#: Instants the commands accept: windows and slot arithmetic around them stay representable.
_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def parse_instant(text: str, option: str) -> datetime:
    """ISO-8601 → aware UTC datetime; anything else is invalid input naming the option."""
    out_of_range = InvalidInput(
        f"{option} {text!r} is out of range: give a time between "
        f"{_EARLIEST:%Y-%m-%d} and {_LATEST:%Y-%m-%d} (UTC)"
    )
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(
            f"{option} {text!r} is not an ISO-8601 time (e.g. 2026-11-30T22:45:00Z)"
        ) from None
    try:
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:  # year 1 or 9999 moved past the calendar by its offset
        raise out_of_range from None
    if not _EARLIEST <= value <= _LATEST:
        raise out_of_range
    return value
