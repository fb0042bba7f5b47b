"""The ledger's own health as three asset checks on the ``ledger_health`` asset.

Each is a question about the whole ledger (and Dagster's run records), answered read-only
with bounded queries; nothing is run, launched or changed. The sensors that keep the ledger
true fix what these find; a failing check says they have not (yet), names the entries or
runs and the command to inspect them:

- ``no_stale_leases``: running entries whose lease expired and that ``ledger_sensor``
  (reclaim, every 60 s) has not reclaimed. Within SENSOR_GRACE of the expiry the failure is a
  warning -- the reclaim is due -- after it an error.
- ``no_lost_retries``: ``retrying`` entries whose awaited Dagster retry will never come (the
  newest run of the entry's retry chain ended, Dagster will not or did not retry it, or the
  run is gone), which ``ledger_sensor`` (outcomes) settles as ``failed``/``dispatch_failed``.
- ``no_unledgered_failed_runs``: task runs Dagster ended FAILURE or CANCELED in the last
  24 h that left no trace in the ledger (no failed run of a task may be
  invisible to ``summary``); ``ledger_sensor`` (outcomes) records a run that failed before
  claiming as ``dispatch_failed``. Runs that ended within SENSOR_GRACE are not judged yet.

``ledger_sensor`` (slot health) reports all three at each slot start as runless check
evaluations;
"Execute" on a check in the Catalog evaluates the same (orchestration/checks.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import dagster as dg

from orchestration.manual_launch import entry_request_from_tags
from orchestration.reclaim import reclaim_expired
from orchestration.services.dagster_runs import (
    RetryState,
    attributed_tags,
    dagster_retry_state,
    newest_automatic_retry,
)
from orchestration.services.summary import SUMMARY_WINDOW
from orchestration.task_spec import TaskView
from resources.core import tags as t
from resources.core.due import format_due
from resources.core.entry import SUMMARY_REJECTIONS, Entry, Status
from resources.core.instants import iso
from resources.ledger import Ledger
from resources.ledger.rules import format_duration

#: The task whose asset carries the ledger checks (assets/ledger_health.py).
LEDGER_HEALTH_TASK: Final = "ledger_health"
CHECK_NO_STALE_LEASES: Final = "no_stale_leases"
CHECK_NO_LOST_RETRIES: Final = "no_lost_retries"
CHECK_NO_UNLEDGERED_FAILED_RUNS: Final = "no_unledgered_failed_runs"
LEDGER_CHECK_NAMES: Final = (
    CHECK_NO_STALE_LEASES,
    CHECK_NO_LOST_RETRIES,
    CHECK_NO_UNLEDGERED_FAILED_RUNS,
)

#: What the sensor duties that fix these findings get before a finding counts: they run
#: every 60 s, and the outcomes duty waits up to 60 s for Dagster's will_retry tag.
SENSOR_GRACE: Final = timedelta(minutes=3)
#: Failed runs looked at: those that ended within the summary's window.
FAILED_RUNS_WINDOW: Final = SUMMARY_WINDOW
#: Bounds of one evaluation (each check reads at most this many rows or runs).
MAX_STALE: Final = 200
MAX_RETRYING: Final = 100
MAX_FAILED_RUNS: Final = 200
#: Entries or runs a failing check names in its description (metadata lists up to MAX_LISTED).
MAX_NAMED: Final = 5
MAX_LISTED: Final = 50


@dataclass(frozen=True)
class LedgerCheck:
    """One check's answer: passed or not, why, and what it found (entries or runs)."""

    name: str
    passed: bool
    detail: str
    found: tuple[Mapping[str, Any], ...] = ()
    #: A failure that the sensors are still due to fix is a warning, not an error.
    warning: bool = False
    #: The evaluation's bound was reached: there may be more than ``found``.
    truncated: bool = False

    @property
    def severity(self) -> dg.AssetCheckSeverity:
        return dg.AssetCheckSeverity.WARN if self.warning else dg.AssetCheckSeverity.ERROR

    def metadata(self) -> dict[str, Any]:
        return {
            "found": len(self.found),
            "truncated": self.truncated,
            "items": dg.MetadataValue.json([dict(x) for x in self.found[:MAX_LISTED]]),
        }

    def result(self) -> dg.AssetCheckResult:
        """As the result of an executed check (the Catalog's "Execute")."""
        return dg.AssetCheckResult(
            passed=self.passed,
            metadata=self.metadata(),
            severity=self.severity,
            description=self.detail,
        )

    def evaluation(self, asset: str) -> dg.AssetCheckEvaluation:
        """As a runless check evaluation a sensor reports."""
        return dg.AssetCheckEvaluation(
            asset_key=dg.AssetKey(asset),
            check_name=self.name,
            passed=self.passed,
            metadata=self.metadata(),
            severity=self.severity,
            description=self.detail,
        )


def _named(items: Sequence[Mapping[str, Any]], line: Callable[[Mapping[str, Any]], str]) -> str:
    shown = "; ".join(line(x) for x in items[:MAX_NAMED])
    more = len(items) - MAX_NAMED
    return shown + (f"; and {more} more (see the metadata)" if more > 0 else "")


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


# --- no_stale_leases ---------------------------------------------------------------------


def stale_leases(ledger: Ledger, now: datetime) -> LedgerCheck:
    """Running entries whose lease expired before ``now`` and that are not reclaimed yet."""
    entries = reclaim_expired(ledger, now=now, dry_run=True, limit=MAX_STALE)
    if not entries:
        return LedgerCheck(CHECK_NO_STALE_LEASES, True, "no running entry has an expired lease")
    found: list[dict[str, Any]] = []
    for e in entries:
        assert e.lease_expires_at is not None  # selected by its expiry
        found.append(
            {
                "entry_id": e.id,
                "task": e.task_key,
                "label": e.label,
                "run_id": e.lease_owner,
                "lease_expired_at": iso(e.lease_expires_at),
                "overdue": format_duration(now - e.lease_expires_at),
                "overdue_seconds": int((now - e.lease_expires_at).total_seconds()),
            }
        )
    overdue = [x for x in found if int(x["overdue_seconds"]) > SENSOR_GRACE.total_seconds()]
    names = _named(
        found,
        lambda x: (
            f"entry {x['entry_id']} {x['label']} (run {x['run_id']}, lease expired "
            f"{x['overdue']} ago; `dueledger runs show {x['entry_id']}`)"
        ),
    )
    who = (
        "ledger_sensor (reclaim, every 60 s) has not reclaimed them: is it running?"
        if overdue
        else "ledger_sensor (reclaim) is due to reclaim them"
    )
    detail = (
        f"{_plural(len(found), 'running entry has', 'running entries have')} an expired "
        f"lease: {names}. {who} `dueledger reclaim --dry-run` lists them, `dueledger reclaim` "
        f"fails them (lease_reclaimed; never re-run automatically)."
    )
    return LedgerCheck(
        CHECK_NO_STALE_LEASES,
        False,
        detail,
        tuple(found),
        warning=not overdue,
        truncated=len(entries) >= MAX_STALE,
    )


# --- no_lost_retries ---------------------------------------------------------------------


def _lost_because(
    instance: dg.DagsterInstance, entry: Entry, now: datetime
) -> tuple[str, str] | None:
    """(run id, why) when ``entry``'s awaited Dagster retry will never come, else None."""
    last = entry.run_ids[-1]
    newest = newest_automatic_retry(instance, last)
    if newest is None:
        return last, (
            f"a run of its retry chain (from run {last}) is no longer in Dagster's run "
            f"storage, so no retry of it can come"
        )
    run = newest.dagster_run
    state = dagster_retry_state(run.status, run.tags, newest.end_time, now)
    if state is RetryState.LOST:
        return run.run_id, (
            f"Dagster announced a retry of run {run.run_id} ({t.DAGSTER_WILL_RETRY}=true) and "
            f"had not created it {format_duration(now - _ended(newest, now))} after it ended"
        )
    if state is RetryState.NOT_RETRIED and now - _ended(newest, now) >= SENSOR_GRACE:
        said = run.tags.get(t.DAGSTER_WILL_RETRY)
        return run.run_id, (
            f"Dagster will not retry run {run.run_id} ({run.status.value}"
            f"{f', {t.DAGSTER_WILL_RETRY}={said}' if said else ''})"
        )
    return None


def _ended(record: dg.RunRecord, now: datetime) -> datetime:
    stamp = record.end_time
    return datetime.fromtimestamp(stamp, UTC) if stamp is not None else now


def lost_retries(ledger: Ledger, instance: dg.DagsterInstance, now: datetime) -> LedgerCheck:
    """``retrying`` entries whose awaited Dagster retry will never come."""
    waiting, more = ledger.list_entries(statuses=[Status.RETRYING], limit=MAX_RETRYING)
    found = []
    for entry in waiting:
        if not entry.run_ids:
            continue
        lost = _lost_because(instance, entry, now)
        if lost is not None:
            run_id, why = lost
            found.append(
                {
                    "entry_id": entry.id,
                    "task": entry.task_key,
                    "label": entry.label,
                    "attempt": entry.attempt,
                    "run_id": run_id,
                    "why": why,
                }
            )
    if not found:
        detail = (
            f"no retrying entry waits for a retry that will not come "
            f"({_plural(len(waiting), 'entry', 'entries')} retrying)"
        )
        return LedgerCheck(CHECK_NO_LOST_RETRIES, True, detail, truncated=more is not None)
    names = _named(
        found,
        lambda x: (
            f"entry {x['entry_id']} {x['label']} (attempt {x['attempt']}): {x['why']}; "
            f"`dueledger runs show {x['entry_id']}`"
        ),
    )
    detail = (
        f"{_plural(len(found), 'entry waits', 'entries wait')} in retrying for a Dagster "
        f"retry that will never come: {names}. ledger_sensor (outcomes) settles such entries "
        f"(failed, or dispatch_failed when the last run never claimed): is it running?"
    )
    return LedgerCheck(
        CHECK_NO_LOST_RETRIES, False, detail, tuple(found), truncated=more is not None
    )


# --- no_unledgered_failed_runs -------------------------------------------------------------


def run_is_traced(entry: Entry | None, run_id: str, tags: Mapping[str, str]) -> bool:
    """Pure: does the ledger trace this ended run of ``entry``'s task?

    Yes when the entry records it: among its runs (it claimed), its dispatch failures (it
    ended before claiming) or its late-job rejections (refused). Yes too for Dagster's
    automatic retry of a run that claimed the entry (the retry copies the ``dueledger/entry``
    tag) that died before claiming while Dagster retried it again: the next retry's attempt
    is on the entry, or the outcome sensor records this one once no retry comes.
    """
    if entry is None:
        return False
    if run_id in entry.run_ids or run_id in entry.dispatch_failure_run_ids:
        return True
    rejected = entry.summary.get(SUMMARY_REJECTIONS, [])
    if any(isinstance(x, Mapping) and x.get("run_id") == run_id for x in rejected):
        return True
    return t.DAGSTER_RETRY_NUMBER in tags and tags.get(t.TAG_ENTRY) == str(entry.id)


def unledgered_failed_runs(
    ledger: Ledger, instance: dg.DagsterInstance, views: Sequence[TaskView], now: datetime
) -> LedgerCheck:
    """Task runs Dagster ended FAILURE or CANCELED within FAILED_RUNS_WINDOW (and at least
    SENSOR_GRACE ago) that the ledger does not trace."""
    records = instance.get_run_records(
        filters=dg.RunsFilter(
            statuses=[dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED],
            updated_after=now - FAILED_RUNS_WINDOW,
            updated_before=now - SENSOR_GRACE,
        ),
        limit=MAX_FAILED_RUNS,
    )
    entries: dict[tuple[str, str], Entry | None] = {}
    found = []
    for record in records:
        run = record.dagster_run
        if run.tags.get(t.TAG_OUTCOME) in t.OUTCOMES:
            continue  # ended by the ledger's own decision (refused, skipped, replaced), audited
        for tags in attributed_tags(run, views):
            task = tags[t.TAG_TASK]
            try:
                request = entry_request_from_tags(tags, run.run_id)
            except ValueError as exc:
                entry, why = None, f"its tags name no ledger entry ({exc})"
            else:
                key = (request.task_key, request.dedup_key)
                if key not in entries:
                    entries[key] = ledger.find(*key)
                entry = entries[key]
                why = (
                    f"entry {entry.id} ({entry.status}) does not record it"
                    if entry is not None
                    else f"no ledger entry {request.dedup_key}"
                )
            if run_is_traced(entry, run.run_id, tags):
                continue
            found.append(
                {
                    "run_id": run.run_id,
                    "task": task,
                    "status": run.status.value,
                    "ended_at": iso(_ended(record, now)),
                    "due": tags.get(t.TAG_DUE),
                    "why": why,
                    "run_path": t.run_path(run.run_id),
                }
            )
    since = format_due(now - FAILED_RUNS_WINDOW)
    if not found:
        detail = (
            f"every task run Dagster ended FAILURE or CANCELED since {since} is in the "
            f"ledger ({_plural(len(records), 'run', 'runs')} looked at)"
        )
        return LedgerCheck(
            CHECK_NO_UNLEDGERED_FAILED_RUNS,
            True,
            detail,
            truncated=len(records) >= MAX_FAILED_RUNS,
        )
    names = _named(
        found,
        lambda x: (
            f"run {x['run_id']} of {x['task']} ({x['status']} at {x['ended_at']}): {x['why']}; "
            f"`dueledger runs list --task {x['task']}`"
        ),
    )
    detail = (
        f"{_plural(len(found), 'failed task run is', 'failed task runs are')} not in the "
        f"ledger, so `dueledger summary` does not count them: {names}. ledger_sensor (outcomes) "
        f"records a run that failed before claiming as dispatch_failed: is it running?"
    )
    return LedgerCheck(
        CHECK_NO_UNLEDGERED_FAILED_RUNS,
        False,
        detail,
        tuple(found),
        truncated=len(records) >= MAX_FAILED_RUNS,
    )


# --- all three, for the sensor -------------------------------------------------------------


def ledger_health_view(views: Sequence[TaskView]) -> TaskView | None:
    """The ``ledger_health`` task's view: its asset carries the checks (None: no such task)."""
    return next((v for v in views if v.spec.key == LEDGER_HEALTH_TASK), None)


def evaluate_ledger_check(
    name: str,
    ledger: Ledger,
    instance: dg.DagsterInstance,
    views: Sequence[TaskView],
    now: datetime,
) -> LedgerCheck:
    """The check called ``name`` (one of LEDGER_CHECK_NAMES) as of ``now``."""
    if name == CHECK_NO_STALE_LEASES:
        return stale_leases(ledger, now)
    if name == CHECK_NO_LOST_RETRIES:
        return lost_retries(ledger, instance, now)
    if name == CHECK_NO_UNLEDGERED_FAILED_RUNS:
        return unledgered_failed_runs(ledger, instance, views, now)
    raise ValueError(f"unknown ledger check {name!r}; known: {', '.join(LEDGER_CHECK_NAMES)}")


def ledger_check_evaluations(
    ledger: Ledger, instance: dg.DagsterInstance, views: Sequence[TaskView], now: datetime
) -> list[dg.AssetCheckEvaluation]:
    """Every ledger check as a runless evaluation on the ``ledger_health`` asset; none when
    the code location has no ``ledger_health`` task."""
    view = ledger_health_view(views)
    if view is None:
        return []
    return [
        evaluate_ledger_check(name, ledger, instance, views, now).evaluation(view.spec.asset)
        for name in LEDGER_CHECK_NAMES
    ]
