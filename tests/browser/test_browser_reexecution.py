"""Re-executing a failed run from the UI, and the Runs page filter of a ledger entry.

(d) Story ``reexecute_failed``: ticket_auto_close is made to fail honestly -- its source
    table is renamed away, no product code changes -- and launched from the job's launchpad;
    once its entry is ``failed`` the table comes back, and the failed run's page "Re-execute ▾
    → From failure" makes a child entry (``manual_retry`` by ``dagster-ui``) that succeeds.
    "Re-execute all" of the same failed run again is refused: audited on the parent, tagged
    ``dueledger/outcome=refused``, and so shown in the Runs list.
(g) Runs → Filter → Tag → ``dueledger/entry`` → ``<id>`` lists every run of that entry.
"""

from __future__ import annotations

import pytest
from browser_support import (
    DevServer,
    entry_by_run,
    filter_runs_by_tag,
    listed_run_ids,
    run_row,
    show_runs_within_backfills,
    uses_stories,
)
from playwright.sync_api import Page, expect
from stories import FAILING_TASK

pytestmark = pytest.mark.browser


@uses_stories("reexecute_failed")
def test_reexecuting_a_failed_run_from_the_ui_retries_it_once(
    finish, page: Page, dagster_dev: DevServer
):
    story = finish("reexecute_failed")
    assert story["first_status"] == "FAILURE", f"without its table the run must fail: {story}"
    entries = dagster_dev.entries(FAILING_TASK)
    parent = entry_by_run(entries, story["first_run"])
    assert parent["id"] == story["parent_id"]
    assert story["retry_status"] == "SUCCESS", f"re-execution from failure: {story}"

    parent = dagster_dev.show(parent["id"])
    assert parent["status"] == "failed", "the parent keeps its failure"
    assert parent["trigger"] == "manual" and parent["operator"] == "dagster-ui", parent
    assert parent["dedup_key"] == f"manual:{story['first_run']}", parent
    assert "tickets" in (parent["error"] or ""), parent["error"]
    # Exactly one child: the first re-execution, a manual retry by dagster-ui that succeeded.
    assert len(parent["children"]) == 1, parent["children"]
    (child,) = parent["children"]
    assert child["trigger"] == "manual_retry", child
    assert child["parent_id"] == parent["id"], child
    assert child["operator"] == "dagster-ui", child
    assert child["status"] == "success", child
    assert child["dedup_key"] == f"retry:{parent['id']}", child
    assert child["run_ids"] == [story["retry_run"]], child
    assert entry_by_run(entries, story["retry_run"])["id"] == child["id"]
    assert dagster_dev.run(story["retry_run"])["tags"].get("dueledger/entry") == str(child["id"])

    # The second re-execution of the same failed run was refused, and the audit says so.
    refused_run = story["refused_run"]
    refusals = [
        a
        for a in parent["audit"]
        if refused_run in f"{a.get('reason')} {a.get('outcome')}"
        and str(a.get("outcome", "")).startswith("refused")
    ]
    assert refusals, f"no refused audit record for {refused_run}: {parent['audit']}"
    assert refusals[-1]["operator"] == "dagster-ui", refusals[-1]
    assert not [e for e in entries if refused_run in e["run_ids"]], "a refused run is no attempt"
    assert dagster_dev.run(refused_run)["tags"].get("dueledger/outcome") == "refused"

    # A person sees it in the Runs list: filtered by the tag, the run's row shows it.
    filter_runs_by_tag(page, dagster_dev, "dueledger/outcome", "refused")
    row = run_row(page, refused_run)
    expect(row).to_be_visible()
    expect(row.get_by_text("dueledger/outcome: refused")).to_be_visible()


@uses_stories("reexecute_failed")
def test_runs_page_filtered_by_entry_tag_lists_every_run_of_the_entry(
    finish, page: Page, dagster_dev: DevServer
):
    story = finish("reexecute_failed")
    entries = dagster_dev.entries(FAILING_TASK)  # run ids and late-run rejections included
    parent = entry_by_run(entries, story["first_run"])
    children = [e for e in entries if e["parent_id"] == parent["id"]]
    assert children, f"entry {parent['id']} has no child entry: {entries}"
    # The failed parent (its attempts, plus the re-execution it refused) and its child.
    for entry in (parent, *children):
        entry_id = entry["id"]
        filter_runs_by_tag(page, dagster_dev, "dueledger/entry", str(entry_id))
        show_runs_within_backfills(page)  # an entry's runs may be inside a backfill
        listed = listed_run_ids(page)
        attempts = set(entry["run_ids"])
        refused = {str(r["run_id"]) for r in entry["summary"]["late_job_rejections"]}
        assert attempts <= listed, (
            f"entry {entry_id}: attempts {sorted(attempts - listed)} missing from the Runs page "
            f"filtered by dueledger/entry={entry_id} (listed {sorted(listed)})"
        )
        assert listed <= attempts | refused, (
            f"entry {entry_id}: runs {sorted(listed - attempts - refused)} listed under "
            f"dueledger/entry={entry_id} are neither its attempts nor runs it refused"
        )
        for run_id in listed:
            assert dagster_dev.run(run_id)["tags"].get("dueledger/entry") == str(entry_id)
