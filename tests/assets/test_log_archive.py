"""Log archive: old automation and notification logs move to verified gzip CSV files; the
run ledger -- here deliberately in the SAME database as the logs -- is left untouched."""

from __future__ import annotations

import gzip
import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa
from fence_support import lost_guard, refusals
from hook_support import build
from run_support import scheduled

from assets.domain_config import DomainRules
from assets.logs.archive import (
    ArchivedLog,
    ArchiveVerificationError,
    archive_log,
    verify_archive,
    write_archive,
)
from orchestration.declarations import registered_tasks
from resources.core import tags as t
from resources.core.due import format_due
from resources.core.entry import Trigger
from resources.core.fence import FenceLost
from resources.idempotency import create_domain_schema
from resources.ledger import RunLedger
from resources.source_schema import automation_log
from resources.source_store import SourceStore, create_schema

# The code location's assets, built with this environment's plugin hooks.
log_archive = build("log_archive")


def read_archive(path: Path) -> pd.DataFrame:
    """An archive file as a DataFrame (what an auditor would do: `pd.read_csv(path)`)."""
    return pd.read_csv(path, compression="gzip")


DUE = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
NAIVE = DUE.replace(tzinfo=None)
DAY = timedelta(days=1)
LEDGER_TABLES = ("dueledger_entries", "dueledger_audit", "dueledger_alembic_version")


def log_rows(ids_and_ages: list[tuple[int, timedelta]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": [i for i, _ in ids_and_ages],
            "at": [NAIVE - age for _, age in ids_and_ages],
            "task_key": "order_cleanup",
            "entry_key": "1:due:2026-08-01T00:00:00Z",
            "action": "cancel",
            "object_type": "order",
            "object_id": [100 + i for i, _ in ids_and_ages],
            "detail": '{"from": "pending", "to": "cancelled"}',
        }
    )


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def shared_url(request, tmp_path) -> str:
    """One database holding BOTH the source store and the run ledger."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.sqlite'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


def ledger_snapshot(engine: sa.Engine) -> dict[str, pd.DataFrame]:
    return {name: pd.read_sql(f"SELECT * FROM {name} ORDER BY 1", engine) for name in LEDGER_TABLES}


def test_old_logs_are_archived_verified_and_deleted_and_the_ledger_is_untouched(
    shared_url, tmp_path
):
    source = SourceStore(url=shared_url)
    ledger = RunLedger(database_url=shared_url)
    engine = source.engine()
    create_schema(engine)
    create_domain_schema(engine)
    ledger.migrate()
    # Ledger history older than the retention: it must survive the archive run.
    old = DUE - 200 * DAY
    for n in range(3):
        entry = ledger.ensure_entry(
            task_key="order_cleanup",
            trigger="schedule",
            dedup_key=f"due:{format_due(old + n * timedelta(minutes=15))}",
            now=old,
        )
        ledger.claim(entry.id, f"run-{n}", lease_ttl=timedelta(minutes=5), now=old)
        ledger.succeed(entry.id, f"run-{n}", now=old)
    old_ids = [1, 2, 3, 4, 5]
    logs = log_rows(
        [(i, 100 * DAY) for i in old_ids]
        + [(6, 90 * DAY), (7, 89 * DAY), (8, DAY)]  # exactly at the cutoff: kept
    )
    logs.to_sql("automation_log", engine, if_exists="append", index=False)
    effects = pd.DataFrame(
        {
            "id": [1, 2],
            "rule": "invoice_overdue_reminder",
            "object_type": "invoice",
            "object_id": [1, 2],
            "time_point": [NAIVE - 120 * DAY, NAIVE - 2 * DAY],
            "channel": "email",
            "status": "succeeded",
            "attempts": 1,
            "task_key": "billing_maintenance",
            "entry_key": "x",
            "first_at": [NAIVE - 120 * DAY, NAIVE - 2 * DAY],
            "last_at": [NAIVE - 120 * DAY, NAIVE - 2 * DAY],
        }
    )
    effects.to_sql("side_effects", engine, if_exists="append", index=False)
    pd.DataFrame(
        {
            "id": [1, 2],
            "effect_id": [1, 2],
            "created_at": [NAIVE - 120 * DAY, NAIVE - 2 * DAY],
            "task_key": "billing_maintenance",
            "entry_key": "x",
            "rule": "invoice_overdue_reminder",
            "channel": "email",
            "customer_id": 1,
            "recipient": "ada@example.org",
            "subject": "Reminder, with a comma",
            "body": 'Line one\nline two, "quoted"',
            "status": "pending",
        }
    ).to_sql("notification_outbox", engine, if_exists="append", index=False)
    before = ledger_snapshot(engine)

    archive_dir = tmp_path / "archives"
    rules = DomainRules(archive_dir=str(archive_dir), archive_batch_rows=2)
    tags = scheduled(
        {
            t.TAG_TASK: "log_archive",
            t.TAG_TRIGGER: Trigger.SCHEDULE.value,
            t.TAG_DUE: format_due(DUE),
        }
    )
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [log_archive],
            resources={"source": source, "ledger": ledger, "rules": rules},
            instance=instance,
            tags=tags,
        )
    (mat,) = result.asset_materializations_for_node("log_archive")
    assert mat.metadata["automation_log/archived"].value == 5
    assert mat.metadata["notification_outbox/archived"].value == 1
    assert mat.metadata["files"].value == 4  # 2 + 2 + 1 automation_log rows, 1 outbox row

    # The logs: exactly the old rows are gone.
    kept = pd.read_sql("SELECT id FROM automation_log ORDER BY id", engine)["id"].tolist()
    assert kept == [6, 7, 8]
    assert pd.read_sql("SELECT id FROM notification_outbox", engine)["id"].tolist() == [2]
    # The idempotency log is not a log to archive: it keeps old reminders from resending.
    assert len(pd.read_sql("SELECT id FROM side_effects", engine)) == 2

    # The archives: readable with plain pandas, the same rows, hashes as recorded.
    manifest = pd.read_sql("SELECT * FROM log_archives ORDER BY id", engine)
    assert manifest["table_name"].tolist() == ["automation_log"] * 3 + ["notification_outbox"]
    assert (manifest["rows"] == manifest["deleted"]).all()
    archived = pd.concat([read_archive(Path(p)) for p in manifest["path"][:3]], ignore_index=True)
    assert archived["id"].tolist() == old_ids
    assert archived["object_id"].tolist() == [101, 102, 103, 104, 105]
    assert (archived["detail"] == '{"from": "pending", "to": "cancelled"}').all()
    outbox_archive = read_archive(Path(manifest["path"][3]))
    assert outbox_archive.loc[0, "body"] == 'Line one\nline two, "quoted"'
    for path, digest in zip(manifest["path"], manifest["sha256"], strict=True):
        assert Path(path).parent.parent == archive_dir
        assert hashlib.sha256(gzip.decompress(Path(path).read_bytes())).hexdigest() == digest

    # The ledger: every row as it was, plus only the archive run's own entry.
    after = ledger_snapshot(engine)
    for name in ("dueledger_audit", "dueledger_alembic_version"):
        pd.testing.assert_frame_equal(after[name], before[name])
    entries = after["dueledger_entries"]
    others = entries.loc[entries["task_key"] != "log_archive"].reset_index(drop=True)
    pd.testing.assert_frame_equal(others, before["dueledger_entries"])
    assert entries.loc[entries["task_key"] == "log_archive", "status"].tolist() == ["success"]
    source.engine().dispose()
    ledger.dispose()


def test_the_next_days_run_archives_only_what_has_aged_since(tmp_path):
    source = SourceStore(url=f"sqlite:///{tmp_path / 'source.sqlite'}")
    ledger = RunLedger(database_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    create_schema(source.engine())
    log_rows([(1, 100 * DAY), (2, 90 * DAY + timedelta(hours=12)), (3, DAY)]).to_sql(
        "automation_log", source.engine(), if_exists="append", index=False
    )
    rules = DomainRules(archive_dir=str(tmp_path / "archives"))
    archived = []
    with dg.instance_for_test() as instance:
        for due in (DUE - DAY, DUE, DUE + DAY):
            tags = scheduled(
                {
                    t.TAG_TASK: "log_archive",
                    t.TAG_TRIGGER: Trigger.SCHEDULE.value,
                    t.TAG_DUE: format_due(due),
                }
            )
            result = dg.materialize(
                [log_archive],
                resources={"source": source, "ledger": ledger, "rules": rules},
                instance=instance,
                tags=tags,
            )
            (mat,) = result.asset_materializations_for_node("log_archive")
            archived.append(mat.metadata["archived_rows"].value)
    assert archived == [1, 1, 0]
    assert pd.read_sql("SELECT id FROM automation_log", source.engine())["id"].tolist() == [3]
    source.engine().dispose()


def test_an_archive_file_is_never_overwritten(tmp_path):
    frame = log_rows([(1, 100 * DAY)])
    path = tmp_path / "a.csv.gz"
    first = write_archive(frame, path)
    with pytest.raises(FileExistsError):
        write_archive(log_rows([(2, 100 * DAY)]), path)
    assert read_archive(path)["id"].tolist() == [1]
    verify_archive(first, np.array([1]))


def test_a_tampered_archive_fails_verification(tmp_path):
    archive = write_archive(log_rows([(1, 100 * DAY), (2, 100 * DAY)]), tmp_path / "a.csv.gz")
    with pytest.raises(ArchiveVerificationError, match="ids"):
        verify_archive(archive, np.array([1, 3]))
    archive.path.write_bytes(gzip.compress(b"id\n1\n"))
    with pytest.raises(ArchiveVerificationError, match="sha256"):
        verify_archive(archive, np.array([1, 2]))


def test_log_archive_is_daily_at_two_and_not_manually_triggerable():
    (spec,) = [s for s in registered_tasks() if s.key == "log_archive"]
    assert spec.manual_trigger is False
    assert spec.rule.describe() == "cron '0 2 * * *'"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"log_retention_days": 0}, "log_retention_days"),
        ({"archive_format": "parquet"}, "pyarrow"),
        ({"archive_batch_rows": 0}, "batch_rows"),
    ],
)
def test_bad_archive_configuration_fails_at_load(fields, message):
    with pytest.raises(ValueError, match=message):
        DomainRules(**fields)


def test_a_run_that_lost_its_lease_deletes_nothing_and_leaves_no_archive_file(tmp_path):
    # A worker paused past its lease used to delete rows after the reclaim.
    engine = SourceStore(url=f"sqlite:///{tmp_path / 'source.sqlite'}").engine()
    create_schema(engine)
    log_rows([(1, 100 * DAY), (2, DAY)]).to_sql(
        "automation_log", engine, if_exists="append", index=False
    )
    policy = DomainRules(archive_dir=str(tmp_path / "archives")).archive_policy()
    guard, ledger = lost_guard(tmp_path, "log_archive")
    with pytest.raises(FenceLost):
        archive_log(
            engine,
            ArchivedLog(automation_log, "at"),
            policy,
            DUE,
            task_key="log_archive",
            entry_key="e",
            entry_id=guard.fence.entry_id,
            attempt=1,
            guard=guard,
        )
    assert pd.read_sql("SELECT id FROM automation_log", engine)["id"].tolist() == [1, 2]
    assert pd.read_sql("SELECT * FROM log_archives", engine).empty
    assert [p for p in (tmp_path / "archives").rglob("*") if p.is_file()] == []
    assert ["automation_log" in reason for reason in refusals(ledger, guard)] == [True]
    engine.dispose()
