"""The page a person reads first on ``ledger_health``: one line per task -- its latest due,
what became of it, how late it started, where its runs are (a link only when it has runs),
what to run next (nothing for a due that succeeded).

Each line is the ``latest_due_accounted_for`` check's own answer
(``orchestration/services/accounting.py``), so the table and the Catalog's checks agree; the
lag is the entry's latest start after its due; the link is the Dagster UI's Runs page
filtered on ``dueledger/entry=N``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from orchestration.pause import Pause, pauses_by_task
from orchestration.services import accounting as acc
from orchestration.services.accounting import account_latest_due, next_step
from orchestration.task_spec import TaskView
from resources.core import tags as t
from resources.core.due import format_due
from resources.ledger import Ledger

if TYPE_CHECKING:
    import dagster as dg

#: The first metadata key of ``ledger_health``: what the per-task rows after it say.
LATEST_DUES: Final = "latest_dues"
#: The check's state in words, where the due has no entry to show the status of.
_STATE_WORDS: Final = {
    acc.STATE_NO_DUE: "no due yet",
    acc.STATE_NEW: "no run yet",
    acc.STATE_MISSED: "MISSED",
    acc.STATE_QUEUED: "queued",
    acc.STATE_DISPATCH_FAILED: "dispatch_failed",
}


def latest_due_rows(
    ledger: Ledger,
    views: Sequence[TaskView],
    now: datetime,
    *,
    instance: dg.DagsterInstance | None = None,
) -> list[dict[str, Any]]:
    """One row per task: its latest finished-slot due as the check accounts for it, and its
    next due as `dueledger dues --next 1` lists it (with the pause that skips it)."""
    rows = []
    pauses = pauses_by_task(ledger)
    for view in views:
        account = account_latest_due(view, ledger, now, instance=instance)
        entry = ledger.get(account.entry_id) if account.entry_id is not None else None
        lag = None
        if entry is not None and entry.started_at is not None and account.due is not None:
            lag = max(0, int((entry.started_at - account.due.at).total_seconds()))
        rows.append(
            {
                "task": view.spec.key,
                "due": account.due.text if account.due else None,
                "state": account.state,
                "passed": account.passed,
                "status": entry.status
                if entry is not None
                else _STATE_WORDS.get(account.state, account.state),
                "entry_id": account.entry_id,
                "lag_seconds": lag,
                # A link only where it finds something: a skipped due has no run to list.
                "runs_path": t.entry_runs_path(entry.id)
                if entry is not None and entry.run_ids
                else None,
                "next_due": _next_due(view, now, pauses.get(view.spec.key, ())),
                # A due that succeeded asks nothing of anyone; the check still names its entry.
                "next": ""
                if account.state == acc.STATE_SUCCESS
                else next_step(account.state, view.spec.key, entry),
            }
        )
    return rows


def _next_due(view: TaskView, now: datetime, pauses: Sequence[Pause]) -> str:
    listed = view.next_dues(now, 1, pauses)
    if not listed:
        return ""
    (due,) = listed
    held = f" (paused by {due.pause.as_json()['by']})" if due.pause is not None else ""
    return format_due(due.due) + held


def _lag(seconds: int | None) -> str:
    """``42 s``, ``1 min 15 s``, ``13 h 21 min``."""
    if seconds is None:
        return ""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def latest_dues_metadata(rows: Sequence[Mapping[str, Any]], as_of: str) -> dict[str, Any]:
    """The rows as asset metadata, in the order the UI lists them: ``latest_dues`` (as of
    when), then one entry per task labelled ``task KEY`` whose value is its row as a few short
    lines of Markdown (failing tasks first, then in registry order).

    One value per task, not one Markdown table: the Dagster UI shows a Markdown value inline
    only while it is under 1,000 characters (else behind "[Show Markdown]"), and a table of
    eleven tasks with their links is longer than that; a Table value has no links. The UI
    does not wrap a value's lines (a long one scrolls out of sight), so each line is short.
    """
    import dagster as dg

    metadata: dict[str, Any] = {LATEST_DUES: dg.MetadataValue.text(f"as of {as_of}, failing first")}
    for row in sorted(rows, key=lambda r: r["passed"]):
        metadata[task_label(row["task"])] = dg.MetadataValue.md(latest_due_lines(row))
    return metadata


def task_label(task: str) -> str:
    """The metadata label of a task's row."""
    return f"task {task}"


def latest_due_lines(row: Mapping[str, Any]) -> str:
    """One task's row as a few short lines of Markdown, the empty parts left out::

    **FAILING** failed · 1 min 15 s late · [entry 7](/runs?...)
    due 2026-11-30T22:45:00Z · next due 2026-11-30T23:15:00Z
    next: `dueledger runs show 7`, then once:
    `dueledger runs retry 7 --operator NAME --reason TEXT`

    The next step's second command starts a line of its own: the UI does not wrap a value's
    lines, and the two commands on one line ran past a 1600-pixel window.
    """
    mark = "" if row["passed"] else "**FAILING** "
    if row["runs_path"]:
        runs = f"[entry {row['entry_id']}]({row['runs_path']})"
    else:
        runs = f"entry {row['entry_id']} (no run)" if row["entry_id"] is not None else ""
    lag = _lag(row["lag_seconds"])
    lines = [
        [mark + row["status"], f"{lag} late" if lag else "", runs],
        [
            f"due {row['due']}" if row["due"] else "",
            f"next due {row['next_due']}" if row["next_due"] else "",
        ],
    ]
    joined = [" · ".join(part for part in line if part) for line in lines]
    if row["next"]:
        joined += _command_lines(f"next: {row['next']}")
    # Two trailing spaces: a Markdown hard line break.
    return "  \n".join(line for line in joined if line)


def _command_lines(text: str) -> list[str]:
    """``text`` broken before each code span that follows another one on its line (a code
    span is never broken: it is a command to copy whole)."""
    lines = [""]
    has_code = False
    for part in re.split(r"(`[^`]*`)", text):
        is_code = part.startswith("`")
        if is_code and has_code:
            lines[-1] = lines[-1].rstrip()
            lines.append("")
            has_code = False
        lines[-1] += part
        has_code = has_code or is_code
    return [line.strip() for line in lines if line.strip()]
