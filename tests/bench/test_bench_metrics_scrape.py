"""bench/metrics_scrape.py at a small size on SQLite (the 1,000,000-entry run takes minutes:
``bench/run.py --only metrics --full``): it builds the ledger it says, its scrape agrees
with what it generated, and it writes its rows for bench/run.py."""

from __future__ import annotations

import metrics_scrape
from run import KIND_CHECK, read_json


def test_a_small_run_checks_the_scrape_and_writes_its_rows(tmp_path):
    path = tmp_path / "metrics.json"
    code = metrics_scrape.main(
        ["--entries", "3000", "--repeat", "1", "--backend", "sqlite", "--json", str(path)]
    )
    assert code == 0
    bench, rows = read_json(path)
    assert bench == "metrics"
    between, audited, before, build, check = rows
    assert between.target == "<= 200 ms" and between.baseline and between.ratio
    assert between.value > 0 and audited.value > 0 and before.value > 0 and build.unit == "s"
    assert (check.kind, check.met, check.value) == (KIND_CHECK, True, 0.0)


def test_the_check_catches_a_scrape_that_disagrees_with_the_ledger():
    gen = metrics_scrape.Generated()
    gen.statuses["success"] = 2
    gen.refused = 1
    text = (
        b"# TYPE dueledger_entries_total counter\n"
        b'dueledger_entries_total{status="success",task="a",failure_kind="",trigger="schedule"} 2\n'
        b"# TYPE dueledger_refused_runs_total counter\n"
        b'dueledger_refused_runs_total{task="a"} 0\n'
    )
    assert metrics_scrape.check(text, gen) == ["refused: scraped 0, generated 1"]
