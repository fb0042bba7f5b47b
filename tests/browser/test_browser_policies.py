"""A task's policies are where a Dagster user looks for them: the job's Info panel.

The platform's tasks use the policies their work calls for (a deadline, a pause after
failures, overlap ``skip``), every task's retries wait a backoff, and a policy that is off
reads "none" there, as ``dueledger tasks`` says it -- never a 0 that reads as a value.
What each value should be comes from ``dueledger tasks --json``; the page is opened as a
person does: Jobs, then the job, then its Info panel.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from browser_support import DevServer, nav
from playwright.sync_api import Page, expect

pytestmark = pytest.mark.browser

#: Metadata key on the job -> the field of ``dueledger tasks --json`` it shows.
POLICIES = {
    "dueledger/overlap_policy": "overlap_policy",
    "dueledger/deadline_seconds": "deadline_seconds",
    "dueledger/pause_after_failures": "pause_after_failures",
    "dueledger/retry_backoff_seconds": "retry_backoff_seconds",
    "dueledger/max_attempts": "max_attempts",
}


def _shown(value: Any) -> str:
    """How the UI should show a field: "none" where the policy is off."""
    return "none" if value is None else str(value).lower()


def _metadata_value(page: Page, key: str) -> str:
    row = page.get_by_role("row").filter(has=page.get_by_role("cell", name=key, exact=True))
    expect(row).to_have_count(1)
    return row.get_by_role("cell").nth(1).inner_text().strip()


def test_each_tasks_policies_read_in_its_jobs_info_panel_as_dueledger_tasks_says(
    page: Page, dagster_dev: DevServer
):
    tasks = {t["key"]: t for t in dagster_dev.cli("tasks")}
    # The demo shows what the policies do: a task that skips an overlap, one with a deadline,
    # one that pauses after failures; and every task's retries wait.
    assert any(t["overlap_policy"] in ("skip", "replace") for t in tasks.values())
    assert any(t["deadline_seconds"] for t in tasks.values())
    assert any(t["pause_after_failures"] for t in tasks.values())
    assert all(t["retry_backoff_seconds"] for t in tasks.values() if t["max_attempts"] > 1)
    # One task with every policy on, one with some off.
    with_all = next(
        k for k, t in tasks.items() if t["deadline_seconds"] and t["pause_after_failures"]
    )
    with_none = next(
        k
        for k, t in tasks.items()
        if t["overlap_policy"] != "queue" and t["pause_after_failures"] is None
    )
    for key in (with_all, with_none):
        page.goto(dagster_dev.url("/"))
        nav(page, "Jobs")
        # The list breaks names at underscores with zero-width spaces: find the link by where
        # it goes.
        page.locator(f'a[href$="/jobs/{key}_job"]').first.click()
        expect(page).to_have_url(re.compile(rf"/jobs/{key}_job"))
        for label, field in POLICIES.items():
            shown = _metadata_value(page, label)
            assert shown == _shown(tasks[key][field]), (key, label, shown)
    # The task with policies off says so in words.
    assert _metadata_value(page, "dueledger/pause_after_failures") == "none"
