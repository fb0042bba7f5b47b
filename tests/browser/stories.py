"""What a person clicks in the Dagster UI, as stories the stage runs side by side (stage.py).

Each story clicks with its own page, yields a `Wait` whenever Dagster has work to do, and
returns what the test that owns it asserts on (run ids, backfills, snapshots taken between
clicks). The tests (``test_browser_*.py``) finish their story and check the ledger through
the CLI; they also look at pages themselves where the check is what a person sees.

Which task each story uses, and why:
- order_cleanup (launchpad, Catalog, re-execute a success): every-slot task, cheap run.
- ticket_auto_close (re-execute a failed run): the only reader of ``tickets``, scheduled once
  a day (00:00 UTC), so renaming that table away fails no scheduled run.
- log_archive (a launchpad run refused): declared not manually triggerable.
- billing_maintenance (backfill): the daily-partitioned task with outbox notices.
- ledger_health (the page a person reads): materialized from the Catalog after a run of
  ticket_auto_close's latest due (daily, so that due stays the latest one while the suite
  runs), launched with the tags its schedule gives it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from browser_support import (
    DevServer,
    launch_backfill_from_asset_page,
    launch_from_job_launchpad,
    launch_scheduled_run,
    materialize_from_catalog,
    reexecute,
)
from playwright.sync_api import Page
from stage import Stage, Story, Wait

ORDER_TASK = "order_cleanup"
FAILING_TASK = "ticket_auto_close"
LOCKED_TASK = "log_archive"
BACKFILL_TASK = "billing_maintenance"
#: Three whole past UTC days: each partition computes as of the end of its day.
BACKFILL_DAYS = [(datetime.now(UTC).date() - timedelta(days=n)).isoformat() for n in (3, 2, 1)]
TICKETS, TICKETS_HIDDEN = "tickets", "tickets_hidden_by_browser_test"

StoryRun = Generator[Wait, Any, dict[str, Any]]


def launchpad(stage: Stage, page: Page) -> StoryRun:
    """(a) Jobs → order_cleanup_job → Materialize ▾ → Open launchpad → launch."""
    run_id = launch_from_job_launchpad(page, stage.server, f"{ORDER_TASK}_job")
    run = yield stage.server.run_ended(run_id)
    return {"run_id": run_id, "status": run["status"]}


def catalog(stage: Stage, page: Page) -> StoryRun:
    """(b) Catalog → order_cleanup → Materialize."""
    run_id = materialize_from_catalog(page, stage.server, ORDER_TASK)
    run = yield stage.server.run_ended(run_id)
    return {"run_id": run_id, "status": run["status"]}


def automation_log(server: DevServer, task: str) -> dict[int, str]:
    """automation_log rows of TASK: id -> entry key (``<entry id>:<dedup key>``)."""
    with server.source() as conn:
        rows = conn.execute(
            "SELECT id, entry_key FROM automation_log WHERE task_key = ?", (task,)
        ).fetchall()
    return {int(r["id"]): str(r["entry_key"]) for r in rows}


def reexecute_success(stage: Stage, page: Page) -> StoryRun:
    """(e) The successful run of (a) → "Re-execute all"."""
    launched = yield stage.result_of("launchpad")
    parent_run = launched["run_id"]
    log_before = automation_log(stage.server, ORDER_TASK)
    run_id = reexecute(page, stage.server, parent_run, how="all")
    run = yield stage.server.run_ended(run_id)
    return {
        "parent_run": parent_run,
        "run_id": run_id,
        "status": run["status"],
        "log_before": log_before,
    }


@contextlib.contextmanager
def tickets_table_missing(server: DevServer) -> Iterator[None]:
    """The source store without its ``tickets`` table (renamed away), restored afterwards."""
    with server.source() as conn:
        conn.execute(f"ALTER TABLE {TICKETS} RENAME TO {TICKETS_HIDDEN}")
        conn.commit()
    try:
        yield
    finally:
        with server.source() as conn:
            conn.execute(f"ALTER TABLE {TICKETS_HIDDEN} RENAME TO {TICKETS}")
            conn.commit()


def reexecute_failed(stage: Stage, page: Page) -> StoryRun:
    """(d) A failed run of ticket_auto_close, re-executed from failure, then again (all)."""
    server = stage.server
    with tickets_table_missing(server):
        first_run = launch_from_job_launchpad(page, server, f"{FAILING_TASK}_job")
        first = yield server.run_ended(first_run)
        if first["status"] != "FAILURE":
            return {"first_run": first_run, "first_status": first["status"]}
    # As soon as the run is red -- no waiting for a sensor: a launchpad run carries
    # no dagster/max_retries, Dagster will not retry it, so its entry is already failed.
    entry = server.entries_now(FAILING_TASK, f"manual:{first_run}")
    failed_run = first_run
    retry_run = reexecute(page, server, failed_run, how="from_failure")
    retry = yield server.run_ended(retry_run)
    refused_run = reexecute(page, server, failed_run, how="all")
    refused = yield server.run_ended(refused_run)
    return {
        "first_run": first_run,
        "first_status": first["status"],
        "parent_status_when_red": entry["status"],
        "parent_id": entry["id"],
        "failed_run": failed_run,
        "retry_run": retry_run,
        "retry_status": retry["status"],
        "refused_run": refused_run,
        "refused_status": refused["status"],
    }


def launchpad_locked(stage: Stage, page: Page) -> StoryRun:
    """Jobs → log_archive_job → Materialize ▾ → Open launchpad → launch: a task that is not
    manually triggerable; the run page the person is taken to is the one they read."""
    run_id = launch_from_job_launchpad(page, stage.server, f"{LOCKED_TASK}_job")
    run = yield stage.server.run_ended(run_id)
    return {"run_id": run_id, "status": run["status"]}


def outbox(server: DevServer) -> list[dict[str, Any]]:
    with server.source() as conn:
        return [dict(r) for r in conn.execute("SELECT * FROM notification_outbox ORDER BY id")]


def backfill_twice(stage: Stage, page: Page) -> StoryRun:
    """(c) billing_maintenance → Materialize → three days → Launch backfill; then again."""
    server = stage.server
    first_id = launch_backfill_from_asset_page(page, server, BACKFILL_TASK, BACKFILL_DAYS)
    first = yield server.backfill_ended(first_id, len(BACKFILL_DAYS))
    after_first = outbox(server)
    second_id = launch_backfill_from_asset_page(page, server, BACKFILL_TASK, BACKFILL_DAYS)
    second = yield server.backfill_ended(second_id, len(BACKFILL_DAYS))
    return {"first": first, "second": second, "outbox_after_first": after_first}


def ledger_health_page(stage: Stage, page: Page) -> StoryRun:
    """A run of ticket_auto_close's latest due as its schedule would launch it, then Catalog →
    ledger_health → Materialize: the materialization whose page the test reads."""
    server = stage.server
    due = latest_daily_due()
    due_run = launch_scheduled_run(server, FAILING_TASK, due)
    ended = yield server.run_ended(due_run)
    health_run = materialize_from_catalog(page, server, "ledger_health")
    health = yield server.run_ended(health_run)
    return {
        "due": due,
        "due_run": due_run,
        "due_status": ended["status"],
        "health_run": health_run,
        "health_status": health["status"],
    }


def latest_daily_due() -> str:
    """ticket_auto_close's latest due whose slot is over: today's 00:00 UTC (yesterday's
    during the first slot of the day)."""
    now = datetime.now(UTC)
    day = now.date() if now.hour or now.minute >= 15 else now.date() - timedelta(days=1)
    return f"{day.isoformat()}T00:00:00Z"


#: Stories whose tests go last, longest last (their runs take longest; see conftest).
LONGEST_LAST = ["reexecute_failed", "backfill_twice"]

#: Every story, in the order the stage starts them: longest chain of runs first.
STORIES: dict[str, Story] = {
    "backfill_twice": backfill_twice,
    "reexecute_failed": reexecute_failed,
    "launchpad": launchpad,
    "catalog": catalog,
    "reexecute_success": reexecute_success,
    "ledger_health_page": ledger_health_page,
    "launchpad_locked": launchpad_locked,
}
