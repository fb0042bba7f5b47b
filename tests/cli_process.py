"""The `dueledger` console script run as a user runs it: a subprocess with its own
environment, arguments passed as bytes (so text that is not UTF-8 arrives as it would from a
shell), output read back without assuming it is clean.

Also: every text value stored in a database's tables, to search them for a planted secret.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

DUELEDGER = Path(sys.executable).with_name("dueledger")
PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Ran:
    """One finished command: exit code and what it printed (decoded, bad bytes escaped)."""

    args: tuple[str, ...]
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def error(self, code: int) -> str:
        """The ``{"error": ...}`` of a ``--json`` command that exited ``code``."""
        assert self.code == code, (self.args, self.code, self.out[-2000:], self.err[-2000:])
        data = self.json()
        assert set(data) == {"error"} and isinstance(data["error"], str), data
        return str(data["error"])

    @property
    def output(self) -> str:
        return self.out + self.err


def base_env(**extra: str) -> dict[str, str]:
    """This process's environment without any ``DUELEDGER_*`` setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUELEDGER_")}
    env.update(extra)
    return env


def run_cli(args: Sequence[str], env: Mapping[str, str], *, timeout: float = 120) -> Ran:
    """Run ``dueledger ARGS`` in ``env``; text with surrogates (``"\\udcff"``) becomes the
    raw bytes a shell would pass (``os.fsencode``)."""
    proc = subprocess.run(
        [os.fsencode(str(DUELEDGER)), *(os.fsencode(a) for a in args)],
        cwd=PROJECT_ROOT,
        env={os.fsencode(k): os.fsencode(v) for k, v in env.items()},
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    return Ran(
        tuple(args),
        proc.returncode,
        proc.stdout.decode("utf-8", "backslashreplace"),
        proc.stderr.decode("utf-8", "backslashreplace"),
    )


@functools.cache
def _engine(url: str) -> sa.Engine:
    return sa.create_engine(url, poolclass=sa.pool.NullPool)


@functools.cache
def _tables(url: str) -> tuple[sa.Table, ...]:
    metadata = sa.MetaData()
    metadata.reflect(_engine(url))
    return tuple(metadata.sorted_tables)


def stored_text(url: str) -> list[str]:
    """Every row of every table of the database at ``url``, each as text (``table: row``).
    The tables are read from the database once per URL (a fuzz calls this per example)."""
    engine = _engine(url)
    with engine.connect() as conn:
        return [
            f"{table.name}: {tuple(row)}"
            for table in _tables(url)
            for row in conn.execute(sa.select(table))
        ]
