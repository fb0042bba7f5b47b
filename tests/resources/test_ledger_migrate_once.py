"""Migrations run once per process and database, at resource set-up, not on every use.

Regression: ``migrate()`` used to run at the start of every task run and every sensor tick
(a version-table read each time, an advisory lock when behind). The spy wraps the package's
own migration function and counts how often its body runs; the database is real.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import pytest

from resources.ledger import RunLedger
from resources.ledger import migrate as migrations
from resources.ledger.engine import Runtime

REPEATS = 3
THREADS = 8


@pytest.fixture
def upgrade_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The process ids of every run of the migration function's body, in order."""
    calls: list[int] = []
    real: Callable[[Runtime], None] = migrations.upgrade

    def spy(runtime: Runtime) -> None:
        calls.append(os.getpid())
        real(runtime)

    monkeypatch.setattr(migrations, "upgrade", spy)
    return calls


@dg.asset
def uses_the_ledger(ledger: RunLedger) -> int:
    return len(ledger.list_entries()[0])


@dg.sensor(asset_selection=[uses_the_ledger])
def watches_the_ledger(context: dg.SensorEvaluationContext, ledger: RunLedger) -> dg.SkipReason:
    return dg.SkipReason(f"{ledger.summary_counts()['queued']} queued")


def test_a_fresh_ledger_is_migrated_once_however_often_runs_and_ticks_use_it(
    sqlite_url: str, upgrade_calls: list[int]
) -> None:
    for _ in range(REPEATS):  # daemon sensor ticks: the first one meets an empty database
        with dg.build_sensor_context(resources={"ledger": RunLedger(database_url=sqlite_url)}) as c:
            assert watches_the_ledger(c).skip_message == "0 queued"
    for _ in range(REPEATS):  # task runs
        resources = {"ledger": RunLedger(database_url=sqlite_url)}
        assert dg.materialize([uses_the_ledger], resources=resources).success
    for _ in range(REPEATS):  # CLI commands and other hand-built ledgers
        RunLedger(database_url=sqlite_url).ensure_migrated()
    assert upgrade_calls == [os.getpid()]


def test_each_database_is_migrated_once(
    sqlite_url: str, tmp_path: Path, upgrade_calls: list[int]
) -> None:
    other_url = f"sqlite:///{tmp_path / 'other.sqlite'}"
    for _ in range(REPEATS):
        for url in (sqlite_url, other_url):
            ledger = RunLedger(database_url=url)
            ledger.ensure_migrated()
            assert ledger.get(1) is None
            ledger.dispose()
    assert len(upgrade_calls) == 2


def test_threads_racing_to_first_use_migrate_once(
    sqlite_url: str, upgrade_calls: list[int]
) -> None:
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def first_use() -> None:
        ledger = RunLedger(database_url=sqlite_url)
        barrier.wait(timeout=30)
        try:
            ledger.ensure_migrated()
            assert ledger.get(1) is None
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)
        finally:
            ledger.dispose()

    threads = [threading.Thread(target=first_use) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(upgrade_calls) == 1


def test_an_explicit_migrate_counts_and_still_checks_every_time(
    sqlite_url: str, upgrade_calls: list[int]
) -> None:
    ledger = RunLedger(database_url=sqlite_url)
    ledger.migrate()
    ledger.ensure_migrated()
    ledger.migrate()
    ledger.dispose()
    assert len(upgrade_calls) == 2


def test_a_forked_child_checks_once_for_itself(sqlite_url: str, upgrade_calls: list[int]) -> None:
    ledger = RunLedger(database_url=sqlite_url)
    ledger.ensure_migrated()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report how often it ran the migration, then leave at once
        code = 1
        try:
            for _ in range(REPEATS):
                RunLedger(database_url=sqlite_url).ensure_migrated()
            mine = sum(1 for p in upgrade_calls if p == os.getpid())
            os.write(write_end, str(mine).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    reported = os.read(read_end, 100).decode()
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    ledger.dispose()
    assert os.waitstatus_to_exitcode(status) == 0
    assert reported == "1"
    assert upgrade_calls == [os.getpid()]
