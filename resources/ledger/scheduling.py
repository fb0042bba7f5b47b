"""Each task's schedule as the scheduler ran it, and the task's pauses (migration 0005).

The outcome sensor mirrors Dagster's schedule state here (``observe_schedule``), so the
ledger alone -- without loading Dagster -- knows since when a task's schedule has run and when
it was stopped; ``dueledger pause``/``resume`` write pauses too. Pauses are closed
(``resumed_at``), never deleted: what was paused, by whom and why stays answerable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Final

import sqlalchemy as sa

from resources.core.arguments import require_text
from resources.core.dues import Pause
from resources.core.operators import UI_OPERATOR
from resources.ledger.model import from_db, to_db
from resources.ledger.schema import pauses, schedules
from resources.ledger.store import LedgerStore

SCHEDULE_RUNNING: Final = "running"
SCHEDULE_STOPPED: Final = "stopped"
#: Where a pause comes from: the Dagster UI's schedule toggle, `dueledger pause`, or the task
#: pausing itself after consecutive failures (``pause_after_failures``).
PAUSE_SCHEDULE_STOPPED: Final = "schedule_stopped"
PAUSE_CLI: Final = "cli"
PAUSE_AFTER_FAILURES: Final = "pause_after_failures"
PAUSE_SOURCES: Final = (PAUSE_SCHEDULE_STOPPED, PAUSE_CLI, PAUSE_AFTER_FAILURES)


@dataclass(frozen=True)
class ScheduleState:
    """A task's schedule as last observed."""

    task_key: str
    schedule_name: str
    status: str
    first_started_at: datetime | None
    started_at: datetime | None
    observed_at: datetime


class LedgerScheduling(LedgerStore):
    """Schedule states and pauses of :class:`RunLedger`."""

    def schedule_states(self) -> dict[str, ScheduleState]:
        """Every task's observed schedule, by task key."""
        with self._connect("autocommit") as conn:
            rows = conn.execute(sa.select(schedules)).mappings()
            return {
                r["task_key"]: ScheduleState(
                    r["task_key"],
                    r["schedule_name"],
                    r["status"],
                    from_db(r["first_started_at"]),
                    from_db(r["started_at"]),
                    from_db(r["observed_at"]) or datetime.min,
                )
                for r in rows
            }

    def observe_schedule(
        self,
        task_key: str,
        schedule_name: str,
        *,
        running: bool,
        started_at: datetime | None,
        now: datetime | None = None,
    ) -> list[str]:
        """Record the schedule of ``task_key`` as Dagster reports it now; returns what changed,
        in words (empty: nothing). A schedule seen stopped opens a pause (source
        ``schedule_stopped``, by ``dagster-ui``); seen running again, the pause closes. A start
        later than the one recorded means it was stopped and started again unseen: that gap
        is recorded as a closed pause. ``first_started_at`` keeps the earliest start."""
        require_text(task_key, "task_key")
        at = self._now(now)
        status = SCHEDULE_RUNNING if running else SCHEDULE_STOPPED
        changes: list[str] = []
        with self._connect("write") as conn:
            row = (
                conn.execute(sa.select(schedules).where(schedules.c.task_key == task_key))
                .mappings()
                .first()
            )
            previous_start = from_db(row["started_at"]) if row else None
            first = from_db(row["first_started_at"]) if row else None
            if started_at is not None and (first is None or started_at < first):
                first = started_at
            values = {
                "schedule_name": schedule_name,
                "status": status,
                "first_started_at": to_db(first, "first_started_at"),
                "started_at": to_db(started_at if running else previous_start, "started_at"),
                "observed_at": to_db(at, "now"),
            }
            if row is None:
                conn.execute(sa.insert(schedules).values(task_key=task_key, **values))
                changes.append(f"schedule {schedule_name} first seen {status}")
            else:
                conn.execute(
                    sa.update(schedules).where(schedules.c.task_key == task_key).values(**values)
                )
            open_pause = self._open_pause(conn, task_key, PAUSE_SCHEDULE_STOPPED)
            if not running and open_pause is None:
                self._insert_pause(
                    conn,
                    task_key,
                    at,
                    UI_OPERATOR,
                    f"schedule {schedule_name} stopped in Dagster",
                    PAUSE_SCHEDULE_STOPPED,
                )
                changes.append(f"schedule {schedule_name} stopped: paused")
            elif running and open_pause is not None:
                self._close_pause(conn, open_pause, at, UI_OPERATOR, "schedule started again")
                changes.append(f"schedule {schedule_name} running again: resumed")
            elif (
                running
                and row is not None
                and previous_start is not None
                and started_at is not None
                and started_at > previous_start
                and row["status"] == SCHEDULE_RUNNING
            ):
                # Stopped and started again between two observations: the gap was a pause.
                self._insert_pause(
                    conn,
                    task_key,
                    from_db(row["observed_at"]) or at,
                    UI_OPERATOR,
                    f"schedule {schedule_name} stopped and started again (restarted at "
                    f"{started_at:%Y-%m-%dT%H:%M:%SZ})",
                    PAUSE_SCHEDULE_STOPPED,
                    resumed=(started_at, UI_OPERATOR, "schedule started again"),
                )
                changes.append(f"schedule {schedule_name} restarted: the gap is a pause")
        return changes

    def touch_schedules(self, task_keys: Sequence[str], *, now: datetime | None = None) -> None:
        """Stamp the schedules of ``task_keys`` as seen unchanged at ``now`` (one statement):
        a later restart is then dated from the last time they were seen running."""
        if not task_keys:
            return
        with self._connect("write") as conn:
            conn.execute(
                sa.update(schedules)
                .where(schedules.c.task_key.in_(list(task_keys)))
                .values(observed_at=to_db(self._now(now), "now"))
            )

    def pause_task(
        self, task_key: str, *, by: str, reason: str, source: str, now: datetime | None = None
    ) -> Pause | None:
        """Open a pause of ``task_key`` from ``source``; None when one from that source is open
        already (at most one: a unique index over the open pauses, migration 0007)."""
        require_text(task_key, "task_key")
        require_text(by, "by")
        require_text(reason, "reason")
        if source not in PAUSE_SOURCES:
            raise ValueError(f"pause source {source!r} is not one of {', '.join(PAUSE_SOURCES)}")
        at = self._now(now)
        try:
            with self._connect("write") as conn:
                if self._open_pause(conn, task_key, source) is not None:
                    return None
                pause_id = self._insert_pause(conn, task_key, at, by, reason, source)
        except sa.exc.IntegrityError:
            return None  # another process opened it between our read and our insert
        return Pause(at, None, by, reason, source, id=pause_id, task_key=task_key)

    def resume_task(
        self,
        task_key: str,
        *,
        by: str,
        reason: str,
        sources: Sequence[str],
        now: datetime | None = None,
    ) -> list[Pause]:
        """Close the open pauses of ``task_key`` from ``sources``; returns them, closed."""
        require_text(by, "by")
        require_text(reason, "reason")
        at = self._now(now)
        closed: list[Pause] = []
        with self._connect("write") as conn:
            for pause in self._open_pauses(conn, task_key):
                if pause.source in sources and pause.id is not None:
                    self._close_pause(conn, pause.id, at, by, reason)
                    closed.append(replace(pause, end=at))
        return closed

    def open_pauses(self, task_key: str | None = None) -> list[Pause]:
        """The pauses not resumed yet, of ``task_key`` (every task's when None), oldest first."""
        with self._connect("autocommit") as conn:
            return self._open_pauses(conn, task_key)

    def pauses(self, task_key: str | None = None) -> list[Pause]:
        """The pauses of ``task_key`` (every task's when None), oldest first."""
        query = sa.select(pauses).order_by(pauses.c.paused_at, pauses.c.id)
        if task_key is not None:
            query = query.where(pauses.c.task_key == task_key)
        with self._connect("autocommit") as conn:
            return [_pause(r) for r in conn.execute(query).mappings()]

    def pauses_by_task(self) -> dict[str, tuple[Pause, ...]]:
        """Every task's pauses, oldest first."""
        by_task: dict[str, list[Pause]] = {}
        query = sa.select(pauses).order_by(pauses.c.paused_at, pauses.c.id)
        with self._connect("autocommit") as conn:
            for r in conn.execute(query).mappings():
                by_task.setdefault(r["task_key"], []).append(_pause(r))
        return {k: tuple(v) for k, v in by_task.items()}

    # --- helpers on the caller's transaction -----------------------------------------------

    def _open_pause(self, conn: sa.Connection, task_key: str, source: str) -> int | None:
        found = conn.execute(
            sa.select(pauses.c.id)
            .where(
                pauses.c.task_key == task_key,
                pauses.c.source == source,
                pauses.c.resumed_at.is_(None),
            )
            .order_by(pauses.c.id.desc())
            .limit(1)
        ).scalar()
        return int(found) if found is not None else None

    def _open_pauses(self, conn: sa.Connection, task_key: str | None) -> list[Pause]:
        query = (
            sa.select(pauses)
            .where(pauses.c.resumed_at.is_(None))
            .order_by(pauses.c.paused_at, pauses.c.id)
        )
        if task_key is not None:
            query = query.where(pauses.c.task_key == task_key)
        return [_pause(r) for r in conn.execute(query).mappings()]

    def _insert_pause(
        self,
        conn: sa.Connection,
        task_key: str,
        at: datetime,
        by: str,
        reason: str,
        source: str,
        *,
        resumed: tuple[datetime, str, str] | None = None,
    ) -> int:
        # A pause seen only once over (a stop and restart between two observations) is
        # inserted closed (``resumed``: when, by whom, why), never meeting the unique index
        # over open pauses.
        end, resumed_by, resume_reason = resumed if resumed else (None, None, None)
        result = conn.execute(
            sa.insert(pauses)
            .values(
                task_key=task_key,
                source=source,
                paused_at=to_db(at, "paused_at"),
                paused_by=by,
                reason=reason,
                resumed_at=to_db(end, "resumed_at") if end else None,
                resumed_by=resumed_by,
                resume_reason=resume_reason,
            )
            .returning(pauses.c.id)
        )
        return int(result.scalar_one())

    def _close_pause(
        self, conn: sa.Connection, pause_id: int, at: datetime, by: str, reason: str
    ) -> None:
        conn.execute(
            sa.update(pauses)
            .where(pauses.c.id == pause_id, pauses.c.resumed_at.is_(None))
            .values(resumed_at=to_db(at, "resumed_at"), resumed_by=by, resume_reason=reason)
        )


def _pause(row: sa.RowMapping) -> Pause:
    start = from_db(row["paused_at"])
    assert start is not None  # NOT NULL
    return Pause(
        start=start,
        end=from_db(row["resumed_at"]),
        by=row["paused_by"],
        reason=row["reason"],
        source=row["source"],
        id=int(row["id"]),
        task_key=row["task_key"],
    )
