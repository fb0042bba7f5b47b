"""Alembic migrations of the run ledger; applied by ``RunLedger.migrate()`` (no alembic.ini)."""
