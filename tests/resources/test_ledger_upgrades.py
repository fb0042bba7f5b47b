"""Upgrade safety: a ledger written by the code of every schema revision so far, upgraded by
today's code, keeps every row and every JSON shape `runs show` printed.

The golden databases (tests/fixtures/ledger_golden/, made by ``make_golden.py`` there with the
code of the commit that added each revision) are a SQLite file and a plain-SQL PostgreSQL
dump per revision, plus what the old code said about each entry and audit record. Each is
loaded, its rows read raw, upgraded with ``RunLedger.migrate()``, and then:

- every table keeps every row, every old column with its old value (new columns take their
  defaults), and the version is today's head;
- `runs show --json` (in process for every entry; through the console script for the oldest
  golden) shows every field the old code's entry JSON had, with the same value, and the same
  audit records;
- today's code goes on from there: the live lease left running is reclaimed, the queued
  backfill entry is claimed with a fencing token, `summary` counts what the rows say.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from pg_server import PgServer

from orchestration.cli import main as dueledger
from orchestration.reclaim import reclaim_expired
from resources.core.entry import FailureKind, Status, Trigger
from resources.ledger import RunLedger
from resources.ledger.migrate import migration_head
from resources.ledger.schema import VERSION_TABLE

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "ledger_golden"
VERSIONS = Path(__file__).resolve().parents[2] / "resources" / "ledger" / "migrations" / "versions"
REVISIONS = sorted(p.stem for p in VERSIONS.glob("[0-9]*.py"))
CLI = Path(sys.executable).with_name("dueledger")
#: The golden story's instants end before this; "now" for today's code afterwards.
AFTER = datetime(2026, 12, 1, 1, 0, tzinfo=UTC)


def test_every_schema_revision_has_its_golden_databases() -> None:
    for revision in REVISIONS:
        for suffix in (".sqlite", ".sql", ".json"):
            assert (GOLDEN / f"{revision}{suffix}").is_file(), (
                f"no golden {revision}{suffix}: add the revision and its commit to REVISIONS in "
                f"tests/fixtures/ledger_golden/make_golden.py and run it (see its docstring)"
            )


def _load_postgres(server: PgServer, revision: str) -> tuple[str, str]:
    name = f"golden_{uuid.uuid4().hex[:12]}"
    url = server.create_database(name)
    conn = psycopg2.connect(server.dsn(name))
    try:
        conn.autocommit = True
        with conn.cursor() as cursor:
            cursor.execute((GOLDEN / f"{revision}.sql").read_text())
    finally:
        conn.close()
    return name, url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=REVISIONS)
def golden(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path
) -> Iterator[tuple[str, str]]:
    """(revision, URL) of a copy of that revision's golden ledger on ``backend``."""
    revision = str(request.param)
    if backend == "sqlite":
        path = tmp_path / "ledger.sqlite"
        shutil.copyfile(GOLDEN / f"{revision}.sqlite", path)
        yield revision, f"sqlite:///{path}"
        return
    server: PgServer = request.getfixturevalue("pg_server")
    name, url = _load_postgres(server, revision)
    yield revision, url
    server.drop_database(name)


def _rows(url: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table, as plain values, in primary-key order."""
    engine = sa.create_engine(url)
    try:
        meta = sa.MetaData()
        meta.reflect(engine)
        with engine.connect() as conn:
            return {
                name: [
                    dict(row)
                    for row in conn.execute(
                        sa.select(table).order_by(*table.primary_key.columns)
                    ).mappings()
                ]
                for name, table in meta.tables.items()
            }
    finally:
        engine.dispose()


def _contains(new: Any, old: Any, where: str) -> list[str]:
    """Where ``new`` lost or changed something ``old`` had (dicts may gain keys)."""
    if isinstance(old, dict):
        if not isinstance(new, dict):
            return [f"{where}: {new!r} is no longer an object"]
        return [
            p for k, v in old.items() for p in _contains(new.get(k, _MISSING), v, f"{where}.{k}")
        ]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [
            p
            for i, (n, o) in enumerate(zip(new, old, strict=True))
            for p in _contains(n, o, f"{where}[{i}]")
        ]
    return [] if new == old else [f"{where}: {old!r} became {new!r}"]


_MISSING = object()


def _show(entry_id: int) -> dict[str, Any]:
    result = CliRunner().invoke(dueledger, ["runs", "show", str(entry_id), "--json"])
    assert result.exit_code == 0, result.output
    shown: dict[str, Any] = json.loads(result.output)
    return shown


def test_an_upgrade_keeps_every_row_and_every_runs_show_shape(
    golden: tuple[str, str], backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    revision, url = golden
    said = json.loads((GOLDEN / f"{revision}.json").read_text())[
        "postgresql" if backend == "postgres" else "sqlite"
    ]
    before = _rows(url)
    assert before[VERSION_TABLE] == [{"version_num": revision}]
    assert len(before["dueledger_entries"]) == len(said["entries"]) >= 9

    ledger = RunLedger(database_url=url)
    ledger.migrate()
    after = _rows(url)
    assert after[VERSION_TABLE] == [{"version_num": migration_head()}]
    for table, rows in before.items():
        if table == VERSION_TABLE:
            continue
        assert len(after[table]) == len(rows), (
            f"{table}: {len(rows)} rows became {len(after[table])}"
        )
        for old, new in zip(rows, after[table], strict=True):
            assert {k: new[k] for k in old} == old, f"{table} row changed by the upgrade"
    if "claim_generation" not in before["dueledger_entries"][0]:
        # 0003 added the fencing token: rows from before start at 0 (docs/deployment.md).
        assert {row["claim_generation"] for row in after["dueledger_entries"]} == {0}

    monkeypatch.setenv("DUELEDGER_DATABASE_URL", url)
    for entry_id, old_json in said["entries"].items():
        shown = _show(int(entry_id))
        assert not _contains(shown, old_json, f"entry {entry_id}"), _contains(
            shown, old_json, f"entry {entry_id}"
        )
        assert not _contains(shown["audit"], said["audit"][entry_id], f"audit of {entry_id}")
    shape = _show(1)
    children = [e for e in said["entries"].values() if e["parent_id"] is not None]
    assert children and _show(children[0]["parent_id"])["children"][0]["id"] == children[0]["id"]
    assert {"children", "audit", "attempts", "claim_generation"} <= set(shape)

    # Today's code carries on from the old rows.
    reclaimed = reclaim_expired(ledger, now=AFTER)
    assert [(e.status, e.failure_kind) for e in reclaimed] == [
        (Status.FAILED, FailureKind.LEASE_RECLAIMED)
    ]
    (backfill,) = [e for e in ledger.list_entries(limit=50)[0] if e.trigger == Trigger.BACKFILL]
    claim = ledger.claim(
        backfill.id, "run-after-upgrade", lease_ttl=timedelta(minutes=5), now=AFTER
    )
    assert (
        claim.claimed
        and claim.fence is not None
        and claim.fence.token == backfill.claim_generation + 1
    )
    counts = ledger.summary_counts(now=AFTER, window=timedelta(days=2))
    assert (
        counts["failed_window"]
        == sum(e["status"] == "failed" for e in said["entries"].values()) + 1
    )
    ledger.dispose()


@pytest.mark.parametrize(
    "backend_name", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_the_console_script_shows_the_oldest_golden_after_the_upgrade(
    backend_name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    revision = REVISIONS[0]
    said = json.loads((GOLDEN / f"{revision}.json").read_text())[
        "postgresql" if backend_name == "postgres" else "sqlite"
    ]
    if backend_name == "sqlite":
        path = tmp_path / "ledger.sqlite"
        shutil.copyfile(GOLDEN / f"{revision}.sqlite", path)
        url, cleanup = f"sqlite:///{path}", None
    else:
        server: PgServer = request.getfixturevalue("pg_server")
        name, url = _load_postgres(server, revision)
        cleanup = (server, name)
    try:
        env = {**os.environ, "DUELEDGER_DATABASE_URL": url}
        # The CLI migrates on first use, as the documented upgrade path does.
        result = subprocess.run(
            [str(CLI), "runs", "list", "--json", "--limit", "500"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        listed = {str(e["id"]): e for e in json.loads(result.stdout)["entries"]}
        assert set(listed) == set(said["entries"])
        for entry_id, old_json in said["entries"].items():
            assert not _contains(listed[entry_id], old_json, f"entry {entry_id}")
    finally:
        if cleanup is not None:
            cleanup[0].drop_database(cleanup[1])
