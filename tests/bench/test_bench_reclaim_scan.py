"""bench/reclaim_scan.py at a tiny size on SQLite: it reclaims exactly the expired leases,
leaves live ones alone, and its own check would notice otherwise."""

from __future__ import annotations

import pytest
import reclaim_scan
import sqlalchemy as sa
from run import KIND_CHECK, read_json

from orchestration.reclaim import reclaim_expired
from resources.core.entry import FailureKind, Status
from resources.ledger import RunLedger
from resources.ledger.schema import entries

ENTRIES, EXPIRED = 2000, 20


@pytest.fixture
def prepared(tmp_path):
    return reclaim_scan.prepare(f"sqlite:///{tmp_path}/ledger.sqlite", ENTRIES, EXPIRED)


def _ids(url: str, *where) -> set[int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return set(conn.execute(sa.select(entries.c.id).where(*where)).scalars())
    finally:
        engine.dispose()


def test_the_prepared_ledger_has_the_expired_and_live_leases_it_claims(prepared):
    assert len(prepared.expired) == EXPIRED
    assert prepared.live, "the builder's running entries should hold live leases"
    running = _ids(prepared.url, entries.c.status == Status.RUNNING)
    assert running == set(prepared.expired) | prepared.live


def test_reclaim_takes_exactly_the_expired_leases_and_leaves_live_ones(prepared):
    reclaimed = reclaim_expired(RunLedger(database_url=prepared.url), now=prepared.now)
    assert {e.id for e in reclaimed} == set(prepared.expired)
    assert {e.failure_kind for e in reclaimed} == {FailureKind.LEASE_RECLAIMED}
    assert _ids(prepared.url, entries.c.status == Status.RUNNING) == prepared.live


def test_every_repeat_starts_from_the_same_expired_leases(prepared):
    timings = reclaim_scan.measure(prepared, repeat=2)
    assert timings.problems == []
    assert [len(x) for x in (timings.scan, timings.select, timings.reclaim, timings.update)] == [
        2,
        2,
        2,
        2,
    ]
    # The scan's SQL was captured for EXPLAIN, and measure() left the expired leases reset.
    assert any("lease_expires_at" in sql for sql, _ in prepared.scan_sql)
    running = _ids(prepared.url, entries.c.status == Status.RUNNING)
    assert running == set(prepared.expired) | prepared.live


def test_the_check_notices_an_entry_reclaimed_that_should_not_have_been(prepared):
    engine = sa.create_engine(prepared.url)
    extra = min(prepared.live)
    with engine.begin() as conn:  # one live lease quietly expires
        conn.execute(
            sa.update(entries)
            .where(entries.c.id == extra)
            .values(lease_expires_at=min(prepared.expired.values()))
        )
    reclaimed = reclaim_expired(RunLedger(database_url=prepared.url), now=prepared.now)
    problems = reclaim_scan.check(prepared, engine, {e.id for e in reclaimed})
    engine.dispose()
    assert problems and "1 extra" in problems[0]
    assert any("live leases lost" in p for p in problems)


def test_the_bench_writes_its_rows_and_a_passing_check(tmp_path):
    path = tmp_path / "reclaim.json"
    args = ["--backend", "sqlite", "--entries", str(ENTRIES), "--expired", str(EXPIRED)]
    assert reclaim_scan.main([*args, "--repeat", "1", "--json", str(path)]) == 0
    bench, rows = read_json(path)
    assert bench == "reclaim"
    scan, reclaim, check = rows
    assert scan.unit == "ms" and scan.baseline and scan.ratio == scan.value / scan.baseline
    assert scan.target.startswith("<= 50 ms")
    assert reclaim.baseline_label == "one set-based UPDATE"
    assert (check.kind, check.met, check.value) == (KIND_CHECK, True, 0.0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--expired", "1001"], "--expired must be between 1 and 1000"),
        (["--entries", "100", "--expired", "50"], "--entries must be at least 4 x --expired"),
        (["--backend", "oracle"], "unknown backend"),
    ],
)
def test_bad_input_is_refused_with_the_fix(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        reclaim_scan.main(args)
    assert info.value.code == 2
    assert message in capsys.readouterr().err
