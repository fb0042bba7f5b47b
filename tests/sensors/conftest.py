"""Fixtures of the ledger-keeping sensor tests (helpers live in sensor_support.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sensor_support import LedgerEnv

from resources.core.settings import ENV_DATABASE_URL
from resources.ledger import RunLedger


@pytest.fixture
def ledger_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LedgerEnv]:
    """A migrated SQLite ledger that the test code location (and its workers) use."""
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    monkeypatch.setenv(ENV_DATABASE_URL, url)
    ledger = RunLedger(database_url=url)
    ledger.migrate()
    yield LedgerEnv(ledger, url, tmp_path)
    ledger.dispose()
