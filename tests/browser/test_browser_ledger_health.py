"""The pages an operator reads at a glance: ``ledger_health``'s latest-dues table in the
Dagster UI, and the Prometheus metrics page of `dueledger metrics serve`.

Story ``ledger_health_page``: a run of ticket_auto_close's latest due (the tags its schedule
gives it), then Catalog → ledger_health → Materialize. The test opens the asset's Events tab,
screenshots the ``latest_dues`` rows (inline, one per task) and checks what is visible in the
task's row -- its status, the due, the entry link, the next due and the command to run next -- then
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

from orchestration.services.health_page import LATEST_DUES, task_label
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


def _text_box(element) -> dict[str, float]:
    """The box of an element's text itself: the union of its text nodes' line boxes (a
    cell is as wide as its widest neighbour; the text may be far narrower, or run past it)."""
    box = element.evaluate(
        """e => {
            const walker = document.createTreeWalker(e, NodeFilter.SHOW_TEXT);
            let left = Infinity, top = Infinity, right = -Infinity, bottom = -Infinity;
            for (let node = walker.nextNode(); node; node = walker.nextNode()) {
                if (!node.textContent.trim()) continue;
                const range = document.createRange();
                range.selectNodeContents(node);
                for (const r of range.getClientRects()) {
                    left = Math.min(left, r.left); top = Math.min(top, r.top);
                    right = Math.max(right, r.right); bottom = Math.max(bottom, r.bottom);
                }
            }
            return {x: left, y: top, width: right - left, height: bottom - top};
        }"""
    )
    return dict(box)


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
    # Inline, not behind "[Show Markdown]": the UI shows a Markdown value inline only under
    # 1,000 characters, and each task's row is a value of its own.
    header = page.get_by_role("row").filter(
        has=page.get_by_role("cell", name=LATEST_DUES, exact=True)
    )
    expect(header.last).to_be_visible()
    assert "failing first" in header.last.inner_text()
    row = (
        page.get_by_role("row")
        .filter(has=page.get_by_role("cell", name=task_label(FAILING_TASK), exact=True))
        .last
    )
    expect(row).to_be_visible()
    tasks = page.get_by_role("row").filter(
        has=page.get_by_role("cell", name=re.compile(r"^task [a-z0-9_]+$"))
    )
    expect(tasks.get_by_text("[Show Markdown]")).to_have_count(0)
    assert tasks.count() == len(dagster_dev.cli("tasks"))
    # What the screenshot shows: every task's whole text, inside the window once the rows are
    # scrolled to (the UI does not wrap a value's lines: a long one would run out of sight).
    header.last.evaluate("e => e.scrollIntoView({block: 'start'})")
    window = {"x": 0, "y": 0, "width": 1600, "height": 1000}
    boxes = [_text_box(r.locator(".dagster-markdown")) for r in tasks.all()]
    for box in boxes:
        assert _inside(box, window), f"a task's line is out of sight: {box}"
    # The picture: from the `latest_dues` line to the last task's row, as wide as the text.
    top, bottom = header.last.bounding_box(), tasks.last.bounding_box()
    assert top is not None and bottom is not None
    right = max(b["x"] + b["width"] for b in boxes)
    clip = {
        "x": top["x"],
        "y": top["y"],
        "width": right + 16 - top["x"],
        "height": bottom["y"] + bottom["height"] - top["y"],
    }
    for directory in _shots(tmp_path):
        directory.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(directory / "ledger_health.png"), clip=clip)
    line = row.locator(".dagster-markdown").inner_text()
    parts = re.split(r" · |\n", line.strip())
    assert parts[0].endswith(entry["status"]), line
    assert f"entry {entry['id']}" in parts and f"due {story['due']}" in parts, line
    # The next due, as `dueledger dues` lists it (the page is as of its materialization: the
    # same slot, as the story just made it).
    (listed,) = dagster_dev.cli("dues", FAILING_TASK, "--next", "1")["dues"]
    assert any(p.startswith(f"next due {listed['due']}") for p in parts), line
    if entry["status"] == "success":
        assert "next:" not in line, line  # a due that succeeded asks nothing of anyone
    else:  # the failing story may have hidden the tickets table meanwhile
        assert f"dueledger runs retry {entry['id']}" in parts[-1], line

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
#: ledger_sensor (slot health) ticks every 60 s; slower while runs compete for 2 cores.
CHECK_WAIT = 240.0


def _check_states(server: DevServer, asset: str) -> dict[str, str | None]:
    data = server.graphql(_CHECKS_QUERY, {"key": {"path": [asset]}})
    checks = data["assetNodeOrError"]["assetChecksOrError"]["checks"]
    return {c["name"]: (c["executionForLatestMaterialization"] or {}).get("status") for c in checks}


def _text_box(element) -> dict[str, float]:
    """The box of an element's text itself (its lines' width, not the cell's)."""
    box = element.evaluate(
        """e => { const r = document.createRange(); r.selectNodeContents(e);
                  const b = r.getBoundingClientRect();
                  return {x: b.x, y: b.y, width: b.width, height: b.height}; }"""
    )
    return dict(box)


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
