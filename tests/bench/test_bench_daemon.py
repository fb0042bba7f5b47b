"""bench/idle.py and bench/drain.py without starting Dagster: the CPU reading of a process
tree, the window that keeps clear of a due, the instance config, the rows and ratios.
(Running them for real takes minutes: ``bench/run.py --only idle,drain``.)"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import drain
import idle
import pytest
from drain import Drain
from idle import Sample
from run import KIND_CHECK, Row


def test_the_cpu_of_a_process_tree_counts_its_children():
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\n"
            "while time.process_time() - t < 0.3: pass\ntime.sleep(30)",
        ]
    )
    try:
        deadline = datetime.now(UTC) + timedelta(seconds=20)
        while idle.tree_cpu(os.getpid())[0] < 0.3 and datetime.now(UTC) < deadline:
            pass
        assert child.pid in idle.tree_pids(os.getpid())
        cpu, count = idle.tree_cpu(os.getpid())
        assert cpu >= 0.3 and count >= 2
    finally:
        child.kill()
        child.wait()


def test_a_window_that_would_reach_midnight_waits_for_it_to_pass():
    evening = datetime(2026, 12, 1, 23, 50, tzinfo=UTC)
    assert idle.wait_out_slot_boundary(timedelta(minutes=5), now=evening) == 0.0
    assert idle.wait_out_slot_boundary(timedelta(minutes=15), now=evening) == 605.0
    assert drain.wait_out_slot_boundary is idle.wait_out_slot_boundary  # one rule for both


def test_idle_rows_give_each_location_against_the_bare_one_of_its_pair():
    pairs = [
        [
            Sample("bare", 3.0, 100.0, 5),
            Sample("main", 9.0, 100.0, 5),
            Sample("branch", 3.6, 100.0, 5),
        ]
    ]
    bare, main, branch = idle.rows(pairs, 100.0)
    assert (bare.value, bare.ratio) == (3.0, None)
    assert (main.value, main.ratio, main.met) == (9.0, 3.0, False)
    assert (branch.ratio, branch.met) == (1.2, True)  # the target is <= 1.3x
    assert "(branch)" in branch.measurement
    Row.from_json(branch.__dict__, "idle")  # what bench/run.py reads back


def test_drain_rows_are_runs_per_minute_with_a_check_on_failed_runs():
    pairs = [[Drain("bare", 10, 10, 60.0), Drain("dueledger", 10, 9, 120.0)]]
    bare, ours, failed = drain.rows(pairs, 10, "sqlite")
    assert (bare.value, ours.value, ours.ratio, ours.met) == (10.0, 5.0, 0.5, False)
    assert ours.measurement.endswith("dueledger task jobs")
    assert (failed.value, failed.met, failed.kind) == (1, False, KIND_CHECK)


def test_the_drain_instance_is_the_deploy_config_with_its_storage_swapped():
    config = drain.instance_config(None)
    assert "storage" not in config
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    assert config["run_coordinator"]["config"]["dequeue_interval_seconds"] == 1
    assert config["code_servers"] == {"local_startup_timeout": 600}
    pg = drain.instance_config({"postgres": {"postgres_url": "postgresql://x"}})
    assert pg["storage"] == {"postgres": {"postgres_url": "postgresql://x"}}
    assert pg["concurrency"] == config["concurrency"]


def test_drain_tasks_are_manually_launchable_ones_and_name_the_row():
    assert drain.parse_tasks("ledger_health, order_cleanup") == ["ledger_health", "order_cleanup"]
    with pytest.raises(argparse.ArgumentTypeError, match="tick_every_slot"):
        drain.parse_tasks("tick_every_slot")  # not manually launchable
    workload = drain.dueledger_workload("dueledger", drain._paths.ROOT, ["ledger_health"])
    assert [job for job, _ in workload.jobs] == ["ledger_health_job"]
    pairs = [[Drain("bare", 10, 10, 60.0, 20.0, 1.0), Drain("dueledger", 10, 10, 60.0)]]
    _, ours, _ = drain.rows(pairs, 10, "sqlite", ["ledger_health"])
    assert ours.measurement.endswith("dueledger task jobs of ledger_health")
