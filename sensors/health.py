"""Ledger health: the numbers `dueledger summary` and the ``ledger_health`` asset show, the
structured alert line every sensor writes, and the per-slot health warning.

- :func:`ledger_summary` is the one computation of the summary: totals come from
  ``RunLedger.summary_counts`` (the same query `dueledger summary` runs), missed dues
  from the gap audit (``sensors/audit.py``), plus a per-task table.
- :func:`alert_line` renders one alert as one JSON line (``{"alert": kind, ...}``) so log
  pipelines can parse it; :func:`emit_alert` writes it to the Dagster context log and to
  the ``dueledger.alerts`` Python logger.
- :func:`slot_health` + :func:`build_slot_health_sensor`: once per slot, one warning
  listing reclaims, dispatch failures, missed dues and queue backlog — nothing when all is
  well.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import dagster as dg

from orchestration import tags as t
from orchestration.registry import TaskView
from orchestration.slots import floor_to_slot, format_due
from resources.ledger import SUMMARY_DISPATCH_FAILURES, Entry, RunLedger
from sensors.audit import DEFAULT_AUDIT_WINDOW, TaskAudit, audit_tasks

ALERT_LOGGER: Final = logging.getLogger("dueledger.alerts")
SUMMARY_WINDOW: Final = DEFAULT_AUDIT_WINDOW
#: Entries created this long before the window are still read for "finished in the window".
_LOOKBACK: Final = timedelta(hours=24)
_PAGE: Final = 500

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The production clock of every sensor (tests inject Dagster's frozen clock)."""
    return datetime.now(UTC)


def iso(instant: datetime | None) -> str | None:
    """ISO-8601 UTC with ``Z`` (seconds precision), the alerts' time format."""
    if instant is None:
        return None
    return instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- structured alerts ---------------------------------------------------------------------


def alert_line(kind: str, **fields: Any) -> str:
    """One alert as one JSON line: ``{"alert": kind, ...fields}`` (keys in the given order)."""
    return json.dumps({"alert": kind, **fields}, default=str, separators=(",", ":"))


def emit_alert(log: Any | None, kind: str, **fields: Any) -> str:
    """Write one alert line as a warning to ``log`` (a Dagster context log) and to the
    ``dueledger.alerts`` logger (the daemon's own log). Returns the line."""
    line = alert_line(kind, **fields)
    if log is not None:
        log.warning(line)
    ALERT_LOGGER.warning(line)
    return line


# --- reading the ledger ----------------------------------------------------------------------


def all_entries(ledger: RunLedger, **filters: Any) -> list[Entry]:
    """Every entry matching ``list_entries`` filters (all pages), newest first."""
    found: list[Entry] = []
    cursor: str | None = None
    while True:
        page, cursor = ledger.list_entries(limit=_PAGE, cursor=cursor, **filters)
        found.extend(page)
        if cursor is None:
            return found


def _recent_entries(ledger: RunLedger, since: datetime) -> list[Entry]:
    """Entries created since ``since - _LOOKBACK`` plus every running one (any age)."""
    by_id = {e.id: e for e in all_entries(ledger, since=since - _LOOKBACK)}
    for entry in all_entries(ledger, statuses=[t.STATUS_RUNNING]):
        by_id.setdefault(entry.id, entry)
    return sorted(by_id.values(), key=lambda e: e.id)


# --- the summary -----------------------------------------------------------------------------

#: Contract name (DESIGN ``summary``) -> key of ``RunLedger.summary_counts``.
_TOTALS: Final = {
    "active": "active",
    "stale": "stale",
    "failed_24h": "failed_window",
    "success_24h": "success_window",
    "manual_retry_24h": "manual_retry_window",
    "dispatch_failed_24h": "dispatch_failed_window",
    "lease_reclaimed_24h": "lease_reclaimed_window",
    "queued": "queued",
    "retrying": "retrying",
}
#: Problems first: the UI's inline table view shows only the first few columns.
TASK_COLUMNS: Final = (
    "task_key",
    "failed_24h",
    "dispatch_failed_24h",
    "missed_24h",
    "stale",
    "active",
    "success_24h",
    "manual_retry_24h",
    "last_success_at",
    "missed_slot_policy",
)


def _after(instant: datetime | None, since: datetime) -> bool:
    return instant is not None and instant >= since


def task_counts(entries: Iterable[Entry], now: datetime, since: datetime) -> dict[str, int]:
    """Per-task counts with the definitions of ``RunLedger.summary_counts`` (its docstring):
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
        ),
        0,
    )
    for e in entries:
        if e.status == t.STATUS_RUNNING and e.lease_expires_at is not None:
            counts["active" if e.lease_expires_at >= now else "stale"] += 1
        if e.status == t.STATUS_FAILED and _after(e.finished_at, since):
            counts["failed_24h"] += 1
            if e.failure_kind == t.FAILURE_LEASE_RECLAIMED:
                counts["lease_reclaimed_24h"] += 1
        if e.status == t.STATUS_SUCCESS and _after(e.finished_at, since):
            counts["success_24h"] += 1
        if e.status == t.STATUS_DISPATCH_FAILED and _after(e.updated_at, since):
            counts["dispatch_failed_24h"] += 1
        if e.trigger == t.TRIGGER_MANUAL_RETRY and _after(e.created_at, since):
            counts["manual_retry_24h"] += 1
    return counts


def ledger_summary(
    ledger: RunLedger,
    views: Sequence[TaskView],
    now: datetime,
    *,
    instance: dg.DagsterInstance | None = None,
    window: timedelta = SUMMARY_WINDOW,
) -> dict[str, Any]:
    """The ledger's health as of ``now``: the contract's summary numbers plus a per-task table.

    Totals are ``RunLedger.summary_counts`` (one query, shared with `dueledger summary`);
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
    for entry in _recent_entries(ledger, since):
        by_task.setdefault(entry.task_key, []).append(entry)
    policies = {v.spec.key: v.spec.missed_slot_policy for v in views}
    rows = []
    for key in [*policies, *sorted(k for k in by_task if k not in policies)]:
        entries = by_task.get(key, [])
        audit = audits.get(key)
        successes = [
            e.finished_at for e in entries if e.status == t.STATUS_SUCCESS and e.finished_at
        ]
        rows.append(
            {
                "task_key": key,
                "missed_slot_policy": policies.get(key, "unregistered"),
                **task_counts(entries, now, since),
                "missed_24h": len(audit.missed) if audit else 0,
                "missed_dues": [format_due(d) for d in audit.missed] if audit else [],
                "audited_since": iso(audit.start) if audit and audit.start else None,
                "last_success_at": iso(max(successes)) if successes else None,
            }
        )
    return {
        **{name: int(counts[key]) for name, key in _TOTALS.items()},
        "missed_24h": sum(len(a.missed) for a in audits.values()),
        "attention": attention_rows(by_task.values(), now, since),
        "as_of": iso(now),
        "window_hours": int(window.total_seconds() // 3600),
        "tasks": rows,
        "notes": {
            "active": "running entries whose lease is live",
            "stale": "running entries whose lease expired (the reclaim sensor fails them)",
            "missed_24h": (
                "dues the task's rule implies in the window (from its first recorded run on) "
                "with neither a ledger entry nor a Dagster run"
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
    the run to open and the Runs-page filter that lists every run of the entry."""
    rows = []
    for entries in entries_by_task:
        for e in entries:
            stale = (
                e.status == t.STATUS_RUNNING
                and e.lease_expires_at is not None
                and e.lease_expires_at < now
            )
            failed = e.status in (t.STATUS_FAILED, t.STATUS_DISPATCH_FAILED) and _after(
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
                    "error": _first_line(e.error or ""),
                    "runs_path": t.entry_runs_path(e.id),
                }
            )
    rows.sort(key=lambda r: (r["updated_at"] or "", r["entry_id"]), reverse=True)
    return rows[:ATTENTION_ROWS]


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


def summary_metadata(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Asset metadata: the numbers, the per-task table and a Markdown report."""
    int_columns = [
        c for c in TASK_COLUMNS if c not in ("task_key", "missed_slot_policy", "last_success_at")
    ]
    schema = dg.TableSchema(
        columns=[dg.TableColumn(c, "int" if c in int_columns else "string") for c in TASK_COLUMNS]
    )
    records = [
        dg.TableRecord({c: (row[c] if c in int_columns else (row[c] or "")) for c in TASK_COLUMNS})
        for row in summary["tasks"]
    ]
    numbers = {k: int(summary[k]) for k in (*_TOTALS, "missed_24h")}
    attention = [
        dg.TableRecord({c: str(row[c] or "") for c in ATTENTION_COLUMNS})
        for row in summary.get("attention", [])
    ]
    return {
        **numbers,
        "as_of": summary["as_of"],
        "needs_attention": dg.MetadataValue.table(
            records=attention,
            schema=dg.TableSchema(columns=[dg.TableColumn(c, "string") for c in ATTENTION_COLUMNS]),
        ),
        "per_task": dg.MetadataValue.table(records=records, schema=schema),
        "report": dg.MetadataValue.md(summary_markdown(summary)),
    }


# --- slot health -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotHealth:
    """What went wrong since the previous slot evaluation (empty lists: healthy)."""

    slot: datetime
    since: datetime
    reclaims: list[dict[str, Any]] = field(default_factory=list)
    dispatch_failures: list[dict[str, Any]] = field(default_factory=list)
    missed_dues: dict[str, list[str]] = field(default_factory=dict)
    queue_backlog: dict[str, Any] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return not (
            self.reclaims or self.dispatch_failures or self.missed_dues or self.queue_backlog
        )

    def alert_fields(self) -> dict[str, Any]:
        return {
            "slot": format_due(self.slot),
            "since": iso(self.since),
            "reclaims": self.reclaims,
            "dispatch_failures": self.dispatch_failures,
            "missed_dues": self.missed_dues,
            "queue_backlog": self.queue_backlog,
        }


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:200] if (text or "").strip() else ""


def queue_backlog(
    instance: dg.DagsterInstance, views: Sequence[TaskView], now: datetime, slot_minutes: int
) -> dict[str, Any]:
    """Task runs waiting in Dagster's queue for longer than a slot (empty dict: none)."""
    oldest_allowed = now - timedelta(minutes=slot_minutes)
    jobs = {v.spec.job_name for v in views}
    waiting = [
        r
        for r in instance.get_run_records(
            filters=dg.RunsFilter(
                statuses=[dg.DagsterRunStatus.QUEUED], created_before=oldest_allowed
            )
        )
        if r.dagster_run.job_name in jobs
    ]
    if not waiting:
        return {}
    by_task: dict[str, int] = {}
    for record in waiting:
        key = record.dagster_run.tags.get(t.TAG_TASK, record.dagster_run.job_name)
        by_task[key] = by_task.get(key, 0) + 1
    oldest = min(r.create_timestamp for r in waiting)
    return {
        "queued_runs": len(waiting),
        "oldest_queued_seconds": int((now - oldest).total_seconds()),
        "by_task": by_task,
    }


def slot_health(
    ledger: RunLedger,
    views: Sequence[TaskView],
    now: datetime,
    since: datetime,
    *,
    instance: dg.DagsterInstance | None = None,
) -> SlotHealth:
    """Problems that appeared in ``[since, now)``: reclaims and dispatch failures by when
    they happened, missed dues of slots that ended since ``since``'s slot, and queue backlog
    (runs queued for longer than a slot) as of ``now``."""
    slot_minutes = views[0].slot_minutes if views else 15
    slot = floor_to_slot(now, slot_minutes)
    reclaims, failures = [], []
    for e in _recent_entries(ledger, since):
        if (
            e.status == t.STATUS_FAILED
            and e.failure_kind == t.FAILURE_LEASE_RECLAIMED
            and e.finished_at is not None
            and since <= e.finished_at < now
        ):
            reclaims.append(
                {
                    "task": e.task_key,
                    "entry_id": e.id,
                    "run_id": e.run_ids[-1] if e.run_ids else None,
                }
            )
        for item in e.summary.get(SUMMARY_DISPATCH_FAILURES, []):
            at = _parse_iso(item.get("at"))
            if at is not None and since <= at < now:
                failures.append(
                    {
                        "task": e.task_key,
                        "entry_id": e.id,
                        "due": format_due(e.due) if e.due else None,
                        "run_id": item.get("run_id"),
                        "error": _first_line(item.get("error")),
                    }
                )
    first_slot = floor_to_slot(since, slot_minutes)
    audits: list[TaskAudit] = audit_tasks(
        ledger, views, now, window=SUMMARY_WINDOW, instance=instance
    )
    missed = {
        a.task_key: [format_due(d) for d in a.missed if d >= first_slot]
        for a in audits
        if any(d >= first_slot for d in a.missed)
    }
    backlog = queue_backlog(instance, views, now, slot_minutes) if instance is not None else {}
    return SlotHealth(slot, since, reclaims, failures, missed, backlog)


def _parse_iso(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def _slot_cursor(cursor: str | None) -> tuple[datetime | None, datetime | None]:
    """(slot evaluated last, when) from the sensor cursor; (None, None) when unset/garbled."""
    try:
        data = json.loads(cursor) if cursor else {}
        return _parse_iso(data.get("slot")), _parse_iso(data.get("at"))
    except (ValueError, AttributeError):
        return None, None


def build_slot_health_sensor(
    views: Sequence[TaskView], *, clock: Clock = utc_now, minimum_interval_seconds: int = 60
) -> dg.SensorDefinition:
    """``slot_health_sensor``: once per slot, one structured warning when anything is wrong.

    The cursor remembers the slot last evaluated and when; the next evaluation in a new slot
    covers everything since. The first evaluation ever looks back one audit window.
    """
    slot_minutes = views[0].slot_minutes if views else 15

    @dg.sensor(
        name="slot_health_sensor",
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Once per slot: one structured warning listing lease reclaims, dispatch failures, "
            "missed dues and queue backlog since the previous slot; silent when healthy."
        ),
    )
    def slot_health_sensor(
        context: dg.SensorEvaluationContext, ledger: RunLedger
    ) -> dg.SensorResult:
        now = clock()
        slot = floor_to_slot(now, slot_minutes)
        last_slot, last_at = _slot_cursor(context.cursor)
        if last_slot is not None and last_slot >= slot:
            return dg.SensorResult(skip_reason=f"slot {format_due(slot)} already evaluated")
        ledger.migrate()
        since = last_at if last_at is not None else now - SUMMARY_WINDOW
        health = slot_health(ledger, views, now, since, instance=context.instance)
        cursor = json.dumps({"slot": format_due(slot), "at": now.astimezone(UTC).isoformat()})
        if health.healthy:
            return dg.SensorResult(skip_reason=f"slot {format_due(slot)}: healthy", cursor=cursor)
        emit_alert(context.log, "slot_health", **health.alert_fields())
        return dg.SensorResult(
            skip_reason=f"slot {format_due(slot)}: problems reported (see the warning)",
            cursor=cursor,
        )

    return slot_health_sensor
