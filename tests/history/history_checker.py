"""The history checker: one verdict over what happened to every due of a fault test.

Pure: a list of history records in (``history/history_format.py`` documents them), a list of
:class:`Violation` out, empty when every rule holds. ``tests/history/test_history_checker.py``
feeds it a doctored history for each rule and sees the rule fire, so a clean verdict means
something.

Rules (the check name is the first word of each violation):

- ``double_effect`` -- no (task, due) with the same side effect twice (the ``effect`` sink has
  no unique constraint, so a second delivery shows);
- ``effect_without_claim`` -- a side effect comes from a run that holds the entry under the
  token it wrote with (a claim record, and the run among the entry's ``run_ids``);
- ``effect_after_release`` -- no effect after its claim ended (reclaimed, failed, succeeded, or
  overtaken by a later claim): 0 effects after a reclaim;
- ``refused_run_effect`` -- a run the ledger refused did nothing;
- ``shared_claim`` -- one claim (entry, token) is held by one run in one process: two
  processes of one Dagster run (two daemons dequeuing it at once) must not both hold it;
- ``claim_order`` -- an entry's claims come in token order, each after the previous one ended;
- ``two_entries`` -- one ledger entry per due;
- ``unclassified_due`` -- every due ends classified: ``success``, a final ``failed`` /
  ``dispatch_failed`` (with a failure kind), ``skipped`` with a reason, or reported ``missed``
  with a reason -- never queued, running or retrying, never silently absent;
- ``late_classification`` -- and classified by ``due + window + lease TTL``;
- ``failed_run_invisible`` -- every failed run (not a refused one) is found in the ledger (an
  attempt, a dispatch failure or a rejection of some entry), and ``summary`` counts exactly
  the failed and dispatch-failed entries per task -- refused runs are not failures;
- ``orphan_manual_retry`` -- every manual retry has its parent: an existing failed entry
  stamped ``manual_retry_at``, an audit record naming both, and runs tagged with it.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from history.history_format import Record, parse_time

SUCCESS, FAILED, DISPATCH_FAILED, SKIPPED = "success", "failed", "dispatch_failed", "skipped"
FINAL = (SUCCESS, FAILED, DISPATCH_FAILED, SKIPPED)
REFUSED = "refused"
FAILURE_RUN_STATUSES = ("FAILURE",)
CHECKS = (
    "double_effect",
    "effect_without_claim",
    "effect_after_release",
    "refused_run_effect",
    "shared_claim",
    "claim_order",
    "two_entries",
    "unclassified_due",
    "late_classification",
    "failed_run_invisible",
    "orphan_manual_retry",
)


@dataclass(frozen=True, order=True)
class Violation:
    """One broken rule: ``check`` (a name of ``CHECKS``), the due/run/entry, and why."""

    check: str
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"{self.check} {self.subject}: {self.detail}"


def _key(task: str, due: str | None) -> str:
    return f"{task}@{due}"


def due_key(dedup_key: str) -> str | None:
    """The due string of a ``due:<due>`` dedup key, else None."""
    return dedup_key.removeprefix("due:") if dedup_key.startswith("due:") else None


@dataclass
class History:
    """A history's records, indexed for the checks."""

    records: Sequence[Record]
    by_type: dict[str, list[Record]] = field(default_factory=lambda: defaultdict(list))
    releases: dict[tuple[int, int], list[Record]] = field(default_factory=lambda: defaultdict(list))

    def __post_init__(self) -> None:
        for record in self.records:
            self.by_type[record["type"]].append(record)
            if record["type"] == "release":
                self.releases[(int(record["entry_id"]), int(record["token"]))].append(record)

    def of(self, type_: str) -> list[Record]:
        return self.by_type.get(type_, [])

    @property
    def meta(self) -> Mapping[str, Any]:
        metas = self.of("meta")
        return metas[0] if metas else {}

    @property
    def entries(self) -> dict[int, Record]:
        return {int(e["id"]): e for e in self.of("entry")}

    def lease_ttl(self, task: str) -> timedelta:
        for record in self.of("task"):
            if record["task"] == task:
                return timedelta(seconds=float(record.get("lease_ttl_seconds", 0)))
        return timedelta(seconds=float(self.meta.get("lease_ttl_seconds", 0)))


def _order(record: Mapping[str, Any]) -> tuple[float, datetime | None]:
    """A record's place in time: its ``seq`` when the writer knew it, else its ``at``."""
    seq = record.get("seq")
    return (float(seq) if seq is not None else float("inf"), parse_time(record.get("at")))


def _before(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Did ``a`` happen strictly before ``b``? Exact with ``seq`` on both, else by time."""
    if a.get("seq") is not None and b.get("seq") is not None:
        return float(a["seq"]) < float(b["seq"])
    at_a, at_b = parse_time(a.get("at")), parse_time(b.get("at"))
    return at_a is not None and at_b is not None and at_a < at_b


def check(records: Iterable[Record]) -> list[Violation]:
    """Every violated rule of the history, sorted (empty: all hold)."""
    history = History(list(records))
    found: list[Violation] = []
    for rule in (_effects, _claims, _dues, _failed_runs, _manual_retries):
        found.extend(rule(history))
    return sorted(found)


# --- effects and claims -------------------------------------------------------------------


def _claims_by_entry(history: History) -> dict[int, list[Record]]:
    claims: dict[int, list[Record]] = defaultdict(list)
    for claim in history.of("claim"):
        claims[int(claim["entry_id"])].append(claim)
    for items in claims.values():
        items.sort(key=lambda c: (int(c["token"]), _order(c)))
    return claims


def _end_of(claim: Record, history: History, claims: list[Record]) -> Record | None:
    """When this claim stopped holding its entry: its release, else the next token's claim."""
    ends = list(history.releases.get((int(claim["entry_id"]), int(claim["token"])), []))
    later = [c for c in claims if int(c["token"]) > int(claim["token"])]
    candidates = ends + later[:1]
    if not candidates:
        return None
    return min(candidates, key=_order)


def _effects(history: History) -> list[Violation]:
    found = []
    counts = Counter((e["task"], e["due"], e["effect"]) for e in history.of("effect"))
    for (task, due, effect), count in sorted(counts.items(), key=str):
        if count > 1:
            found.append(
                Violation("double_effect", _key(task, due), f"{effect!r} happened {count} times")
            )
    claims = _claims_by_entry(history)
    entries = history.entries
    refused = {r["run_id"] for r in history.of("run") if r.get("outcome") == REFUSED}
    for effect in history.of("effect"):
        subject = _key(effect["task"], effect["due"])
        entry_id, run_id, token = int(effect["entry_id"]), effect["run_id"], int(effect["token"])
        if run_id in refused:
            found.append(
                Violation(
                    "refused_run_effect", subject, f"refused run {run_id} did {effect['effect']!r}"
                )
            )
        entry = entries.get(entry_id)
        held = [c for c in claims.get(entry_id, []) if c["run_id"] == run_id]
        held = [c for c in held if int(c["token"]) == token]
        if not held or (entry is not None and run_id not in entry.get("run_ids", [])):
            found.append(
                Violation(
                    "effect_without_claim",
                    subject,
                    f"{effect['effect']!r} by run {run_id} under token {token}, which never "
                    f"claimed entry {entry_id}",
                )
            )
            continue
        end = _end_of(held[0], history, claims[entry_id])
        if end is not None and not _before(effect, end):
            how = end.get("how") or f"claim {end.get('token')} by run {end.get('run_id')}"
            found.append(
                Violation(
                    "effect_after_release",
                    subject,
                    f"{effect['effect']!r} by run {run_id} (token {token}) at "
                    f"{effect.get('at')} after its claim ended ({how} at {end.get('at')})",
                )
            )
    return found


def _claims(history: History) -> list[Violation]:
    found = []
    claims = _claims_by_entry(history)
    refused = {r["run_id"] for r in history.of("run") if r.get("outcome") == REFUSED}
    for entry_id, items in sorted(claims.items()):
        by_token: dict[int, set[tuple[str, str]]] = defaultdict(set)
        for claim in items:
            by_token[int(claim["token"])].add((claim["run_id"], str(claim.get("worker", ""))))
            if claim["run_id"] in refused:
                found.append(
                    Violation(
                        "refused_run_effect",
                        f"entry {entry_id}",
                        f"run {claim['run_id']} holds token {claim['token']} but is tagged refused",
                    )
                )
        for token, holders in sorted(by_token.items()):
            if len(holders) > 1:
                found.append(
                    Violation(
                        "shared_claim",
                        f"entry {entry_id}",
                        f"token {token} held by {len(holders)} processes: {sorted(holders)}",
                    )
                )
        ordered = sorted(items, key=_order)
        tokens = [int(c["token"]) for c in ordered]
        if tokens != sorted(tokens):
            found.append(
                Violation("claim_order", f"entry {entry_id}", f"tokens out of order: {tokens}")
            )
        for earlier, later in itertools.pairwise(items):
            if int(later["token"]) == int(earlier["token"]):
                continue
            end = _end_of(earlier, history, [])
            if end is not None and _before(later, end):
                found.append(
                    Violation(
                        "claim_order",
                        f"entry {entry_id}",
                        f"run {later['run_id']} claimed token {later['token']} at "
                        f"{later.get('at')} while run {earlier['run_id']} still held token "
                        f"{earlier['token']} (released {end.get('at')})",
                    )
                )
    return found


# --- dues ----------------------------------------------------------------------------------


def _classified_at(entry: Mapping[str, Any]) -> datetime | None:
    if entry["status"] == DISPATCH_FAILED:
        # Its newest dispatch failure, not updated_at: a manual retry stamps that later.
        failures = (entry.get("summary") or {}).get("dispatch_failures") or []
        times = [parse_time(f.get("at")) for f in failures]
        return max((x for x in times if x), default=parse_time(entry.get("updated_at")))
    return parse_time(entry.get("finished_at")) or parse_time(entry.get("updated_at"))


def _unclassified(entry: Mapping[str, Any]) -> str | None:
    """Why the entry's state is not a final classification, or None when it is one."""
    status = entry["status"]
    if status not in FINAL:
        return f"entry {entry['id']} left {status}"
    if status in (FAILED, DISPATCH_FAILED) and not entry.get("failure_kind"):
        return f"entry {entry['id']} {status} without a failure kind"
    if status == SKIPPED and not (entry.get("error") or entry.get("reason")):
        return f"entry {entry['id']} skipped without a reason"
    return None


def _dues(history: History) -> list[Violation]:
    found = []
    window = timedelta(seconds=float(history.meta.get("window_seconds", 0)))
    by_due: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for entry in history.of("entry"):
        due = due_key(entry.get("dedup_key", ""))
        if due is not None:
            by_due[(entry["task_key"], due)].append(entry)
    missed = {(m["task"], m["due"]): m for m in history.of("missed")}
    for record in history.of("due"):
        task, due = record["task"], record["due"]
        subject = _key(task, due)
        entries = by_due.get((task, due), [])
        if len(entries) > 1:
            ids = sorted(int(e["id"]) for e in entries)
            found.append(Violation("two_entries", subject, f"{len(entries)} entries {ids}"))
        if not entries:
            report = missed.get((task, due))
            if report is None:
                found.append(
                    Violation(
                        "unclassified_due", subject, "no ledger entry and not reported missed"
                    )
                )
            elif not str(report.get("reason") or "").strip():
                found.append(Violation("unclassified_due", subject, "reported missed without why"))
            continue
        entry = entries[0]
        why = _unclassified(entry)
        if why is not None:
            found.append(Violation("unclassified_due", subject, why))
            continue
        at, instant = _classified_at(entry), parse_time(due)
        deadline = instant + window + history.lease_ttl(task) if instant else None
        if window and at is not None and deadline is not None and at > deadline:
            found.append(
                Violation(
                    "late_classification",
                    subject,
                    f"entry {entry['id']} became {entry['status']} at {entry.get('finished_at')}"
                    f" / {entry.get('updated_at')}, after {deadline:%Y-%m-%dT%H:%M:%SZ} (due + "
                    f"window {window} + lease TTL {history.lease_ttl(task)})",
                )
            )
    return found


# --- failed runs and summary -----------------------------------------------------------------


def mentioned_runs(entry: Mapping[str, Any]) -> set[str]:
    """The runs an entry (its JSON) knows of: attempts, dispatch failures, rejections."""
    summary = entry.get("summary") or {}
    found = set(entry.get("run_ids") or [])
    for key in ("dispatch_failures", "late_job_rejections"):
        found |= {str(i.get("run_id")) for i in summary.get(key) or [] if i.get("run_id")}
    return found


def failed_run(status: str | None, outcome: str | None) -> bool:
    """A run that failed, not one the ledger refused (a refusal is not a failure)."""
    return status in FAILURE_RUN_STATUSES and outcome != REFUSED


def untraced_failed_runs(
    runs: Iterable[tuple[str, str | None, str | None]], entries: Iterable[Mapping[str, Any]]
) -> list[str]:
    """Of ``runs`` (run id, status, ``dueledger/outcome``), the failed ones no entry (its
    JSON) knows of yet: what a test waits for the outcome sensor to trace before it writes
    the history ``failed_run_invisible`` is checked on."""
    known = set().union(*(mentioned_runs(e) for e in entries))
    return [
        run_id
        for run_id, status, outcome in runs
        if failed_run(status, outcome) and run_id not in known
    ]


def _failed_runs(history: History) -> list[Violation]:
    found = []
    mentioned = set().union(*(mentioned_runs(e) for e in history.of("entry")))
    for run in history.of("run"):
        if failed_run(run.get("status"), run.get("outcome")) and run["run_id"] not in mentioned:
            found.append(
                Violation(
                    "failed_run_invisible",
                    f"run {run['run_id']}",
                    f"{run.get('task')} run {run.get('status')} is in no ledger entry",
                )
            )
    summaries = history.of("summary")
    if not summaries:
        return found
    rows = {row["task_key"]: row for row in summaries[-1].get("tasks", [])}
    tasks = {t["task"] for t in history.of("task")} or {e["task_key"] for e in history.of("entry")}
    by_task: dict[str, list[Record]] = defaultdict(list)
    for entry in history.of("entry"):
        by_task[entry["task_key"]].append(entry)
    for task in sorted(tasks):
        entries = by_task.get(task, [])
        for status, column in ((FAILED, "failed_24h"), (DISPATCH_FAILED, "dispatch_failed_24h")):
            want = sum(e["status"] == status for e in entries)
            got = int((rows.get(task) or {}).get(column, 0))
            if got != want:
                found.append(
                    Violation(
                        "failed_run_invisible",
                        f"summary {task}",
                        f"{column} is {got}, the ledger has {want} {status} entries",
                    )
                )
    return found


# --- manual retries ---------------------------------------------------------------------------


def _manual_retries(history: History) -> list[Violation]:
    found = []
    entries = history.entries
    audits = history.of("audit")
    for entry in entries.values():
        if entry.get("trigger") != "manual_retry":
            continue
        subject = f"entry {entry['id']}"
        parent = entries.get(int(entry["parent_id"])) if entry.get("parent_id") else None
        if parent is None:
            found.append(
                Violation("orphan_manual_retry", subject, f"parent {entry.get('parent_id')} absent")
            )
            continue
        if parent["status"] not in (FAILED, DISPATCH_FAILED) or not parent.get("manual_retry_at"):
            found.append(
                Violation(
                    "orphan_manual_retry",
                    subject,
                    f"parent {parent['id']} is {parent['status']}, manual_retry_at "
                    f"{parent.get('manual_retry_at')}",
                )
            )
        allowed = [
            a
            for a in audits
            if a.get("child_entry_id") == entry["id"] and a.get("entry_id") == parent["id"]
        ]
        if audits and not allowed:
            found.append(
                Violation(
                    "orphan_manual_retry", subject, f"no audit record names it and {parent['id']}"
                )
            )
    for run in history.of("run"):
        if run.get("trigger") == "manual_retry":
            parent = run.get("parent_entry")
            if parent is None or int(parent) not in entries:
                found.append(
                    Violation(
                        "orphan_manual_retry",
                        f"run {run['run_id']}",
                        f"manual retry run names parent entry {parent}, which does not exist",
                    )
                )
    return found


# --- figures -----------------------------------------------------------------------------------


def figures(records: Iterable[Record], violations: Sequence[Violation]) -> dict[str, Any]:
    """What a report line and docs/reliability.md quote: dues, runs, faults, outcomes."""
    history = History(list(records))
    outcomes = Counter(
        e["status"] + (f":{e['failure_kind']}" if e["status"] != SUCCESS else "")
        for e in history.of("entry")
    )
    return {
        "dues": len(history.of("due")),
        "runs": len(history.of("run")),
        "refused_runs": sum(r.get("outcome") == REFUSED for r in history.of("run")),
        "claims": len(history.of("claim")),
        "effects": len(history.of("effect")),
        "refused_commits": sum(not c.get("committed") for c in history.of("commit")),
        "missed": len(history.of("missed")),
        "faults": dict(sorted(Counter(f["kind"] for f in history.of("fault")).items())),
        "outcomes": dict(sorted(outcomes.items())),
        "violations": len(violations),
    }
