"""The ledger's side of a metrics scrape (resources/ledger/scrape_queries.py) on real SQLite and
PostgreSQL: each number against a ledger written through the ledger's own operations, and
each query's plan on the index migration 0006 made for it (a partial index is used only when
the query repeats its predicate word for word)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from orchestration.reclaim import reclaim_expired
from orchestration.services.hooks import vocabulary as hooks_model
from resources.core import metric_model as m
from resources.core.entry import (
    FailureKind,
    Status,
    Trigger,
    dedup_key_for_due,
    dedup_key_for_request,
)
from resources.ledger import RunLedger
from resources.ledger import schema as ledger_schema

TASK, OTHER = "order_cleanup", "ticket_auto_close"
DUE = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)
SLOT = timedelta(minutes=15)
TTL = timedelta(minutes=5)
NOW = DUE + 8 * SLOT


def scheduled(ledger: RunLedger, due: datetime, task: str = TASK, attempts: int = 1):
    return ledger.ensure_entry(
        task_key=task,
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(due),
        due=due,
        max_attempts=attempts,
        now=due,
    )


def build(ledger: RunLedger) -> dict[str, int]:
    """A small ledger with one of everything a scrape counts; returns the entry ids."""
    ids = {}
    # success, 90 s after its due
    ok = scheduled(ledger, DUE)
    ledger.claim(ok.id, "run-ok", lease_ttl=TTL, now=DUE + timedelta(seconds=30))
    ledger.succeed(ok.id, "run-ok", now=DUE + timedelta(seconds=90))
    ids["ok"] = ok.id
    # a duplicate run refused on it, and a failed hook recorded on it
    ledger.claim(ok.id, "run-dup", lease_ttl=TTL, now=DUE + timedelta(seconds=95))
    ledger.record_hook_result(ok.id, {"event": "task_before", "outcome": "error"})
    ledger.record_hook_result(ok.id, {"event": "task_after", "outcome": "allow"})
    # failed with an error
    bad = scheduled(ledger, DUE + SLOT)
    ledger.claim(bad.id, "run-bad", lease_ttl=TTL, now=DUE + SLOT + timedelta(seconds=10))
    ledger.fail(bad.id, "run-bad", error="boom", now=DUE + SLOT + timedelta(seconds=20))
    ids["bad"] = bad.id
    # reclaimed: claimed, lease expired, reclaimed
    lost = scheduled(ledger, DUE + 2 * SLOT)
    ledger.claim(lost.id, "run-lost", lease_ttl=TTL, now=DUE + 2 * SLOT)
    reclaim_expired(ledger, now=DUE + 2 * SLOT + 2 * TTL)
    ids["lost"] = lost.id
    # stale: running with an expired lease, not reclaimed yet
    stale = scheduled(ledger, DUE + 3 * SLOT)
    ledger.claim(stale.id, "run-stale", lease_ttl=TTL, now=DUE + 3 * SLOT)
    ids["stale"] = stale.id
    # waiting: two queued dues; the older one is the oldest waiting due
    for n in (5, 6):
        ids[f"queued{n}"] = scheduled(ledger, DUE + n * SLOT).id
    # a manual launch of another task, succeeded
    manual = ledger.ensure_entry(
        task_key=OTHER,
        trigger=Trigger.MANUAL,
        dedup_key=dedup_key_for_request("req-1"),
        operator="alice",
        reason="test",
        now=DUE,
    )
    ledger.claim(manual.id, "run-m", lease_ttl=TTL, now=DUE)
    ledger.succeed(manual.id, "run-m", now=DUE + timedelta(seconds=5))
    ids["manual"] = manual.id
    return ids


def test_each_scrape_number_is_what_the_ledger_recorded(ledger: RunLedger) -> None:
    ids = build(ledger)
    counts = ledger.entry_counts()
    assert counts[(TASK, Status.SUCCESS, "", Trigger.SCHEDULE)] == 1
    assert counts[(TASK, Status.FAILED, FailureKind.ERROR, Trigger.SCHEDULE)] == 1
    assert counts[(TASK, Status.FAILED, FailureKind.LEASE_RECLAIMED, Trigger.SCHEDULE)] == 1
    assert counts[(TASK, Status.RUNNING, "", Trigger.SCHEDULE)] == 1
    assert counts[(TASK, Status.QUEUED, "", Trigger.SCHEDULE)] == 2
    assert counts[(OTHER, Status.SUCCESS, "", Trigger.MANUAL)] == 1
    assert sum(counts.values()) == 7

    assert ledger.stale_lease_counts(now=NOW) == {TASK: 1}
    assert ledger.stale_lease_counts(now=DUE + 3 * SLOT + timedelta(seconds=1)) == {}
    assert ledger.refused_run_counts() == {TASK: 1}
    assert ledger.hook_failure_counts() == {"task_before": 1}
    assert ledger.last_success_times([TASK, OTHER, "nothing"]) == {
        TASK: DUE + timedelta(seconds=90),
        OTHER: DUE + timedelta(seconds=5),
    }
    assert ledger.last_dues([TASK, OTHER]) == {TASK: DUE + 6 * SLOT}
    assert ledger.oldest_waiting_dues() == {TASK: DUE + 5 * SLOT}
    assert ledger.skipped_counts() == {}  # no entry is `skipped` yet

    times = {(r.task_key, r.due): r for r in ledger.due_times_since(DUE - SLOT)}
    assert len(times) == 6  # the scheduled dues; the manual launch has none
    first = times[(TASK, DUE)]
    assert (first.started_at, first.finished_at, first.status) == (
        DUE + timedelta(seconds=30),
        DUE + timedelta(seconds=90),
        Status.SUCCESS,
    )
    assert times[(TASK, DUE + 5 * SLOT)].started_at is None
    assert ledger.due_times_since(NOW) == []
    assert ids["ok"] < ids["manual"]


def test_a_run_refused_before_it_had_an_entry_is_counted_as_summary_counts_it(
    ledger: RunLedger,
) -> None:
    # A launchpad run of a task that is not manually triggerable is refused before any entry
    # exists: summary's refused_24h counted it from its audit record, the metric did not.
    for task_key in ("log_archive", "log_archive", ""):
        ledger.write_audit(
            operator="dagster-ui",
            action="run_refused",
            entry_id=None,
            reason=None,
            checks={"run_id": "r", "task_key": task_key, "dedup_key": "manual:x"},
            outcome="refused: not manually triggerable",
        )
    ledger.write_audit(
        operator="bob", action="reclaim", entry_id=None, reason=None, checks={}, outcome="x"
    )
    assert ledger.refused_run_counts() == {"log_archive": 2}
    assert ledger.summary_counts(now=datetime.now(UTC))["refused_window"] == 3


def test_skipped_entries_are_counted_by_reason_word(ledger: RunLedger) -> None:
    # The test writes `skipped` entries itself, as the overlap and pause policies would.
    for n, why in enumerate(("overlap: entry 4 running", "paused by alice: maintenance")):
        entry = scheduled(ledger, DUE + n * SLOT)
        with ledger.transaction() as conn:
            conn.execute(
                sa.update(ledger_schema.entries)
                .where(ledger_schema.entries.c.id == entry.id)
                .values(status=m.STATUS_SKIPPED, error=why)
            )
    assert ledger.skipped_counts() == {(TASK, "overlap"): 1, (TASK, "paused"): 1}


def test_alert_deliveries_are_counted_by_channel_and_outcome(ledger: RunLedger) -> None:
    lease = timedelta(seconds=30)
    outcomes = {"a": None, "b": "down", "c": "down for good", "d": "never tried"}
    for subject, error in outcomes.items():
        (record,) = ledger.record_alert(
            channels=["webhook"], kind="lease_reclaimed", subject=subject, payload={}, now=DUE
        )
        if subject == "d":
            continue
        attempt = ledger.claim_alert_attempt(record.id, lease=lease, now=DUE)
        assert attempt is not None
        retry_at = DUE + SLOT if subject == "b" else None
        ledger.finish_alert_attempt(
            record.id, attempt=attempt.attempts, error=error, next_attempt_at=retry_at, now=DUE
        )
    assert ledger.delivery_counts() == {
        ("webhook", "delivered"): 1,
        ("webhook", "failed"): 1,
        ("webhook", m.DELIVERY_GIVEN_UP): 1,
        ("webhook", "pending"): 1,
    }


def _plan(ledger: RunLedger, statement: sa.Select) -> str:
    engine = ledger._get_engine()
    compiled = statement.compile(engine, compile_kwargs={"literal_binds": True})
    prefix = "EXPLAIN QUERY PLAN " if engine.dialect.name == "sqlite" else "EXPLAIN "
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            # A tiny table is read whole whatever its indexes: ask for the plan a big one gets.
            conn.execute(sa.text("SET enable_seqscan = off"))
        rows = conn.execute(sa.text(prefix + str(compiled))).all()
    return "\n".join(" ".join(str(c) for c in row) for row in rows)


def _plan_text(ledger: RunLedger, statement: str) -> str:
    engine = ledger._get_engine()
    prefix = "EXPLAIN QUERY PLAN " if engine.dialect.name == "sqlite" else "EXPLAIN "
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(sa.text("SET enable_seqscan = off"))
        rows = conn.exec_driver_sql(prefix + statement).all()
    return "\n".join(" ".join(str(c) for c in row) for row in rows)


def test_the_summary_predicates_are_those_of_the_partial_indexes(ledger: RunLedger) -> None:
    build(ledger)
    sqlite = ledger.dialect_name == "sqlite"
    for name, where in (
        ("ix_dueledger_entries_rejected", ledger_schema.SQLITE_REJECTED),
        ("ix_dueledger_entries_hook_failed", ledger_schema.SQLITE_HOOK_FAILED),
    ):
        if not sqlite:
            where = {
                ledger_schema.SQLITE_REJECTED: ledger_schema.PG_REJECTED,
                ledger_schema.SQLITE_HOOK_FAILED: ledger_schema.PG_HOOK_FAILED,
            }[where]
        query = sa.select(ledger_schema.entries.c.task_key).where(sa.text(where))
        assert name in _plan(ledger, query), f"{name} not used by a query on its predicate"
    # The statements the counts really send find their entries through the same indexes.
    engine = ledger._get_engine()
    sent: list[str] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        sent.append(statement)

    sa.event.listen(engine, "before_cursor_execute", capture)
    try:
        ledger.refused_run_counts()
        ledger.hook_failure_counts()
    finally:
        sa.event.remove(engine, "before_cursor_execute", capture)
    rejected, hooks = (s for s in sent if "json" in s.lower())
    assert "ix_dueledger_entries_rejected" in _plan_text(ledger, rejected)
    assert "ix_dueledger_entries_hook_failed" in _plan_text(ledger, hooks)
    counts = sa.select(
        ledger_schema.entries.c.task_key, ledger_schema.entries.c.status, sa.func.count()
    ).group_by(
        ledger_schema.entries.c.task_key,
        ledger_schema.entries.c.status,
        ledger_schema.entries.c.trigger,
        ledger_schema.entries.c.failure_kind,
    )
    assert "ix_dueledger_entries_task_status_trigger_kind" in _plan(ledger, counts)


def test_the_failed_hook_outcomes_are_the_hooks_own() -> None:
    failures = (hooks_model.OUTCOME_ERROR, hooks_model.OUTCOME_TIMEOUT, hooks_model.OUTCOME_INVALID)
    assert failures == m.HOOK_FAILURE_OUTCOMES
    assert set(failures) <= set(hooks_model.OUTCOMES)
    for outcome in failures:
        assert (
            f'\\"outcome\\":\\"{outcome}\\"'.replace("\\", "") in ledger_schema.SQLITE_HOOK_FAILED
        )
        assert f'"outcome": "{outcome}"' in ledger_schema.PG_HOOK_FAILED


def test_a_summary_that_is_not_json_is_still_written_on_sqlite(sqlite_url: str) -> None:
    # The partial indexes' predicates must never make a write fail.
    ledger = RunLedger(database_url=sqlite_url)
    ledger.migrate()
    entry = scheduled(ledger, DUE)
    with ledger.transaction() as conn:
        conn.execute(
            sa.text("UPDATE dueledger_entries SET summary = 'not json' WHERE id = :id"),
            {"id": entry.id},
        )
    assert ledger.refused_run_counts() == {} and ledger.hook_failure_counts() == {}
    ledger.dispose()
