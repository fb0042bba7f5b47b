"""Racing `dueledger launch` processes on a fresh DAGSTER_HOME: one run, no broken storage,
on a SQLite and a PostgreSQL ledger.

Dagster's SQLite storage creates its tables and Alembic stamp on first use; processes doing
that at once left two Alembic heads in runs.db and every later command failed. The console
script is run as users run it, several at once, with one request id: exactly one racer
creates the run and the entry (``"existing": false``); a request id is the launch's
idempotency key, so the others return that run (exit 0, ``"existing": true``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from orchestration.services.launch import manual_run_id
from resources.ledger import RunLedger

ROOT = Path(__file__).resolve().parents[2]
DUELEDGER = Path(sys.executable).with_name("dueledger")
RACERS = 4


@pytest.mark.slow
def test_racing_launches_on_a_fresh_home_make_one_run(tmp_path: Path, ledger_url: str) -> None:
    home = tmp_path / "home"  # does not exist yet: the racers create it
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "DUELEDGER_DATABASE_URL": ledger_url,
        "DUELEDGER_SOURCE_URL": f"sqlite:///{tmp_path / 'source.sqlite'}",
    }
    command = [str(DUELEDGER), "launch", "order_cleanup", "--operator", "ops"]
    command += ["--reason", "race", "--request-id", "same", "--json"]
    racers = [
        subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(RACERS)
    ]
    results = [(p.wait(timeout=600), *p.communicate()) for p in racers]
    for code, out, err in results:
        assert code == 0, (out, err[-2000:])
    run_id = manual_run_id("order_cleanup", "same")
    assert {json.loads(out)["run_id"] for _, out, _ in results} == {run_id}
    # The one racer whose submit created the run launched it; the others found it existing.
    assert sorted(json.loads(out)["existing"] for _, out, _ in results) == [False] + [True] * (
        RACERS - 1
    )

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(home))
        with dg.DagsterInstance.get() as instance:
            assert [r.dagster_run.run_id for r in instance.get_run_records()] == [run_id]
    ledger = RunLedger(database_url=ledger_url)
    try:
        entries, _ = ledger.list_entries(limit=10)
        assert [e.dedup_key for e in entries] == ["manual:same"]
    finally:
        ledger.dispose()
    # A later command still works on the storage the racers created.
    again = ["launch", "order_cleanup", "--operator", "ops", "--reason", "after", "--json"]
    later = subprocess.run(
        [str(DUELEDGER), *again],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert later.returncode == 0, later.stderr[-2000:]
