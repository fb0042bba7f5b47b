"""Fixtures of the domain asset tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from resources.source_schema import customers
from resources.source_store import create_schema, make_engine


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    """A source store with one customer, on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'source.sqlite'}"
    else:
        url = request.getfixturevalue("postgres_url")
    engine = make_engine(url)
    create_schema(engine)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(customers),
            {"id": 1, "name": "Ada", "email": "ada@example.test", "phone": "+1", "channels": ""},
        )
    yield engine
    engine.dispose()
