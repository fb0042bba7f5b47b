"""Helpers of the ledger-keeping sensor tests: the test code locations, the ledger the code
location (and its run workers) read from ``DUELEDGER_DATABASE_URL``, waiting on workers."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import dagster as dg
from dagster_internals import CodeTarget

from resources.core import tags as t
from resources.core.entry import Entry
from resources.ledger import RunLedger

TESTS_DIR = Path(__file__).resolve().parent.parent
PROJECT_ROOT = TESTS_DIR.parent
LEDGER_DEFS = TESTS_DIR / "fixtures" / "ledger_defs.py"

T = TypeVar("T")


def target(attribute: str) -> CodeTarget:
    """One of the test code locations in tests/fixtures/ledger_defs.py."""
    return CodeTarget.from_file(LEDGER_DEFS, attribute=attribute)


@dataclass(frozen=True)
class LedgerEnv:
    ledger: RunLedger
    url: str
    tmp: Path

    def entries(self, task_key: str | None = None) -> list[Entry]:
        page, _ = self.ledger.list_entries(task_key=task_key, limit=500)
        return sorted(page, key=lambda e: e.id)

    def worker_env(self) -> dict[str, str]:
        """Environment of a spawned run worker: the ledger URL and the test helper modules."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), str(PROJECT_ROOT)])
        return env


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60.0) -> T:
    """Poll ``probe`` until it returns something truthy (real workers take seconds to start)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def task_runs(instance: dg.DagsterInstance, task_key: str) -> list[dg.DagsterRun]:
    """Runs of a task, oldest first."""
    return list(reversed(instance.get_runs(dg.RunsFilter(tags={t.TAG_TASK: task_key}))))


def utc_now() -> datetime:
    return datetime.now(UTC)


def fixture_module() -> Any:
    """tests/fixtures/ledger_defs.py as a module (for its task specs and views)."""
    import importlib.util
    import sys

    if "ledger_defs" not in sys.modules:
        spec = importlib.util.spec_from_file_location("ledger_defs", LEDGER_DEFS)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["ledger_defs"] = module
        spec.loader.exec_module(module)
    return sys.modules["ledger_defs"]
