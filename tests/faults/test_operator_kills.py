"""Operator commands killed at random instants leave their change and its audit together.

Each round starts the real console script (`dueledger pause`, `resume`, `catch-up`), kills
its whole process group with SIGKILL after a random delay -- before it started, while it
writes, after it finished -- and then holds the ledger's state against its audit: every
pause has its `task_paused` record and every closed pause its `task_resumed`; every due a
catch-up created has its `catch_up` record. A command killed halfway once left a pause with
no audit (22 of 60 kills), and a catch-up's entries without theirs.

CI size: KILL_ROUNDS rounds per command on each ledger (about a minute each).
``DUELEDGER_KILL_ROUNDS=N`` sets the rounds (full size: 200); ``DUELEDGER_KILL_SEED`` replays.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cli_process import DUELEDGER, PROJECT_ROOT, base_env

from orchestration.pause import PAUSE_CLI, task_pauses
from resources.core.entry import Trigger
from resources.core.settings import ENV_DATABASE_URL
from resources.ledger import RunLedger

KILL_ROUNDS = int(os.environ.get("DUELEDGER_KILL_ROUNDS") or 8)
TASK = "order_cleanup"


@pytest.fixture
def env(ledger: RunLedger, ledger_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    home = tmp_path / "dagster_home"
    home.mkdir()
    yield base_env(DAGSTER_HOME=str(home), **{ENV_DATABASE_URL: ledger_url})


@pytest.fixture
def rng() -> random.Random:
    seed = int(os.environ.get("DUELEDGER_KILL_SEED") or time.time_ns() % 1_000_000)
    print(f"kill seed {seed}")
    return random.Random(seed)


def _killed(args: list[str], env: dict[str, str], delay: float) -> int | None:
    """Run `dueledger ARGS`, SIGKILL its process group after ``delay`` seconds unless it ended
    by then; its exit code, or None when it was killed."""
    proc = subprocess.Popen(
        [str(DUELEDGER), *args],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its launcher children die with it
    )
    try:
        return proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        return None


def _lifetime(args: list[str], env: dict[str, str]) -> float:
    """How long the command takes here, run once to its end: the kills fall within it."""
    started = time.monotonic()
    _killed(args, env, 600)
    return time.monotonic() - started


def _audits(ledger: RunLedger, action: str) -> list[dict]:
    return ledger.recent_audit(action=action, limit=10_000)


def test_a_killed_pause_or_resume_leaves_its_change_and_its_audit_together(
    env: dict[str, str], ledger: RunLedger, rng: random.Random
) -> None:
    killed = 0
    commands = {
        command: [command, TASK, "--reason", "kill test", "--operator", "alice"]
        for command in ("pause", "resume")
    }
    lifetime = max(_lifetime(args, env) for args in commands.values())
    for _ in range(KILL_ROUNDS):
        for args in commands.values():
            killed += _killed(args, env, rng.uniform(0, lifetime)) is None
            pauses = [p for p in task_pauses(ledger, TASK) if p.source == PAUSE_CLI]
            paused = _audits(ledger, "task_paused")
            resumed = _audits(ledger, "task_resumed")
            assert sorted(a["checks"]["pause_id"] for a in paused) == sorted(
                p.id for p in pauses
            ), (pauses, paused)
            closed = sorted(p.id for p in pauses if p.end is not None)
            assert sorted(i for a in resumed for i in a["checks"]["pause_ids"]) == closed
    assert killed > 0, "no command was killed: the delays were all longer than the commands"


def test_a_killed_catch_up_leaves_every_entry_it_made_with_its_audit(
    env: dict[str, str], ledger: RunLedger, rng: random.Random
) -> None:
    end = datetime.now(UTC).replace(second=0, microsecond=0)
    start = end - timedelta(hours=6)
    args = ["catch-up", TASK, "--from", start.isoformat(), "--to", end.isoformat()]
    args += ["--only", "missed", "--operator", "alice", "--reason", "kill test"]
    killed = 0
    # The first run is killed too: its lifetime is only known from a dry run's.
    lifetime = _lifetime([*args, "--dry-run"], env) * 3
    for _ in range(max(2, KILL_ROUNDS // 2)):
        killed += _killed(args, env, rng.uniform(0, lifetime)) is None
        entries = [
            e
            for e in ledger.list_entries(task_key=TASK, limit=500)[0]
            if e.trigger == Trigger.MANUAL and e.due is not None
        ]
        audited = [a["entry_id"] for a in _audits(ledger, "catch_up")]
        assert sorted(audited) == sorted(e.id for e in entries)
    assert killed > 0, "no catch-up was killed: the delays were all longer than the commands"
