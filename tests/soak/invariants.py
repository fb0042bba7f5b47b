"""The soak's invariant checker: what must hold over the ledger, the outbox and the deliveries
after any mix of dues and worker kills. Pure (plain data in, violations out), so
tests/soak/test_invariants.py can show that each rule catches what it is meant to catch.

Rules (each violation is one line naming the entry or effect):

1. **No due lost, none doubled**: every (task, due) of the window has exactly one ledger entry,
   and the scheduler created exactly one run for it (``dagster/run_key`` = the due, not a
   retry); no entry exists for a due outside the window, but a due after it that the
   ledger recorded ``skipped`` for the soak's own stop of the schedules (a stop outside
   ``dueledger pause`` is a pause by ``dagster-ui``, and its dues are written skipped once
   ``ledger_sensor`` sees them pass; a slow settle -- a retry Dagster announced and never
   created waits three minutes -- lets some pass).
2. **One outcome per due**: the entry ended ``success`` or ``failed``, or ``dispatch_failed``
   (its last run died before claiming and no retry of it survived; its slot -- the only
   window for a re-dispatch -- is over; a manual retry of it needs
   --acknowledge-side-effects). ``queued``, ``running`` or ``retrying`` at the end means a
   due left hanging, and so does a ``dispatch_failed`` entry that a Dagster retry of its
   failed run, not killed itself, left alone.
3. **No failure without a cause**: a failed or dispatch-failed entry's failing run was one
   the soak killed.
4. **No side effect twice**: at most one outbox row and at most one ``email``
   delivery per idempotency key; only a run that claimed the entry sent anything.
5. **Success is complete**: a ``success`` entry sent every message on every channel; an
   email left ``in_flight`` (in doubt: its worker died between delivery and settlement) is
   allowed only when one of the entry's runs was killed, and was delivered at most once.
6. **Every reclaim traced**: a ``lease_reclaimed`` entry's owner was killed, its error names
   that run, and the reclaim sensor logged an alert for (entry, run).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from orchestration.pause import PAUSED_PREFIX
from orchestration.retry import is_retry_of_a_dispatch_failure
from resources.core import tags as t
from resources.core.entry import Entry, FailureKind, Status, dedup_key_for_due
from resources.core.operators import UI_OPERATOR
from resources.source_schema import naive_utc

SMS = "sms"
EMAIL = "email"


@dataclass(frozen=True)
class RunInfo:
    """What the checker needs of one Dagster run."""

    run_id: str
    task_key: str
    status: str
    tags: Mapping[str, str]


@dataclass(frozen=True)
class Effect:
    """One ``side_effects`` row (idempotency key + state)."""

    id: int
    rule: str
    object_id: int
    time_point: datetime  # naive UTC, as stored
    channel: str
    status: str
    entry_key: str


@dataclass(frozen=True)
class Delivery:
    """One row the fake gateway recorded (``soak_deliveries``) or one outbox row."""

    effect_id: int
    rule: str
    object_id: int
    time_point: datetime  # naive UTC
    channel: str
    run_id: str


@dataclass
class SoakRecord:
    """Everything the soak observed, read after the daemon stopped."""

    tasks: Sequence[str]
    dues: Sequence[datetime]
    messages: int
    entries: Sequence[Entry]
    runs: Sequence[RunInfo]
    effects: Sequence[Effect]
    deliveries: Sequence[Delivery]  # email, from the gateway
    outbox: Sequence[Delivery]  # notification_outbox rows, every channel (run_id = "")
    killed: set[str] = field(default_factory=set)  # run ids the soak kill -9'ed
    reclaim_alerts: set[tuple[int, str]] = field(default_factory=set)  # (entry id, run id)


def _key(rule: str, object_id: int, time_point: datetime, channel: str) -> tuple:
    return (rule, int(object_id), naive_utc(time_point), channel)


def _delivery_key(row: Delivery | Effect) -> tuple:
    return _key(row.rule, row.object_id, row.time_point, row.channel)


def _due_key(due: datetime) -> str:
    return dedup_key_for_due(due).removeprefix("due:")


def _failing_runs(entry: Entry) -> set[str]:
    """The runs whose death could explain this entry's failure."""
    return set(entry.run_ids[-1:]) | entry.dispatch_failure_run_ids


def _skipped_for_the_stop(entry: Entry, dues: Sequence[datetime]) -> bool:
    """A due after the window, skipped for the pause the soak's stop of the schedules is."""
    return (
        entry.status == Status.SKIPPED
        and entry.due is not None
        and bool(dues)
        and entry.due > max(dues)
        and (entry.error or "").startswith(f"{PAUSED_PREFIX}{UI_OPERATOR}:")
    )


def check(record: SoakRecord) -> list[str]:
    """Every violated invariant, one line each (empty: all hold)."""
    problems: list[str] = []
    expected = {(task, dedup_key_for_due(due)) for task in record.tasks for due in record.dues}
    due_of = {dedup_key_for_due(due): due for due in record.dues}

    # 1. one entry per due, one scheduled run per due
    by_due: dict[tuple[str, str], list[Entry]] = defaultdict(list)
    for entry in record.entries:
        by_due[(entry.task_key, entry.dedup_key)].append(entry)
        if (entry.task_key, entry.dedup_key) not in expected and not _skipped_for_the_stop(
            entry, record.dues
        ):
            problems.append(f"unexpected entry {entry.id} {entry.label} ({entry.origin})")
    for task, dedup in sorted(expected):
        found = by_due.get((task, dedup), [])
        if len(found) != 1:
            problems.append(f"{task} {dedup}: {len(found)} ledger entries (want exactly 1)")
    scheduled: Counter[tuple[str, str]] = Counter(
        (run.task_key, run.tags.get(t.DAGSTER_RUN_KEY, ""))
        for run in record.runs
        if t.DAGSTER_PARENT_RUN_ID not in run.tags
        and "#" not in run.tags.get(t.DAGSTER_RUN_KEY, "#")
    )
    for task in record.tasks:
        for due in record.dues:
            count = scheduled[(task, _due_key(due))]
            if count != 1:
                problems.append(f"{task} due {_due_key(due)}: {count} scheduled runs (want 1)")

    entries = {
        key: found[0] for key, found in by_due.items() if len(found) == 1 and key in expected
    }
    entry_by_key = {f"{e.id}:{e.dedup_key}": e for e in entries.values()}

    # 2. + 3. one outcome per due, and no failure without a kill
    for entry in entries.values():
        if entry.status not in (Status.SUCCESS, Status.FAILED, Status.DISPATCH_FAILED):
            problems.append(f"entry {entry.id} {entry.label} left {entry.status}")
            continue
        if entry.status != Status.SUCCESS and not (_failing_runs(entry) & record.killed):
            problems.append(
                f"entry {entry.id} {entry.label} {entry.status} ({entry.failure_kind}) "
                f"but none of its runs {sorted(_failing_runs(entry))} was killed"
            )
        survivors = [
            run
            for run in record.runs
            if is_retry_of_a_dispatch_failure(run.tags, entry) and run.run_id not in record.killed
        ]
        for retry in survivors:
            problems.append(
                f"entry {entry.id} {entry.label} left dispatch_failed though Dagster's "
                f"retry {retry.run_id} ({retry.status}) of its failed run was not killed"
            )

    # 4. no side effect twice, and only claiming runs send
    effects = {e.id: e for e in record.effects}
    for name, rows in (("email delivery", record.deliveries), ("sms outbox row", record.outbox)):
        counts = Counter(_delivery_key(d) for d in rows)
        for key, count in sorted(counts.items()):
            if count > 1:
                problems.append(f"{name} {key} recorded {count} times")
    for delivery in record.deliveries:
        effect = effects.get(delivery.effect_id)
        entry = entry_by_key.get(effect.entry_key) if effect else None
        if entry is None:
            problems.append(f"delivery of effect {delivery.effect_id} has no ledger entry")
        elif delivery.run_id not in entry.run_ids:
            problems.append(
                f"effect {delivery.effect_id} delivered by run {delivery.run_id}, which never "
                f"claimed entry {entry.id} {entry.label}"
            )

    # 5. success is complete
    delivered = Counter(
        _key(d.rule, d.object_id, d.time_point, d.channel) for d in record.deliveries
    )
    in_outbox = Counter(_key(d.rule, d.object_id, d.time_point, d.channel) for d in record.outbox)
    effect_by_key = {_delivery_key(e): e for e in record.effects}
    for (task, dedup), entry in sorted(entries.items()):
        if entry.status != Status.SUCCESS or dedup not in due_of:
            continue
        point = naive_utc(due_of[dedup])
        for number in range(record.messages):
            sms = _key(task, number, point, SMS)
            if in_outbox[sms] != 1:
                problems.append(f"entry {entry.id} {entry.label} success without sms {sms}")
            email = _key(task, number, point, EMAIL)
            effect = effect_by_key.get(email)
            if effect is None:
                problems.append(f"entry {entry.id} {entry.label} success without email {email}")
            elif effect.status == "succeeded" and delivered[email] != 1:
                problems.append(f"email {email} succeeded but delivered {delivered[email]} times")
            elif effect.status == "in_flight" and not (set(entry.run_ids) & record.killed):
                problems.append(f"email {email} left in doubt though no run of it was killed")
            elif effect.status not in ("succeeded", "in_flight"):
                problems.append(f"entry {entry.id} success but email {email} is {effect.status}")

    # 6. every reclaim traced
    for entry in entries.values():
        if entry.failure_kind != FailureKind.LEASE_RECLAIMED:
            continue
        owner = entry.run_ids[-1] if entry.run_ids else ""
        if owner not in record.killed:
            problems.append(f"entry {entry.id} {entry.label} reclaimed from live run {owner}")
        if owner not in (entry.error or ""):
            problems.append(f"entry {entry.id} reclaim error does not name run {owner}")
        if (entry.id, owner) not in record.reclaim_alerts:
            problems.append(f"entry {entry.id} reclaimed from {owner} without an alert")
    return problems


def outcome_counts(record: SoakRecord) -> dict[str, int]:
    """How the dues ended, for the soak's report line."""
    counts: Counter[str] = Counter()
    for entry in record.entries:
        label = entry.status
        if entry.failure_kind and entry.status != Status.SUCCESS:
            label = f"{entry.status}:{entry.failure_kind}"
        counts[label] += 1
        if entry.status == Status.SUCCESS and entry.attempt > 1:
            counts["success_after_retry"] += 1
    return dict(sorted(counts.items()))


def utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def parse_alerts(lines: Iterable[str], kind: str) -> set[tuple[int, str]]:
    """(entry id, run id) of every ``kind`` alert line (JSON) found in a daemon log."""
    found: set[tuple[int, str]] = set()
    for line in lines:
        start = line.find('{"alert":')
        if start < 0:
            continue
        try:
            alert = json.loads(line[start:].strip())
        except ValueError:
            continue
        if alert.get("alert") == kind and "entry_id" in alert and "run_id" in alert:
            found.add((int(alert["entry_id"]), str(alert["run_id"])))
    return found
