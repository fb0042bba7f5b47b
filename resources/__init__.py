"""Resources: the run ledger, the hosting source store, and later notifiers and hooks."""
