"""Thousands of dues with injected faults against the real ledger, on SQLite and PostgreSQL,
and the history checker's verdict over every one of them (tests/history/harness.py says what
is simulated and what is real).

Default (CI) size: DEFAULT_DUES per backend, 10,000 in all, about a minute on a quiet
2-core machine. ``DUELEDGER_HISTORY_DUES=N`` sets the dues per backend (full size: 10,000
each, 35 s on SQLite and 65 s on PostgreSQL measured on that machine);
``DUELEDGER_HISTORY_SEED`` replays a run (each run prints its seed). The SQLite ledger sits
on tmpfs when there is one: the same code, without waiting on the disk for every commit (the
throwaway PostgreSQL runs with fsync off for the same reason).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest
from history.harness import FAULTS, HarnessConfig, run_harness
from history.history_checker import check, figures
from history.history_format import read_history

DEFAULT_DUES = 5_000
TASKS = 40
TMPFS = Path("/dev/shm")


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def harness_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_url")
        return url
    folder = tmp_path
    if TMPFS.is_dir() and os.access(TMPFS, os.W_OK):
        folder = TMPFS / f"dueledger-harness-{os.getpid()}-{time.monotonic_ns()}"
        folder.mkdir()
        request.addfinalizer(lambda: _remove(folder))
    return f"sqlite:///{folder / 'ledger.sqlite'}"


def _remove(folder: Path) -> None:
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()


def test_thousands_of_dues_with_injected_faults_keep_every_rule(
    harness_url: str, tmp_path: Path
) -> None:
    dues = int(os.environ.get("DUELEDGER_HISTORY_DUES") or DEFAULT_DUES)
    seed = int(os.environ.get("DUELEDGER_HISTORY_SEED") or time.time_ns() % 1_000_000)
    config = HarnessConfig(tasks=TASKS, slots=math.ceil(dues / TASKS), seed=seed)
    path = tmp_path / "history.jsonl"
    started = time.monotonic()
    run_harness(config, harness_url, path)
    records = read_history(path)
    violations = check(records)
    found = figures(records, violations)
    report = (
        f"harness seed={seed} ({harness_url.split(':')[0]}): {json.dumps(found)} in "
        f"{time.monotonic() - started:.0f} s; history {path}"
    )
    print(report)
    assert not violations, report + "\n" + "\n".join(map(str, violations[:50]))

    # The verdict means something only if the faults landed and were caught where they should.
    assert found["dues"] == config.dues
    assert all(found["faults"].get(kind, 0) > 0 for kind in FAULTS), report
    assert found["faults"]["duplicate"] > 0 and found["refused_runs"] > 0, report
    assert found["refused_commits"] > 0, report  # paused workers woke up fenced
    assert found["outcomes"].get("failed:lease_reclaimed", 0) > 0, report
    assert found["missed"] == found["faults"].get("not_dispatched", 0) > 0, report
    retried = [r for r in records if r["type"] == "entry" and r["trigger"] == "manual_retry"]
    assert retried, report
    skews = [abs(r["seconds"]) for r in records if r["type"] == "fault" and r["kind"] == "skew"]
    assert max(skews) > 25, report
