"""What a Prometheus scrape reports: the ledger, the alert log and the Dagster instance read
at scrape time into one :class:`~resources.core.metrics.MetricsSnapshot`.

Every number comes from storage (the ledger's indexed queries in
``resources/ledger/scrape_queries.py``, Dagster's daemon heartbeats and run records): nothing is
counted in memory, so a restarted exporter reports what the one before it did. The metric
model (names, types, which number feeds which family) is ``resources/core/metric_model.py``; the
HTTP server and the textfile writer are the CLI's (``orchestration/cli/metrics.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

from orchestration.missed_dues import audit_tasks
from orchestration.services.hooks.vocabulary import EVENTS as HOOK_EVENTS
from orchestration.services.liveness import DEFAULT_MAX_AGE, scheduler_heartbeat_check
from orchestration.services.summary import SUMMARY_WINDOW, all_entries, attention_rows
from orchestration.task_spec import TaskView
from resources.core import metric_model as m
from resources.core.due import floor_to_slot
from resources.core.entry import Entry, Status, Trigger
from resources.ledger import Ledger

if TYPE_CHECKING:
    import dagster as dg

#: Entries created this long before the window are still read for "needs attention" (as the
#: summary does: an entry created earlier may have failed inside the window).
_ATTENTION_LOOKBACK: Final = timedelta(hours=24)


def missed_dues(
    ledger: Ledger,
    views: Sequence[TaskView],
    now: datetime,
    *,
    window: timedelta = SUMMARY_WINDOW,
    instance: dg.DagsterInstance | None = None,
) -> dict[str, int]:
    """Missed dues per task over ``window``: the one call to the missed-due rule (the gap
    audit that `dueledger summary` and ``ledger_health`` report as ``missed_24h``)."""
    audits = audit_tasks(ledger, views, now, window=window, instance=instance)
    return {a.task_key: len(a.missed) for a in audits}


@dataclass
class MissedDuesMemo:
    """The gap audit's answer, reused by the scrapes of one exporter for up to ``ttl`` within
    one slot. The audit costs about the same whatever the ledger's size (each task's cron over
    the window, two Dagster run queries per task: 0.1-0.3 s for the 11 tasks here), which
    would be most of a scrape. Its answer changes at a slot boundary (recomputed at the first
    scrape of each slot), and when a missed due gets its run (a catch-up) or leaves the window
    (seen at most ``ttl`` late). Owned by the caller (one per exporter process, never shared
    between threads without its lock): a restart simply audits again."""

    ttl: timedelta = timedelta(minutes=5)
    _slot: datetime | None = None
    _at: datetime | None = None
    _value: dict[str, int] = field(default_factory=dict)

    def get(
        self, compute: Callable[[], dict[str, int]], now: datetime, slot_minutes: int
    ) -> dict[str, int]:
        slot = floor_to_slot(now, slot_minutes)
        fresh = self._at is not None and self._at <= now < self._at + self.ttl
        if not fresh or slot != self._slot:
            self._value, self._at, self._slot = compute(), now, slot
        return dict(self._value)


def _lags(ledger: Ledger, since: datetime) -> dict[tuple[str, str], list[float]]:
    lags: dict[tuple[str, str], list[float]] = {}
    for row in ledger.due_times_since(since):
        if row.started_at is not None:
            lag = (row.started_at - row.due).total_seconds()
            lags.setdefault((row.task_key, m.STAGE_START), []).append(lag)
        if row.status == Status.SUCCESS and row.finished_at is not None:
            lag = (row.finished_at - row.due).total_seconds()
            lags.setdefault((row.task_key, m.STAGE_SUCCESS), []).append(lag)
    return lags


def _attention(ledger: Ledger, now: datetime, since: datetime) -> list[m.AttentionEntry]:
    """The summary's "needs attention" rows (``summary.attention_rows``), read from only the
    entries that can be one: failed or dispatch_failed ones of the window, running ones."""
    candidates: dict[int, Entry] = {
        e.id: e
        for e in all_entries(
            ledger,
            statuses=[Status.FAILED, Status.DISPATCH_FAILED],
            since=since - _ATTENTION_LOOKBACK,
        )
    }
    for entry in all_entries(ledger, statuses=[Status.RUNNING]):
        candidates.setdefault(entry.id, entry)
    # The successful manual retries of the same span: a failed entry one of them made good
    # needs nothing more (``summary`` sees them among all its entries; without them here the
    # page listed an entry `summary` and ``ledger_health`` did not).
    for entry in all_entries(
        ledger,
        statuses=[Status.SUCCESS],
        trigger=Trigger.MANUAL_RETRY,
        since=since - _ATTENTION_LOOKBACK,
    ):
        candidates.setdefault(entry.id, entry)
    by_task: dict[str, list[Entry]] = {}
    for entry in candidates.values():
        by_task.setdefault(entry.task_key, []).append(entry)
    rows = attention_rows(by_task.values(), now, since)
    return [
        m.AttentionEntry(
            task=r["task_key"],
            entry_id=int(r["entry_id"]),
            status=r["status"],
            failure_kind=r["failure_kind"],
            updated_at=datetime.fromisoformat(r["updated_at"].replace("Z", "+00:00")).timestamp(),
        )
        for r in rows
    ]


def scrape(
    ledger: Ledger,
    views: Sequence[TaskView],
    now: datetime | None = None,
    *,
    instance: dg.DagsterInstance | None = None,
    slot_minutes: int | None = None,
    window: timedelta = SUMMARY_WINDOW,
    memo: MissedDuesMemo | None = None,
) -> m.MetricsSnapshot:
    """The ledger's metrics as of ``now`` (default: the current time).

    ``instance``: the Dagster instance of the deployment, for the scheduler heartbeat and so
    that a due whose run waits in Dagster's queue is not counted missed (as `summary` does);
    without it the heartbeat age is unknown (+Inf). ``slot_minutes`` defaults to the views'.
    ``memo``: reuse the missed-due audit across scrapes (see :class:`MissedDuesMemo`).
    """
    now = datetime.now(UTC) if now is None else now
    since = now - window
    if slot_minutes is None:
        slot_minutes = views[0].slot_minutes if views else 15
    snap = m.MetricsSnapshot(
        slot_seconds=float(slot_minutes * 60),
        tasks=[
            m.TaskInfo(
                key=v.spec.key,
                effective_cadence=v.effective.label,
                missed_slot_policy=v.spec.missed_slot_policy,
                overlap_policy=v.spec.overlap_policy,
                source=v.spec.source,
            )
            for v in views
        ],
        hook_events=tuple(HOOK_EVENTS),
    )
    snap.entry_counts = ledger.entry_counts()
    keys = snap.task_keys()
    snap.stale_leases = ledger.stale_lease_counts(now=now)

    def audit() -> dict[str, int]:
        return missed_dues(ledger, views, now, window=window, instance=instance)

    snap.missed_dues = audit() if memo is None else memo.get(audit, now, slot_minutes)
    snap.skipped = ledger.skipped_counts()
    snap.refused_runs = ledger.refused_run_counts()
    snap.lags = _lags(ledger, since)
    snap.last_success = {k: v.timestamp() for k, v in ledger.last_success_times(keys).items()}
    snap.last_due = {k: v.timestamp() for k, v in ledger.last_dues(keys).items()}
    snap.oldest_waiting_due = {k: v.timestamp() for k, v in ledger.oldest_waiting_dues().items()}
    snap.attention = _attention(ledger, now, since)
    snap.deliveries = ledger.delivery_counts()
    snap.hook_failures = ledger.hook_failure_counts()
    if instance is not None:
        heartbeat = scheduler_heartbeat_check(instance, now, DEFAULT_MAX_AGE)
        seen = heartbeat.observed_at
        snap.heartbeat_age = None if seen is None else max(0.0, (now - seen).total_seconds())
    return snap
