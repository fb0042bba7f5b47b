"""Range catch-up (`dueledger catch-up`), pure: what to do about each due of a range.

Like Airflow 3's backfill with a reprocess behaviour, for a task without partitions: every due
the task's schedule produces in ``[--from, --to)`` gets at most one ``due:<due>`` entry, never
a second. ``--only missed`` launches the dues with no entry (and no Dagster run) that no pause
covers; ``--only failed`` retries the ``failed`` ones as audited manual-retry children; without
``--only``, both. Everything else -- a due that succeeded, runs, was skipped, or is paused --
is listed and left alone. A range is refused when it holds more than :data:`MAX_CATCH_UP_DUES`
dues or reaches further back than :data:`CATCH_UP_RETENTION`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from resources.core.due import format_due
from resources.core.entry import Entry, FailureKind, Status, Trigger

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
