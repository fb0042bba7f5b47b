"""The history format: what happened to every due of a fault test, one JSON record a line.

Every fault test (the in-process harness, the two-daemon test, the network-namespace
topology) writes one history file and hands it to the one checker
(``history/history_checker.py``). A record is a JSON object with a ``type``; times are
ISO-8601 UTC with ``Z``; ``seq``, when present, is a global order of the events as the writer
saw them (the in-process harness knows it exactly; real topologies leave it out and the
checker orders by time). Unknown fields are ignored, so writers may add context freely.

Record types (fields, then what the record says):

- ``meta`` (``source``, ``backend``, ``seed``, ``slot_seconds``, ``window_seconds``,
  ``started_at``): one per history. A due must be classified by
  ``due + window_seconds + lease_ttl_seconds`` of its task.
- ``task`` (``task``, ``lease_ttl_seconds``, ``max_attempts``): one per task of the test.
- ``due`` (``task``, ``due``): a due the task's rule implies inside the test's window; it must
  be accounted for.
- ``run`` (``run_id``, ``task``, ``due``, ``trigger``, ``status``, ``outcome``,
  ``parent_entry``, ``parent_run_id``, ``worker``): one Dagster run (a harness worker);
  ``status`` as Dagster ended it (``SUCCESS``, ``FAILURE``, ``CANCELED``...), ``outcome`` its
  ``dueledger/outcome`` tag (``refused``...) or null.
- ``claim`` (``entry_id``, ``run_id``, ``token``, ``worker``, ``at``): a claim succeeded; the
  run holds the entry under fencing token ``token``. ``worker`` names the process (host, pid),
  so two processes of one Dagster run are told apart.
- ``claim_refused`` (``entry_id``, ``run_id``, ``at``, ``reason``): a late or duplicate run.
- ``heartbeat`` (``entry_id``, ``run_id``, ``token``, ``at``, ``ok``): a lease renewal, ``ok``
  false once the run lost its entry.
- ``commit`` (``entry_id``, ``run_id``, ``token``, ``effect``, ``at``, ``committed``): a fenced
  commit attempt, ``committed`` false when the fence refused it.
- ``effect`` (``task``, ``due``, ``effect``, ``entry_id``, ``run_id``, ``token``, ``at``): a
  side effect as the outside world saw it (a sink without a unique constraint: a double shows).
- ``release`` (``entry_id``, ``run_id``, ``token``, ``at``, ``how``): a claim ended --
  ``success``, ``fail`` or ``reclaim``; ``at`` is when that committed, or when a test first
  observed it.
- ``entry``: every ledger entry at the end, as ``dueledger runs show --json`` prints it (``id``,
  ``task_key``, ``trigger``, ``dedup_key``, ``due``, ``status``, ``failure_kind``, ``error``,
  ``parent_id``, ``run_ids``, ``finished_at``, ``updated_at``, ``manual_retry_at``,
  ``summary``...).
- ``audit`` (``id``, ``action``, ``entry_id``, ``child_entry_id``, ``operator``, ``outcome``):
  the ledger's audit records of manual retries.
- ``missed`` (``task``, ``due``, ``reason``): a due ``summary`` reports missed, with why.
- ``summary``: ``dueledger summary --json`` at the end, what an operator reads.
- ``fault`` (``kind``, ``at``, ``target``, free detail): a fault injected -- ``kill_*``,
  ``pause_past_lease``, ``skew``, ``duplicate``, ``error_*``, ``not_dispatched``,
  ``daemon_kill``, ``partition``, ``heal``, ``pg_restart``...

``HistoryWriter`` appends records to a ``.jsonl`` file; ``read_history`` reads one back.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

Record = dict[str, Any]

RECORD_TYPES = frozenset(
    {
        "meta",
        "task",
        "due",
        "run",
        "claim",
        "claim_refused",
        "heartbeat",
        "commit",
        "effect",
        "release",
        "entry",
        "audit",
        "missed",
        "summary",
        "fault",
    }
)


def stamp(when: datetime | None) -> str | None:
    """ISO-8601 UTC with microseconds and ``Z`` (None stays None)."""
    if when is None:
        return None
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> datetime | None:
    """The instant of a history time (``...Z`` or an offset); None for None or empty."""
    if not text:
        return None
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _default(value: object) -> object:
    if isinstance(value, datetime):
        return stamp(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable in a history record")


class HistoryWriter:
    """Appends records to a JSON-lines history file; counts them by type."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = path.open("w", encoding="utf-8")
        self.counts: dict[str, int] = {}

    def write(self, type_: str, **fields: Any) -> None:
        if type_ not in RECORD_TYPES:
            raise ValueError(f"unknown history record type {type_!r}")
        record = {"type": type_, **fields}
        self._file.write(json.dumps(record, default=_default, sort_keys=True) + "\n")
        self.counts[type_] = self.counts.get(type_, 0) + 1

    def write_all(self, records: Iterable[Mapping[str, Any]]) -> None:
        for record in records:
            fields = dict(record)
            self.write(fields.pop("type"), **fields)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_history(path: Path) -> list[Record]:
    """Every record of a history file, in order; a line that is not a record is an error."""
    return list(_records(path.read_text(encoding="utf-8").splitlines(), str(path)))


def _records(lines: Iterable[str], where: str) -> Iterator[Record]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record = json.loads(line)
        if not isinstance(record, dict) or record.get("type") not in RECORD_TYPES:
            raise ValueError(f"{where}:{number}: not a history record: {line[:200]}")
        yield record
