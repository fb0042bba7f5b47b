"""Fixtures of the browser suite: one real `dagster dev` for the whole suite, Debian's chromium
driven by Playwright, the stage that runs the suite's UI stories side by side, a fresh page
per test, and a screenshot + HTML of the pages involved when a test fails.

- ``dagster_dev`` (session): throwaway DAGSTER_HOME seeded with the project's
  ``dagster.yaml.local``, SQLite ledger and source store in it, sample data from
  ``dueledger sample-data``, then ``dagster dev -w workspace.yaml -h 127.0.0.1 -p PORT`` from
  the repo root in its own process group (SIGINT/SIGTERM restored), stopped group-wide.
- ``browser`` (session): one browser context (window) of ``chromium`` from PATH, its tabs
  sharing one cache. Missing chromium fails the suite (it never skips silently):
  `scripts/test.sh` installs it as root.
- ``stage`` (session): starts, at once, every story (stories.py) that a selected test finishes
  (``@uses_stories``), so their Dagster runs overlap; a test then finishes its own.
- ``page``: a new tab for the test; the OSS UI's community dialog is clicked away ("Skip")
  whenever it appears.

Artifacts of a failed test (``<test>[-<story>].png`` and ``.html`` of its page and of the
pages of the stories it finished, plus the dagster dev log tail) go to
``$DUELEDGER_BROWSER_ARTIFACTS`` when set, else to the test's pytest tmp dir; the paths are
printed in the failure report (section "browser artifacts").
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import DevServer, free_port, http_ok
from playwright.sync_api import BrowserContext, Page, expect, sync_playwright
from processes import start_group, stop_group
from stage import Stage
from stories import LONGEST_LAST, STORIES

from resources.core.settings import (
    ENV_DATABASE_URL,
    ENV_KEEPER_INTERVAL,
    ENV_SOURCE_URL,
    PROJECT_ROOT,
)

#: Chromium flags for a headless, sandbox-less container without network.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: `dagster dev` imports Dagster three times over (webserver, daemon, code server) and loads
#: the code location: about a minute on 2 cores.
STARTUP_TIMEOUT = 240.0
#: Playwright's wait for one element; the UI is slow while runs compete for 2 cores.
UI_TIMEOUT_MS = 60_000

_READY_QUERY = """
{
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError { __typename ... on PythonError { message } }
      }
    }
  }
  repositoriesOrError { ... on RepositoryConnection { nodes { name jobs { name } } } }
}
"""


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    # A failed test that used pages: keep their screenshots and HTML, say where in the report.
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    pages: dict[str, Page] = getattr(item, "browser_pages", {})
    if report.when != "call" or not report.failed or not pages:
        return
    directory: Path = item.browser_artifacts_dir  # type: ignore[attr-defined]
    server: DevServer = item.browser_server  # type: ignore[attr-defined]
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", item.name)
    lines = []
    for label, page in pages.items():
        name = base if label == "test" else f"{base}-{label}"
        shot, html = directory / f"{name}.png", directory / f"{name}.html"
        try:
            lines.append(f"{label} page at {page.url}")
            page.screenshot(path=str(shot), full_page=True)
            lines.append(f"  screenshot: {shot}")
            html.write_text(page.content())
            lines.append(f"  html: {html}")
        except Exception as exc:  # the page may be gone; the report still says what is there
            lines.append(f"  could not save the {label} page: {exc}")
    log_tail = directory / f"{base}.dagster-dev.log"
    log_tail.write_text(server.log_tail(20000))
    lines.append(f"dagster dev log tail: {log_tail} (whole log: {server.log_path})")
    print("\nbrowser artifacts:\n" + "\n".join(lines))
    report.sections.append(("browser artifacts", "\n".join(lines)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The browser tests of long stories last: the others are checked while those still run.
    # (Within the places the browser tests hold; every other test keeps its place.)
    def story_length(item: pytest.Item) -> int:
        names = getattr(getattr(item, "function", None), "browser_stories", ())
        return max((LONGEST_LAST.index(n) + 1 for n in names if n in LONGEST_LAST), default=0)

    places = [i for i, item in enumerate(items) if item.get_closest_marker("browser")]
    ordered = sorted((items[i] for i in places), key=story_length)
    for place, item in zip(places, ordered, strict=True):
        items[place] = item


def _chromium_or_fail() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail(
            "chromium is not on PATH: the browser tests (tests/browser, marker `browser`) drive "
            "Debian's chromium with Playwright and cannot run without it. Install it "
            "(`apt-get install chromium`; `scripts/test.sh` does so when run as root), or "
            "deselect these tests with -m 'not browser'.",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def chromium_path() -> str:
    return _chromium_or_fail()


def _wait_ready(server: DevServer, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"dagster dev exited with {proc.returncode} before it was ready:\n"
                f"{server.log_tail()}"
            )
        if http_ok(server.url("/server_info")):
            try:
                data = server.graphql(_READY_QUERY)
            except (OSError, AssertionError) as exc:
                last = repr(exc)
            else:
                entries = data["workspaceOrError"].get("locationEntries") or []
                nodes = (data["repositoriesOrError"] or {}).get("nodes") or []
                last = repr(entries)
                for entry in entries:
                    error = entry["locationOrLoadError"] or {}
                    if error.get("__typename") == "PythonError":
                        raise RuntimeError(
                            f"code location {entry['name']} failed to load: {error['message']}"
                        )
                loaded = [e for e in entries if e["loadStatus"] == "LOADED"]
                if (
                    loaded
                    and nodes
                    and any(j["name"] == "order_cleanup_job" for j in nodes[0]["jobs"])
                ):
                    return
        time.sleep(1)
    raise RuntimeError(
        f"dagster dev not ready within {STARTUP_TIMEOUT:.0f} s ({last}):\n{server.log_tail()}"
    )


@pytest.fixture(scope="session")
def dagster_dev(
    tmp_path_factory: pytest.TempPathFactory, chromium_path: str
) -> Iterator[DevServer]:
    """A real `dagster dev` on a free loopback port, for the whole browser suite."""
    root = tmp_path_factory.mktemp("browser-dagster-dev")
    home = root / "dagster_home"
    home.mkdir()
    shutil.copyfile(PROJECT_ROOT / "dagster.yaml.local", home / "dagster.yaml")
    ledger_db, source_db = home / "dueledger_ledger.sqlite", home / "dueledger_source.sqlite"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUELEDGER_")}
    env.update(
        {
            "DAGSTER_HOME": str(home),
            ENV_DATABASE_URL: f"sqlite:///{ledger_db}",
            ENV_SOURCE_URL: f"sqlite:///{source_db}",
            # The stories wait for ledger_sensor's duties (a UI toggle seen as a pause, a
            # run's outcome): every 30 s instead of the default 60 s halves those waits; the
            # duties are the same.
            ENV_KEEPER_INTERVAL: "30",
        }
    )
    bin_dir = Path(sys.executable).parent
    for script in ("dagster", "dueledger"):
        if not (bin_dir / script).exists():
            pytest.fail(f"console script {script!r} not found next to {sys.executable}")
    port = free_port()
    server = DevServer(
        base_url=f"http://127.0.0.1:{port}",
        home=home,
        env=env,
        ledger_db=ledger_db,
        source_db=source_db,
        log_path=root / "dagster-dev.log",
        bin_dir=bin_dir,
    )
    # Sample data while dagster dev starts: both take seconds of imports, and no run can
    # start before the daemon is up anyway.
    sample = subprocess.Popen(
        [str(bin_dir / "dueledger"), "sample-data", "--json"],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log = server.log_path.open("wb")
    proc = start_group(
        [
            str(bin_dir / "dagster"),
            "dev",
            "-w",
            "workspace.yaml",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        cwd=PROJECT_ROOT,
        env=env,
        log=log,
    )
    try:
        out, _ = sample.communicate(timeout=180)
        assert sample.returncode == 0, f"dueledger sample-data failed:\n{out}"
        _wait_ready(server, proc)
        print(f"\ndagster dev at {server.base_url}, DAGSTER_HOME={home}, log {server.log_path}")
        yield server
    finally:
        if sample.poll() is None:
            sample.kill()
        stop_group(proc)
        log.close()


@pytest.fixture(scope="session")
def browser(chromium_path: str) -> Iterator[BrowserContext]:
    """One browser window of one person: every page (tab) shares its cache, so the UI's
    JavaScript bundle is fetched and compiled once, not per page."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        expect.set_options(timeout=UI_TIMEOUT_MS)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.set_default_timeout(UI_TIMEOUT_MS)
        try:
            yield context
        finally:
            context.close()
            browser.close()


def new_page(browser: BrowserContext) -> Page:
    """A new tab."""
    page = browser.new_page()
    # The OSS UI greets a new browser with a community dialog; a person clicks "Skip".
    page.add_locator_handler(
        page.get_by_role("dialog").get_by_role("button", name="Skip", exact=True),
        lambda skip: skip.click(),
    )
    return page


@pytest.fixture(scope="session")
def stage(
    browser: BrowserContext, dagster_dev: DevServer, request: pytest.FixtureRequest
) -> Iterator[Stage]:
    """The suite's stories, all started at once (longest chain of runs first)."""
    wanted = {
        name
        for item in request.session.items
        for name in getattr(getattr(item, "function", None), "browser_stories", ())
    }
    stage = Stage(dagster_dev, STORIES, lambda: new_page(browser))
    dagster_dev.idle.append(stage.poll_once)
    for name in STORIES:
        if name in wanted:
            stage.start(name)
    try:
        yield stage
    finally:
        dagster_dev.idle.remove(stage.poll_once)
        stage.close()


def _artifacts_dir(tmp_path: Path) -> Path:
    configured = os.environ.get("DUELEDGER_BROWSER_ARTIFACTS")
    directory = Path(configured) if configured else tmp_path
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@pytest.fixture
def page(
    browser: BrowserContext, stage: Stage, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Page]:
    """A fresh page of the test's own; on failure its screenshot and HTML are kept (and
    those of the stories the test finished: `finish`)."""
    page = new_page(browser)
    request.node.browser_pages = {"test": page}
    request.node.browser_artifacts_dir = _artifacts_dir(tmp_path)
    request.node.browser_server = stage.server
    try:
        yield page
    finally:
        page.close()


@pytest.fixture
def finish(stage: Stage, page: Page, request: pytest.FixtureRequest) -> Callable[[str], Any]:
    """``finish(story)``: drive the stage until STORY is done, return its result; its page
    joins the test's failure artifacts."""

    def run(name: str) -> Any:
        stage.start(name)
        story_page = stage.page_of(name)
        if story_page is not None:
            request.node.browser_pages[name] = story_page
        return stage.finish(name)

    return run
