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

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from orchestration.pause import pause_at, task_pauses
from orchestration.retry import retry_entry
from orchestration.services.launch import Launcher, LaunchFailed, launch_runs
from orchestration.task_spec import TaskSpec, TaskView, task_run_tags
from orchestration.timetable import plan_dues
from resources.core import tags as t
from resources.core.due import Due, format_due
from resources.core.entry import Entry, FailureKind, Status, Trigger
from resources.core.errors import InvalidInput, Refused
from resources.core.operators import Operators
from resources.ledger import Ledger

if TYPE_CHECKING:
    import dagster as dg

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
) -> CatchUpStep:
    """The step for one due: ``entry`` its ledger entry (None: none), ``has_run`` a Dagster run
    names it, ``pause_reason`` a pause covers it (None: none)."""
    missed_too = only in (None, ONLY_MISSED)
    failed_too = only in (None, ONLY_FAILED)
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
) -> list[CatchUpStep]:
    """One step per due of ``view`` in ``[start, end)``, oldest first. ``with_runs``: the dues
    Dagster has a run of (``dagster_runs.run_dues``, read by the caller)."""
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
            "unchanged": sum(1 for s in self.steps if s.action == LEAVE),
        }


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
    entry and run (a step that could not be done says why and becomes ``none``)."""
    spec = view.spec
    done: list[CatchUpStep] = []
    to_launch: list[tuple[int, CatchUpStep]] = []
    for step in steps:
        if step.action in (LAUNCH, RELAUNCH):
            # The entry and its audit record in one transaction: a catch-up killed at any
            # instant leaves both or neither.
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
                if ours and not entry.run_ids and step.action == LAUNCH:
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
            to_launch.append((len(done), replace(step, entry_id=entry.id)))
            done.append(replace(step, entry_id=entry.id))
        elif step.action == RETRY and step.entry_id is not None:
            done.append(
                _retry(step, ledger, instance, specs, operator, reason, operators, launcher)
            )
        else:
            done.append(step)
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
