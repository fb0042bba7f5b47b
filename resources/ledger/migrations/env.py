"""Alembic environment for the run ledger.

Only ``RunLedger.migrate()`` runs this: it opens the connection (and, for the duration of the
upgrade, holds the cross-process migration lock in that connection's transaction) and hands
it over in ``config.attributes["connection"]``. There is no offline/SQL-script mode and no
alembic.ini: the ledger URL comes from the resource, like everywhere else.
"""

from __future__ import annotations

from alembic import context

from resources.ledger.schema import VERSION_TABLE, metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "ledger migrations run through RunLedger.migrate() (or `dueledger` commands that call "
        "it), which supplies the database connection; the alembic CLI is not configured here"
    )

context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    # SQLite cannot ALTER most things in place; batch mode lets later (additive) migrations
    # use op.batch_alter_table() portably.
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)

# The caller's connection is already inside a transaction, so this does not commit on its
# own: the upgrade commits (or rolls back) as one unit together with the lock.
with context.begin_transaction():
    context.run_migrations()
