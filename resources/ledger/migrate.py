"""Ledger schema migrations: the Alembic runner (run once per process through ``memo.py``).

``upgrade`` applies the Alembic revisions in ``resources/ledger/migrations`` up to head. It
is idempotent and safe when processes race: cheap when the schema is already at head (one
read, no lock); otherwise the upgrade runs in one transaction that first takes a
cross-process lock (PostgreSQL: ``pg_advisory_xact_lock``; SQLite: ``BEGIN IMMEDIATE``), so
a second process waits, then finds the schema at head and does nothing. A database a newer
dueledger already migrated further (a rolling upgrade) is left as it is: migrations only add.

``memo.migrate_once`` is what resource set-up calls: the first use of a database URL in a process
runs ``upgrade``, later uses (every run, every sensor tick) cost a set lookup. The memo is
per process, not per resource object, because Dagster builds a fresh copy of a resource for
every run and tick; it is keyed by process id so a forked child checks again for itself.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Final

import sqlalchemy as sa

from resources.core.settings import mask_url
from resources.ledger.engine import TX_OPTION, Runtime
from resources.ledger.model import LedgerError
from resources.ledger.schema import VERSION_TABLE

#: Key of the PostgreSQL advisory lock that serialises concurrent ``migrate()`` calls.
MIGRATION_LOCK_KEY: Final = int.from_bytes(b"dueledgr", "big") & 0x7FFF_FFFF_FFFF_FFFF
MIGRATIONS_DIR: Final = Path(__file__).resolve().parent / "migrations"


@functools.cache
def migration_head() -> str:
    """The head revision of the ledger migrations shipped with this code: the highest-numbered
    revision file's name. Every revision id is its file's name, ``NNNN_what`` (a test holds
    this, and that Alembic finds the same head), so the check a command pays on every start
    reads a folder instead of loading Alembic."""
    numbered = [
        (number, path.stem)
        for path in (MIGRATIONS_DIR / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")
        if (number := _number(path.stem)) is not None
    ]
    assert numbered, f"no migrations in {MIGRATIONS_DIR}"
    return max(numbered)[1]


def _number(revision: str) -> int | None:
    prefix = revision.split("_", 1)[0]
    return int(prefix) if prefix.isdigit() else None


def is_newer_revision(revision: str, head: str) -> bool:
    """Is ``revision`` (the database's) a later one than this code's ``head``, by the number
    every ledger revision starts with? An unnumbered or older unknown one is not."""
    theirs, ours = _number(revision), _number(head)
    return theirs is not None and ours is not None and theirs > ours


def upgrade(runtime: Runtime) -> None:
    """Apply the migrations up to head on ``runtime``'s database (see the module docstring)."""
    head = migration_head()
    try:
        with runtime.engine.connect() as conn:
            if runtime.sqlite:
                conn.execution_options(**{TX_OPTION: "read"})
            current = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
        if current == [(head,)]:
            return
        if len(current) == 1 and is_newer_revision(str(current[0][0]), head):
            # A newer dueledger migrated this database: a rolling upgrade, its workers beside
            # ours. Its migrations only added (nullable or defaulted columns, tables,
            # indexes; tests/resources/test_ledger_migration_rules.py), so this code's
            # statements still work on it; migrating "down" to our head is not a thing.
            return
    except sa.exc.DBAPIError:
        pass  # no version table yet (or unreadable): the locked path below decides
    # Alembic is loaded only when there is something to migrate, not on every start.
    from alembic import command
    from alembic.config import Config
    from alembic.util import CommandError

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with runtime.connect("write") as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(MIGRATION_LOCK_KEY)))
        config.attributes["connection"] = conn
        try:
            command.upgrade(config, "head")
        except CommandError as exc:
            # Typically a database migrated by a newer dueledger than this one.
            raise LedgerError(
                f"cannot migrate the ledger in {mask_url(runtime.url)}: {exc}; this code knows "
                f"revisions up to {head!r}: deploy the dueledger version that migrated it"
            ) from exc
