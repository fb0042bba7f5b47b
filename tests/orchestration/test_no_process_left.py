"""A run leaves no process behind, however it ends -- the ledger's refusal included.

Dagster mirrors a run's output with `tail -F` processes and stops them with SIGTERM when the
run ends. A suite started in the background inherits SIGINT ignored, and Dagster maps SIGTERM
onto SIGINT's handler, so without ``tests/conftest.py`` restoring the defaults those mirrors
ignored SIGTERM: each run's end waited 30 s for them, and dozens outlived the suite.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
from hook_support import build

from resources.core import tags as t
from resources.core.due import format_due
from resources.core.entry import Status, Trigger
from resources.ledger import RunLedger

DUE = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
TASK = "tick_every_slot"


def _processes_naming(path: Path) -> list[str]:
    """The command lines of live processes that mention ``path``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # ended meanwhile
        if str(path) in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


def test_the_suite_does_not_hand_an_ignored_sigterm_to_what_it_starts():
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN


def test_a_run_the_ledger_refuses_leaves_no_process_behind(tmp_path: Path, ledger: RunLedger):
    asset = build(TASK)
    tags = {
        t.TAG_TASK: TASK,
        t.TAG_TRIGGER: Trigger.SCHEDULE.value,
        t.TAG_DUE: format_due(DUE),
        t.DAGSTER_SCHEDULE_NAME: f"{TASK}_schedule",
    }
    home = tmp_path / "instance"
    home.mkdir()
    # What Dagster does in every daemon and run worker (and so in this process once a daemon
    # test ran): SIGTERM takes SIGINT's handler. The runs execute off the main thread, as the
    # daemon tests execute theirs: there Dagster cannot swap the handlers for its own, so
    # what the runs start inherits this process's.
    term = signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGINT))
    ran: list[tuple[dg.ExecuteInProcessResult, dg.DagsterRun | None]] = []
    try:
        worker = threading.Thread(
            target=lambda: ran.append(_refused_twice(asset, tags, home, ledger))
        )
        worker.start()
        worker.join(timeout=300)
    finally:
        signal.signal(signal.SIGTERM, term)
    assert ran, "the runs did not end within 300 s"
    ((first, refused),) = ran
    assert first.success
    assert refused is not None and refused.status == dg.DagsterRunStatus.CANCELED
    assert refused.tags.get(t.TAG_OUTCOME) == t.OUTCOME_REFUSED
    (entry,) = ledger.list_entries(limit=5)[0]
    assert entry.status == Status.SUCCESS
    # Dagster has stopped the runs' mirrors by the time a run ends; a short grace for the
    # processes to be reaped.
    deadline = time.monotonic() + 10
    while (left := _processes_naming(home)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == []


def _refused_twice(
    asset: dg.AssetsDefinition, tags: dict[str, str], home: Path, ledger: RunLedger
) -> tuple[dg.ExecuteInProcessResult, dg.DagsterRun | None]:
    """Materialize one due twice: the run, then the ledger's refusal of the duplicate."""
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        first = dg.materialize([asset], resources={"ledger": ledger}, instance=instance, tags=tags)
        again = dg.materialize(
            [asset],
            resources={"ledger": ledger},
            instance=instance,
            tags=tags,
            raise_on_error=False,
        )
        return first, instance.get_run_by_id(again.run_id)
