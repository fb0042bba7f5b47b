"""The page a person reads first on ``ledger_health``: one line per task -- its latest due,
what became of it, how late it started, where its runs are (a link only when it has runs),
what to run next (nothing for a due that succeeded).

Each line is the ``latest_due_accounted_for`` check's own answer
(``orchestration/services/accounting.py``), so the table and the Catalog's checks agree; the
lag is the entry's latest start after its due; the link is the Dagster UI's Runs page
filtered on ``dueledger/entry=N``.
"""

from __future__ import annotations

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

#: What a person looks at first comes first: the UI shows the table in a narrow column.
COLUMNS: Final = ("task", "status", "lag", "runs", "latest due", "next due", "next")
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


def latest_dues_markdown(rows: Sequence[Mapping[str, Any]], as_of: str) -> str:
    """The rows as a Markdown table (failing tasks first, then in registry order)."""
    lines = [
        f"### Latest due of each task, as of {as_of}",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for row in sorted(rows, key=lambda r: r["passed"]):
        mark = "" if row["passed"] else "**FAILING** "
        if row["runs_path"]:
            runs = f"[entry {row['entry_id']}]({row['runs_path']})"
        else:
            runs = f"entry {row['entry_id']} (no run)" if row["entry_id"] is not None else ""
        step = str(row["next"]).replace("|", "\\|")
        cells = [
            row["task"],
            mark + row["status"],
            _lag(row["lag_seconds"]),
            runs,
            row["due"] or "",
            row["next_due"],
        ]
        lines.append("| " + " | ".join([*cells, step]) + " |")
    return "\n".join(lines)
