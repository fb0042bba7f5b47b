"""Log archive: move automation and notification logs older than the retention period
into gzip CSV files, verify them, then delete exactly the rows archived.

Only the source store's log tables are touched (`automation_log`,
`notification_outbox`); the run ledger lives elsewhere and is never read, archived or
deleted. The idempotency log (`side_effects`) is not archived either: it is what keeps
an old reminder from being sent again, so it must outlive any backfill.

Per table, in batches of at most `batch_rows` (oldest ids first):
1. read rows with `time < as_of - retention`;
2. write them as CSV, gzip-compressed, to a new file (temp file, fsync, hard link to the
   final name, which must not exist yet -- an archive file is never overwritten);
3. verify: decompress, compare the sha256 of the CSV text and re-parse the ids;
4. in one transaction: delete `WHERE id IN (archived ids) AND time < cutoff` and record
   the file in `log_archives` (path, rows, deleted, id range, sha256, ledger entry).
A crash before step 4 leaves an unrecorded file and the rows in place; the next run
archives them again into a new file. `log_archives` is the authority on what was moved.

gzip CSV rather than Parquet: pyarrow is not a dependency, and `pandas.read_csv(path)`
or `gzip -dc` reads the files anywhere. Nothing here imports Dagster.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Final

import numpy as np
import pandas as pd
import sqlalchemy as sa

from assets.tunables import ARCHIVE_FORMAT, ArchivePolicy
from resources.core.fence import EffectGuard, FenceLost
from resources.effects import effect_transaction
from resources.idempotency import log_archives, notification_outbox
from resources.source_schema import automation_log, chunks, naive_utc, read_frame_from


class ArchiveVerificationError(RuntimeError):
    """An archive file did not read back as written; nothing was deleted."""


@dataclass(frozen=True)
class ArchivedLog:
    """A log table and the column that says how old a row is."""

    table: sa.Table
    time_column: str


ARCHIVED_LOGS: Final = (
    ArchivedLog(automation_log, "at"),
    ArchivedLog(notification_outbox, "created_at"),
)


@dataclass(frozen=True)
class ArchiveFile:
    """One written and verified archive file."""

    path: Path
    rows: int
    sha256: str
    min_id: int
    max_id: int


def archive_cutoff(as_of: datetime, policy: ArchivePolicy) -> datetime:
    """Rows strictly older than this instant are archived."""
    return naive_utc(as_of) - policy.retention


def select_rows_to_archive(frame: pd.DataFrame, time_column: str, cutoff: datetime) -> pd.DataFrame:
    """Rows with `time_column < cutoff`, ordered by id (pure; the SQL mirrors it)."""
    if "id" not in frame.columns or time_column not in frame.columns:
        raise ValueError(f"log frame needs columns 'id' and {time_column!r}")
    times = pd.to_datetime(frame[time_column])
    return frame.loc[times < pd.Timestamp(naive_utc(cutoff))].sort_values("id", kind="stable")


def csv_text(frame: pd.DataFrame) -> bytes:
    """The archive's uncompressed content: CSV with a header, UTF-8, `\\n` line ends."""
    return frame.to_csv(index=False, lineterminator="\n").encode("utf-8")


def write_archive(frame: pd.DataFrame, path: Path) -> ArchiveFile:
    """Write `frame` as gzip CSV to `path`, which must not exist (never overwritten).

    Written to a temp file in the same directory, fsynced, then hard-linked to `path`
    (atomic, fails if `path` exists). The gzip header carries no timestamp, so the same
    rows always give the same bytes.
    """
    if frame.empty:
        raise ValueError("refusing to write an empty archive")
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = csv_text(frame)
    digest = hashlib.sha256(raw).hexdigest()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(gzip.compress(raw, compresslevel=6, mtime=0))
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    ids = frame["id"].to_numpy(dtype=np.int64)
    return ArchiveFile(path, len(frame), digest, int(ids.min()), int(ids.max()))


def verify_archive(archive: ArchiveFile, expected_ids: np.ndarray) -> None:
    """Raise ArchiveVerificationError unless the file decompresses to the same CSV text
    (sha256) and parses back to exactly `expected_ids`, in order."""
    try:
        raw = gzip.decompress(archive.path.read_bytes())
    except (OSError, EOFError) as exc:
        raise ArchiveVerificationError(f"{archive.path}: cannot be decompressed: {exc}") from exc
    digest = hashlib.sha256(raw).hexdigest()
    if digest != archive.sha256:
        raise ArchiveVerificationError(
            f"{archive.path}: content sha256 {digest} != written {archive.sha256}"
        )
    parsed = pd.read_csv(io.BytesIO(raw))
    ids = parsed["id"].to_numpy(dtype=np.int64) if "id" in parsed.columns else np.array([])
    if len(parsed) != archive.rows or not np.array_equal(ids, expected_ids):
        raise ArchiveVerificationError(
            f"{archive.path}: read back {len(parsed)} rows, expected {archive.rows} with the "
            f"archived ids; nothing was deleted"
        )


def archive_file_name(table: str, as_of: datetime, entry_id: int, attempt: int, batch: int) -> str:
    """`<table>_<as_of>_e<entry>a<attempt>_<batch>.csv.gz`: unique per ledger attempt."""
    stamp = naive_utc(as_of).strftime("%Y%m%dT%H%M%SZ")
    return f"{table}_{stamp}_e{entry_id}a{attempt}_{batch:04d}.{ARCHIVE_FORMAT}"


def archive_log(
    engine: sa.Engine,
    log: ArchivedLog,
    policy: ArchivePolicy,
    as_of: datetime,
    *,
    task_key: str,
    entry_key: str,
    entry_id: int,
    attempt: int,
    guard: EffectGuard | None,
) -> list[dict[str, object]]:
    """Archive one log table (see the module docstring); return the manifest rows written."""
    table, time_col = log.table, log.table.c[log.time_column]
    cutoff = archive_cutoff(as_of, policy)
    at = naive_utc(as_of)
    manifests: list[dict[str, object]] = []
    last_id = 0
    batch = 0
    while True:
        query = (
            sa.select(table)
            .where(time_col < cutoff, table.c.id > last_id)
            .order_by(table.c.id)
            .limit(policy.batch_rows)
        )
        frame = read_frame_from(engine, query)
        frame = select_rows_to_archive(frame, log.time_column, cutoff) if not frame.empty else frame
        if frame.empty:
            break
        batch += 1
        name = archive_file_name(table.name, at, entry_id, attempt, batch)
        archive = write_archive(frame, policy.directory / table.name / name)
        ids = frame["id"].to_numpy(dtype=np.int64)
        verify_archive(archive, ids)
        deleted = 0
        try:
            with effect_transaction(engine, guard, f"delete archived {table.name} rows") as conn:
                for chunk in chunks([int(i) for i in ids]):
                    result = conn.execute(
                        sa.delete(table).where(table.c.id.in_(chunk), time_col < cutoff)
                    )
                    deleted += int(result.rowcount or 0)
                manifest: dict[str, object] = {
                    "table_name": table.name,
                    "path": str(archive.path),
                    "format": policy.format,
                    "rows": archive.rows,
                    "deleted": deleted,
                    "min_id": archive.min_id,
                    "max_id": archive.max_id,
                    "cutoff": cutoff,
                    "sha256": archive.sha256,
                    "created_at": at,
                    "task_key": task_key,
                    "entry_key": entry_key,
                }
                conn.execute(sa.insert(log_archives), [manifest])
        except FenceLost:
            # The rows stay in the table; a file no manifest names would only mislead.
            archive.path.unlink(missing_ok=True)
            raise
        manifests.append(manifest)
        last_id = archive.max_id
        if len(frame) < policy.batch_rows:
            break
    return manifests
