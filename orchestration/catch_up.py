"""Catch-up: a range of a task's dues run once each (`dueledger catch-up TASK --from --to
[--only missed|failed]`) -- the decision per due and the ledger writes that carry it out.

Like Airflow 3's backfill with a reprocess behaviour, for a task without partitions: every due
the task's schedule produces in ``[--from, --to)`` gets at most one ``due:<due>`` entry, never
a second. ``--only missed`` launches the dues with no entry (and no Dagster run) that no pause
covers; ``--only failed`` retries the ``failed`` ones as audited manual-retry children; without
``--only``, both. Everything else -- a due that succeeded, runs, was skipped, or is paused --
is listed and left alone (:func:`catch_up_step`, pure). A range is refused when it holds more
than :data:`MAX_CATCH_UP_DUES` dues or reaches further back than :data:`CATCH_UP_RETENTION`.

The plan (:func:`plan_catch_up`) is one step per due; ``--dry-run`` prints exactly it.
:func:`run_catch_up` then

- for each missed due: creates its ``due:<due>`` entry (trigger ``manual``: the operator and
  reason on it, audited ``catch_up``) -- insert-or-ignore, so a due that got an entry
  meanwhile keeps it and launches nothing -- and launches all their runs through one
  ``launchMultipleRuns`` into the run queue. A catch-up run waits its turn under any overlap
  policy (Temporal's backfills override a schedule's Skip the same way);
- for each failed due: a manual retry, the rules of `dueledger runs retry` (a child entry,
  audited, a re-execution of its last run).

Running it again finds every due with an entry and does nothing; a crash between an entry and
its run is finished by running it again (``relaunch``). A task declared with
``missed_slot_policy: catch_up`` has its missed dues inside ``catch_up_window`` launched by its
``<task>_catch_up_sensor`` the same way (``sensors/catch_up.py``). Dagster-free.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import sqlalchemy as sa

from orchestration.missed_dues import run_dues
from orchestration.pause import pause_at, task_pauses
from orchestration.services.launch import (
    LAUNCH_TIMEOUT_SECONDS,
    Launcher,
    LaunchFailed,
    launch_runs,
)
from orchestration.task_spec import TaskSpec, TaskView, task_run_tags
from orchestration.timetable import plan_dues
from resources.core import tags as t
from resources.core.due import Due, format_due
from resources.core.entry import Entry, FailureKind, Status, Trigger
from resources.core.errors import InvalidInput, Refused
from resources.core.instants import iso
from resources.core.operators import Operators
from resources.ledger import Ledger
from resources.ledger.model import from_db, to_db
from resources.ledger.schema import launch_claims

if TYPE_CHECKING:
    import dagster as dg
    from sqlalchemy.engine import Connection

#: Most dues one catch-up may hold (each becomes a run): split a longer range.
MAX_CATCH_UP_DUES: Final = 1000
#: How far back a catch-up may reach: the ledger's and Dagster's run history are the evidence
#: of what ran, and a due older than this is treated as beyond the task's retention.
CATCH_UP_RETENTION: Final = timedelta(days=31)
ONLY_MISSED: Final = "missed"
ONLY_FAILED: Final = "failed"
ONLY_CHOICES: Final = (ONLY_MISSED, ONLY_FAILED)

LAUNCH: Final = "launch"  # a new due:<due> entry and its run
RELAUNCH: Final = "relaunch"  # a catch-up entry whose run was never created (a crash between)
RETRY: Final = "retry"  # a manual-retry child of the failed entry
LEAVE: Final = "none"
HELD: Final = "held"  # another catch-up holds its launch: it launches it, not this one


@dataclass(frozen=True)
class CatchUpStep:
    """What catch-up does about one due (``action``), and why in words."""

    due: datetime
    action: str
    status: str
    note: str
    entry_id: int | None = None
    run_id: str | None = None

    def as_json(self) -> dict[str, object]:
        return {
            "due": format_due(self.due),
            "status": self.status,
            "action": self.action,
            "entry_id": self.entry_id,
            "run_id": self.run_id,
            "note": self.note,
        }


def catch_up_step(
    due: datetime,
    entry: Entry | None,
    *,
    has_run: bool,
    pause_reason: str | None,
    only: str | None,
    unqueued_run: str | None = None,
) -> CatchUpStep:
    """The step for one due: ``entry`` its ledger entry (None: none), ``has_run`` a Dagster run
    names it, ``pause_reason`` a pause covers it (None: none), ``unqueued_run`` its run that
    Dagster created but never queued, long ago (None: none)."""
    missed_too = only in (None, ONLY_MISSED)
    failed_too = only in (None, ONLY_FAILED)
    unstarted = entry is None or (entry.status == Status.QUEUED and not entry.run_ids)
    if unqueued_run is not None and unstarted:
        # A launcher killed between Dagster's two writes (the run created, not yet queued)
        # leaves a run that never starts and stands for the due; it ran nothing.
        why = (
            f"its run {unqueued_run} was created but never queued (its launcher was killed): "
            f"`dagster run delete {unqueued_run}`, then run this catch-up again"
        )
        return CatchUpStep(due, LEAVE, "unqueued", why, entry.id if entry else None)
    if entry is None:
        if has_run:
            return CatchUpStep(due, LEAVE, "queued", "a Dagster run exists for it (not started)")
        if pause_reason is not None:
            return CatchUpStep(due, LEAVE, "paused", f"not run on purpose: {pause_reason}")
        if not missed_too:
            return CatchUpStep(due, LEAVE, "missed", "missed; --only failed leaves it")
        return CatchUpStep(due, LAUNCH, "missed", "missed: a due:<due> entry and its run")
    status, eid = entry.status, entry.id
    if entry.status == Status.FAILED:
        kind = entry.failure_kind or FailureKind.ERROR
        if not failed_too:
            return CatchUpStep(due, LEAVE, status, f"failed ({kind}); --only missed leaves it", eid)
        if entry.manual_retry_at is not None:
            return CatchUpStep(due, LEAVE, status, "failed; retried by hand already", eid)
        if kind == FailureKind.LEASE_RECLAIMED:
            return CatchUpStep(
                due,
                LEAVE,
                status,
                f"failed (lease_reclaimed): its side effects may have happened; "
                f"`dueledger runs retry {eid} --acknowledge-side-effects` if it must run again",
                eid,
            )
        return CatchUpStep(due, RETRY, status, f"failed ({kind}): a manual-retry child", eid)
    fresh_catch_up = (
        entry.status == Status.QUEUED and entry.trigger == Trigger.MANUAL and not has_run
    )
    if fresh_catch_up and not entry.run_ids and missed_too:
        return CatchUpStep(due, RELAUNCH, status, "its catch-up run was never created", eid)
    if entry.status == Status.DISPATCH_FAILED:
        return CatchUpStep(
            due,
            LEAVE,
            status,
            f"its run never started; `dueledger runs retry {eid} --acknowledge-side-effects`",
            eid,
        )
    note: str = {
        Status.SUCCESS: "succeeded",
        Status.SKIPPED: f"skipped ({entry.error})",
    }.get(Status(entry.status), f"{entry.status}: in progress")
    return CatchUpStep(due, LEAVE, status, note, eid)


#: The audit action of each due a catch-up launches.
ACTION_CATCH_UP: Final = "catch_up"


def plan_catch_up(
    view: TaskView,
    ledger: Ledger,
    with_runs: Collection[datetime],
    start: datetime,
    end: datetime,
    only: str | None,
    unqueued: Mapping[datetime, str] | None = None,
) -> list[CatchUpStep]:
    """One step per due of ``view`` in ``[start, end)``, oldest first. ``with_runs``: the dues
    Dagster has a run of (``missed_dues.run_dues``, read by the caller); ``unqueued``: those
    whose run was created and never queued (``missed_dues.unqueued_runs``)."""
    key = view.spec.key
    dues = plan_dues(view.plan, view.slot_minutes, start, end)
    entries = ledger.due_entries(key, start, end)
    pauses = task_pauses(ledger, key)
    steps = []
    for due in dues:
        pause = pause_at(pauses, due)
        steps.append(
            catch_up_step(
                due,
                entries.get(due),
                has_run=due in with_runs,
                pause_reason=pause.skip_reason if pause is not None else None,
                only=only,
                unqueued_run=(unqueued or {}).get(due),
            )
        )
    return steps


def catch_up_tags(spec: TaskSpec, due: datetime, operator: str, reason: str) -> dict[str, str]:
    """The tags of a catch-up run: the task's run tags, ``manual`` with the due it runs."""
    return {
        **task_run_tags(spec),
        t.TAG_TRIGGER: Trigger.MANUAL.value,
        t.TAG_DUE: format_due(due),
        t.TAG_OPERATOR: operator,
        t.TAG_REASON: reason,
    }


@dataclass(frozen=True)
class CatchUpResult:
    task_key: str
    start: datetime
    end: datetime
    only: str | None
    dry_run: bool
    steps: list[CatchUpStep]

    def as_json(self) -> dict[str, Any]:
        counts = {a: sum(1 for s in self.steps if s.action == a) for a in (LAUNCH, RETRY)}
        return {
            "task_key": self.task_key,
            "from": format_due(self.start),
            "to": format_due(self.end),
            "only": self.only,
            "dry_run": self.dry_run,
            "dues": [s.as_json() for s in self.steps],
            "launched": counts[LAUNCH] + sum(1 for s in self.steps if s.action == RELAUNCH),
            "retried": counts[RETRY],
            "held_elsewhere": sum(1 for s in self.steps if s.action == HELD),
            "unchanged": sum(1 for s in self.steps if s.action == LEAVE),
        }


#: How long an unsubmitted launch claim holds against another host's catch-up: its launcher
#: is killed after LAUNCH_TIMEOUT_SECONDS and dies with its CLI, so past this nothing of that
#: claim can still create a run. A claim of a process of this host that is gone is free at once.
LAUNCH_CLAIM_TTL: Final = timedelta(seconds=LAUNCH_TIMEOUT_SECONDS + 60)


def process_identity(pid: int | None = None) -> str:
    """``host:pidns:pid:start`` of a process (this one by default): ``pidns`` names its PID
    namespace (two containers may share a host name, never a namespace), ``start`` its start
    time in clock ticks since boot, so a pid the kernel reused names another process."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{_pid_namespace()}:{pid}:{_start_ticks(pid)}"


def _pid_namespace() -> str:
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return "?"
    return "".join(c for c in link if c.isdigit()) or "?"


def _start_ticks(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    # Field 22 (starttime), counted after the command name, which may hold spaces.
    return stat[stat.rindex(")") + 2 :].split()[19]


def holder_gone(claimed_by: str) -> bool:
    """The process that took a claim is known to be gone: it ran on this host, in this PID
    namespace, and its pid is unused or names a process started at another time. False when
    that cannot be known (another host or container, no /proc): then only
    :data:`LAUNCH_CLAIM_TTL` frees the claim."""
    try:
        host, namespace, pid_text, start = claimed_by.rsplit(":", 3)
        pid = int(pid_text)
    except ValueError:
        return False
    here = host == socket.gethostname() and namespace == _pid_namespace() != "?"
    if not here or start == "?":
        return False
    return _start_ticks(pid) != start


@dataclass(frozen=True)
class LaunchClaim:
    """Which catch-up may submit an entry's run (a row of ``dueledger_launch_claims``)."""

    entry_id: int
    claimed_by: str
    claimed_at: datetime
    run_id: str | None
    submitted_at: datetime | None

    def free(self, now: datetime) -> bool:
        """Another catch-up may take it over: never submitted, and its holder cannot submit
        any more (gone, or past :data:`LAUNCH_CLAIM_TTL`)."""
        if self.submitted_at is not None:
            return False
        return self.claimed_at + LAUNCH_CLAIM_TTL <= now or holder_gone(self.claimed_by)

    def words(self) -> str:
        if self.submitted_at is not None:
            return f"submitted as run {self.run_id} at {iso(self.submitted_at)}"
        holder = f"{self.claimed_by}, since {iso(self.claimed_at)}"
        return f"being launched by another catch-up ({holder}): it launches this due"


def _claim_row(conn: Connection, entry_id: int) -> LaunchClaim | None:
    row = (
        conn.execute(sa.select(launch_claims).where(launch_claims.c.entry_id == entry_id))
        .mappings()
        .first()
    )
    if row is None:
        return None
    claimed_at = from_db(row["claimed_at"])
    assert claimed_at is not None  # NOT NULL
    return LaunchClaim(
        entry_id=row["entry_id"],
        claimed_by=row["claimed_by"],
        claimed_at=claimed_at,
        run_id=row["run_id"],
        submitted_at=from_db(row["submitted_at"]),
    )


def take_launch_claim(
    conn: Connection, entry_id: int, me: str, now: datetime
) -> tuple[bool, LaunchClaim | None]:
    """Claim the submission of ``entry_id``'s run for ``me`` in ``conn``'s transaction: the
    first claim is an insert the database lets one process win; a free claim (see
    :meth:`LaunchClaim.free`) is taken over by a compare-and-set on its holder. Returns
    whether ``me`` holds it and, when it was taken over or lost, the claim found."""
    at = to_db(now, "now")
    inserted = conn.execute(
        _insert_for(conn.dialect.name)(launch_claims)
        .values(entry_id=entry_id, claimed_by=me, claimed_at=at)
        .on_conflict_do_nothing(index_elements=["entry_id"])
    )
    if inserted.rowcount == 1:
        return True, None
    found = _claim_row(conn, entry_id)
    if found is None or not found.free(now):
        return False, found
    taken = conn.execute(
        sa.update(launch_claims)
        .where(
            launch_claims.c.entry_id == entry_id,
            launch_claims.c.claimed_by == found.claimed_by,
            launch_claims.c.submitted_at.is_(None),
        )
        .values(claimed_by=me, claimed_at=at)
    )
    return taken.rowcount == 1, found


def _insert_for(dialect: str) -> Any:
    from sqlalchemy.dialects import postgresql, sqlite

    return postgresql.insert if dialect == "postgresql" else sqlite.insert


def record_submitted(ledger: Ledger, entry_id: int, me: str, run_id: str) -> None:
    """Dagster accepted ``run_id`` for ``entry_id``'s claim held by ``me``."""
    with ledger.transaction() as conn:
        conn.execute(
            sa.update(launch_claims)
            .where(launch_claims.c.entry_id == entry_id, launch_claims.c.claimed_by == me)
            .values(run_id=run_id, submitted_at=to_db(ledger.clock(None), "now"))
        )


def run_catch_up(
    view: TaskView,
    steps: Sequence[CatchUpStep],
    *,
    ledger: Ledger,
    instance: dg.DagsterInstance,
    specs: Sequence[TaskSpec],
    operator: str,
    reason: str,
    operators: Operators,
    launcher: Launcher,
) -> list[CatchUpStep]:
    """Carry out ``steps`` (see the module docstring); returns them as done, each with its
    entry and run (a step that could not be done says why and becomes ``none``; a due whose
    launch another catch-up holds becomes ``held``)."""
    spec = view.spec
    me = process_identity()
    done: list[CatchUpStep] = []
    to_launch: list[tuple[int, CatchUpStep]] = []
    taken_over: dict[int, datetime] = {}  # index in done -> when the earlier claim was taken
    for step in steps:
        if step.action in (LAUNCH, RELAUNCH):
            # The entry, its launch claim and its audit record in one transaction: a
            # catch-up killed at any instant leaves all three or none, and of two catch-ups
            # of one due the database lets one hold its launch.
            with ledger.transaction() as conn:
                entry = ledger.ensure_entry(
                    task_key=spec.key,
                    trigger=Trigger.MANUAL,
                    dedup_key=Due(step.due).key,
                    due=step.due,
                    max_attempts=spec.max_attempts,
                    operator=operator,
                    reason=reason,
                    connection=conn,
                )
                ours = entry.trigger == Trigger.MANUAL and entry.status == Status.QUEUED
                held, found = (False, None)
                if ours and not entry.run_ids:
                    held, found = take_launch_claim(conn, entry.id, me, ledger.clock(None))
                if held and found is None and step.action == LAUNCH:
                    ledger.write_audit(
                        operator=operator,
                        action=ACTION_CATCH_UP,
                        entry_id=entry.id,
                        reason=reason,
                        checks={"task_key": spec.key, "due": format_due(step.due)},
                        outcome=f"launched: catch-up of {spec.key} due {format_due(step.due)}",
                        connection=conn,
                    )
            if not ours or entry.run_ids:
                note = f"got entry {entry.id} ({entry.status}) meanwhile: left alone"
                done.append(replace(step, action=LEAVE, entry_id=entry.id, note=note))
                continue
            if not held:
                note = found.words() if found is not None else "another catch-up holds it"
                done.append(replace(step, action=HELD, entry_id=entry.id, note=note))
                continue
            if found is not None:
                taken_over[len(done)] = found.claimed_at
            to_launch.append((len(done), replace(step, entry_id=entry.id)))
            done.append(replace(step, entry_id=entry.id))
        elif step.action == RETRY and step.entry_id is not None:
            done.append(
                _retry(step, ledger, instance, specs, operator, reason, operators, launcher)
            )
        else:
            done.append(step)
    if taken_over:
        # A claim taken over from a holder that can no longer submit: whatever it submitted
        # is in Dagster by now, so a due with a run there is not launched again.
        with_runs = run_dues(instance, spec.key, min(taken_over.values()) - timedelta(minutes=1))
        for index in taken_over:
            if done[index].due in with_runs:
                note = "its run was submitted by an earlier catch-up: left alone"
                done[index] = replace(done[index], action=LEAVE, note=note)
        to_launch = [(i, s) for i, s in to_launch if done[i].action != LEAVE]
    if to_launch:
        tag_sets = [catch_up_tags(spec, s.due, operator, reason) for _, s in to_launch]
        try:
            outcomes: list[str | LaunchFailed] = launch_runs(spec.job_name, tag_sets)
        except LaunchFailed as exc:
            outcomes = [exc] * len(to_launch)
        for (index, step), outcome in zip(to_launch, outcomes, strict=True):
            assert step.entry_id is not None
            if isinstance(outcome, LaunchFailed):
                ledger.record_dispatch_failure(step.entry_id, error=str(outcome))
                done[index] = replace(step, note=f"launch failed: {outcome}")
            else:
                record_submitted(ledger, step.entry_id, me, outcome)
                done[index] = replace(step, run_id=outcome)
    return done


def _retry(
    step: CatchUpStep,
    ledger: Ledger,
    instance: dg.DagsterInstance,
    specs: Sequence[TaskSpec],
    operator: str,
    reason: str,
    operators: Operators,
    launcher: Launcher,
) -> CatchUpStep:
    assert step.entry_id is not None
    try:
        # The retry rule is loaded only to retry: `dueledger dues` imports this module too.
        from orchestration.retry import retry_entry

        result = retry_entry(
            ledger,
            step.entry_id,
            specs=specs,
            operator=operator,
            reason=reason,
            operators=operators,
            acknowledge_side_effects=False,
            instance=instance,
            launcher=launcher,
        )
    except (Refused, InvalidInput, LaunchFailed) as exc:
        return replace(step, action=LEAVE, note=f"not retried: {exc}")
    return replace(step, run_id=result.run_id, note=f"retried as entry {result.record.child.id}")
