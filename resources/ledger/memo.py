"""What this process knows of its ledger databases: which it brought (or found) at the newest
migration. Its own module so that the runtime (``engine.py``, which words a missing-table error
by it) and the migration runner (``migrate.py``) both read it without importing each other.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

# (process id, database URL) of every database this process has migrated to head.
_migrated: set[tuple[int, str]] = set()
_lock = threading.Lock()


def _new_lock_in_child() -> None:
    # A fork while another thread held the lock would leave the child's copy held forever.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)


def mark_migrated(url: str) -> None:
    """Remember that this process brought ``url`` to head (after a successful upgrade)."""
    _migrated.add((os.getpid(), url))


def was_migrated(url: str) -> bool:
    """Whether this process brought ``url`` to head (or found it there)."""
    return (os.getpid(), url) in _migrated


def migrate_once(url: str, migrate: Callable[[], None]) -> None:
    """Run ``migrate`` unless this process already migrated ``url``; threads wait for the first.

    A failed ``migrate`` is not remembered: the next use tries again.
    """
    key = (os.getpid(), url)
    if key in _migrated:
        return
    with _lock:
        if key in _migrated:
            return
        migrate()
        _migrated.add(key)
