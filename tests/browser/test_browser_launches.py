"""Launching a task from the Dagster UI, and re-executing a run that succeeded.

(a) Jobs → order_cleanup_job → Materialize ▾ → "Open launchpad" → launch (story
    ``launchpad``);
(b) Catalog → order_cleanup → Materialize (story ``catalog``);
(e) the run of (a) → "Re-execute all" (story ``reexecute_success``): refused, no second side
    effect, audited.

A UI launch carries no dueledger tags; it must become a manual ledger entry by operator
``dagster-ui`` whose request id is the run id, and the run carries
``dueledger/entry=<entry id>``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from browser_support import DevServer, entry_by_run, uses_stories
from stories import ORDER_TASK, automation_log

pytestmark = pytest.mark.browser


def _assert_manual_ui_entry(server: DevServer, launched: dict[str, Any]) -> dict[str, Any]:
    run_id = launched["run_id"]
    assert launched["status"] == "SUCCESS", f"run {run_id} ended {launched['status']}"
    entry = entry_by_run(server.entries(ORDER_TASK), run_id)
    assert entry["trigger"] == "manual", entry
    assert entry["operator"] == "dagster-ui", entry
    assert entry["dedup_key"] == f"manual:{run_id}", entry
    assert entry["status"] == "success", entry
    assert entry["run_ids"] == [run_id], entry
    tags = server.run(run_id)["tags"]
    assert tags.get("dueledger/entry") == str(entry["id"]), (
        f"run {run_id} should carry dueledger/entry={entry['id']}: {tags}"
    )
    return entry


@uses_stories("launchpad")
def test_launchpad_launch_is_a_manual_entry_by_dagster_ui(finish, dagster_dev: DevServer):
    _assert_manual_ui_entry(dagster_dev, finish("launchpad"))


@uses_stories("catalog")
def test_catalog_materialize_is_a_manual_entry_by_dagster_ui(finish, dagster_dev: DevServer):
    _assert_manual_ui_entry(dagster_dev, finish("catalog"))


@uses_stories("launchpad", "reexecute_success")
def test_reexecuting_a_successful_run_is_refused_without_a_second_side_effect(
    finish, dagster_dev: DevServer
):
    story = finish("reexecute_success")
    parent_run, run_id = story["parent_run"], story["run_id"]
    tags = dagster_dev.run(run_id)["tags"]
    assert tags.get("dueledger/outcome") == "refused", (
        f"re-execution {run_id} of successful run {parent_run} is not marked refused: {tags}"
    )
    entries = dagster_dev.entries(ORDER_TASK)
    entry = entry_by_run(entries, parent_run)
    # No ledger entry took the refused run as an attempt; the parent is untouched.
    assert not [e for e in entries if run_id in e["run_ids"]], entries
    after = dagster_dev.show(entry["id"])
    assert after["status"] == "success", after
    assert after["run_ids"] == [parent_run], after
    assert after["attempt"] == 1 and after["error"] is None, after
    assert after["children"] == [], after["children"]
    # The refusal is audited, naming the re-execution run.
    refusals = [
        a
        for a in after["audit"]
        if run_id in f"{a.get('reason')} {a.get('outcome')}"
        and str(a.get("outcome", "")).startswith("refused")
    ]
    assert refusals, f"no refused audit record for {run_id}: {after['audit']}"
    assert refusals[-1]["operator"] == "dagster-ui", refusals[-1]
    # The refusal says what a person does instead to run the task again.
    assert "use Materialize on its asset in the Catalog" in json.dumps(after), after
    # No side effect besides what scheduled runs (dedup key due:...) did meanwhile.
    new_rows = {
        k: v
        for k, v in automation_log(dagster_dev, ORDER_TASK).items()
        if k not in story["log_before"]
    }
    unexpected = {k: v for k, v in new_rows.items() if ":due:" not in v}
    assert not unexpected, f"side effects after the refused re-execution: {unexpected}"
