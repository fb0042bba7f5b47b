"""Helpers of the browser suite: the `dagster dev` server it drives, the ledger CLI it asserts
with, the source store it breaks and inspects, and the clicks it repeats.

Everything a test *does* goes through the real UI (Playwright); what it *checks* comes from the
`dueledger` console script (``--json``), Dagster's GraphQL API (run status, tags) and the
source SQLite file. Waiting (for a run to end, an entry to settle) polls GraphQL and the
ledger's SQLite file read-only, never the CLI: one CLI call costs 5-10 s of CPU on 2 cores
(it imports Dagster). Waits are `Wait` objects that a story yields (stage.py), so the
suite's stories wait side by side.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

from playwright.sync_api import Locator, Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

#: Dagster run statuses after which nothing more happens to a run.
TERMINAL_RUN_STATUSES = frozenset({"SUCCESS", "FAILURE", "CANCELED"})
#: How long one run may take from launch to its end. Generous: on 2 cores a slot boundary
#: puts about ten scheduled runs in the queue ahead of the test's run.
RUN_TIMEOUT = 360.0

RUN_ID = re.compile(r"/runs/([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")


@dataclass(frozen=True)
class DevServer:
    """One running `dagster dev` (webserver + daemon + code server) and its throwaway home."""

    base_url: str
    home: Path
    env: Mapping[str, str]
    ledger_db: Path
    source_db: Path
    log_path: Path
    bin_dir: Path
    #: Called while a CLI call runs (the stage advances its stories meanwhile).
    idle: list[Callable[[], Any]] = field(default_factory=list)

    def url(self, path: str) -> str:
        return self.base_url + path

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError as exc:
            return f"(no dagster dev log: {exc})"

    # --- GraphQL (observation only: run status and tags, backfill runs) -----------------
    def graphql(self, query: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url("/graphql"),
            data=json.dumps({"query": query, "variables": dict(variables or {})}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            payload = json.loads(response.read())
        if payload.get("errors"):
            raise AssertionError(f"GraphQL errors: {payload['errors']}")
        return payload["data"]

    def run(self, run_id: str) -> dict[str, Any]:
        """``{"runId", "status", "tags": {key: value}, "jobName"}`` of one Dagster run."""
        data = self.graphql(
            "query($id: ID!) { runOrError(runId: $id) { __typename "
            "... on Run { runId status jobName tags { key value } } } }",
            {"id": run_id},
        )["runOrError"]
        assert data["__typename"] == "Run", f"run {run_id}: {data}"
        return {**data, "tags": {t["key"]: t["value"] for t in data["tags"]}}

    def run_ended(self, run_id: str, timeout: float = RUN_TIMEOUT) -> Wait:
        """Wait for the run's end (SUCCESS, FAILURE or CANCELED): the run."""
        note(f"waiting for run {run_id}")

        def probe() -> dict[str, Any] | None:
            run = self.run(run_id)
            if run["status"] not in TERMINAL_RUN_STATUSES:
                return None
            note(f"run {run_id} ended {run['status']}")
            return run

        return Wait(probe, timeout, f"run {run_id} did not end")

    def backfill(self, backfill_id: str) -> dict[str, Any]:
        data = self.graphql(
            "query($id: String!) { partitionBackfillOrError(backfillId: $id) { __typename "
            "... on PartitionBackfill { id status numPartitions "
            "runs(limit: 100) { runId status tags { key value } } } } }",
            {"id": backfill_id},
        )["partitionBackfillOrError"]
        assert data["__typename"] == "PartitionBackfill", f"backfill {backfill_id}: {data}"
        for run in data["runs"]:
            run["tags"] = {t["key"]: t["value"] for t in run["tags"]}
        return data

    def backfill_ended(
        self, backfill_id: str, partitions: int, timeout: float = 2 * RUN_TIMEOUT
    ) -> Wait:
        """Wait for the backfill's one run per partition to have ended: the backfill."""
        note(f"waiting for backfill {backfill_id}")

        def probe() -> dict[str, Any] | None:
            b = self.backfill(backfill_id)
            runs = b["runs"]
            if len(runs) == partitions and all(r["status"] in TERMINAL_RUN_STATUSES for r in runs):
                note(f"backfill {backfill_id}: {partitions} runs ended")
                return b
            return None

        return Wait(probe, timeout, f"backfill {backfill_id} did not finish {partitions} runs")

    # --- the ledger: the CLI for assertions, the SQLite file for cheap polling -----------
    def cli(self, *args: str, expect_code: int | None = 0) -> Any:
        """``dueledger ARGS --json``: the parsed JSON it prints (exit code checked)."""
        cmd = [str(self.bin_dir / "dueledger"), *args, "--json"]
        started = time.monotonic()
        # A call costs seconds (it imports Dagster): the stage's stories go on meanwhile.
        with subprocess.Popen(
            cmd, env=dict(self.env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        ) as proc:
            while proc.poll() is None and time.monotonic() - started < 120:
                for idle in self.idle:
                    idle()
                time.sleep(0.2)
            stdout, stderr = proc.communicate(timeout=10)
        result = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
        took = time.monotonic() - started
        note(f"dueledger {' '.join(args)}: exit {result.returncode} in {took:.1f}s")
        if expect_code is not None:
            assert result.returncode == expect_code, (
                f"{' '.join(cmd)} exited {result.returncode}, expected {expect_code}\n"
                f"stdout: {result.stdout[-3000:]}\nstderr: {result.stderr[-3000:]}"
            )
        return json.loads(result.stdout)

    def entries(self, task: str, *extra: str) -> list[dict[str, Any]]:
        """`dueledger runs list --task TASK --json` entries (one page of 500)."""
        return self.cli("runs", "list", "--task", task, "--limit", "500", *extra)["entries"]

    def show(self, entry_id: int) -> dict[str, Any]:
        return self.cli("runs", "show", str(entry_id))

    def ledger_rows(self, where: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Rows of the ledger's entries table (read-only; polling only, never for asserts)."""
        if not self.ledger_db.exists():
            return []
        with contextlib.closing(
            sqlite3.connect(f"file:{self.ledger_db}?mode=ro", uri=True, timeout=30)
        ) as conn:
            conn.row_factory = sqlite3.Row
            try:
                rows = conn.execute(
                    f"SELECT id, task_key, status, dedup_key, run_ids FROM dueledger_entries "
                    f"WHERE {where}",
                    tuple(params),
                ).fetchall()
            except sqlite3.OperationalError:  # not migrated yet
                return []
        return [dict(r) for r in rows]

    def entries_now(self, task: str, dedup_key: str) -> dict[str, Any]:
        """The entry of ``task`` with ``dedup_key`` as it is now (it must exist)."""
        found = [e for e in self.entries(task) if e["dedup_key"] == dedup_key]
        assert found, f"no entry {task} {dedup_key}: {self.entries(task)}"
        return found[0]

    def entry_reached(
        self, task: str, dedup_key: str, statuses: set[str], timeout: float = RUN_TIMEOUT
    ) -> Wait:
        """Wait for ledger entry (TASK, DEDUP_KEY) to be in one of STATUSES: its row."""
        note(f"waiting for entry {task} {dedup_key} to be {sorted(statuses)}")

        def probe() -> dict[str, Any] | None:
            rows = self.ledger_rows("task_key = ? AND dedup_key = ?", (task, dedup_key))
            if rows and rows[0]["status"] in statuses:
                return {**rows[0], "run_ids": json.loads(rows[0]["run_ids"])}
            return None

        return Wait(probe, timeout, f"ledger entry {task} {dedup_key} not {sorted(statuses)}")

    def runs_ended(self, run_ids: Sequence[str], timeout: float = RUN_TIMEOUT) -> Wait:
        """Wait until every run of RUN_IDS has ended: True."""

        def probe() -> bool | None:
            ended = all(self.run(r)["status"] in TERMINAL_RUN_STATUSES for r in run_ids)
            return True if ended else None

        return Wait(probe, timeout, f"runs {list(run_ids)} did not all end")

    # --- the source store (SQLite file of the hosting data and the outbox) -----------------
    @contextlib.contextmanager
    def source(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.source_db, timeout=60)
        conn.row_factory = sqlite3.Row
        try:
            yield conn
        finally:
            conn.close()


_T0 = time.monotonic()


def note(message: str) -> None:
    """A timestamped progress line (shown with -s, and in a failed test's captured output)."""
    print(f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - _T0:6.1f}s] {message}", flush=True)


class Ready(NamedTuple):
    """What a probe returns to pass on a value that may itself be None."""

    value: Any


@dataclass
class Wait:
    """What a story waits for: ``probe()`` returns None until it returns the value wanted
    (or `Ready(value)`); past ``timeout`` seconds the story gets an AssertionError."""

    probe: Callable[[], Any]
    timeout: float
    message: str
    deadline: float = 0.0

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.timeout


def entry_by_run(entries: Sequence[Mapping[str, Any]], run_id: str) -> dict[str, Any]:
    """The one ledger entry whose runs include ``run_id``."""
    found = [dict(e) for e in entries if run_id in e["run_ids"]]
    assert len(found) == 1, f"run {run_id} is in {len(found)} ledger entries: {found}"
    return found[0]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


# --- clicks ------------------------------------------------------------------------------------
MATERIALIZE = re.compile(r"(^|\s)Materialize$")


def nav(page: Page, name: str) -> None:
    """Click an entry of the UI's left navigation (Overview, Runs, Catalog, Jobs, ...)."""
    # Each nav link's accessible name is its icon's label, then its text.
    page.get_by_role("link", name=re.compile(rf"(^|\s){re.escape(name)}$")).first.click()


def run_id_of(page: Page) -> str:
    """The run id of the run page the browser is on."""
    match = RUN_ID.search(page.url)
    assert match, f"not on a run page: {page.url}"
    return match.group(1)


def wait_run_page(page: Page, other_than: str | None = None) -> str:
    """Wait until the UI has navigated to a run page (other than ``other_than``'s)."""

    def is_new_run_page(url: str) -> bool:
        match = RUN_ID.search(url)
        return bool(match) and match.group(1) != other_than

    page.wait_for_url(is_new_run_page)
    return run_id_of(page)


def dropdown_next_to(page: Page, button: Locator) -> Locator:
    """The small ▾ button that Dagster puts right of a split button (Materialize, Re-execute)."""
    # The split button's two halves are siblings in one flex box; the ▾ half shows the
    # "arrow_drop_down" icon.
    group = button.locator("xpath=ancestor::div[.//*[@aria-label='arrow_drop_down']][1]")
    return group.get_by_role("button").filter(has=page.get_by_role("img", name="arrow_drop_down"))


def launch_from_job_launchpad(page: Page, server: DevServer, job: str) -> str:
    """Jobs → JOB → Materialize ▾ → "Open launchpad" → launch: the new run's id.

    An asset job's page in Dagster 1.13 has no Launchpad tab: its launchpad opens from the
    Materialize button's menu, and its launch button is the dialog's "Materialize".
    """
    page.goto(server.url("/"))
    nav(page, "Jobs")
    page.get_by_role("link").filter(has_text=re.compile(rf"^\s*{re.escape(job)}\s*$")).first.click()
    expect(page).to_have_url(re.compile(rf"/jobs/{job}$"))
    materialize = page.get_by_role("button", name=MATERIALIZE)
    expect(materialize).to_be_visible()
    dropdown_next_to(page, materialize).click()
    _menu_item(page, "Open launchpad").click()
    # The launchpad's own dialog, by its header ("Launchpad (configure assets)"): the menu
    # that opened it is a dialog too, and on a loaded machine it is still closing -- its
    # "Open launchpad" item would match a plain "Launchpad" text search.
    header = page.get_by_text(re.compile(r"^Launchpad\b"))
    dialog = page.get_by_role("dialog").filter(has=header)
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name=MATERIALIZE).click()
    run_id = wait_run_page(page)
    note(f"{job}: launched run {run_id} from the launchpad")
    return run_id


_RECENT_RUNS = """
{ runsOrError(limit: 30) { __typename ... on Runs { results { runId assetSelection { path } } } } }
"""


def _runs_of_asset(server: DevServer, asset: str) -> set[str]:
    """Ids of the newest runs (up to 30) that materialize ASSET."""
    runs = server.graphql(_RECENT_RUNS)["runsOrError"]["results"]
    return {r["runId"] for r in runs if [asset] in [a["path"] for a in r["assetSelection"] or []]}


def materialize_from_catalog(page: Page, server: DevServer, asset: str) -> str:
    """Catalog → ASSET → Materialize, then "View" in the "Launched run" toast: the run's id."""
    page.goto(server.url("/"))
    nav(page, "Catalog")
    page.get_by_role("link").filter(has=page.get_by_title(asset, exact=True)).first.click()
    expect(page).to_have_url(re.compile(rf"/assets/{asset}$"))
    before = _runs_of_asset(server, asset)
    page.get_by_role("button", name=MATERIALIZE).click()
    toast = page.locator("[data-sonner-toast]").filter(has_text="Launched run")
    expect(toast).to_be_visible()
    try:
        toast.get_by_role("link", name="View").click(timeout=10_000)
    except PlaywrightTimeoutError:
        # The toast re-renders while the asset page refreshes (seen on ledger_health, whose
        # checks update) and its link never holds still for a click: open the run it
        # announced, found through GraphQL (the one run of the asset that is new).
        deadline = time.monotonic() + 60
        while not (new := _runs_of_asset(server, asset) - before):
            assert time.monotonic() < deadline, f"no new run of {asset} after Materialize"
            time.sleep(1)
        (launched,) = new
        page.goto(server.url(f"/runs/{launched}"))
    run_id = wait_run_page(page)
    note(f"{asset}: materialized from the Catalog as run {run_id}")
    return run_id


_LAUNCH_RUN = """
mutation($p: ExecutionParams!) {
  launchRun(executionParams: $p) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
  }
}"""


def launch_scheduled_run(server: DevServer, task: str, due: str) -> str:
    """A run of TASK's job for DUE with the tags its schedule gives a run (GraphQL
    ``launchRun``, as the daemon's own launch would queue it): the run's id. Set-up for a
    page to read, not a click under test."""
    tags = {"dueledger/task": task, "dueledger/trigger": "schedule", "dueledger/due": due}
    params = {
        "selector": {
            "repositoryLocationName": "dueledger",
            "repositoryName": "__repository__",
            "jobName": f"{task}_job",
        },
        "runConfigData": {},
        "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]},
    }
    result = server.graphql(_LAUNCH_RUN, {"p": params})["launchRun"]
    assert result["__typename"] == "LaunchRunSuccess", result
    run_id: str = result["run"]["runId"]
    note(f"{task}: launched run {run_id} for due {due}")
    return run_id


def reexecute(page: Page, server: DevServer, run_id: str, how: str = "all") -> str:
    """Open run RUN_ID's page and click "Re-execute all" (``how="all"``) or
    Re-execute ▾ → "From failure" (``how="from_failure"``): the new run's id."""
    page.goto(server.url(f"/runs/{run_id}"))
    button = page.get_by_role("button", name=re.compile(r"^Re-execute all"))
    expect(button).to_be_enabled()
    if how == "all":
        button.click()
    elif how == "from_failure":
        dropdown_next_to(page, button).click()
        _menu_item(page, "From failure").click()
    else:
        raise ValueError(how)
    new_run = wait_run_page(page, other_than=run_id)
    note(f"re-executed run {run_id} ({how}) as run {new_run}")
    return new_run


def launch_backfill_from_asset_page(
    page: Page, server: DevServer, asset: str, days: Sequence[str]
) -> str:
    """Catalog → ASSET → Materialize → type the days → Launch backfill: the backfill id."""
    page.goto(server.url("/"))
    nav(page, "Catalog")
    page.get_by_role("link").filter(has=page.get_by_title(asset, exact=True)).first.click()
    expect(page).to_have_url(re.compile(rf"/assets/{asset}$"))
    # A partitioned asset's button reads "Materialize..." (it opens the partitions dialog).
    page.get_by_role("button", name=re.compile(r"(^|\s)Materialize")).first.click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_text(f"Launch runs to materialize {asset}")).to_be_visible()
    partitions = dialog.get_by_role("textbox").first
    partitions.fill(f"[{days[0]}...{days[-1]}]")
    partitions.press("Enter")
    expect(dialog.get_by_text(f"{len(days)} partitions", exact=True)).to_be_visible()
    dialog.get_by_role("button", name="Launch backfill").click()
    created = page.locator("[data-sonner-toast]").filter(has_text="Created backfill")
    expect(created).to_be_visible()
    match = re.search(r"Created backfill\s+(\S+)", created.inner_text())
    assert match, created.inner_text()
    note(f"{asset}: launched backfill {match.group(1)} of {', '.join(days)}")
    return match.group(1)


def uses_stories(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a test as finishing these stories, so the stage starts them with the suite."""

    def mark(test: Callable[..., Any]) -> Callable[..., Any]:
        test.browser_stories = names  # type: ignore[attr-defined]
        return test

    return mark


def filter_runs_by_tag(page: Page, server: DevServer, key: str, value: str) -> None:
    """Runs → Filter → Tag → KEY → VALUE, picked from the menus as a person does."""
    page.goto(server.url("/"))
    nav(page, "Runs")
    page.get_by_role("button", name=re.compile(r"(^|\s)Filter$")).click()
    _menu_item(page, "Tag").click()
    page.keyboard.type(key)
    _menu_item(page, key, icon="tag").click()
    page.keyboard.type(value)
    # Typing a value suggests it as a schedule, sensor, run id ... and as a tag value.
    _menu_item(page, value, icon="tag").click()
    # Close the suggestions (they cover the filter chip and the first rows).
    page.keyboard.press("Escape")
    page.mouse.click(900, 25)  # the empty space right of the Runs tabs
    # The UI keeps the filter in the URL (q[0]=tag:KEY=VALUE) and shows it as a chip.
    expect(page).to_have_url(
        re.compile(r"[?&]q%5B\d*%5D=tag%3A" + re.escape(quote(f"{key}={value}", safe="")) + "(&|$)")
    )
    chip = page.get_by_text(re.compile(rf"Tag is\s+{re.escape(key)}={re.escape(value)}(?!\w)"))
    expect(chip.first).to_be_visible()


def _menu_item(page: Page, text: str, icon: str | None = None) -> Locator:
    """The menu item that reads TEXT (and shows ICON, e.g. "tag"): its accessible name is
    the icon's label, then the text."""
    item = page.get_by_role("menuitem").filter(has_text=re.compile(rf"^\s*{re.escape(text)}\s*$"))
    if icon is not None:
        item = item.filter(has=page.get_by_role("img", name=icon, exact=True))
    return item.first


def show_runs_within_backfills(page: Page) -> None:
    """Tick "Show runs within backfills" on the Runs page (the box is drawn over a hidden
    input: a person clicks its label)."""
    box = page.get_by_label("Show runs within backfills")
    if not box.is_checked():
        page.get_by_text("Show runs within backfills", exact=True).click()
        expect(box).to_be_checked()


_LISTED_RUN_IDS_JS = """links => links
    .filter(a => a.textContent.trim() === a.getAttribute('href').split('/').pop().slice(0, 8))
    .map(a => a.getAttribute('href'))"""


def listed_run_ids(page: Page, settle_seconds: float = 2.0) -> set[str]:
    """Run ids of the rows the Runs page shows (their "ID" column links), once the table
    has stopped changing (the UI refreshes it in place)."""

    def current() -> set[str]:
        hrefs = page.locator('a[href^="/runs/"]').evaluate_all(_LISTED_RUN_IDS_JS)
        return {m.group(1) for h in hrefs if (m := RUN_ID.search(h or ""))}

    expect(page.locator('a[href^="/runs/"]').first).to_be_visible()
    previous = current()
    while True:
        page.wait_for_timeout(settle_seconds * 1000)
        now = current()
        if now == previous:
            return now
        previous = now


def run_row(page: Page, run_id: str) -> Locator:
    """The Runs page row of one run: the smallest box holding its ID link and its "View"."""
    link = page.locator(f'a[href="/runs/{run_id}"]').filter(has_text=run_id[:8])
    return link.locator(
        f"xpath=ancestor::div[.//a[@href='/runs/{run_id}' and normalize-space()='View']][1]"
    )
