"""`dueledger metrics serve|write` as an operator runs them: the console script in its own
process, scraped over real HTTP and parsed with prometheus_client's own parser, against a
ledger built by real Dagster runs of ``order_cleanup``'s claim on a real instance -- a success,
a duplicate refused, a failure retried by Dagster's retry run, a lease reclaimed by
`dueledger reclaim` (its alert failing to reach a dead webhook), a missed due. Then the server
is restarted and reports the same: every value comes from the ledger, none from memory.
"""

# No ``from __future__ import annotations``: Dagster reads the test asset's annotations.
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from hook_support import registry_of
from processes import start_group, stop_group
from prometheus_client.parser import text_string_to_metric_families

from orchestration.declarations import registered_tasks
from orchestration.services.hooks.registry import Hooks
from orchestration.services.hooks.vocabulary import Listener
from orchestration.task_defs import run_task
from orchestration.task_run import TaskRun
from orchestration.task_spec import require_task
from resources.core import metric_model as m
from resources.core import tags as t
from resources.core.alerting import ENV_WEBHOOK_URL
from resources.core.due import floor_to_slot, format_due
from resources.core.entry import FailureKind, Trigger, dedup_key_for_due
from resources.core.settings import ENV_DATABASE_URL, PROJECT_ROOT
from resources.ledger import RunLedger

SPEC = require_task(registered_tasks(), "order_cleanup")
SLOT = timedelta(minutes=15)
BIN = Path(sys.executable).parent
STARTUP_S = 120.0


def broken_listener(context: Any) -> None:
    raise RuntimeError("plugin down")


HOOKS = Hooks.of(registry_of(Listener("broken", ("task_before",), broken_listener)))
FAIL_FLAG = "DUELEDGER_TEST_METRICS_FAIL"


def _nothing(context: dg.AssetExecutionContext, run: TaskRun):
    if os.environ.get(FAIL_FLAG):
        raise RuntimeError("the source is down")
    yield from ()


@dg.asset(name="order_cleanup", output_required=False)
def order_cleanup(context: dg.AssetExecutionContext, ledger: RunLedger):
    """order_cleanup's claim, a body that does nothing (or fails while the flag is set)."""
    yield from run_task(context, ledger, SPEC, _nothing, hooks=HOOKS, tasks=registered_tasks())


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    home = tmp_path / "home"
    home.mkdir()
    # Run retries on, as in production: a failed run that Dagster will retry stays retrying.
    (home / "dagster.yaml").write_text("run_retries:\n  enabled: true\n  max_retries: 2\n")
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv(ENV_DATABASE_URL, url)
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there: alert deliveries fail (and are retried later)
    monkeypatch.setenv(ENV_WEBHOOK_URL, f"http://127.0.0.1:{port}/hook")
    yield {k: v for k, v in os.environ.items()}


def run(instance: dg.DagsterInstance, ledger: RunLedger, due: datetime, **tags: str) -> str:
    result = dg.materialize(
        [order_cleanup],
        resources={"ledger": ledger},
        instance=instance,
        tags={
            t.TAG_TASK: SPEC.key,
            t.TAG_TRIGGER: Trigger.SCHEDULE.value,
            t.TAG_DUE: format_due(due),
            t.DAGSTER_MAX_RETRIES: "2",
            **tags,
        },
        raise_on_error=False,
    )
    return result.run_id


def build_ledger(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Dues d0..d3 of order_cleanup, the slots before the current one: d0 succeeds (and a
    duplicate of it is refused), d1 is missed, d2 fails then succeeds in Dagster's retry, d3's
    lease expires and `dueledger reclaim` fails it."""
    current = floor_to_slot(datetime.now(UTC), 15)
    d0, d1, d2, d3 = (current - n * SLOT for n in (4, 3, 2, 1))
    ledger = RunLedger(database_url=env[ENV_DATABASE_URL])
    ledger.migrate()
    with dg.DagsterInstance.get() as instance:
        run(instance, ledger, d0)
        refused_run = run(instance, ledger, d0)
        monkeypatch.setenv(FAIL_FLAG, "1")
        failed_run = run(instance, ledger, d2)
        monkeypatch.delenv(FAIL_FLAG)
        retry_tags = {
            t.DAGSTER_PARENT_RUN_ID: failed_run,
            t.DAGSTER_ROOT_RUN_ID: failed_run,
            t.DAGSTER_RETRY_NUMBER: "1",
        }
        run(instance, ledger, d2, **retry_tags)
        refused = instance.get_run_by_id(refused_run)
        assert refused is not None and refused.tags.get(t.TAG_OUTCOME) == t.OUTCOME_REFUSED
    lost = ledger.ensure_entry(
        task_key=SPEC.key, trigger=Trigger.SCHEDULE, dedup_key=dedup_key_for_due(d3), due=d3
    )
    ledger.claim(lost.id, "run-killed", lease_ttl=timedelta(seconds=1), now=d3)
    done = subprocess.run(
        [str(BIN / "dueledger"), "reclaim", "--json"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=STARTUP_S,
    )
    assert done.returncode == 0, done.stderr
    assert [r["entry_id"] for r in json.loads(done.stdout)["reclaims"]] == [lost.id]
    entries = {e.due: e for e in ledger.list_entries(task_key=SPEC.key, limit=10)[0]}
    ledger.dispose()
    assert entries[d2].run_ids == (failed_run, entries[d2].run_ids[1])
    return {"current": current, "dues": (d0, d1, d2, d3), "entries": entries}


def serve(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`dueledger metrics serve --port 0 --json` started; its URL read from its first output."""
    out = log.open("wb")
    proc = start_group(
        [str(BIN / "dueledger"), "metrics", "serve", "--port", "0", "--json"],
        cwd=PROJECT_ROOT,
        env=env,
        log=out,
    )
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        text = log.read_text()
        if text.count("}") and text.lstrip().startswith("{"):
            start = text.index("{")
            try:
                return proc, json.loads(text[start : text.index("}", start) + 1])["url"]
            except ValueError:
                pass
        if proc.poll() is not None:
            raise AssertionError(f"metrics serve exited {proc.returncode}:\n{log.read_text()}")
        time.sleep(0.2)
    stop_group(proc)
    raise AssertionError(f"metrics serve did not start within {STARTUP_S:.0f} s:\n{text}")


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> tuple[Samples, dict[str, str]]:
    """Samples by (name, sorted labels), and the type of each family, by prometheus_client."""
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def scrape(url: str) -> tuple[Samples, dict[str, str]]:
    with urllib.request.urlopen(url, timeout=60) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return parse(response.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_a_scrape_reports_the_ledger_and_a_restarted_server_the_same(env, monkeypatch, tmp_path):
    built = build_ledger(env, monkeypatch)
    d0, d1, d2, d3 = built["dues"]
    entries = built["entries"]
    proc, url = serve(env, tmp_path / "serve-1.log")
    try:
        samples, types = scrape(url)
    finally:
        stop_group(proc)
    assert proc.returncode == 0, (tmp_path / "serve-1.log").read_text()

    # Every family of the model is there, with its type.
    for spec in m.CATALOG:
        name = spec.name.removesuffix("_total") if spec.kind == m.COUNTER else spec.name
        assert name in types, f"{spec.name} missing from the scrape"
        assert types[name] == ("histogram" if spec.kind == m.GAUGE_HISTOGRAM else spec.kind)

    task = {"task": SPEC.key}
    entries_total = "dueledger_entries_total"
    ok = {"status": "success", "failure_kind": "", "trigger": "schedule"}
    # d0, and d2 after its retry (whose entry keeps the failed attempt's kind: not counted).
    assert value(samples, entries_total, **task, **ok) == 2
    assert entries[d2].failure_kind == FailureKind.ERROR
    reclaimed = {"status": "failed", "failure_kind": "lease_reclaimed", "trigger": "schedule"}
    assert value(samples, entries_total, **task, **reclaimed) == 1  # d3
    failed = {"status": "failed", "failure_kind": "error", "trigger": "schedule"}
    assert value(samples, entries_total, **task, **failed) == 0  # d2 was retried, not failed
    assert value(samples, "dueledger_lease_reclaims_total", **task) == 1
    assert value(samples, "dueledger_refused_runs_total", **task) == 1
    # d1, and any slot that ended while the test ran (no run came for it either).
    slots_since = (floor_to_slot(datetime.now(UTC), 15) - built["current"]) // SLOT
    assert value(samples, "dueledger_missed_dues", **task) == 1 + slots_since
    assert value(samples, "dueledger_missed_dues", task="billing_maintenance") == 0
    for status in m.OPEN_STATUSES:
        assert value(samples, "dueledger_open_entries", **task, status=status) == 0
    assert value(samples, "dueledger_stale_leases", **task) == 0
    # Three claimed runs fired task_before; the broken listener failed each time.
    assert value(samples, "dueledger_hook_failures_total", event="task_before") == 3
    assert value(samples, "dueledger_hook_failures_total", event="task_after") == 0
    # The reclaim's alert could not reach the webhook: failed, a retry will come.
    assert value(samples, "dueledger_alert_deliveries_waiting", channel="webhook", status="failed")
    delivered = {"channel": "webhook", "status": "delivered"}
    assert value(samples, "dueledger_alert_deliveries_total", **delivered) == 0

    last = entries[d2]  # the newest success
    assert value(samples, "dueledger_last_success_timestamp_seconds", **task) == pytest.approx(
        last.finished_at.timestamp()
    )
    assert value(samples, "dueledger_last_due_timestamp_seconds", **task) == d3.timestamp()
    lag = "dueledger_due_lag_seconds"
    assert value(samples, f"{lag}_gcount", **task, stage="start") == 3  # d0, d2, d3
    assert value(samples, f"{lag}_gcount", **task, stage="success") == 2
    start_lags = [(entries[d].started_at - d).total_seconds() for d in (d0, d2, d3)]
    assert value(samples, f"{lag}_gsum", **task, stage="start") == pytest.approx(sum(start_lags))
    assert value(samples, f"{lag}_bucket", **task, stage="start", le="+Inf") == 3
    assert value(samples, "dueledger_scheduler_heartbeat_age_seconds") == float("inf")
    attention = [k for k in samples if k[0] == "dueledger_entry_needs_attention_timestamp_seconds"]
    assert [dict(k[1])["entry"] for k in attention] == [str(entries[d3].id)]
    assert d1 not in entries

    # Restarted: the same numbers (only the missed dues may move on with the clock).
    proc, url = serve(env, tmp_path / "serve-2.log")
    try:
        again, _ = scrape(url)
    finally:
        stop_group(proc)
    moving = {"dueledger_missed_dues"}
    assert {k: v for k, v in again.items() if k[0] not in moving} == {
        k: v for k, v in samples.items() if k[0] not in moving
    }

    # The same scrape, written for node_exporter's textfile collector.
    target = tmp_path / "textfile" / "dueledger.prom"
    target.parent.mkdir()
    done = dueledger(env, "metrics", "write", str(target), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["path"] == str(target)
    written, _ = parse(target.read_text())
    assert {k: v for k, v in written.items() if k[0] not in moving} == {
        k: v for k, v in samples.items() if k[0] not in moving
    }
    assert not [p for p in target.parent.iterdir() if p != target]  # no temporary file left


def dueledger(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "dueledger"), *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=STARTUP_S,
    )


def test_a_port_in_use_and_an_unwritable_file_are_exit_2_naming_them(env, tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        done = dueledger(env, "metrics", "serve", "--port", str(port), "--json")
    finally:
        taken.close()
    assert done.returncode == 2, done.stderr
    error = json.loads(done.stdout)["error"]
    assert f"127.0.0.1:{port}" in error and "--port" in error
    # Refused before anything was opened: no ledger file was created.
    assert not Path(env[ENV_DATABASE_URL].removeprefix("sqlite:///")).exists()

    missing = tmp_path / "no-such-dir" / "dueledger.prom"
    done = dueledger(env, "metrics", "write", str(missing))
    assert done.returncode == 2
    assert f"cannot write metrics to {missing}" in done.stderr
    assert "does not exist" in done.stderr

    done = dueledger(env, "metrics", "serve", "--port", "70000", "--json")
    assert done.returncode == 2
    assert "--port '70000'" in json.loads(done.stdout)["error"]


@pytest.mark.parametrize("kind", ["a FIFO", "a character device", "a symbolic link"])
def test_write_refuses_anything_but_a_regular_file_and_replaces_nothing(env, tmp_path, kind):
    # The file is written aside and renamed over FILE: a FIFO a collector reads, or (as root)
    # /dev/null, was once replaced by a regular file, exit 0.
    if kind == "a FIFO":
        target = tmp_path / "metrics.fifo"
        os.mkfifo(target)
    elif kind == "a character device":
        target = Path("/dev/null")
    else:
        target = tmp_path / "link.prom"
        (tmp_path / "real.prom").write_text("")
        target.symlink_to(tmp_path / "real.prom")
    before = target.lstat()
    done = dueledger(env, "metrics", "write", str(target), "--json")
    assert done.returncode == 2, done.stdout + done.stderr
    error = json.loads(done.stdout)["error"]
    assert f"cannot write metrics to {target}: it is {kind}" in error
    after = target.lstat()
    assert (after.st_mode, after.st_ino, after.st_rdev) == (
        before.st_mode,
        before.st_ino,
        before.st_rdev,
    )


@pytest.mark.postgres
def test_a_scrape_that_fails_is_a_500_that_says_what_failed(
    env, tmp_path, pg_server, postgres_url, monkeypatch
):
    # The stock server answered "A server error occurred", not the error the docs promise.
    env = {**env, ENV_DATABASE_URL: postgres_url}
    proc, url = serve(env, tmp_path / "serve.log")
    try:
        scrape(url)  # a healthy scrape first: the ledger is there
        pg_server.drop_database(postgres_url.rsplit("/", 1)[1])  # its connections forced off
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(url, timeout=60)
        body = failed.value.read().decode()
    finally:
        stop_group(proc)
    assert failed.value.code == 500
    assert body.startswith("dueledger metrics: the scrape failed: "), body
    assert "cannot use the ledger database" in body and "DUELEDGER_DATABASE_URL" in body, body
