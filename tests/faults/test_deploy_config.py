"""deploy/dagster.yaml really works: Dagster on PostgreSQL, and the ledger migrates there too."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from pg_server import PgServer

from resources.ledger import RunLedger

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_YAML = ROOT / "deploy" / "dagster.yaml"


@pytest.fixture
def deploy_home(tmp_path: Path, pg_server: PgServer, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A DAGSTER_HOME holding deploy/dagster.yaml, its env vars pointing at a fresh database."""
    db = f"dagster_{uuid.uuid4().hex[:12]}"
    pg_server.create_database(db)
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copyfile(DEPLOY_YAML, home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("DAGSTER_PG_USERNAME", pg_server.superuser)
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", "")  # the throwaway server trusts local users
    monkeypatch.setenv("DAGSTER_PG_HOST", pg_server.host)
    monkeypatch.setenv("DAGSTER_PG_DB", db)
    monkeypatch.setenv("DAGSTER_PG_PORT", str(pg_server.port))
    return home


def test_the_deploy_config_stores_runs_in_postgres(deploy_home: Path, pg_server: PgServer) -> None:
    with dg.DagsterInstance.get() as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
        # The daemon reads the queue's limits from the instance's `concurrency` block.
        concurrency = instance.get_concurrency_config()
        assert concurrency.run_queue_config is not None
        # No tag limit on dueledger/task: skip, buffer_one and replace tasks need a second run
        # to start so the ledger decides it; queue tasks wait in their pools.
        assert not concurrency.run_queue_config.tag_concurrency_limits
        # One run per task pool whatever tags a run carries (UI launches, backfills).
        assert concurrency.pool_config.default_pool_limit == 1
        assert concurrency.pool_config.pool_granularity is not None
        assert concurrency.pool_config.pool_granularity.value == "run"
        assert instance.run_monitoring_enabled
        assert instance.run_retries_enabled
        assert instance.run_retries_max_retries == 0

        run = instance.create_run_for_job(
            dg.GraphDefinition(name="noop", node_defs=[]).to_job(name="noop"),
            tags={"dueledger/task": "noop"},
        )
        stored = instance.get_runs(dg.RunsFilter(tags={"dueledger/task": "noop"}))
        assert [r.run_id for r in stored] == [run.run_id]

    # The rows are in PostgreSQL, not in a SQLite file under DAGSTER_HOME.
    engine = sa.create_engine(pg_server.url(os.environ["DAGSTER_PG_DB"]))
    try:
        with engine.connect() as conn:
            count = conn.execute(
                sa.text("SELECT count(*) FROM runs WHERE run_id = :id"), {"id": run.run_id}
            ).scalar_one()
    finally:
        engine.dispose()
    assert count == 1
    assert not list(deploy_home.glob("**/*.db"))


def test_the_documented_ledger_migration_one_liner_works(postgres_url: str) -> None:
    env = {**os.environ, "DUELEDGER_DATABASE_URL": postgres_url}
    command = "from resources.ledger import RunLedger; RunLedger().migrate()"
    done = subprocess.run(
        [sys.executable, "-c", command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    ledger = RunLedger(database_url=postgres_url)
    try:
        assert ledger.list_entries() == ([], None)  # the tables exist, empty
        ledger.migrate()  # and a second run is a no-op
    finally:
        ledger.dispose()
