"""Ledger migration scripts. Rule: migrations only add; nothing here drops ledger data."""
