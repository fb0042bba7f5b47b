"""Pauses and skipped dues as a person meets them in the Dagster UI.

(g) Automation → a schedule's page → its toggle, off: ``ledger_sensor`` (policies) records a pause
    by ``dagster-ui`` (`dueledger tasks` shows who and since when, `dueledger dues` that the next
    dues are skipped); then on again (the sensor closes the pause on its next tick).
(h) `dueledger pause` a task, and a run of its next due arrives (the tags its schedule gives
    it): the run ends Canceled, its entry ``skipped`` (``paused by NAME: REASON``). The Runs
    page filtered on ``dueledger/outcome=skipped`` lists it as Canceled; the task asset's
    ``latest_due_accounted_for`` check, executed from its Checks tab, says the task is paused
    and names the skipped entry.

Both use tasks no story launches (service_auto_renew, service_lifecycle_maintenance), and put
them back as they were.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from browser_support import (
    DevServer,
    filter_runs_by_tag,
    launch_scheduled_run,
    nav,
    note,
    run_row,
)
from playwright.sync_api import Locator, Page, expect

pytestmark = pytest.mark.browser

TOGGLED = "service_auto_renew"
PAUSED = "service_lifecycle_maintenance"
SENSOR_WAIT = 180.0  # ledger_sensor runs every 60 s, slower while runs compete


def _open_schedule(page: Page, server: DevServer, name: str) -> None:
    page.goto(server.url("/"))
    nav(page, "Automation")
    page.get_by_label("Search and filter automations").focus()
    page.keyboard.type(name)
    page.keyboard.press("Enter")
    page.locator(f'a[href$="/schedules/{name}"]').first.click()
    expect(page).to_have_url(re.compile(rf"/schedules/{name}$"))


def _switch(page: Page) -> tuple[Locator, Locator]:
    """The schedule page's "Running" switch: its checkbox (drawn over, hidden) and the label a
    person clicks."""
    box = page.get_by_role("checkbox").first
    expect(box).to_be_attached()
    return box, page.locator(f'label[for="{box.get_attribute("id")}"]')


def _pauses(server: DevServer, task: str) -> list[dict[str, object]]:
    """`dueledger tasks`: who paused ``task``, since when and why."""
    (row,) = [r for r in server.cli("tasks") if r["key"] == task]
    paused: list[dict[str, object]] = row["paused"]
    return paused


def _open_pauses(server: DevServer, task: str) -> int:
    """Open pauses of ``task`` in the ledger file (read-only; polling only, never asserted)."""
    with contextlib.closing(
        sqlite3.connect(f"file:{server.ledger_db}?mode=ro", uri=True, timeout=30)
    ) as conn:
        try:
            query = (
                "SELECT count(*) FROM dueledger_pauses WHERE task_key = ? AND resumed_at IS NULL"
            )
            return int(conn.execute(query, (task,)).fetchone()[0])
        except sqlite3.OperationalError:  # not migrated yet
            return 0


def _until(what: str, probe: Callable[[], Any], timeout: float = SENSOR_WAIT) -> Any:
    """Poll ``probe`` until it returns something truthy (each `dueledger` call takes seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_a_schedule_toggled_off_in_the_ui_is_a_pause_by_dagster_ui(
    page: Page, dagster_dev: DevServer
) -> None:
    schedule = f"{TOGGLED}_schedule"
    _open_schedule(page, dagster_dev, schedule)
    box, switch = _switch(page)
    expect(box).to_be_checked()  # running by default
    switch.click()
    expect(box).not_to_be_checked()
    note(f"{schedule}: stopped in the UI")
    try:
        _until("a pause by dagster-ui", lambda: _open_pauses(dagster_dev, TOGGLED))
        (pause,) = _pauses(dagster_dev, TOGGLED)
        assert pause["by"] == "dagster-ui" and pause["source"] == "schedule_stopped"
        assert pause["reason"] == f"schedule {schedule} stopped in Dagster"
        listed = dagster_dev.cli("dues", TOGGLED, "--next", "2")
        assert [d["skipped_by_pause"] for d in listed["dues"]] == [True, True]
        assert listed["dues"][0]["pause"]["by"] == "dagster-ui"
    finally:
        _open_schedule(page, dagster_dev, schedule)
        box, switch = _switch(page)
        if not box.is_checked():
            switch.click()
        expect(box).to_be_checked()
    # Started again: the outcome sensor closes the pause on its next tick (the sensor tests,
    # tests/sensors/test_scheduling.py, hold that; not waited for here).


def test_a_skipped_due_shows_on_the_runs_page_and_in_the_asset_check(
    page: Page, dagster_dev: DevServer
) -> None:
    server = dagster_dev
    reason = "browser test: maintenance window"
    server.cli("pause", PAUSED, "--reason", reason, "--operator", "alice")
    try:
        now = datetime.now(UTC)
        slot = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
        due = (slot + timedelta(minutes=15)).strftime("%Y-%m-%dT%H:%M:%SZ")
        run_id = launch_scheduled_run(server, PAUSED, due)
        ended = _until(
            f"run {run_id} to end",
            lambda: (r := server.run(run_id))["status"] in ("SUCCESS", "FAILURE", "CANCELED") and r,
        )
        assert ended["status"] == "CANCELED", ended
        (entry,) = [e for e in server.entries(PAUSED) if e["dedup_key"] == f"due:{due}"]
        assert entry["status"] == "skipped"
        assert entry["error"] == f"paused by alice: {reason}"

        # Runs → Filter → Tag dueledger/outcome=skipped: the run, Canceled.
        filter_runs_by_tag(page, server, "dueledger/outcome", "skipped")
        row = run_row(page, run_id)
        expect(row).to_be_visible()
        expect(row).to_contain_text("Canceled")

        # The asset's Checks tab → Execute all: the check says paused, naming the entry.
        page.goto(server.url(f"/assets/{PAUSED}?view=checks"))
        page.get_by_role("button", name=re.compile(r"Execute all")).first.click()
        said = page.get_by_text(re.compile(rf"entry {entry['id']} \(.*\), was skipped"))
        expect(said.first).to_be_visible(timeout=SENSOR_WAIT * 1000)
        expect(page.get_by_text(re.compile("paused by alice")).first).to_be_visible()
    finally:
        server.cli("resume", PAUSED, "--reason", "browser test done", "--operator", "alice")


def _toggle_shows(page: Page, server: DevServer, schedule: str, running: bool) -> None:
    """The schedule page, opened again until its switch shows ``running`` (the policy sensor
    moves it within a tick, 60 s; slower while runs compete)."""
    deadline = time.monotonic() + SENSOR_WAIT
    while True:
        _open_schedule(page, server, schedule)
        box, _ = _switch(page)
        if box.is_checked() == running:
            return
        assert time.monotonic() < deadline, f"{schedule}: the switch never showed {running}"
        time.sleep(5)


def test_one_pause_from_both_sides_a_cli_pause_turns_the_toggle_off_and_the_ui_resumes_it(
    page: Page, dagster_dev: DevServer
) -> None:
    server, schedule = dagster_dev, f"{TOGGLED}_schedule"
    _until("no pause of the task left open", lambda: _open_pauses(server, TOGGLED) == 0)
    try:
        # `dueledger pause`: the switch on the schedule's page turns off.
        server.cli("pause", TOGGLED, "--reason", "browser test: cli pause", "--operator", "alice")
        _toggle_shows(page, server, schedule, running=False)
        (pause,) = _pauses(server, TOGGLED)
        assert (pause["by"], pause["source"]) == ("alice", "cli")  # the stop is that pause
        # A person starts it in the UI: that resumes the CLI's pause, by dagster-ui.
        box, switch = _switch(page)
        switch.click()
        expect(box).to_be_checked()
        _until("the pause resumed by the UI's start", lambda: _open_pauses(server, TOGGLED) == 0)
        assert _pauses(server, TOGGLED) == []
        # Stopped in the UI, resumed from the CLI: the switch turns on again.
        _open_schedule(page, server, schedule)
        box, switch = _switch(page)
        switch.click()
        expect(box).not_to_be_checked()
        _until("a pause by dagster-ui", lambda: _open_pauses(server, TOGGLED))
        server.cli("resume", TOGGLED, "--reason", "browser test: resumed", "--operator", "alice")
        _toggle_shows(page, server, schedule, running=True)
        assert _pauses(server, TOGGLED) == []
    finally:
        if _open_pauses(server, TOGGLED):
            server.cli("resume", TOGGLED, "--reason", "browser test done", "--operator", "alice")
        _toggle_shows(page, server, schedule, running=True)
