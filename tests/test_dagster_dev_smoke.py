"""`dg dev`, what `scripts/dev.sh` runs, really starts this code location: GraphQL answers,
schedules are there.

Starts the venv's `dg dev` from the project root (so `[tool.dg]` in pyproject.toml picks the
code location, as for the user) — the real webserver + daemon on a free loopback port with
a throwaway DAGSTER_HOME seeded from the project's dagster.yaml, and stops the whole process group
by PID (SIGTERM, then SIGKILL) so no server outlives the test.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from processes import start_group, stop_group

from resources.core.settings import PROJECT_ROOT

pytestmark = pytest.mark.slow

QUERY = """
{
  version
  repositoriesOrError {
    ... on RepositoryConnection {
      nodes {
        name
        location { name }
        schedules { name cronSchedule description scheduleState { status } }
      }
    }
  }
}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _graphql(port: int, query: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_dagster_dev_serves_the_code_location_and_its_schedules(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    shutil.copyfile(PROJECT_ROOT / "dagster.yaml.local", home / "dagster.yaml")
    port = _free_port()
    # VIRTUAL_ENV as `uv run` (scripts/dev.sh) sets it.
    env = {**os.environ, "DAGSTER_HOME": str(home), "VIRTUAL_ENV": sys.prefix}
    log = (tmp_path / "dg-dev.log").open("wb")
    proc = start_group(
        [
            str(Path(sys.executable).parent / "dg"),
            "dev",
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
        deadline = time.monotonic() + 180
        payload: dict | None = None
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "dg-dev.log").read_text()[-3000:]
            try:
                payload = _graphql(port, QUERY)
                nodes = payload["data"]["repositoriesOrError"].get("nodes") or []
                if nodes:
                    break
            except OSError:
                pass
            time.sleep(1)
        assert payload is not None, "dg dev did not answer GraphQL within 180 s"
        assert payload["data"]["version"]
        (repo,) = payload["data"]["repositoriesOrError"]["nodes"]
        assert repo["location"]["name"] == "dueledger"
        schedules = {s["name"]: s for s in repo["schedules"]}
        assert "order_cleanup_schedule" in schedules
        assert "service_lifecycle_maintenance_schedule" in schedules
        for schedule in schedules.values():
            assert schedule["scheduleState"]["status"] == "RUNNING"
        # The effective cadence is shown next to the declared one in the UI.
        assert "effective every 15 minutes" in schedules["order_cleanup_schedule"]["description"]
        assert "declared every minute" in schedules["tick_every_minute_schedule"]["description"]
    finally:
        stop_group(proc)
        log.close()
    assert proc.poll() is not None
