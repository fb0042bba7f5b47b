"""The pages an operator reads at a glance: ``ledger_health``'s latest-dues table in the
Dagster UI, and the Prometheus metrics page of `dueledger metrics serve`.

Story ``ledger_health_page``: a run of ticket_auto_close's latest due (the tags its schedule
gives it), then Catalog → ledger_health → Materialize. The test opens the asset's Events tab,
screenshots the ``latest_dues`` table and checks what is visible in it -- the columns, the
task's row with its status, the due, the entry link and the command to run next -- then
clicks the entry link: the Runs page filtered on ``dueledger/entry=N`` lists the due's run.
Then `dueledger metrics serve` runs against the same DAGSTER_HOME and its page is opened.

With ``DUELEDGER_SCREENSHOTS=DIR`` the screenshots are also written to DIR (the README's
pictures in docs/images come from there).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from browser_support import DevServer, listed_run_ids, uses_stories
from playwright.sync_api import Page, expect
from processes import start_group, stop_group
from stories import FAILING_TASK

from orchestration.services.health_page import COLUMNS
from resources.core.settings import PROJECT_ROOT

pytestmark = pytest.mark.browser


def _shots(tmp_path: Path) -> list[Path]:
    where = [tmp_path]
    if os.environ.get("DUELEDGER_SCREENSHOTS"):
        where.append(Path(os.environ["DUELEDGER_SCREENSHOTS"]))
    return where


def _inside(inner: dict[str, float] | None, outer: dict[str, float] | None) -> bool:
    assert inner is not None and outer is not None
    return (
        inner["x"] >= outer["x"] - 1
        and inner["y"] >= outer["y"] - 1
        and inner["x"] + inner["width"] <= outer["x"] + outer["width"] + 1
        and inner["y"] + inner["height"] <= outer["y"] + outer["height"] + 1
    )


@uses_stories("ledger_health_page")
def test_ledger_health_shows_each_tasks_latest_due_and_links_to_its_runs(
    finish, page: Page, dagster_dev: DevServer, tmp_path: Path
):
    story = finish("ledger_health_page")
    assert story["health_status"] == "SUCCESS", story
    (entry,) = [
        e for e in dagster_dev.entries(FAILING_TASK) if e["dedup_key"] == f"due:{story['due']}"
    ]

    page.set_viewport_size({"width": 1600, "height": 1000})
    page.goto(dagster_dev.url("/assets/ledger_health?view=events"))
    # The UI shows a Markdown value inline while it is under 1,000 characters, else behind
    # "[Show Markdown]" (one click, a dialog): the table is read in either place.
    inline = page.get_by_role("cell").filter(has_text="Latest due of each task").last
    collapsed = (
        page.get_by_role("row").filter(has_text="latest_dues").get_by_text("[Show Markdown]")
    )
    expect(inline.or_(collapsed).first).to_be_visible()
    if inline.is_visible():
        table = inline
    else:
        collapsed.first.click()
        table = page.get_by_role("dialog").filter(has_text="Latest due of each task")
        expect(table).to_be_visible()
    row = table.get_by_role("row").filter(has_text=FAILING_TASK)
    expect(row).to_be_visible()
    for directory in _shots(tmp_path):
        directory.mkdir(parents=True, exist_ok=True)
        table.screenshot(path=str(directory / "ledger_health.png"))
    # What the screenshot shows: the whole row, inside the table, inside the window.
    assert _inside(row.bounding_box(), table.bounding_box())
    window = {"x": 0, "y": 0, "width": 1600, "height": 1000}
    assert _inside(row.bounding_box(), window), "the row is not on screen"
    header = table.get_by_role("row").first.inner_text()
    assert re.findall(r"[a-z ]+?(?=\t|$)", header.replace("\n", "\t")) == list(COLUMNS), header
    cells = row.get_by_role("cell").all_inner_texts()
    assert cells[0] == FAILING_TASK
    assert cells[1].endswith(entry["status"]), cells
    assert cells[3] == f"entry {entry['id']}" and cells[4] == story["due"], cells
    # The next due, as `dueledger dues` lists it (the page is as of its materialization: the
    # same slot, as the story just made it).
    (listed,) = dagster_dev.cli("dues", FAILING_TASK, "--next", "1")["dues"]
    assert cells[5].split(" ")[0] == listed["due"], cells
    if entry["status"] == "success":
        assert cells[6] == "", cells  # a due that succeeded asks nothing of anyone
    else:  # the failing story may have hidden the tickets table meanwhile
        assert f"dueledger runs retry {entry['id']}" in cells[6], cells

    row.get_by_role("link", name=f"entry {entry['id']}").click()
    expect(page).to_have_url(
        re.compile(rf"/runs\?q%5B0%5D=tag%3Adueledger%2Fentry%3D{entry['id']}$")
    )
    assert story["due_run"] in listed_run_ids(page)

    # The metrics page of the same deployment.
    log = tmp_path / "metrics-serve.log"
    with log.open("wb") as out:
        proc = start_group(
            [str(dagster_dev.bin_dir / "dueledger"), "metrics", "serve", "--port", "0", "--json"],
            cwd=PROJECT_ROOT,
            env=dagster_dev.env,
            log=out,
        )
    try:
        url = _served_url(proc, log)
        page.goto(url)
        body = page.locator("body")
        line = (
            'dueledger_entries_total{failure_kind="",status="success",'
            'task="ledger_health",trigger="manual"}'
        )
        text = body.inner_text()
        manual_successes = [
            e
            for e in dagster_dev.entries("ledger_health", "--trigger", "manual")
            if e["status"] == "success"
        ]
        assert f"{line} {len(manual_successes)}.0" in text
        assert f'dueledger_open_entries{{status="queued",task="{FAILING_TASK}"}}' in text
        # The picture shows what the due's run did, found as a person would (Ctrl-F).
        mine = f'status="success",task="{FAILING_TASK}",trigger="schedule"}}'
        if entry["status"] != "success":
            mine = f'task="{FAILING_TASK}",trigger="schedule"}} 1.0'
        assert page.evaluate("text => window.find(text)", mine), mine
        for directory in _shots(tmp_path):
            page.screenshot(path=str(directory / "metrics.png"))
    finally:
        stop_group(proc)


#: The query the asset page's Checks tab makes for each check's state on the latest
#: materialization (None: "Not evaluated").
_CHECKS_QUERY = """
query Checks($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    ... on AssetNode {
      assetChecksOrError {
        ... on AssetChecks {
          checks { name executionForLatestMaterialization { status evaluation { description } } }
        }
      }
    }
  }
}
"""
#: slot_health_sensor ticks every 60 s; slower while runs compete for 2 cores.
CHECK_WAIT = 240.0


def _check_states(server: DevServer, asset: str) -> dict[str, str | None]:
    data = server.graphql(_CHECKS_QUERY, {"key": {"path": [asset]}})
    checks = data["assetNodeOrError"]["assetChecksOrError"]["checks"]
    return {c["name"]: (c["executionForLatestMaterialization"] or {}).get("status") for c in checks}


@uses_stories("ledger_health_page")
def test_checks_sit_on_the_materialization_they_judge_not_evaluated_never_shows(
    finish, page: Page, dagster_dev: DevServer
):
    # Both assets materialized after the slot's evaluation (the due's run, then the Catalog's
    # ledger_health): the sensor reports their checks again once their entries settle, so
    # each check has an evaluation on the latest materialization without anyone executing it.
    story = finish("ledger_health_page")
    assert story["health_status"] == "SUCCESS", story
    for asset in (FAILING_TASK, "ledger_health"):
        deadline = time.monotonic() + CHECK_WAIT
        states = _check_states(dagster_dev, asset)
        while None in states.values() and time.monotonic() < deadline:
            time.sleep(5)
            states = _check_states(dagster_dev, asset)
        assert None not in states.values(), f"{asset}: not evaluated on its latest: {states}"
        # The Checks tab as a person opens it: every check listed, none "Not evaluated" (a
        # run still finishing elsewhere may materialize meanwhile: the page is read again).
        deadline = time.monotonic() + CHECK_WAIT
        while True:
            page.goto(dagster_dev.url(f"/assets/{asset}?view=checks"))
            for name in states:
                expect(page.get_by_text(name, exact=True).first).to_be_visible()
            if page.get_by_text("Not evaluated").count() == 0:
                break
            assert time.monotonic() < deadline, f"{asset}: the Checks tab says Not evaluated"
            time.sleep(5)
    if story["due_status"] == "SUCCESS":
        assert _check_states(dagster_dev, FAILING_TASK)["latest_due_accounted_for"] == "SUCCEEDED"
        page.goto(dagster_dev.url(f"/assets/{FAILING_TASK}?view=checks"))
        expect(page.get_by_text("Passed").first).to_be_visible()


def _served_url(proc: subprocess.Popen[bytes], log: Path, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text()
        if text.lstrip().startswith("{") and "}" in text:
            start = text.index("{")
            try:
                return str(json.loads(text[start : text.index("}", start) + 1])["url"])
            except ValueError:
                pass
        if proc.poll() is not None:
            raise AssertionError(f"metrics serve exited {proc.returncode}: {log.read_text()}")
        time.sleep(0.2)
    raise AssertionError(f"metrics serve did not start: {log.read_text()}")
