"""`dueledger catch-up TASK --from --to [--only missed|failed]`: a range of dues, run once each.

The plan (:func:`plan_catch_up`) is one step per due the task's schedule produces in the
range (``resources/core/catchup.py`` decides each from the due's entry, its Dagster runs and
the task's pauses); ``--dry-run`` prints exactly it. :func:`run_catch_up` then

- for each missed due: creates its ``due:<due>`` entry (trigger ``manual``: the operator and
  reason on it, audited ``catch_up``) -- insert-or-ignore, so a due that got an entry
  meanwhile keeps it and launches nothing -- and launches all their runs through one
  ``launchMultipleRuns`` into the run queue. A catch-up run waits its turn under any overlap
  policy (Temporal's backfills override a schedule's Skip the same way);
- for each failed due: a manual retry, the rules of `dueledger runs retry` (a child entry,
  audited, a re-execution of its last run).

Running it again finds every due with an entry and does nothing; a crash between an entry and
its run is finished by running it again (``relaunch``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

import dagster as dg

from orchestration.services.launch import Launcher, LaunchFailed, launch_runs
from orchestration.services.retry import retry_entry
from orchestration.task_spec import TaskSpec, TaskView, task_run_tags
from orchestration.timetable import plan_dues
from resources.core import tags as t
from resources.core.catchup import (
    LAUNCH,
    LEAVE,
    RELAUNCH,
    RETRY,
    CatchUpStep,
    catch_up_step,
)
from resources.core.due import Due, format_due
from resources.core.entry import Status, Trigger
from resources.core.errors import InvalidInput, Refused
from resources.core.operators import Operators
from resources.ledger import Ledger

#: The audit action of each due a catch-up launches.
ACTION_CATCH_UP: Final = "catch_up"


def plan_catch_up(
    view: TaskView,
    ledger: Ledger,
    instance: dg.DagsterInstance,
    start: datetime,
    end: datetime,
    only: str | None,
) -> list[CatchUpStep]:
    """One step per due of ``view`` in ``[start, end)``, oldest first."""
    key = view.spec.key
    dues = plan_dues(view.plan, view.slot_minutes, start, end)
    entries = ledger.due_entries(key, start, end)
    records = instance.get_run_records(
        filters=dg.RunsFilter(tags={t.TAG_TASK: key}, created_after=start)
    )
    with_runs = {r.dagster_run.tags.get(t.TAG_DUE) for r in records}
    pauses = ledger.pauses(key)
    steps = []
    for due in dues:
        pause = next((p for p in pauses if p.covers(due)), None)
        steps.append(
            catch_up_step(
                due,
                entries.get(due),
                has_run=format_due(due) in with_runs,
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
            entry = ledger.ensure_entry(
                task_key=spec.key,
                trigger=Trigger.MANUAL,
                dedup_key=Due(step.due).key,
                due=step.due,
                max_attempts=spec.max_attempts,
                operator=operator,
                reason=reason,
            )
            ours = entry.trigger == Trigger.MANUAL and entry.status == Status.QUEUED
            if not ours or entry.run_ids:
                note = f"got entry {entry.id} ({entry.status}) meanwhile: left alone"
                done.append(replace(step, action=LEAVE, entry_id=entry.id, note=note))
                continue
            if step.action == LAUNCH:
                ledger.write_audit(
                    operator=operator,
                    action=ACTION_CATCH_UP,
                    entry_id=entry.id,
                    reason=reason,
                    checks={"task_key": spec.key, "due": format_due(step.due)},
                    outcome=f"launched: catch-up of {spec.key} due {format_due(step.due)}",
                )
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
