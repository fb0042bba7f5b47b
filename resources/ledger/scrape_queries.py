"""The ledger's side of a Prometheus scrape: each number one indexed query (migration 0006).

Read-only, one autocommit connection per call. What the numbers mean, and which metric each
feeds, is in ``resources/core/metric_model.py``; ``orchestration/services/metrics.py`` puts them
together at scrape time. Cost on 1,000,000 entries: bench/metrics_scrape.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Final, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from resources.core import metric_model as m
from resources.core.alerting import DELIVERY_FAILED
from resources.core.due import parse_due
from resources.core.entry import ACTION_RUN_REFUSED, Origin, Status
from resources.ledger.model import from_db, to_db
from resources.ledger.schema import (
    PG_HOOK_FAILED,
    PG_REJECTED,
    SQLITE_HOOK_FAILED,
    SQLITE_REJECTED,
    alert_deliveries,
    audit,
    entries,
)
from resources.ledger.store import LedgerStore

#: Statuses of an entry that waits to (re)run: its due is late while it waits.
WAITING_STATUSES: Final = (
    Status.QUEUED,
    Status.RETRYING,
    Status.DISPATCH_FAILED,
)
#: Characters of a skipped entry's reason read (the reason word comes first).
_REASON_CHARS: Final = 64


class DueTimes(NamedTuple):
    """One scheduled due's entry: when it was due, when its latest attempt started, when it
    finished (None while not), and its status."""

    task_key: str
    due: datetime
    started_at: datetime | None
    finished_at: datetime | None
    status: str


class LedgerMetricsQueries(LedgerStore):
    """The queries of a metrics scrape (see the module docstring)."""

    def entry_counts(self) -> dict[tuple[str, str, str, str], int]:
        """Entries by ``(task, status, failure kind or "", trigger)``: one GROUP BY over the
        covering index ``(task_key, status, trigger, failure_kind)``."""
        c = entries.c
        query = sa.select(
            c.task_key, c.status, c.failure_kind, c.trigger, sa.func.count().label("n")
        ).group_by(c.task_key, c.status, c.trigger, c.failure_kind)
        with self.connect("autocommit") as conn:
            return {
                (r.task_key, r.status, r.failure_kind or "", r.trigger): int(r.n)
                for r in conn.execute(query)
            }

    def stale_lease_counts(self, *, now: datetime | None = None) -> dict[str, int]:
        """Running entries whose lease expired before ``now``, by task."""
        c = entries.c
        stamp = to_db(self.clock(now), "now")
        query = (
            sa.select(c.task_key, sa.func.count().label("n"))
            .where(c.status == Status.RUNNING, c.lease_expires_at < stamp)
            .group_by(c.task_key)
        )
        with self.connect("autocommit") as conn:
            return {r.task_key: int(r.n) for r in conn.execute(query)}

    def last_success_times(self, task_keys: Iterable[str]) -> dict[str, datetime]:
        """When each task's newest successful entry finished (tasks with none left out): one
        index seek per task on ``(task_key, status, finished_at)``."""
        c = entries.c
        query = sa.select(sa.func.max(c.finished_at)).where(
            c.task_key == sa.bindparam("task"),
            c.status == Status.SUCCESS,
            c.finished_at.is_not(None),
        )
        found: dict[str, datetime] = {}
        with self.connect("autocommit") as conn:
            for key in task_keys:
                value = from_db(conn.execute(query, {"task": key}).scalar())
                if value is not None:
                    found[key] = value
        return found

    def last_dues(self, task_keys: Iterable[str]) -> dict[str, datetime]:
        """Each task's newest due with an entry: the greatest ``due:`` dedup key, read from
        the unique index (the key's text sorts as its time does)."""
        c = entries.c
        query = sa.select(sa.func.max(c.dedup_key)).where(
            c.task_key == sa.bindparam("task"), c.origin == Origin.DUE
        )
        found: dict[str, datetime] = {}
        with self.connect("autocommit") as conn:
            for key in task_keys:
                dedup = conn.execute(query, {"task": key}).scalar()
                if dedup:
                    found[key] = parse_due(str(dedup).split(":", 1)[1])
        return found

    def oldest_waiting_dues(self) -> dict[str, datetime]:
        """Each task's oldest scheduled due whose entry waits to run (queued, retrying,
        dispatch_failed): read through the status index, few rows, aggregated here (with a
        GROUP BY or an origin filter SQLite prefers the unique index: every entry read)."""
        c = entries.c
        query = sa.select(c.task_key, c.origin, c.due).where(c.status.in_(WAITING_STATUSES))
        found: dict[str, datetime] = {}
        with self.connect("autocommit") as conn:
            for r in conn.execute(query):
                due = from_db(r.due)
                if r.origin != Origin.DUE or due is None:
                    continue
                if r.task_key not in found or due < found[r.task_key]:
                    found[r.task_key] = due
        return found

    def due_times_since(self, since: datetime) -> list[DueTimes]:
        """The scheduled dues (origin ``due``) whose entries were created since ``since``: an
        index range on ``created_at``."""
        c = entries.c
        query = sa.select(c.task_key, c.due, c.started_at, c.finished_at, c.status).where(
            c.created_at >= to_db(since, "since"), c.origin == Origin.DUE, c.due.is_not(None)
        )
        with self.connect("autocommit") as conn:
            rows = conn.execute(query).all()
        out = []
        for r in rows:
            due = from_db(r.due)
            assert due is not None  # filtered above
            out.append(
                DueTimes(r.task_key, due, from_db(r.started_at), from_db(r.finished_at), r.status)
            )
        return out

    def skipped_counts(self) -> dict[tuple[str, str], int]:
        """Skipped entries by ``(task, reason word)`` (``resources.core.metrics.skip_reason``).
        The reason is the entry's error text, else its recorded reason."""
        c = entries.c
        text = sa.func.substr(sa.func.coalesce(c.error, c.reason), 1, _REASON_CHARS)
        query = (
            sa.select(c.task_key, c.failure_kind, text.label("why"), sa.func.count().label("n"))
            .where(c.status == m.STATUS_SKIPPED)
            .group_by(c.task_key, c.failure_kind, text)
        )
        found: Counter[tuple[str, str]] = Counter()
        with self.connect("autocommit") as conn:
            for r in conn.execute(query):
                found[(r.task_key, m.skip_reason(r.failure_kind, r.why))] += int(r.n)
        return dict(found)

    def refused_run_counts(self) -> dict[str, int]:
        """Refused runs, by task: those recorded in entries' ``late_job_rejections`` (only
        entries with rejections are read, partial index ``ix_dueledger_entries_rejected``,
        their lists counted in SQL), and those refused before they had an entry (a launchpad
        run of a task that is not manually triggerable), which only their ``run_refused``
        audit record names (read through ``ix_dueledger_audit_entry``, entry NULL). So a
        refusal `dueledger summary` counts in ``refused_24h`` is counted here too."""
        rows = self._json_items(
            "late_job_rejections",
            "action",
            m.REFUSED_RUN_ACTIONS,
            "task_key",
            (SQLITE_REJECTED, PG_REJECTED),
        )
        found: Counter[str] = Counter({str(key): n for key, n in rows})
        query = sa.select(audit.c.checks).where(
            audit.c.entry_id.is_(None), audit.c.action == ACTION_RUN_REFUSED
        )
        with self.connect("autocommit") as conn:
            for (checks,) in conn.execute(query):
                task = checks.get("task_key") if isinstance(checks, dict) else None
                if isinstance(task, str) and task:
                    found[task] += 1
        return dict(found)

    def hook_failure_counts(self) -> dict[str, int]:
        """Failed listener calls recorded in entries' ``hooks`` outcomes, by event: only
        entries with a failure are read (partial index ``ix_dueledger_entries_hook_failed``),
        and their lists are counted in SQL."""
        rows = self._json_items(
            "hooks",
            "outcome",
            m.HOOK_FAILURE_OUTCOMES,
            "event",
            (SQLITE_HOOK_FAILED, PG_HOOK_FAILED),
        )
        return {str(key or "unknown"): n for key, n in rows}

    def delivery_counts(self) -> dict[tuple[str, str], int]:
        """Alert deliveries by ``(channel, status)``: ``delivered``, ``given_up`` (failed with
        no attempt left), ``failed`` (a retry will come), ``pending``."""
        d = alert_deliveries.c
        query = sa.select(
            d.channel, d.status, (d.next_attempt_at.is_(None)).label("final"), sa.func.count()
        ).group_by(d.channel, d.status, d.next_attempt_at.is_(None))
        found: Counter[tuple[str, str]] = Counter()
        with self.connect("autocommit") as conn:
            for channel, status, final, n in conn.execute(query):
                gave_up = status == DELIVERY_FAILED and bool(final)
                found[(channel, m.DELIVERY_GIVEN_UP if gave_up else status)] += int(n)
        return dict(found)

    def _json_items(
        self,
        summary_list: str,
        field: str,
        values: Sequence[str],
        group: str,
        predicates: tuple[str, str],
    ) -> list[tuple[Any, int]]:
        """Items of the entries' ``summary[summary_list]`` whose ``field`` is one of
        ``values``, counted by ``group`` (``task_key``, or a field of the item). Only the
        entries a partial index's predicate selects are read; a list that is not a list (or
        a summary that is not JSON) counts nothing and never raises. The names are this
        module's constants, never input: they are written into the SQL."""
        marks = ", ".join(f"'{v}'" for v in values)
        with self.connect("autocommit") as conn:
            if _dialect(conn) == "sqlite":
                key = "e.task_key" if group == "task_key" else f"json_extract(i.value, '$.{group}')"
                sql = (
                    f"SELECT {key} AS k, count(*) AS n FROM dueledger_entries AS e, json_each("
                    f"CASE WHEN json_valid(e.summary) THEN e.summary ELSE '{{}}' END, "
                    f"'$.{summary_list}') AS i WHERE ({predicates[0]}) AND i.type = 'object' "
                    f"AND json_extract(i.value, '$.{field}') IN ({marks}) GROUP BY k"
                )
            else:
                items = f"e.summary -> '{summary_list}'"
                key = "e.task_key" if group == "task_key" else f"i ->> '{group}'"
                sql = (
                    f"SELECT {key} AS k, count(*) AS n FROM dueledger_entries AS e CROSS JOIN "
                    f"LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof({items}) = 'array' "
                    f"THEN {items} ELSE '[]'::jsonb END) AS i WHERE ({predicates[1]}) "
                    f"AND i ->> '{field}' IN ({marks}) GROUP BY k"
                )
            return [(r.k, int(r.n)) for r in conn.execute(sa.text(sql))]


def _dialect(conn: Connection) -> str:
    return conn.dialect.name
