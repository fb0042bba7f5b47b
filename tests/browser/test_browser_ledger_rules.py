"""Every ledger rule holds on the UI path, and a person sees what the ledger decided.

(a) Story ``launchpad_locked``: Jobs → log_archive_job → launchpad → Materialize. log_archive
    is declared not manually triggerable: the run does nothing, ends Canceled -- the run page
    says so and why -- and the ledger has no entry for it.
(b) Story ``reexecute_failed`` (test_browser_reexecution.py): the failed launchpad run of
    ticket_auto_close is re-executed as soon as it is red, and that first re-execution runs;
    the parent entry's lineage filter lists the child's run and the refused one.
(c) A fresh deployment (this suite's own ``dagster dev``): `summary` reports no missed due
    from before its scheduler started.
"""

from __future__ import annotations

import re

import pytest
from browser_support import DevServer, filter_runs_by_tag, listed_run_ids, uses_stories
from playwright.sync_api import Page, expect
from stories import LOCKED_TASK

pytestmark = pytest.mark.browser


@uses_stories("launchpad_locked")
def test_a_launchpad_run_of_a_task_not_manually_triggerable_is_refused_and_shown(
    finish, page: Page, dagster_dev: DevServer
):
    story = finish("launchpad_locked")
    run_id = story["run_id"]
    assert story["status"] == "CANCELED", f"refused, never a green success: {story}"
    run = dagster_dev.run(run_id)
    assert run["tags"].get("dueledger/outcome") == "refused", run["tags"]
    # A refused launch makes no entry. (The task's own schedule may have made one meanwhile:
    # it is daily at 02:00, and this suite may run across it.)
    assert dagster_dev.entries(LOCKED_TASK, "--trigger", "manual") == []
    assert not [e for e in dagster_dev.entries(LOCKED_TASK) if run_id in e["run_ids"]]

    # The run page a person lands on: its status is Canceled, and the log says why.
    page.goto(dagster_dev.url(f"/runs/{run_id}"))
    expect(page.get_by_text("Canceled").first).to_be_visible()
    expect(page.get_by_text("Success", exact=True)).to_have_count(0)
    why = page.get_by_text(re.compile(r"is not manually triggerable")).first
    expect(why).to_be_visible()

    # summary counts it apart from failures.
    summary = dagster_dev.cli("summary")
    assert summary["refused_24h"] >= 1, summary
    assert not [r for r in summary["attention"] if r["task_key"] == LOCKED_TASK], (
        "a refused run needs no attention"
    )


@uses_stories("reexecute_failed")
def test_the_first_reexecution_of_a_fresh_red_run_runs_and_the_lineage_filter_lists_it(
    finish, page: Page, dagster_dev: DevServer
):
    story = finish("reexecute_failed")
    # Regression: the entry was `retrying` here (Dagster would never retry a launchpad run)
    # and the first re-execution was refused "only a failed entry can be retried".
    assert story["parent_status_when_red"] == "failed", story
    assert story["retry_status"] == "SUCCESS", story
    assert story["refused_status"] == "CANCELED", story
    parent_id = story["parent_id"]
    parent = dagster_dev.show(parent_id)
    (child,) = parent["children"]

    filter_runs_by_tag(page, dagster_dev, "dueledger/lineage", str(parent_id))
    listed = listed_run_ids(page)
    assert {story["first_run"], story["retry_run"], story["refused_run"]} <= listed, (
        f"the lineage filter of entry {parent_id} lists {sorted(listed)}"
    )
    assert dagster_dev.run(story["retry_run"])["tags"]["dueledger/entry"] == str(child["id"])
    # Made good by its retry: the failed parent needs no attention any more.
    attention = dagster_dev.cli("summary")["attention"]
    assert parent_id not in [r["entry_id"] for r in attention], attention


def test_a_fresh_deployment_reports_no_missed_due_from_before_it_started(
    dagster_dev: DevServer,
):
    # This suite's dagster dev started on an empty DAGSTER_HOME minutes ago: no due before
    # its scheduler first ran is missed, whatever else was launched by hand since.
    summary = dagster_dev.cli("summary")
    missed = {r["task_key"]: r["missed_dues"] for r in summary["tasks"] if r["missed_dues"]}
    assert summary["missed_24h"] == 0, missed
