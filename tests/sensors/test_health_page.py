"""``ledger_health``'s first table (orchestration/services/health_page.py) and what the
``latest_due_accounted_for`` check says to run next (orchestration/services/accounting.py), on
a real SQLite ledger: one row per task with its latest due, status, lag and the Runs-page
link of its entry; the next command fits the state."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from sensor_support import fixture_module

from orchestration.reclaim import reclaim_expired
from orchestration.services import accounting as acc
from orchestration.services.health_page import (
    latest_due_lines,
    latest_due_rows,
    latest_dues_metadata,
)
from resources.core import tags as t
from resources.core.entry import Trigger, dedup_key_for_due
from resources.ledger import RunLedger


@pytest.fixture
def ledger_url(sqlite_url: str) -> str:
    """This module's ledger is SQLite only."""
    return sqlite_url


SLOT = timedelta(minutes=15)
NOW = datetime(2026, 11, 30, 23, 5, tzinfo=UTC)  # the latest finished slot's due: 22:45
LATEST = datetime(2026, 11, 30, 22, 45, tzinfo=UTC)
TTL = timedelta(minutes=5)


def views():
    module = fixture_module()
    return module.views_of(module.STRICT)


def scheduled(ledger: RunLedger, due: datetime, attempts: int = 1):
    return ledger.ensure_entry(
        task_key="strict_task",
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(due),
        due=due,
        max_attempts=attempts,
        now=due,
    )


def test_a_failed_latest_due_is_a_failing_row_with_its_runs_link_and_the_retry_to_run(ledger):
    entry = scheduled(ledger, LATEST)
    ledger.claim(entry.id, "run-1", lease_ttl=TTL, now=LATEST + timedelta(seconds=75))
    ledger.fail(entry.id, "run-1", error="boom", now=LATEST + timedelta(seconds=80))
    (row,) = latest_due_rows(ledger, views(), NOW)
    assert row["task"] == "strict_task" and row["due"] == "2026-11-30T22:45:00Z"
    assert (row["status"], row["passed"], row["lag_seconds"]) == ("failed", False, 75)
    assert row["runs_path"] == t.entry_runs_path(entry.id)
    assert f"`dueledger runs retry {entry.id} --operator NAME --reason TEXT`" in row["next"]
    assert "--acknowledge-side-effects" not in row["next"]
    assert latest_due_lines(row).split("  \n") == [
        f"**FAILING** failed · 1 min 15 s late · "
        f"[entry {entry.id}](/runs?q%5B0%5D=tag%3Adueledger%2Fentry%3D{entry.id})",
        "due 2026-11-30T22:45:00Z · next due 2026-11-30T23:15:00Z",
        f"next: `dueledger runs show {entry.id}`, then once:",
        f"`dueledger runs retry {entry.id} --operator NAME --reason TEXT`",
    ]
    # The check's description names the same next step.
    account = acc.account_latest_due(views()[0], ledger, NOW)
    assert account.detail.endswith(f"next: {row['next']}")


def test_a_reclaimed_lease_needs_the_side_effects_acknowledged(ledger):
    entry = scheduled(ledger, LATEST)
    ledger.claim(entry.id, "run-1", lease_ttl=TTL, now=NOW - timedelta(minutes=4))
    later = NOW + timedelta(minutes=5)  # the lease ran out at 23:06; still the 22:45 due
    stale = acc.account_latest_due(views()[0], ledger, later)
    assert stale.state == acc.STATE_STALE_LEASE
    assert "next: `dueledger reclaim` (fails it, lease_reclaimed)" in stale.detail
    reclaim_expired(ledger, now=later)
    account = acc.account_latest_due(views()[0], ledger, later)
    assert account.state == acc.STATE_FAILED
    assert (
        f"`dueledger runs retry {entry.id} --operator NAME --reason TEXT "
        f"--acknowledge-side-effects`" in account.detail
    )


def test_success_and_missed_rows_say_what_to_look_at(ledger):
    scheduled(ledger, LATEST - 2 * SLOT)  # the task ran here before
    missed = acc.account_latest_due(views()[0], ledger, NOW)
    assert missed.state == acc.STATE_MISSED
    (row,) = latest_due_rows(ledger, views(), NOW)
    assert (row["status"], row["runs_path"]) == ("MISSED", None)
    assert "`dueledger launch strict_task --operator NAME --reason TEXT`" in missed.detail
    entry = scheduled(ledger, LATEST)
    ledger.claim(entry.id, "run-1", lease_ttl=TTL, now=LATEST)
    ledger.succeed(entry.id, "run-1", now=LATEST + timedelta(seconds=30))
    (row,) = latest_due_rows(ledger, views(), NOW)
    assert (row["status"], row["passed"], row["lag_seconds"]) == ("success", True, 0)
    assert row["next"] == ""  # nothing to do; the check's description still names the entry
    line = latest_due_lines(row)
    assert line.startswith("success · 0 s late · [entry ") and "next:" not in line
    late = latest_due_lines({**row, "lag_seconds": 13 * 3600 + 21 * 60 + 58})
    assert " · 13 h 21 min late · " in late


def test_a_skipped_due_has_no_link_to_an_empty_run_list(ledger):
    entry, _ = ledger.record_skipped_due(
        "strict_task", LATEST, reason="overlap: entry 1 running", now=LATEST
    )
    (row,) = latest_due_rows(ledger, views(), NOW)
    assert (row["status"], row["entry_id"], row["runs_path"]) == ("skipped", entry.id, None)
    assert latest_due_lines(row).startswith(f"**FAILING** skipped · entry {entry.id} (no run)  \n")


def test_the_next_due_is_the_one_dueledger_dues_lists_with_the_pause_that_holds_it(ledger):
    from orchestration.pause import pause_task

    (row,) = latest_due_rows(ledger, views(), NOW)
    assert row["next_due"] == "2026-11-30T23:15:00Z"  # the slot after now's (23:00)
    spec = views()[0].spec
    pause_task(ledger, [spec], spec.key, operator="alice", reason="db work", now=NOW)
    (row,) = latest_due_rows(ledger, views(), NOW)
    assert row["next_due"] == "2026-11-30T23:15:00Z (paused by alice)"
    # A later page (each materialization, every slot) shows the due after that one.
    (row,) = latest_due_rows(ledger, views(), NOW + SLOT)
    assert row["next_due"].startswith("2026-11-30T23:30:00Z")


def test_each_task_is_one_inline_line_failing_first_after_what_the_lines_say(ledger):
    # The Dagster UI shows a Markdown value inline only under 1,000 characters: one value
    # per task stays inline however many tasks there are; one table of them did not.
    entry = scheduled(ledger, LATEST)
    ledger.claim(entry.id, "run-1", lease_ttl=TTL, now=LATEST)
    ledger.fail(entry.id, "run-1", error="boom", now=LATEST + timedelta(seconds=5))
    (failing,) = latest_due_rows(ledger, views(), NOW)
    fine = [
        {**failing, "task": f"task_{i}", "passed": True, "status": "success", "next": ""}
        for i in range(30)
    ]
    metadata = latest_dues_metadata([*fine, failing], "2026-11-30T23:05:00Z")
    labels = list(metadata)
    assert labels[:2] == ["latest_dues", "task strict_task"]
    assert labels[2:] == [f"task task_{i}" for i in range(30)]
    assert metadata["latest_dues"].value == "as of 2026-11-30T23:05:00Z, failing first"
    assert all(len(value.value) < 1000 for value in list(metadata.values())[1:])


#: Characters of a line the UI shows whole in a 1600-pixel window: ``ledger_health``'s values
#: start about 880 px in, at about 8.1 px per monospace character (measured in the browser
#: test, which checks the pixels themselves).
VISIBLE_CHARS = 88


STATES = sorted(v for k, v in vars(acc).items() if k.startswith("STATE_"))


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("status", ["failed", "dispatch_failed"])
def test_every_next_step_is_lines_the_ui_shows_whole_each_command_unbroken(ledger, state, status):
    entry = scheduled(ledger, LATEST)
    ledger.claim(entry.id, "run-1", lease_ttl=TTL, now=LATEST)
    ledger.fail(entry.id, "run-1", error="boom", now=LATEST + timedelta(seconds=5))
    entry = ledger.get(entry.id)
    entry = dataclasses.replace(entry, id=9999, status=status)
    task = "service_lifecycle_maintenance"  # the longest key of the platform's tasks
    step = acc.next_step(state, task, entry)
    row = {
        "task": task,
        "due": "2026-11-30T22:45:00Z",
        "passed": False,
        "status": status,
        "entry_id": 9999,
        "lag_seconds": 5,
        "runs_path": t.entry_runs_path(9999),
        "next_due": "2026-11-30T23:15:00Z",
        "next": step,
    }
    lines = latest_due_lines(row).split("  \n")
    next_lines = lines[2:]
    if not step:  # a state that asks nothing of anyone has no next line
        assert next_lines == []
        return
    assert next_lines[0].startswith("next: ")
    shown = [line.replace("`", "") for line in next_lines]
    assert all(len(line) <= VISIBLE_CHARS for line in shown), shown
    # Nothing lost, and no command cut: the lines joined are the step, each code span whole.
    assert " ".join(next_lines) == f"next: {step}"
    assert all(line.count("`") % 2 == 0 for line in next_lines)
