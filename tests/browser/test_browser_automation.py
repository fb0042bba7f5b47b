"""(f) The Automation page shows a schedule's effective cadence, not the one it declares.

``tick_every_minute`` declares "every minute" (cron ``* * * * *``) but runs once per
15-minute slot; its schedule's cron is slot-aligned (``*/15 * * * *``), so the UI -- which
humanizes the cron -- says "Every 15 minutes" in the Automation list and on the schedule's
page.
"""

from __future__ import annotations

import re

import pytest
from browser_support import DevServer, nav
from playwright.sync_api import Page, expect

pytestmark = pytest.mark.browser

SCHEDULE = "tick_every_minute_schedule"
EVERY_MINUTE = re.compile(r"Every minute\b")


def test_automation_page_shows_the_slot_aligned_cadence(page: Page, dagster_dev: DevServer):
    page.goto(dagster_dev.url("/"))
    nav(page, "Automation")
    # The search box is a code editor: focus it and type, as a person clicks into it.
    page.get_by_label("Search and filter automations").focus()
    page.keyboard.type("tick_every_minute")
    page.keyboard.press("Enter")
    # The list item is one link: name, then "Scheduled <humanized cron>".
    item = page.locator(f'a[href$="/schedules/{SCHEDULE}"]')
    expect(item).to_contain_text(SCHEDULE)
    expect(item).to_contain_text("Scheduled Every 15 minutes")
    expect(item).not_to_contain_text(EVERY_MINUTE)

    item.click()
    expect(page).to_have_url(re.compile(rf"/schedules/{SCHEDULE}$"))
    schedule_row = page.get_by_role("row").filter(has=page.get_by_text("Schedule", exact=True))
    expect(schedule_row).to_contain_text("Every 15 minutes")
    expect(schedule_row).to_contain_text("*/15 * * * *")
    expect(schedule_row).not_to_contain_text(EVERY_MINUTE)
