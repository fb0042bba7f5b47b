"""bench/run.py: the one entry point -- result rows, the merged table, failures and exit codes."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import run
from run import Row

STARTED = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
FINISHED = datetime(2026, 12, 1, 3, 25, tzinfo=UTC)
MACHINE = {
    "cpu": "AMD EPYC",
    "cores": "2",
    "ram": "23.4 GiB",
    "os": "Debian GNU/Linux 12 (bookworm)",
    "python": "3.11.9",
    "dagster": "1.13.27",
    "postgresql": "postgres (PostgreSQL) 15.18",
}


def claims(workers: int, cycles: float) -> Row:
    return Row(
        area=run.CLAIMS_AREA,
        measurement="RunLedger claim -> heartbeat -> succeed",
        size=f"{workers} workers",
        value=cycles,
        unit="cycles/s",
        backend="postgres",
        baseline=cycles * 1.5,
        baseline_label="raw",
        ratio=1 / 1.5,
    )


def ceiling(clients: int, commits: float) -> Row:
    return Row(
        area=run.COMMITS_AREA,
        measurement="single-row UPDATE commits/s (pgbench)",
        size=f"{clients} clients",
        value=commits,
        unit="commits/s",
        backend="postgres",
    )


def scan(ms: float) -> Row:
    return Row(
        area="reclaim",
        measurement="reclaim scan",
        size="1,000,000 entries",
        value=ms,
        unit="ms",
        baseline=10.0,
        baseline_label="plain | SELECT",
        ratio=ms / 10.0,
        target="<= 50 ms",
        met=ms <= 50,
    )


def check(ok: bool) -> Row:
    return Row(
        area="claims",
        measurement="double claims",
        size="1,500 entries",
        value=0.0 if ok else 2.0,
        unit="double claims",
        target="0",
        met=ok,
        kind=run.KIND_CHECK,
    )


def outcome(rows: list[Row], error: str = "") -> run.Outcome:
    return run.Outcome("x", (), 0, 1.0, rows, Path("x.log"), error)


def test_rows_survive_the_json_round_trip(tmp_path):
    rows = [claims(1, 700.0), scan(12.5), check(True)]
    run.write_json(tmp_path / "r.json", "mixed", rows)
    assert run.read_json(tmp_path / "r.json") == ("mixed", rows)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"area": "a", "measurement": "m", "size": "s", "unit": "u"}, "lacks ['value']"),
        ({"area": "a", "measurement": "m", "size": "s", "value": "1", "unit": "u"}, "'value'"),
        ({"area": "a", "measurement": "m", "size": "s", "value": 1, "unit": "u", "x": 1}, "'x'"),
        ({"area": "a", "measurement": "m", "size": "s", "value": 1, "unit": "u", "met": 1}, "met"),
        ({"area": "a", "measurement": "m", "size": 2, "value": 1, "unit": "u"}, "'size'"),
        ({"area": "a", "measurement": "m", "size": "s", "value": True, "unit": "u"}, "'value'"),
        ([1, 2], "JSON object"),
    ],
)
def test_a_malformed_row_is_refused_naming_the_file_and_the_field(tmp_path, row, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"bench": "b", "rows": [row]}))
    with pytest.raises(ValueError, match=r"bad\.json row 0") as info:
        run.read_json(path)
    assert message in str(info.value)


def test_claims_are_divided_by_the_commit_ceiling_at_the_same_concurrency():
    rows = run.merge(
        [
            [claims(1, 800.0), claims(4, 1000.0), check(True)],
            [ceiling(1, 8000.0), ceiling(4, 20000.0), ceiling(8, 21000.0)],
            [scan(12.0)],
        ]
    )
    derived = [r for r in rows if r.area == "claims vs ceiling"]
    assert [(r.size, r.value, r.baseline, r.ratio) for r in derived] == [
        ("1 workers", 800.0, 8000.0, 0.1),
        ("4 workers", 1000.0, 20000.0, 0.05),
    ]
    # Right after the commits rows, before the next area.
    assert [r.area for r in rows][-3:] == ["claims vs ceiling", "claims vs ceiling", "reclaim"]


def test_no_ceiling_row_without_a_commit_rate_for_that_concurrency():
    assert run.ceiling_rows([claims(2, 800.0), ceiling(1, 8000.0)]) == []


def report(rows: list[Row]) -> run.Report:
    return run.Report(
        started_at=STARTED,
        finished_at=FINISHED,
        machine=MACHINE,
        rows=rows,
        outcomes=[run.Outcome("reclaim", ("--entries", "20000"), 0, 42.0, rows, Path("r.log"))],
        load=("0.10 0.20 0.30", "1.00 1.10 1.20"),
    )


def test_the_table_is_headed_by_machine_and_date_and_shows_misses():
    rows = [scan(12.0), scan(80.0), check(False)]
    text = run.render(report(rows), markdown=False)
    lines = text.splitlines()
    assert lines[0] == "dueledger benchmarks, small sizes, 2026-12-01 03:00-03:25 UTC"
    assert "AMD EPYC, 2 cores, 23.4 GiB RAM, Debian GNU/Linux 12 (bookworm)" in lines[1]
    assert "Dagster 1.13.27, postgres (PostgreSQL) 15.18" in lines[2]
    assert "bench reclaim: 42 s, exit 0 (--entries 20000)" in text
    table = [line for line in lines if line.startswith("reclaim") or line.startswith("claims")]
    assert len(table) == 3
    assert table[0].rstrip().endswith("yes")
    assert table[1].rstrip().endswith("MISS")
    assert "8.00" in table[1]  # the ratio, 80 / 10
    assert table[2].rstrip().endswith("FAILED")
    assert "1 speed target(s) missed; 1 check(s) failed" in text


def test_markdown_is_one_pipe_table_with_pipes_in_cells_escaped():
    text = run.render(report([scan(12.0), claims(4, 900.0)]), markdown=True)
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert table[0] == "| " + " | ".join(run.COLUMNS) + " |"
    assert len(table) == 4
    assert all(line.count(" | ") == len(run.COLUMNS) - 1 for line in table[2:])
    assert "plain \\| SELECT" in table[2]
    assert text.startswith("**dueledger benchmarks, small sizes, 2026-12-01 03:00-03:25 UTC**")


@pytest.mark.parametrize(
    ("value", "text"),
    [(12345.6, "12,346"), (123.45, "123.5"), (12.345, "12.35"), (0.01234, "0.0123"), (0, "0")],
)
def test_numbers_read_well_at_any_magnitude(value, text):
    assert run.fmt_number(value) == text


def test_exit_status_fails_on_a_broken_bench_or_check_and_on_misses_only_when_asked():
    ok, missed = [scan(12.0)], [scan(80.0)]
    assert run.exit_status([outcome(ok)], ok, fail_on_miss=False) == run.EXIT_OK
    assert run.exit_status([outcome(missed)], missed, fail_on_miss=False) == run.EXIT_OK
    assert run.exit_status([outcome(missed)], missed, fail_on_miss=True) == run.EXIT_MISSED
    assert run.exit_status([outcome([check(False)])], [check(False)], False) == run.EXIT_FAILED
    assert run.exit_status([outcome([], error="wrote no results")], [], False) == run.EXIT_FAILED


def test_a_bench_that_crashes_without_results_is_reported_as_failed(tmp_path, capsys):
    script = tmp_path / "crashing_bench.py"
    script.write_text("import sys\nprint('about to fail')\nsys.exit(5)\n")
    bench = run.Bench("crash", str(script), (), ())  # an absolute path wins over bench/
    result = run.run_bench(bench, False, tmp_path, verbose=False)
    assert (result.exit_code, result.rows, result.error) == (5, [], "wrote no results")
    assert "about to fail" in capsys.readouterr().err  # the log's tail is shown
    assert run.exit_status([result], [], fail_on_miss=False) == run.EXIT_FAILED


def test_a_bench_that_writes_rows_ran_even_if_it_exits_non_zero(tmp_path):
    # ledger_queries.py exits 1 on a missed target; its rows say so.
    script = tmp_path / "missing_bench.py"
    script.write_text(
        "import sys\n"
        f"sys.path.append({str(run.BENCH_DIR)!r})\n"
        "from run import Row, write_json\n"
        "path = sys.argv[sys.argv.index('--json') + 1]\n"
        "write_json(path, 'm', [Row('q', 'p95', '1 entries', 30.0, 'ms', met=False)])\n"
        "sys.exit(1)\n"
    )
    result = run.run_bench(run.Bench("m", str(script), (), ()), False, tmp_path, verbose=False)
    assert (result.exit_code, result.error, len(result.rows)) == (1, "", 1)
    assert run.exit_status([result], result.rows, fail_on_miss=False) == run.EXIT_OK


def test_unknown_bench_names_are_refused(capsys):
    with pytest.raises(SystemExit) as info:
        run.main(["--only", "claims,nope"])
    assert info.value.code == 2
    assert "unknown bench nope" in capsys.readouterr().err


def test_dry_run_lists_every_bench_with_its_json_option(tmp_path, capsys):
    assert run.main(["--dry-run", "--full", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [Path(line.split()[1]).name for line in lines] == [b.script for b in run.BENCHES]
    assert all(line.split()[0] == sys.executable for line in lines)
    assert all(f"--json {tmp_path}/" in line for line in lines)
    assert "--sizes 1,20,200" in lines[0]
    assert any("--entries 1000000" in line for line in lines)


def test_every_bench_script_accepts_the_json_option():
    for bench in run.BENCHES:
        source = (run.BENCH_DIR / bench.script).read_text()
        assert '"--json"' in source, f"{bench.script} has no --json option"
