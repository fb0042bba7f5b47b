"""Rolling upgrades: workers of an older dueledger and of today's share one ledger.

During a rolling upgrade the schema is already at today's head (today's code migrates it on
first use) while workers of the previous release still claim and finish runs. Two halves:

- **the previous revision's code against today's schema**: a worker of the code whose newest
  revision is the one before today's head (and, on PostgreSQL, the very first ledger code),
  exported with ``git archive`` and run as its own process (old_ledger_worker.py), claims,
  heartbeats, commits a fenced effect, succeeds, is refused as a duplicate, fails an attempt,
  leaves a lease running and reclaims an expired lease of today's worker; today's code then
  claims the retry, reclaims the old lease, and every entry reads back whole. The old code's
  own ``migrate()`` refuses the newer schema ("deploy the dueledger version that migrated
  it"): with those releases, a worker that migrates at start fails before it claims (a
  dispatch failure, re-dispatched in its slot; docs/deployment.md says how to roll them);
- **today's code against a newer schema**: a database some later release migrated further
  (a column, a table, a higher revision number) is left as it is by today's ``migrate()``,
  and today's worker does its whole job on it -- so from this release on, the next rolling
  upgrade needs no such care. An unknown revision that is not newer is still refused.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from orchestration.reclaim import reclaim_expired
from resources.core.entry import FailureKind, Status, Trigger, dedup_key_for_due
from resources.effects import effect_transaction
from resources.ledger import LedgerError, RunLedger
from resources.ledger.guard import LedgerGuard
from resources.ledger.migrate import migration_head

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "old_ledger_worker.py"
#: The last commit before revision 0004 landed (its head is 0003: the previous revision), and
#: the commit of the first ledger code (head 0002).
PREVIOUS = "01c37107d15c4e635fa07d619db457a7bb0d5353"
FIRST = "7466b9c5f61fbee9167bc5680effe7475ddf821d"
D0 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
TTL = timedelta(minutes=5)


def _export(commit: str, into: Path) -> Path:
    """The code of ``commit`` (git archive), as an old release's image would hold it."""
    result = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], capture_output=True, timeout=120
    )
    assert result.returncode == 0, (
        f"cannot export commit {commit} ({result.stderr.decode().strip()}): the rolling-upgrade "
        "test needs the repository's history (a full clone, not a shallow one)"
    )
    with tarfile.open(fileobj=io.BytesIO(result.stdout)) as archive:
        archive.extractall(into, filter="data")
    return into


@pytest.fixture(scope="module")
def old_code(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        name: _export(commit, tmp_path_factory.mktemp(name))
        for name, commit in (("previous", PREVIOUS), ("first", FIRST))
    }


def _run_old_worker(code: Path, url: str) -> dict[str, object]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(code), "DAGSTER_HOME": str(code)}
    result = subprocess.run(
        [sys.executable, str(WORKER), url],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    said: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(str(said["code"])) == code.resolve(), "the old worker ran today's code"
    return said


@pytest.mark.parametrize(
    ("release", "backend"),
    [
        ("previous", "sqlite"),
        pytest.param("previous", "postgres", marks=pytest.mark.postgres),
        pytest.param("first", "postgres", marks=pytest.mark.postgres),
    ],
)
def test_a_worker_of_an_older_release_claims_and_finishes_on_todays_schema(
    release: str, backend: str, old_code: dict[str, Path], request: pytest.FixtureRequest
) -> None:
    url: str = request.getfixturevalue(f"{backend}_url")
    today = RunLedger(database_url=url)
    today.migrate()
    e3 = today.ensure_entry(
        task_key="order_cleanup",
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(D0 + timedelta(minutes=30)),
        now=D0,
    )
    assert today.claim(e3.id, "new-1", lease_ttl=TTL, now=D0).claimed

    said = _run_old_worker(old_code[release], url)

    assert "deploy the dueledger version that migrated it" in str(said["migrate"]), said
    assert migration_head() in str(said["migrate"])
    assert said["claimed"] and said["heartbeat"] and said["succeeded"], said
    assert said["duplicate_refused"] and said["left_running"], said
    assert said["fenced_effect"] in ("committed", "no fencing in this code"), said
    assert said["failed_to"] == Status.RETRYING, said
    assert said["reclaimed"] == [e3.dedup_key], said  # today's expired lease, by the old code

    entries: dict[str, int] = said["entries"]  # type: ignore[assignment]
    e1, e2, e4 = (today.get(entries[k]) for k in sorted(entries))
    assert e1 is not None and e1.status == Status.SUCCESS and e1.run_ids == ("old-1",)
    assert e1.summary["late_job_rejections"][0]["run_id"] == "old-2"
    retry = today.claim(e2.id, "new-2", lease_ttl=TTL, now=D0 + timedelta(minutes=40))
    assert retry.claimed and retry.entry.attempt == 2
    assert retry.fence is not None and retry.fence.token == retry.entry.claim_generation
    assert today.succeed(e2.id, "new-2", now=D0 + timedelta(minutes=41))
    (reclaimed,) = reclaim_expired(today, now=D0 + timedelta(hours=1))
    assert (reclaimed.id, reclaimed.failure_kind) == (e4.id, FailureKind.LEASE_RECLAIMED)
    after = today.get(e3.id)
    assert after is not None and after.failure_kind == FailureKind.LEASE_RECLAIMED
    assert {e.status for e in today.list_entries(limit=10)[0]} == {
        Status.SUCCESS,
        Status.FAILED,
    }
    today.dispose()


@pytest.fixture
def newer_schema(ledger_url: str) -> Iterator[str]:
    """Today's head, then what a later release might add: a column, a table, revision 0099."""
    RunLedger(database_url=ledger_url).migrate()
    engine = sa.create_engine(ledger_url)
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE dueledger_entries ADD COLUMN tenant VARCHAR(64)"))
        conn.execute(sa.text("CREATE TABLE dueledger_future (id INTEGER PRIMARY KEY)"))
        conn.execute(sa.text("UPDATE dueledger_alembic_version SET version_num = '0099_future'"))
    engine.dispose()
    yield ledger_url


def test_todays_worker_carries_on_against_a_newer_releases_schema(newer_schema: str) -> None:
    ledger = RunLedger(database_url=newer_schema)
    ledger.migrate()  # a newer revision: left alone, no error
    entry = ledger.ensure_entry(
        task_key="order_cleanup",
        trigger=Trigger.SCHEDULE,
        dedup_key=dedup_key_for_due(D0),
        now=D0,
    )
    claim = ledger.claim(entry.id, "run-a", lease_ttl=TTL, now=D0)
    assert claim.claimed and claim.fence is not None
    assert ledger.heartbeat(entry.id, "run-a", lease_ttl=TTL, now=D0 + timedelta(minutes=1))
    engine = sa.create_engine(newer_schema)
    table = sa.Table("rolling_effects", sa.MetaData(), sa.Column("what", sa.String(50)))
    table.create(engine)
    with effect_transaction(engine, LedgerGuard(ledger, claim.fence), "effect") as conn:
        conn.execute(sa.insert(table).values(what="done"))
    assert ledger.succeed(entry.id, "run-a", now=D0 + timedelta(minutes=2))
    with engine.connect() as conn:
        version = conn.execute(sa.text("SELECT version_num FROM dueledger_alembic_version")).all()
        assert version == [("0099_future",)]
    engine.dispose()
    ledger.dispose()


def test_an_unknown_revision_that_is_not_newer_is_still_refused(ledger_url: str) -> None:
    RunLedger(database_url=ledger_url).migrate()
    engine = sa.create_engine(ledger_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE dueledger_alembic_version SET version_num = 'hand_made'"))
    engine.dispose()
    with pytest.raises(LedgerError, match="deploy the dueledger version that migrated it"):
        RunLedger(database_url=ledger_url).migrate()
