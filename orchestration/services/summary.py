"""The ledger summary: the numbers `dueledger summary` and the ``ledger_health`` asset show.

:func:`ledger_summary` is the one computation of the summary: totals come from
``Ledger.summary_counts`` (the same query `dueledger summary` runs), missed dues from
the gap audit (``orchestration/services/audit.py``), plus a per-task table and the entries
that need attention.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from orchestration.deadline import deadline_misses
from orchestration.missed_dues import DEFAULT_AUDIT_WINDOW, audit_tasks
from orchestration.task_spec import TaskView
from resources.core import tags as t
from resources.core.due import format_due
from resources.core.entry import SUMMARY_DISPATCH_FAILURES, Entry, FailureKind, Status, Trigger
from resources.core.instants import iso
from resources.ledger import Ledger

if TYPE_CHECKING:
    import dagster as dg

SUMMARY_WINDOW: Final = DEFAULT_AUDIT_WINDOW
#: Entries created this long before the window are still read for "finished in the window".
_LOOKBACK: Final = timedelta(hours=24)
_PAGE: Final = 500

# --- reading the ledger ----------------------------------------------------------------------


def all_entries(ledger: Ledger, **filters: Any) -> list[Entry]:
    """Every entry matching ``list_entries`` filters (all pages), newest first."""
    found: list[Entry] = []
    cursor: str | None = None
    while True:
        page, cursor = ledger.list_entries(limit=_PAGE, cursor=cursor, **filters)
        found.extend(page)
        if cursor is None:
            return found


def recent_entries(ledger: Ledger, since: datetime) -> list[Entry]:
    """Entries created since ``since - _LOOKBACK`` plus every running one (any age)."""
    by_id = {e.id: e for e in all_entries(ledger, since=since - _LOOKBACK)}
    for entry in all_entries(ledger, statuses=[Status.RUNNING]):
        by_id.setdefault(entry.id, entry)
    return sorted(by_id.values(), key=lambda e: e.id)


# --- the summary -----------------------------------------------------------------------------

#: Name in the ``summary`` JSON contract -> key of ``Ledger.summary_counts``.
SUMMARY_TOTALS: Final = {
    "active": "active",
    "stale": "stale",
    "failed_24h": "failed_window",
    "success_24h": "success_window",
    "manual_retry_24h": "manual_retry_window",
    "dispatch_failed_24h": "dispatch_failed_window",
    "lease_reclaimed_24h": "lease_reclaimed_window",
    "refused_24h": "refused_window",
    "skipped_24h": "skipped_window",
    "queued": "queued",
    "retrying": "retrying",
}
#: Problems first: the UI's inline table view shows only the first few columns.
TASK_COLUMNS: Final = (
    "task_key",
    "failed_24h",
    "dispatch_failed_24h",
    "missed_24h",
    "deadline_missed_24h",
    "paused_24h",
    "skipped_24h",
    "stale",
    "active",
    "success_24h",
    "manual_retry_24h",
    "last_success_at",
    "missed_slot_policy",
)


def _after(instant: datetime | None, since: datetime) -> bool:
    return instant is not None and instant >= since


def first_line(text: str | None) -> str:
    """The first line of an error text, at most 200 characters (empty for none)."""
    return (text or "").strip().splitlines()[0][:200] if (text or "").strip() else ""


def task_counts(entries: Iterable[Entry], now: datetime, since: datetime) -> dict[str, int]:
    """Per-task counts with the definitions of ``Ledger.summary_counts`` (its docstring):
    running split by lease expiry, terminal by ``finished_at``, dispatch_failed by
    ``updated_at``, manual retries by ``created_at``."""
    counts = dict.fromkeys(
        (
            "active",
            "stale",
            "failed_24h",
            "success_24h",
            "manual_retry_24h",
            "dispatch_failed_24h",
            "lease_reclaimed_24h",
            "skipped_24h",
        ),
        0,
    )
    for e in entries:
        if e.status == Status.RUNNING and e.lease_expires_at is not None:
            counts["active" if e.lease_expires_at >= now else "stale"] += 1
        if e.status == Status.FAILED and _after(e.finished_at, since):
            counts["failed_24h"] += 1
            if e.failure_kind == FailureKind.LEASE_RECLAIMED:
                counts["lease_reclaimed_24h"] += 1
        if e.status == Status.SUCCESS and _after(e.finished_at, since):
            counts["success_24h"] += 1
        if e.status == Status.DISPATCH_FAILED and _after(e.updated_at, since):
            counts["dispatch_failed_24h"] += 1
        if e.trigger == Trigger.MANUAL_RETRY and _after(e.created_at, since):
            counts["manual_retry_24h"] += 1
        if e.status == Status.SKIPPED and _after(e.finished_at, since):
            counts["skipped_24h"] += 1
    return counts


def ledger_summary(
    ledger: Ledger,
    views: Sequence[TaskView],
    now: datetime,
    *,
    instance: dg.DagsterInstance | None = None,
    window: timedelta = SUMMARY_WINDOW,
) -> dict[str, Any]:
    """The ledger's health as of ``now``: the contract's summary numbers plus a per-task table.

    Totals are ``Ledger.summary_counts`` (one query, shared with `dueledger summary`);
    ``missed_24h`` is the gap audit over ``window`` (``sensors/audit.py``): with
    ``instance`` a due that has a Dagster run but no ledger entry yet (queued) is not
    missed. ``tasks`` has one row per registered task, plus rows for entries of tasks that
    are no longer registered; an entry older than the window plus 24 h that finished
    inside the window is counted in the totals only.
    """
    since = now - window
    counts = ledger.summary_counts(now=now, window=window)
    audits = {
        a.task_key: a for a in audit_tasks(ledger, views, now, window=window, instance=instance)
    }
    by_task: dict[str, list[Entry]] = {}
    for entry in recent_entries(ledger, since):
        by_task.setdefault(entry.task_key, []).append(entry)
    policies = {v.spec.key: v.spec.missed_slot_policy for v in views}
    deadlines = {v.spec.key: len(deadline_misses(ledger, v, now, window=window)) for v in views}
    rows = []
    for key in [*policies, *sorted(k for k in by_task if k not in policies)]:
        entries = by_task.get(key, [])
        audit = audits.get(key)
        successes = [e.finished_at for e in entries if e.status == Status.SUCCESS and e.finished_at]
        rows.append(
            {
                "task_key": key,
                "missed_slot_policy": policies.get(key, "unregistered"),
                **task_counts(entries, now, since),
                "missed_24h": len(audit.missed) if audit else 0,
                "missed_dues": [format_due(d) for d in audit.missed] if audit else [],
                "paused_24h": len(audit.paused) if audit else 0,
                "deadline_missed_24h": deadlines.get(key, 0),
                "audited_since": iso(audit.start) if audit and audit.start else None,
                "last_success_at": iso(max(successes)) if successes else None,
            }
        )
    return {
        **{name: int(counts[key]) for name, key in SUMMARY_TOTALS.items()},
        "missed_24h": sum(len(a.missed) for a in audits.values()),
        "paused_24h": sum(len(a.paused) for a in audits.values()),
        "deadline_missed_24h": sum(deadlines.values()),
        "attention": attention_rows(by_task.values(), now, since),
        "as_of": iso(now),
        "window_hours": int(window.total_seconds() // 3600),
        "tasks": rows,
        "notes": {
            "active": "running entries whose lease is live",
            "stale": "running entries whose lease expired (the reclaim sensor fails them)",
            "missed_24h": (
                "dues the task's rule implies in the window, since its schedule first ran "
                "here, with neither a ledger entry nor a Dagster run, and not paused"
            ),
            "paused_24h": (
                "dues in the window inside a pause of their task (schedule stopped in the "
                "Dagster UI, `dueledger pause`, paused after failures): not run on purpose, "
                "not missed; each is written as a skipped entry"
            ),
            "skipped_24h": (
                "entries that ended skipped in the window: not run on purpose, with the reason "
                "in their error text (overlap: entry N running, paused by NAME: REASON)"
            ),
            "deadline_missed_24h": (
                "dues whose deadline (a duration after the due) passed in the window without "
                "the due succeeding by then"
            ),
            "refused_24h": (
                "runs the ledger did not let act (duplicate or late runs, refused "
                "re-executions, manual launches of tasks that are not manually triggerable); "
                "they end CANCELED and are not failures"
            ),
        },
    }


#: Entries listed under "needs attention" (newest first), and the table's columns.
ATTENTION_ROWS: Final = 10
ATTENTION_COLUMNS: Final = ("entry_id", "task_key", "status", "updated_at", "run_id", "error")


def attention_rows(
    entries_by_task: Iterable[Iterable[Entry]], now: datetime, since: datetime
) -> list[dict[str, Any]]:
    """The newest failed, dispatch_failed and stale entries of the window, one row each, with
    the run to open and the Runs-page filter that lists every run of the entry. An entry a
    manual retry made good (a retry of it, or of its retries, succeeded) needs nothing more."""
    everything = [e for entries in entries_by_task for e in entries]
    resolved = retried_successfully(everything)
    rows = []
    for entries in (everything,):
        for e in entries:
            if e.id in resolved:
                continue
            stale = (
                e.status == Status.RUNNING
                and e.lease_expires_at is not None
                and e.lease_expires_at < now
            )
            failed = e.status in (Status.FAILED, Status.DISPATCH_FAILED) and _after(
                e.updated_at, since
            )
            if not (stale or failed):
                continue
            failures = e.summary.get(SUMMARY_DISPATCH_FAILURES, [])
            runs = [*e.run_ids, *(str(f["run_id"]) for f in failures if f.get("run_id"))]
            rows.append(
                {
                    "entry_id": e.id,
                    "task_key": e.task_key,
                    "status": "stale" if stale else e.status,
                    "failure_kind": e.failure_kind or "",
                    "dedup_key": e.dedup_key,
                    "updated_at": iso(e.updated_at),
                    "run_id": runs[-1] if runs else None,
                    "error": first_line(e.error or ""),
                    "runs_path": t.entry_runs_path(e.id),
                }
            )
    rows.sort(key=lambda r: (r["updated_at"] or "", r["entry_id"]), reverse=True)
    return rows[:ATTENTION_ROWS]


def retried_successfully(entries: Iterable[Entry]) -> set[int]:
    """Ids of the entries among ``entries`` that a manual retry made good: a child (or a
    child's child...) among them succeeded."""
    by_id = {e.id: e for e in entries}
    resolved: set[int] = set()
    for e in by_id.values():
        if e.status != Status.SUCCESS:
            continue
        parent, seen = e.parent_id, set()
        while parent is not None and parent not in seen:
            seen.add(parent)
            resolved.add(parent)
            parent = by_id[parent].parent_id if parent in by_id else None
    return resolved


def _attention_markdown(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    if not rows:
        return ["", "**Needs attention**: nothing failed, stale or dispatch-failed."]
    lines = [
        "",
        "**Needs attention** (newest first; `dueledger runs show ID` for the whole entry)",
        "",
        "| entry | task | status | when | latest run | error |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        run = f"[{r['run_id'][:8]}]({t.run_path(r['run_id'])})" if r["run_id"] else ""
        status = r["status"] + (f" ({r['failure_kind']})" if r["failure_kind"] else "")
        error = r["error"].replace("|", "\\|")[:120]
        lines.append(
            f"| [{r['entry_id']}]({r['runs_path']}) | {r['task_key']} | {status} | "
            f"{r['updated_at']} | {run} | {error} |"
        )
    return lines


def summary_markdown(summary: Mapping[str, Any]) -> str:
    """The summary as a Markdown report (totals line + per-task table) for the Dagster UI."""
    totals = ", ".join(
        f"{k} **{summary[k]}**"
        for k in (
            "active",
            "stale",
            "failed_24h",
            "success_24h",
            "manual_retry_24h",
            "dispatch_failed_24h",
            "missed_24h",
            "paused_24h",
            "skipped_24h",
            "deadline_missed_24h",
            "refused_24h",
        )
    )
    lines = [
        f"### Ledger health as of {summary['as_of']}",
        "",
        totals,
        "",
        "| " + " | ".join(TASK_COLUMNS) + " |",
        "|" + "---|" * len(TASK_COLUMNS),
    ]
    for row in summary["tasks"]:
        lines.append(
            "| " + " | ".join("" if row[c] is None else str(row[c]) for c in TASK_COLUMNS) + " |"
        )
    missed = [(r["task_key"], r["missed_dues"]) for r in summary["tasks"] if r["missed_dues"]]
    if missed:
        lines += ["", "**Missed dues**", ""]
        lines += [f"- `{key}`: {', '.join(dues)}" for key, dues in missed]
    lines += _attention_markdown(summary.get("attention", []))
    return "\n".join(lines)
