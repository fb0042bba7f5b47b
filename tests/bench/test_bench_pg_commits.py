"""bench/pg_commits.py: argument checks, pgbench's output, and one real short run."""

from __future__ import annotations

import pg_commits
import pytest
from run import read_json

PGBENCH_OUTPUT = """\
transaction type: /tmp/update.sql
scaling factor: 1
query mode: prepared
number of clients: 4
number of threads: 2
duration: 2 s
number of transactions actually processed: 56194
latency average = 0.142 ms
initial connection time = 5.310 ms
tps = 28097.123456 (without initial connection time)
"""


def test_the_tps_line_of_pgbench_is_read():
    match = pg_commits.TPS_LINE.search(PGBENCH_OUTPUT)
    assert match is not None and float(match.group(1)) == pytest.approx(28097.123456)


@pytest.mark.parametrize("text", ["", "0", "1,a", "65"])
def test_bad_client_counts_are_refused(text, capsys):
    with pytest.raises(SystemExit) as info:
        pg_commits.main(["--clients", text])
    assert info.value.code == 2
    assert "--clients" in capsys.readouterr().err


def test_a_short_run_reports_the_commit_ceiling(postgres_url, tmp_path):
    path = tmp_path / "commits.json"
    args = ["--clients", "1", "--seconds", "1", "--rounds", "1", "--url", postgres_url]
    assert pg_commits.main([*args, "--json", str(path)]) == 0
    bench, rows = read_json(path)
    assert bench == "commits"
    ceiling = rows[0]
    assert ceiling.size == "1 client" and ceiling.unit == "commits/s" and ceiling.value > 0
    if pg_commits.find_pgbench() is not None:
        assert ceiling.measurement == "single-row UPDATE commits/s (pgbench)"
        assert rows[1].baseline == ceiling.value and rows[1].ratio is not None
