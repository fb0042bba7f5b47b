"""Stranded launches: an entry recorded for a launch whose run was never created.

`dueledger launch` and `dueledger runs retry` write their entry first and then submit the
run. A launch that fails is recorded (``dispatch_failed``); a launching process that dies in
between (killed, machine lost) leaves a ``queued`` entry with no run that nothing would ever
start. This sweep finds such entries -- ``manual`` and ``retry`` origins, ``queued``, no run
id, older than :data:`STRANDED_AFTER`, and no Dagster run launched for them -- and records
each as a launch failure (``dispatch_failed``, kind ``dispatch``), with the command that
re-dispatches it. It never launches a run itself: an operator asked for that run, and asks
again. It runs on every tick of ``lease_reclaim_sensor`` (sensors/reclaim.py) and in
`dueledger reclaim` (deployments without the daemon).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

import dagster as dg

from orchestration.services.launch import manual_run_id
from resources.core import tags as t
from resources.core.alerting import KIND_LAUNCH_STRANDED
from resources.core.entry import Origin, Status
from resources.core.instants import iso
from resources.ledger import Entry, Ledger

#: How long an entry may wait for its run to be created: well past the launch timeout
#: (300 s), so a slow launch that is still going is never taken for a dead one.
STRANDED_AFTER: Final = timedelta(minutes=15)
#: Entries looked at per sweep (the oldest stranded ones wait for the next sweep).
SWEEP_LIMIT: Final = 200
ALERT_KIND: Final = KIND_LAUNCH_STRANDED


@dataclass(frozen=True)
class Stranded:
    """One entry the sweep recorded as a failed launch."""

    entry: Entry
    redo: str

    def as_json(self) -> dict[str, Any]:
        return {
            "task": self.entry.task_key,
            "entry_id": self.entry.id,
            "dedup_key": self.entry.dedup_key,
            "created_at": iso(self.entry.created_at),
            "action": self.redo,
        }


def redo_command(entry: Entry) -> str:
    """The command that re-dispatches a manual or retry entry whose launch failed
    (``dispatch_failed``): the same request again."""
    if entry.origin == Origin.MANUAL:
        request_id = entry.dedup_key.removeprefix(f"{Origin.MANUAL}:")
        return (
            f"`dueledger launch {entry.task_key} --request-id {shlex.quote(request_id)} "
            f"--operator <you> "
            f'--reason "..."` re-dispatches it'
        )
    if entry.parent_id is not None:
        # The retry's own request, repeated, re-dispatches this child (services/retry.py).
        return (
            f'`dueledger runs retry {entry.parent_id} --operator <you> --reason "..."` '
            f"re-dispatches it"
        )
    return f"`dueledger runs retry {entry.id} --acknowledge-side-effects` launches it"


def _has_run(instance: dg.DagsterInstance, entry: Entry) -> bool:
    """Whether a Dagster run was created for ``entry``'s current dispatch (it may still wait
    in the queue). A run whose failure the entry recorded belongs to an earlier dispatch: a
    re-dispatch whose launcher died before its run was created is stranded too."""
    ended = entry.dispatch_failure_run_ids
    if entry.origin == Origin.MANUAL:
        request_id = entry.dedup_key.removeprefix(f"{Origin.MANUAL}:")
        run = instance.get_run_by_id(manual_run_id(entry.task_key, request_id))
        if run is not None and run.run_id not in ended:
            return True
        found = instance.get_runs(
            filters=dg.RunsFilter(tags={t.TAG_TASK: entry.task_key, t.TAG_REQUEST_ID: request_id}),
            limit=1,
        )
        return bool(found) and found[0].run_id not in ended
    # A retry child's runs (new run or re-execution) carry its parent's id.
    found = instance.get_runs(
        filters=dg.RunsFilter(
            tags={t.TAG_TASK: entry.task_key, t.TAG_PARENT_ENTRY: str(entry.parent_id)}
        ),
        limit=1,
    )
    return bool(found)


def stranded_candidates(ledger: Ledger, now: datetime) -> list[Entry]:
    """``queued`` manual/retry entries with no run id, recorded before ``now - STRANDED_AFTER``."""
    page, _ = ledger.list_entries(
        statuses=[Status.QUEUED], until=now - STRANDED_AFTER, limit=SWEEP_LIMIT
    )
    return [e for e in page if e.origin in (Origin.MANUAL, Origin.RETRY) and not e.run_ids]


def sweep_stranded(
    ledger: Ledger, instance: dg.DagsterInstance, now: datetime, *, dry_run: bool = False
) -> list[Stranded]:
    """Record every stranded launch as ``dispatch_failed``; returns what was recorded (with
    ``dry_run``: what would be, unchanged)."""
    swept: list[Stranded] = []
    for entry in stranded_candidates(ledger, now):
        if _has_run(instance, entry):
            continue
        redo = redo_command(entry)
        if dry_run:
            swept.append(Stranded(entry, redo))
            continue
        waited = int((now - entry.created_at).total_seconds() // 60)
        after = ledger.record_dispatch_failure(
            entry.id,
            error=(
                f"no Dagster run was created for this entry {waited} minutes after it was "
                f"recorded: the launching command stopped between recording and launching. "
                f"Nothing ran; {redo}"
            ),
            now=now,
        )
        if after.status == Status.DISPATCH_FAILED:
            swept.append(Stranded(after, redo))
    return swept
