"""Benchmark: each billing/account rule's pandas computation vs. the same question in SQL.

    uv run python bench/assets.py [--rows N] [--repeat R] [--no-postgres] [--url URL] [--json PATH]

What it does, in one run, on one data set:

1. Generates the deterministic sample data (``resources.sample_data``) with ``--rows``
   services (default 1,000,000): as many invoices, half as many customers, a quarter as
   many tickets, and payments for the paid invoices.
2. For each rule, in a **fresh child process** (so peak RSS is the rule's, not the
   generator's): loads the rule's input frames (the full tables, not SQL-narrowed
   candidates -- the worst case), then times the pure function ``--repeat`` times and
   reports the best time, the result's row count and the process's peak RSS.
   Rules: overdue reminders and renewal notices (with the channel expansion), message
   rendering of the overdue reminders, the auto-renew plan, balance reconciliation and
   ticket auto-close. (log_archive is I/O -- CSV + gzip -- and has no SQL equivalent.)
3. Loads the same rows into SQLite (a file) and PostgreSQL (a throwaway server from
   ``tests/pg_server.py`` unless ``--url`` names one; ``--no-postgres`` skips it) and
   times an equivalent SQL query for each rule (best of ``--repeat``, rows fetched into
   Python), checking it returns the same number of rows as the pandas rule.

Prints a table: pandas seconds, peak RSS, SQL seconds per backend and the ratio
pandas/SQL (below 1: pandas is faster). Absolute times depend on the machine; the
ratios compare two ways of answering the same question on the same machine and data.
``--json PATH`` also writes the results as ``bench/run.py`` rows.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path
from typing import Any

from _paths import ROOT  # first: puts the project and tests/ on sys.path

# isort: split

import numpy as np
import pandas as pd
import sqlalchemy as sa

from assets.billing.reconcile import KIND_BALANCE, KIND_INVOICE, KIND_PAYMENT, reconcile_balances
from assets.billing.reminders import overdue_reminders_due, render_reminders, renewal_notices_due
from assets.services.renewals import plan_auto_renew
from assets.tickets.auto_close import select_tickets_to_close
from assets.tunables import AutoRenewPolicy, ReminderPolicy, TicketAutoClosePolicy
from resources.sample_data import build_sample_frames
from resources.source_store import create_schema, make_engine

AS_OF = datetime(2026, 11, 30, 22, 0, tzinfo=UTC)
AT = AS_OF.replace(tzinfo=None)
REMINDERS = ReminderPolicy()
RENEW = AutoRenewPolicy()
TICKETS = TicketAutoClosePolicy()
TABLES = ("customers", "services", "invoices", "payments", "tickets")
DAY = timedelta(days=1)


# --- the pandas side (runs in a child process per rule) -------------------------------------


def _movements(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    parts = [
        (KIND_BALANCE, frames["customers"]["id"], frames["customers"]["balance_cents"]),
        (KIND_PAYMENT, frames["payments"]["customer_id"], frames["payments"]["amount_cents"]),
        (KIND_INVOICE, frames["invoices"]["customer_id"], frames["invoices"]["amount_cents"]),
    ]
    return pd.concat(
        [
            pd.DataFrame({"kind": kind, "customer_id": ids.to_numpy(), "amount_cents": amounts})
            for kind, ids, amounts in parts
        ],
        ignore_index=True,
    )


#: rule -> (input tables, function of the loaded frames returning a frame or a (frame, x)).
RULES: dict[str, tuple[tuple[str, ...], Callable[[dict[str, Any]], Any]]] = {
    "overdue_reminders": (
        ("invoices", "customers"),
        lambda f: overdue_reminders_due(f["invoices"], f["customers"], AS_OF, REMINDERS),
    ),
    "render_overdue_messages": (
        ("overdue_due",),
        lambda f: render_reminders(f["overdue_due"]),
    ),
    "renewal_notices": (
        ("services", "customers"),
        lambda f: renewal_notices_due(f["services"], f["customers"], AS_OF, REMINDERS),
    ),
    "auto_renew_plan": (
        ("services", "customers"),
        lambda f: plan_auto_renew(f["services"], f["customers"], AS_OF, RENEW),
    ),
    "reconcile_balances": (
        ("movements",),
        lambda f: reconcile_balances(f["movements"]),
    ),
    "ticket_auto_close": (
        ("tickets",),
        lambda f: select_tickets_to_close(f["tickets"], AS_OF, TICKETS),
    ),
}


def _row_count(result: Any) -> int:
    if isinstance(result, tuple):  # reconcile: (mismatches, summary)
        return len(result[0])
    if hasattr(result, "to_renew"):  # auto-renew plan
        return len(result.to_renew) + len(result.insufficient)
    return len(result)


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM). Not getrusage's ru_maxrss: Linux carries that
    across fork + exec, so a child would report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux


def child(rule: str, data_dir: Path, repeat: int) -> None:
    """Load the rule's inputs, time it, print one JSON line."""
    inputs, function = RULES[rule]
    frames = {name: pd.read_pickle(data_dir / f"{name}.pkl") for name in inputs}
    loaded_mb = peak_rss_mb()
    best, rows = float("inf"), 0
    for _ in range(repeat):
        start = time.perf_counter()
        result = function(frames)
        best = min(best, time.perf_counter() - start)
        rows = _row_count(result)
        del result
    peak_mb = peak_rss_mb()
    print(
        json.dumps(
            {
                "rule": rule,
                "seconds": best,
                "rows": rows,
                "peak_mb": peak_mb,
                "inputs_mb": loaded_mb,
            }
        )
    )


def run_child(rule: str, data_dir: Path, repeat: int) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            rule,
            "--data",
            str(data_dir),
            "--repeat",
            str(repeat),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


# --- the SQL side ---------------------------------------------------------------------------


def _sql_time(value: datetime, dialect: str) -> Any:
    # SQLite stores SQLAlchemy DateTime as 'YYYY-MM-DD HH:MM:SS.ffffff' text; compare with
    # the same text. PostgreSQL gets a real timestamp.
    return value.strftime("%Y-%m-%d %H:%M:%S.%f") if dialect == "sqlite" else value


CHANNEL_ROWS = "(SELECT 'email' AS channel UNION ALL SELECT 'sms' UNION ALL SELECT 'in_app')"

SQL: dict[str, str] = {
    "overdue_reminders": f"""
        WITH inv AS (
            SELECT i.id, i.customer_id, i.due_at,
                   CASE WHEN i.due_at <= :d5 THEN 5 WHEN i.due_at <= :d3 THEN 3 ELSE 1 END AS stage
              FROM invoices i
             WHERE (i.paid_at IS NULL OR i.paid_at > :at) AND i.created_at <= :at
               AND i.due_at <= :d1)
        SELECT inv.id, inv.stage, ch.channel,
               CASE ch.channel WHEN 'email' THEN c.email WHEN 'sms' THEN c.phone
                    ELSE 'customer:' || c.id END AS recipient
          FROM inv JOIN customers c ON c.id = inv.customer_id
          JOIN {CHANNEL_ROWS} ch ON (',' || c.channels || ',') LIKE ('%,' || ch.channel || ',%')
    """,
    "render_overdue_messages": f"""
        WITH inv AS (
            SELECT i.id, i.customer_id, i.due_at, i.amount_cents,
                   CASE WHEN i.due_at <= :d5 THEN 5 WHEN i.due_at <= :d3 THEN 3 ELSE 1 END AS stage
              FROM invoices i
             WHERE (i.paid_at IS NULL OR i.paid_at > :at) AND i.created_at <= :at
               AND i.due_at <= :d1)
        SELECT 'Reminder: invoice #' || inv.id || ' is ' || inv.stage
                   || CASE WHEN inv.stage = 1 THEN ' day' ELSE ' days' END || ' overdue',
               'Invoice #' || inv.id || ' for ' || (inv.amount_cents / 100) || '.'
                   || (inv.amount_cents % 100) || ' was due on ' || inv.due_at
          FROM inv JOIN customers c ON c.id = inv.customer_id
          JOIN {CHANNEL_ROWS} ch ON (',' || c.channels || ',') LIKE ('%,' || ch.channel || ',%')
    """,
    "renewal_notices": f"""
        WITH svc AS (
            SELECT s.id, s.customer_id, s.expires_at,
                   CASE WHEN s.expires_at <= :h1 THEN 1 WHEN s.expires_at <= :h3 THEN 3
                        ELSE 7 END AS stage
              FROM services s
             WHERE s.status = 'active' AND s.expires_at > :at AND s.expires_at <= :h7)
        SELECT svc.id, svc.stage, ch.channel
          FROM svc JOIN customers c ON c.id = svc.customer_id
          JOIN {CHANNEL_ROWS} ch ON (',' || c.channels || ',') LIKE ('%,' || ch.channel || ',%')
    """,
    "auto_renew_plan": """
        SELECT s.id, s.customer_id, s.price_cents, COALESCE(c.balance_cents, 0) AS balance,
               SUM(s.price_cents) OVER (PARTITION BY s.customer_id
                                        ORDER BY s.expires_at, s.id
                                        ROWS UNBOUNDED PRECEDING) AS needed
          FROM services s LEFT JOIN customers c ON c.id = s.customer_id
         WHERE s.status = 'active' AND s.auto_renew = :true AND s.expires_at <= :renew_horizon
    """,
    "reconcile_balances": """
        SELECT c.id, c.balance_cents, COALESCE(p.total, 0), COALESCE(i.total, 0)
          FROM customers c
          LEFT JOIN (SELECT customer_id, SUM(amount_cents) AS total FROM payments
                      GROUP BY customer_id) p ON p.customer_id = c.id
          LEFT JOIN (SELECT customer_id, SUM(amount_cents) AS total FROM invoices
                      GROUP BY customer_id) i ON i.customer_id = c.id
         WHERE c.balance_cents <> COALESCE(p.total, 0) - COALESCE(i.total, 0)
    """,
    "ticket_auto_close": """
        SELECT id FROM tickets WHERE status = 'waiting_customer' AND updated_at <= :cutoff
    """,
}


def sql_params(dialect: str) -> dict[str, Any]:
    times = {
        "at": AT,
        "d1": AT - DAY,
        "d3": AT - 3 * DAY,
        "d5": AT - 5 * DAY,
        "h1": AT + DAY,
        "h3": AT + 3 * DAY,
        "h7": AT + 7 * DAY,
        "renew_horizon": AT + RENEW.window,
        "cutoff": AT - TICKETS.waiting,
    }
    params: dict[str, Any] = {k: _sql_time(v, dialect) for k, v in times.items()}
    params["true"] = 1 if dialect == "sqlite" else True
    return params


def time_sql(engine: sa.Engine, rule: str, repeat: int) -> tuple[float, int]:
    statement = sa.text(SQL[rule])
    params = sql_params(engine.dialect.name)
    best, rows = float("inf"), 0
    with engine.connect() as conn:
        for _ in range(repeat):
            start = time.perf_counter()
            rows = len(conn.execute(statement, params).fetchall())
            best = min(best, time.perf_counter() - start)
    return best, rows


def _column_values(series: pd.Series) -> list[Any]:
    if pd.api.types.is_datetime64_any_dtype(series.dtype):
        text = np.datetime_as_string(series.to_numpy(dtype="datetime64[us]"), unit="us")
        return [None if v == "NaT" else v.replace("T", " ") for v in text.tolist()]
    values = series.astype(object).to_numpy()
    values[pd.isna(values)] = None
    if pd.api.types.is_bool_dtype(series.dtype):
        return [None if v is None else int(v) for v in values.tolist()]
    return [v.item() if isinstance(v, np.generic) else v for v in values.tolist()]


def load_sqlite(engine: sa.Engine, frames: dict[str, pd.DataFrame]) -> None:
    """Bulk insert with the text formats SQLAlchemy itself writes for SQLite."""
    create_schema(engine)
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        for name in TABLES:
            frame = frames[name]
            columns = list(frame.columns)
            rows = zip(*(_column_values(frame[c]) for c in columns), strict=True)
            marks = ", ".join("?" for _ in columns)
            cursor.executemany(f"INSERT INTO {name} ({', '.join(columns)}) VALUES ({marks})", rows)
        raw.commit()
        cursor.execute("ANALYZE")
        raw.commit()
    finally:
        raw.close()


def load_postgres(engine: sa.Engine, frames: dict[str, pd.DataFrame]) -> None:
    """COPY each table from CSV text."""
    create_schema(engine)
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        for name in TABLES:
            frame = frames[name]
            buffer = StringIO()
            # \N marks NULL, so an empty channels string stays an empty string.
            frame.to_csv(
                buffer,
                index=False,
                header=False,
                na_rep="\\N",
                date_format="%Y-%m-%d %H:%M:%S.%f",
            )
            buffer.seek(0)
            columns = ", ".join(frame.columns)
            cursor.copy_expert(
                f"COPY {name} ({columns}) FROM STDIN WITH (FORMAT csv, NULL '\\N')", buffer
            )
        raw.commit()
        cursor.execute("ANALYZE")
        raw.commit()
    finally:
        raw.close()


# --- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="services (and invoices)")
    parser.add_argument("--repeat", type=int, default=3, help="timings per measurement (best)")
    parser.add_argument("--no-postgres", action="store_true", help="skip PostgreSQL")
    parser.add_argument("--url", help="an existing empty PostgreSQL database to use")
    parser.add_argument("--json", help="write the result rows here (for bench/run.py)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, Path(args.data), args.repeat)
        return 0

    started = time.perf_counter()
    print(f"generating sample data: {args.rows:,} services ...", flush=True)
    frames = build_sample_frames(services=args.rows, seed=7, as_of=AS_OF)
    counts = ", ".join(f"{name} {len(frames[name]):,}" for name in TABLES)
    print(f"  {counts}", flush=True)

    with tempfile.TemporaryDirectory(prefix="dueledger-bench-") as tmp:
        data_dir = Path(tmp)
        inputs = {name: frames[name] for name in TABLES}
        inputs["movements"] = _movements(frames)
        inputs["overdue_due"] = overdue_reminders_due(
            frames["invoices"], frames["customers"], AS_OF, REMINDERS
        )
        for name, frame in inputs.items():
            frame.to_pickle(data_dir / f"{name}.pkl", protocol=pickle.HIGHEST_PROTOCOL)
        del inputs

        print("timing the pandas rules (a fresh process each) ...", flush=True)
        pandas_results = {rule: run_child(rule, data_dir, args.repeat) for rule in RULES}

        backends: dict[str, sa.Engine] = {}
        print("loading SQLite ...", flush=True)
        sqlite_engine = make_engine(f"sqlite:///{data_dir / 'bench.sqlite'}")
        load_sqlite(sqlite_engine, frames)
        backends["sqlite"] = sqlite_engine

        server = watchdog = None
        try:
            if not args.no_postgres:
                url = args.url
                if url is None:
                    import pg_server  # tests/pg_server.py

                    print("starting a throwaway PostgreSQL ...", flush=True)
                    server = pg_server.start_server()
                    watchdog = pg_server.start_watchdog(server)
                    url = server.create_database("bench_assets")
                print("loading PostgreSQL ...", flush=True)
                backends["postgres"] = make_engine(url)
                load_postgres(backends["postgres"], frames)
            del frames
            print("timing the SQL queries ...", flush=True)
            sql_results = {
                backend: {rule: time_sql(engine, rule, args.repeat) for rule in RULES}
                for backend, engine in backends.items()
            }
        finally:
            for engine in backends.values():
                engine.dispose()
            if server is not None:
                server.stop(remove=True)
            if watchdog is not None:
                watchdog.kill()
                watchdog.wait()

    header = f"{'rule':<24}{'rows':>10}{'pandas s':>10}{'peak MB':>15}"
    for backend in sql_results:
        header += f"{backend + ' s':>12}{'ratio':>8}{'rows ok':>8}"
    print()
    print(header)
    print("-" * len(header))
    for rule, measured in pandas_results.items():
        line = (
            f"{rule:<24}{measured['rows']:>10,}{measured['seconds']:>10.3f}"
            f"{measured['peak_mb']:>8.0f} ({measured['inputs_mb']:>4.0f})"
        )
        for results in sql_results.values():
            seconds, rows = results[rule]
            ok = "yes" if rows == measured["rows"] else f"NO {rows}"
            line += f"{seconds:>12.3f}{measured['seconds'] / seconds:>8.2f}{ok:>8}"
        print(line)
    print()
    print(
        "ratio = pandas seconds / SQL seconds on the same data (below 1: pandas faster). "
        "pandas: the pure rule on full in-memory tables, best of "
        f"{args.repeat}; SQL: the equivalent query with rows fetched, best of {args.repeat}. "
        "peak MB: the rule's own process, inputs included (inputs alone in brackets)."
    )
    print(f"total bench time {time.perf_counter() - started:.0f} s (pid {os.getpid()})")
    if args.json:
        write_rows(args.json, args.rows, pandas_results, sql_results)
    return 0


def write_rows(
    path: str,
    services: int,
    pandas_results: dict[str, dict[str, Any]],
    sql_results: dict[str, dict[str, tuple[float, int]]],
) -> None:
    """Each rule per backend (pandas vs SQL) and one row-count check, as ``bench/run.py``
    rows (``--json``)."""
    if str(ROOT / "bench") not in sys.path:
        sys.path.append(str(ROOT / "bench"))  # last: bench/assets.py shadows `assets`
    from run import Row, write_json  # bench/run.py owns the row format

    rows = []
    mismatches = []
    for rule, measured in pandas_results.items():
        for backend, results in sql_results.items():
            seconds, count = results[rule]
            if count != measured["rows"]:
                mismatches.append(f"{rule}/{backend}")
            rows.append(
                Row(
                    area="business assets",
                    measurement=f"{rule}: pandas rule (peak {measured['peak_mb']:.0f} MB)",
                    backend=backend,
                    size=f"{services:,} services, {measured['rows']:,} result rows",
                    value=measured["seconds"],
                    unit="s",
                    baseline=seconds,
                    baseline_label="the same question in SQL",
                    ratio=measured["seconds"] / seconds,
                )
            )
    rows.append(
        Row(
            area="business assets",
            measurement="pandas and SQL return the same row counts"
            + (f" (differ: {', '.join(mismatches)})" if mismatches else ""),
            backend=",".join(sql_results),
            size=f"{services:,} services, {len(pandas_results)} rules",
            value=float(len(mismatches)),
            unit="mismatches",
            target="0",
            met=not mismatches,
            kind="check",
        )
    )
    write_json(path, "assets", rows)


if __name__ == "__main__":
    sys.exit(main())
