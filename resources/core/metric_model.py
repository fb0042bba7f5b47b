"""The Prometheus metrics of dueledger as a pure model: names, types, labels, and the families a
snapshot of the ledger turns into (Dagster-free, no I/O, no Prometheus client).

The services layer (``orchestration/services/metrics.py``) reads a :class:`MetricsSnapshot`
from the ledger, the alert log and the Dagster instance at scrape time; :func:`families` turns
it into :class:`Family` values; the CLI shell (``orchestration/cli/metrics.py``) hands them to
``prometheus_client``, which writes the exposition format. Nothing is counted in memory: a
restarted exporter reports the same numbers.

Two kinds of numbers, and the type each gets:

- **Counters** (``*_total``) count ledger facts that never change once written: entries that
  reached a terminal status (``success``, ``failed``, ``skipped``: never overwritten), their
  lease reclaims, the refused runs and hook failures recorded on entries, alert deliveries
  that ended (delivered or given up). They only go up (see docs/operations.md for the two
  bounded lists on an entry -- newest 5 rejections, newest 20 hook outcomes -- that cap them).
- **Gauges** for the state now: open entries, stale leases, the missed dues of the audit
  window (a catch-up run or the window moving on makes a missed due no longer missed, so it is
  no counter), the lag histogram of the window's dues (a gauge histogram), timestamps, ages.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from resources.core.alerting import (
    CHANNELS,
    DELIVERY_DELIVERED,
    DELIVERY_FAILED,
    DELIVERY_PENDING,
)
from resources.core.entry import FAILURE_KINDS, TRIGGERS, FailureKind, Status

# --- statuses the metrics sort entries into -----------------------------------------------
#: The terminal ``skipped`` status (a due not run, with a reason: overlap, paused).
STATUS_SKIPPED: Final = Status.SKIPPED
#: Statuses an entry never leaves: ``dueledger_entries_total`` counts them.
COUNTED_STATUSES: Final = (Status.SUCCESS, Status.FAILED, STATUS_SKIPPED)
#: Statuses an entry passes through: ``dueledger_open_entries`` shows how many are in each now
#: (``dispatch_failed`` is re-dispatched in its slot, so it is open too).
OPEN_STATUSES: Final = (
    Status.QUEUED,
    Status.RUNNING,
    Status.RETRYING,
    Status.DISPATCH_FAILED,
)
#: Failure kinds a ``failed`` entry carries (``dispatch`` belongs to ``dispatch_failed``).
FAILED_KINDS: Final = tuple(k for k in FAILURE_KINDS if k != FailureKind.DISPATCH)
#: ``late_job_rejections`` actions of a run the ledger refused outright (``dueledger/outcome=
#: refused``): its claim, or a UI re-execution refused by the retry rules. The other actions
#: (late success/failure reports, fenced side effects) come from runs that had claimed.
REFUSED_RUN_ACTIONS: Final = ("claim", "reject")
#: Hook outcomes that are a listener's failure (orchestration/services/hooks/vocabulary.py; a test
#: keeps the two in step): it raised, ran past its timeout, or returned something no result.
HOOK_FAILURE_OUTCOMES: Final = ("error", "timeout", "invalid")

#: Reasons a due is skipped for (overlap, paused), written with 0 for every task.
SKIP_REASONS: Final = ("overlap", "paused")

#: Lag buckets (seconds after the due): a slot is 15 minutes by default, a day the longest
#: cadence of the registry.
LAG_BUCKETS: Final = (15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0)
LAG_BUCKETS_WIDE: Final = (*LAG_BUCKETS, 21600.0, 86400.0)
STAGE_START: Final = "start"
STAGE_SUCCESS: Final = "success"

COUNTER: Final = "counter"
GAUGE: Final = "gauge"
GAUGE_HISTOGRAM: Final = "gaugehistogram"


@dataclass(frozen=True)
class MetricSpec:
    """One metric family: its exposed name, type, help text and label names."""

    name: str
    kind: str
    help: str
    labels: tuple[str, ...] = ()


def _spec(name: str, kind: str, help_text: str, *labels: str) -> MetricSpec:
    return MetricSpec(name, kind, help_text, labels)


TASK_INFO = _spec(
    "dueledger_task_info",
    GAUGE,
    "Registered tasks (value 1) with their policies and effective cadence.",
    "task",
    "effective_cadence",
    "missed_slot_policy",
    "overlap_policy",
    "source",
)
SLOT_SECONDS = _spec("dueledger_slot_seconds", GAUGE, "The scheduling slot, in seconds.")
ENTRIES = _spec(
    "dueledger_entries_total",
    COUNTER,
    "Ledger entries that reached a terminal status (success, failed, skipped), by task, "
    "status, failure kind and trigger.",
    "task",
    "status",
    "failure_kind",
    "trigger",
)
OPEN_ENTRIES = _spec(
    "dueledger_open_entries",
    GAUGE,
    "Ledger entries in a non-terminal status now (queued, running, retrying, dispatch_failed).",
    "task",
    "status",
)
STALE_LEASES = _spec(
    "dueledger_stale_leases",
    GAUGE,
    "Running entries whose lease has expired (ledger_sensor (reclaim) fails them).",
    "task",
)
MISSED_DUES = _spec(
    "dueledger_missed_dues",
    GAUGE,
    "Dues of the audit window (the last 24 hours) with neither a ledger entry nor a Dagster "
    "run: the missed-due audit of `dueledger summary` (missed_24h).",
    "task",
)
SKIPPED_DUES = _spec(
    "dueledger_skipped_dues_total",
    COUNTER,
    "Dues recorded as skipped (status skipped), by task and reason (overlap, paused, ...).",
    "task",
    "reason",
)
LEASE_RECLAIMS = _spec(
    "dueledger_lease_reclaims_total",
    COUNTER,
    "Entries failed by lease reclaim (failure kind lease_reclaimed).",
    "task",
)
REFUSED_RUNS = _spec(
    "dueledger_refused_runs_total",
    COUNTER,
    "Runs the ledger refused (tagged dueledger/outcome=refused): those recorded in the "
    "entries' late_job_rejections (newest 5 per entry), and those refused before they had an "
    "entry, as their run_refused audit records name them.",
    "task",
)
DUE_LAG = _spec(
    "dueledger_due_lag_seconds",
    GAUGE_HISTOGRAM,
    "Seconds from a due to its run's start (stage=start: the latest attempt's claim) and to "
    "its success (stage=success), over the scheduled dues of the last 24 hours.",
    "task",
    "stage",
)
LAST_SUCCESS = _spec(
    "dueledger_last_success_timestamp_seconds",
    GAUGE,
    "When the task's newest successful entry finished (Unix time).",
    "task",
)
LAST_DUE = _spec(
    "dueledger_last_due_timestamp_seconds",
    GAUGE,
    "The newest due the ledger has an entry for (Unix time).",
    "task",
)
OLDEST_WAITING_DUE = _spec(
    "dueledger_oldest_waiting_due_timestamp_seconds",
    GAUGE,
    "The oldest due whose entry waits to run (queued, retrying, dispatch_failed), Unix time; "
    "absent when none waits.",
    "task",
)
ATTENTION = _spec(
    "dueledger_entry_needs_attention_timestamp_seconds",
    GAUGE,
    "The newest failed, dispatch_failed and stale entries of the last 24 hours (at most 10): "
    "value = when the entry last changed (Unix time); `dueledger runs show ENTRY`.",
    "task",
    "entry",
    "status",
    "failure_kind",
)
DELIVERIES = _spec(
    "dueledger_alert_deliveries_total",
    COUNTER,
    "Alert deliveries that ended, by channel and status (delivered, given_up).",
    "channel",
    "status",
)
DELIVERIES_WAITING = _spec(
    "dueledger_alert_deliveries_waiting",
    GAUGE,
    "Alert deliveries not yet done, by channel and status (pending, failed: a retry will come).",
    "channel",
    "status",
)
HOOK_FAILURES = _spec(
    "dueledger_hook_failures_total",
    COUNTER,
    "Plugin listener calls that failed (error, timeout, invalid result), by event, as recorded "
    "on ledger entries (newest 20 outcomes per entry).",
    "event",
)
HEARTBEAT_AGE = _spec(
    "dueledger_scheduler_heartbeat_age_seconds",
    GAUGE,
    "Age of the Dagster daemon's newest scheduler heartbeat (+Inf: none recorded).",
)

#: Every family the exporter writes, in exposition order.
CATALOG: Final = (
    TASK_INFO,
    SLOT_SECONDS,
    ENTRIES,
    OPEN_ENTRIES,
    STALE_LEASES,
    MISSED_DUES,
    SKIPPED_DUES,
    LEASE_RECLAIMS,
    REFUSED_RUNS,
    DUE_LAG,
    LAST_SUCCESS,
    LAST_DUE,
    OLDEST_WAITING_DUE,
    ATTENTION,
    DELIVERIES,
    DELIVERIES_WAITING,
    HOOK_FAILURES,
    HEARTBEAT_AGE,
)

DELIVERY_GIVEN_UP: Final = "given_up"


# --- pure helpers over ledger rows ---------------------------------------------------------


def refused_runs(rejections: object) -> int:
    """How many items of an entry's ``late_job_rejections`` are refused runs."""
    if not isinstance(rejections, list):
        return 0
    return sum(1 for r in rejections if isinstance(r, Mapping) and _refused(r))


def _refused(rejection: Mapping[str, Any]) -> bool:
    return rejection.get("action") in REFUSED_RUN_ACTIONS


def hook_failures(outcomes: object) -> Counter[str]:
    """Failed listener calls among an entry's ``hooks`` outcomes, by event."""
    found: Counter[str] = Counter()
    if not isinstance(outcomes, list):
        return found
    for item in outcomes:
        if isinstance(item, Mapping) and item.get("outcome") in HOOK_FAILURE_OUTCOMES:
            found[str(item.get("event") or "unknown")] += 1
    return found


_REASON_WORD = re.compile(r"[a-z][a-z0-9_]*")


def skip_reason(failure_kind: str | None, text: str | None) -> str:
    """A skipped entry's reason as a label value: its failure kind when it has one, else the
    word before the first colon of its recorded reason ("overlap: entry 4 running" ->
    ``overlap``, "paused by alice: ..." -> ``paused``), else ``unspecified``."""
    if failure_kind:
        return failure_kind
    head = (text or "").strip().lower().split(":", 1)[0].split(" ", 1)[0]
    return head if _REASON_WORD.fullmatch(head) else "unspecified"


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts (``le`` upper bounds, +Inf last), count and sum."""

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    count: int
    total: float


def histogram(values: Iterable[float], bounds: Sequence[float] = LAG_BUCKETS_WIDE) -> Histogram:
    """The values in cumulative buckets; negative lags (a clock ahead of the due) count as 0."""
    edges = tuple(bounds)
    counts = [0] * (len(edges) + 1)
    total, n = 0.0, 0
    for raw in values:
        value = max(0.0, float(raw))
        n += 1
        total += value
        for i, edge in enumerate(edges):
            if value <= edge:
                counts[i] += 1
                break
        else:
            counts[-1] += 1
    cumulative, running = [], 0
    for c in counts:
        running += c
        cumulative.append(running)
    return Histogram(edges, tuple(cumulative), n, total)


# --- the snapshot and the families it turns into -------------------------------------------


@dataclass(frozen=True)
class TaskInfo:
    key: str
    effective_cadence: str
    missed_slot_policy: str
    overlap_policy: str
    source: str


@dataclass(frozen=True)
class AttentionEntry:
    task: str
    entry_id: int
    status: str
    failure_kind: str
    updated_at: float


@dataclass
class MetricsSnapshot:
    """What the ledger, the alert log and the Dagster instance say at one instant.

    Keys are tuples in the label order of the metric they feed. Times are Unix seconds.
    """

    slot_seconds: float
    tasks: list[TaskInfo] = field(default_factory=list)
    #: (task, status, failure_kind, trigger) -> entries, every status (open ones too).
    entry_counts: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    stale_leases: dict[str, int] = field(default_factory=dict)
    missed_dues: dict[str, int] = field(default_factory=dict)
    skipped: dict[tuple[str, str], int] = field(default_factory=dict)
    refused_runs: dict[str, int] = field(default_factory=dict)
    #: (task, stage) -> lag seconds of each due in the window.
    lags: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    last_success: dict[str, float] = field(default_factory=dict)
    last_due: dict[str, float] = field(default_factory=dict)
    oldest_waiting_due: dict[str, float] = field(default_factory=dict)
    attention: list[AttentionEntry] = field(default_factory=list)
    #: (channel, status) -> deliveries; status delivered / given_up / pending / failed.
    deliveries: dict[tuple[str, str], int] = field(default_factory=dict)
    hook_failures: dict[str, int] = field(default_factory=dict)
    #: Events to report even at 0 (the hook events a plugin can listen to).
    hook_events: tuple[str, ...] = ()
    heartbeat_age: float | None = None

    def task_keys(self) -> list[str]:
        """Registered tasks first (registry order), then tasks only the ledger knows."""
        known = [t.key for t in self.tasks]
        seen = {k[0] for k in self.entry_counts} | set(self.missed_dues) | set(self.last_due)
        return [*known, *sorted(seen - set(known))]


@dataclass(frozen=True)
class Family:
    """One metric family's samples: ``(label values, value)``; for a gauge histogram the value
    is a :class:`Histogram`."""

    spec: MetricSpec
    samples: tuple[tuple[tuple[str, ...], float | Histogram], ...]


def families(snap: MetricsSnapshot) -> list[Family]:
    """The snapshot as metric families, in :data:`CATALOG` order, with zeros written out for
    every registered task (a series that appears only with its first failure would hide that
    failure from ``increase()``)."""
    keys = snap.task_keys()
    registered = [t.key for t in snap.tasks]
    out: dict[MetricSpec, list[tuple[tuple[str, ...], float | Histogram]]] = {
        spec: [] for spec in CATALOG
    }
    for info in snap.tasks:
        out[TASK_INFO].append(
            (
                (
                    info.key,
                    info.effective_cadence,
                    info.missed_slot_policy,
                    info.overlap_policy,
                    info.source,
                ),
                1.0,
            )
        )
    out[SLOT_SECONDS].append(((), snap.slot_seconds))

    counted: Counter[tuple[str, str, str, str]] = Counter()
    open_now: Counter[tuple[str, str]] = Counter()
    reclaims: Counter[str] = Counter()
    for (task, status, kind, trigger), n in snap.entry_counts.items():
        if status in COUNTED_STATUSES:
            # A success keeps the failure kind of an earlier attempt that failed: not its own.
            own_kind = "" if status == Status.SUCCESS else kind
            counted[(task, status, own_kind, trigger)] += n
        elif status in OPEN_STATUSES:
            open_now[(task, status)] += n
        if status == Status.FAILED and kind == FailureKind.LEASE_RECLAIMED:
            reclaims[task] += n
    for task in registered:
        for trigger in TRIGGERS:
            counted.setdefault((task, Status.SUCCESS, "", trigger), 0)
            for kind in FAILED_KINDS:
                counted.setdefault((task, Status.FAILED, kind, trigger), 0)
    out[ENTRIES] = [(k, float(v)) for k, v in sorted(counted.items(), key=_task_order(keys))]
    for task in keys:
        for status in OPEN_STATUSES:
            out[OPEN_ENTRIES].append(((task, status), float(open_now[(task, status)])))
        out[STALE_LEASES].append(((task,), float(snap.stale_leases.get(task, 0))))
        out[MISSED_DUES].append(((task,), float(snap.missed_dues.get(task, 0))))
        out[LEASE_RECLAIMS].append(((task,), float(reclaims[task])))
        out[REFUSED_RUNS].append(((task,), float(snap.refused_runs.get(task, 0))))
        for stage in (STAGE_START, STAGE_SUCCESS):
            out[DUE_LAG].append(((task, stage), histogram(snap.lags.get((task, stage), ()))))
        for spec, values in (
            (LAST_SUCCESS, snap.last_success),
            (LAST_DUE, snap.last_due),
            (OLDEST_WAITING_DUE, snap.oldest_waiting_due),
        ):
            if task in values:
                out[spec].append(((task,), values[task]))
    skipped: Counter[tuple[str, str]] = Counter(snap.skipped)
    for task in registered:
        for reason in SKIP_REASONS:
            skipped.setdefault((task, reason), 0)
    out[SKIPPED_DUES] = [(k, float(v)) for k, v in sorted(skipped.items(), key=_task_order(keys))]
    out[ATTENTION] = [
        ((a.task, str(a.entry_id), a.status, a.failure_kind), a.updated_at) for a in snap.attention
    ]
    channels = sorted({*CHANNELS, *(channel for channel, _ in snap.deliveries)})
    for channel in channels:
        for status in (DELIVERY_DELIVERED, DELIVERY_GIVEN_UP):
            out[DELIVERIES].append(
                ((channel, status), float(snap.deliveries.get((channel, status), 0)))
            )
        for status in (DELIVERY_PENDING, DELIVERY_FAILED):
            out[DELIVERIES_WAITING].append(
                ((channel, status), float(snap.deliveries.get((channel, status), 0)))
            )
    events = sorted(set(snap.hook_events) | set(snap.hook_failures))
    out[HOOK_FAILURES] = [((e,), float(snap.hook_failures.get(e, 0))) for e in events]
    age = math.inf if snap.heartbeat_age is None else float(snap.heartbeat_age)
    out[HEARTBEAT_AGE].append(((), age))
    return [Family(spec, tuple(out[spec])) for spec in CATALOG]


def _task_order(keys: Sequence[str]) -> Any:
    rank = {k: i for i, k in enumerate(keys)}

    def order(item: tuple[tuple[str, ...], int]) -> tuple[int, tuple[str, ...]]:
        labels = item[0]
        return (rank.get(labels[0], len(rank)), labels)

    return order
