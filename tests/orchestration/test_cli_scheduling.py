"""`dueledger dues | pause | resume | catch-up` and `launch --queue` through the console script,
run as a subprocess as a user runs it, ledger on SQLite and
PostgreSQL: pausing shows in `tasks` and `dues`, the DST rule shows in `dues`, a catch-up of a
range with dues done, failed and missed launches the missed, retries the failed, and a second
catch-up does nothing; every bad value is exit 2 naming the option, a refusal exit 3.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import dagster as dg
import pytest
from cli_process import Ran, base_env, run_cli

from resources.core import tags as t
from resources.core.due import Due, floor_to_slot
from resources.core.entry import Status, Trigger
from resources.core.settings import ENV_DATABASE_URL, ENV_TIMEZONE
from resources.ledger import RunLedger

TASK = "order_cleanup"
SLOT = timedelta(minutes=15)


@dataclass
class Box:
    url: str
    tmp: Path
    env: dict[str, str]
    ledger: RunLedger

    def run(self, *args: str, **extra: str) -> Ran:
        return run_cli(args, {**self.env, **extra})

    def ok(self, *args: str, **extra: str) -> object:
        ran = self.run(*args, "--json", **extra)
        assert ran.code == 0, (args, ran.output[-2000:])
        return ran.json()


@pytest.fixture
def box(ledger: RunLedger, ledger_url: str, tmp_path: Path) -> Iterator[Box]:
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = base_env(DAGSTER_HOME=str(home), **{ENV_DATABASE_URL: ledger_url})
    yield Box(ledger_url, tmp_path, env, ledger)


def test_pause_shows_in_tasks_and_dues_and_resume_ends_it(box: Box) -> None:
    paused = box.ok("pause", TASK, "--reason", "db migration", "--operator", "alice")
    assert (paused["by"], paused["reason"], paused["source"]) == ("alice", "db migration", "cli")
    again = box.run("pause", TASK, "--reason", "twice", "--operator", "bob", "--json")
    assert "already paused by alice" in again.error(3)
    (row,) = [r for r in box.ok("tasks") if r["key"] == TASK]
    assert [(p["by"], p["reason"]) for p in row["paused"]] == [("alice", "db migration")]
    listed = box.ok("dues", TASK, "--next", "3")
    assert [d["skipped_by_pause"] for d in listed["dues"]] == [True, True, True]
    assert listed["dues"][0]["pause"]["skip_reason"] == "paused by alice: db migration"
    resumed = box.ok("resume", TASK, "--reason", "done", "--operator", "alice")
    assert [p["by"] for p in resumed["resumed"]] == ["alice"]
    assert "is not paused" in box.run("resume", TASK, "--reason", "x", "--json").error(3)
    audit = box.ledger.recent_audit()
    assert [r["action"] for r in audit if r["action"].startswith("task_")] == [
        "task_paused",
        "task_resumed",
    ]


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_dues_list_utc_and_local_times_with_the_dst_rule(box: Box) -> None:
    berlin = {ENV_TIMEZONE: "Europe/Berlin"}
    # log_archive runs at 02:00 local: on 2027-03-28 02:00 does not exist in Berlin.
    listed = box.ok(
        "dues", "log_archive", "--from", "2027-03-27T00:00Z", "--to", "2027-03-30T00:00Z", **berlin
    )
    assert listed["timezone"] == "Europe/Berlin"
    assert [d["due"] for d in listed["dues"]] == [
        "2027-03-27T01:00:00Z",
        "2027-03-28T01:00:00Z",
        "2027-03-29T00:00:00Z",
    ]
    gap = listed["dues"][1]
    assert gap["local"] == "2027-03-28 03:00 CEST" and "does not exist" in gap["dst"]
    assert listed["dues"][0]["dst"] is None
    nxt = box.ok("dues", TASK, "--next", "4")["dues"]
    starts = [datetime.fromisoformat(d["due"].replace("Z", "+00:00")) for d in nxt]
    assert [b - a for a, b in pairwise(starts)] == [SLOT] * 3


def test_dues_prints_no_python_warnings_about_other_tasks(box: Box) -> None:
    # The cadence warnings of the tick tasks once came out of every command, with source.
    ran = box.run("dues", TASK, "--next", "2")
    assert ran.code == 0, ran.output[-2000:]
    assert "Warning" not in ran.err and "declares every minute" not in ran.err


def test_tasks_json_shows_the_rule_as_declared_and_the_schedules_crons_apart(box: Box) -> None:
    # A rule read in a zone with clock changes fires on UTC crons; "cron" once showed the
    # first of those ("0 0 * * *") as if it were the rule.
    (row,) = [
        r for r in box.ok("tasks", **{ENV_TIMEZONE: "Europe/Berlin"}) if r["key"] == "log_archive"
    ]
    assert (row["cron"], row["timezone"]) == ("0 2 * * *", "Europe/Berlin")
    assert row["schedule_timezone"] == "UTC"
    assert row["schedule_crons"] == ["0 0,1 * * *"]  # 02:00 Berlin in summer and in winter


# Refused before the ledger is read or written: the same on both ledgers, tried on SQLite.
@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("dues", "no_such_task"), "unknown task"),
        (("dues", TASK, "--next", "0"), "--next 0"),
        (("dues", TASK, "--next", "3", "--from", "2027-01-01", "--to", "2027-01-02"), "not both"),
        (("dues", TASK, "--from", "2027-01-02", "--to", "2027-01-01"), "--from"),
        # A range lists every due or is refused naming the limit, never cut short silently.
        (("dues", TASK, "--from", "2027-01-01", "--to", "2027-02-01"), "at most 1000"),
        (("dues", TASK, "--from", "1970-01-01", "--to", "8999-01-01"), "800 days"),
        (("pause", TASK, "--reason", "  "), "reason"),
        (
            ("catch-up", TASK, "--from", "2026-12-02", "--to", "2026-12-01"),
            "must be before --to",
        ),
        (("catch-up", TASK, "--from", "2020-01-01", "--to", "2020-01-02"), "retention"),
        (("catch-up", TASK, "--from", "DAYS_AGO_20", "--to", "NOW"), "at most 1000"),
        (("catch-up", TASK, "--from", "DAYS_AGO_1", "--to", "NOW", "--only", "some"), "--only"),
    ],
)
def test_bad_values_are_exit_2_naming_the_option(box: Box, args: tuple[str, ...], words) -> None:
    now = datetime.now(UTC)
    stamps = {
        "NOW": now.isoformat(),
        "DAYS_AGO_1": (now - timedelta(days=1)).isoformat(),
        "DAYS_AGO_20": (now - timedelta(days=20)).isoformat(),
    }
    args = tuple(stamps.get(a, a) for a in args)
    if args[0] == "catch-up":
        args = (*args, "--operator", "alice", "--reason", "r")
    assert words in box.run(*args, "--json").error(2)
    assert box.ledger.list_entries()[0] == []


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_a_task_that_is_not_manually_triggerable_is_not_caught_up(box: Box) -> None:
    now = datetime.now(UTC)
    ran = box.run(
        "catch-up",
        "log_archive",
        "--from",
        (now - timedelta(days=2)).isoformat(),
        "--to",
        now.isoformat(),
        "--operator",
        "alice",
        "--reason",
        "r",
        "--json",
    )
    assert "not manually triggerable" in ran.error(3)


def test_catch_up_runs_each_due_once_and_a_second_catch_up_does_nothing(
    box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = box.ledger
    start = floor_to_slot(datetime.now(UTC), 15) - 4 * SLOT
    dues = [Due(start + i * SLOT) for i in range(4)]
    done = ledger.ensure_entry(task_key=TASK, trigger=Trigger.SCHEDULE, dedup_key=dues[0].key)
    ledger.claim(done.id, "run-done", lease_ttl=timedelta(minutes=5))
    ledger.succeed(done.id, "run-done")
    failed = ledger.ensure_entry(task_key=TASK, trigger=Trigger.SCHEDULE, dedup_key=dues[1].key)
    ledger.claim(failed.id, "run-failed", lease_ttl=timedelta(minutes=5))
    ledger.fail(failed.id, "run-failed", error="boom", retry_coming=False)
    span = ("--from", dues[0].text, "--to", (dues[-1].at + SLOT).isoformat())
    who = ("--operator", "alice", "--reason", "the daemon was down")

    plan = box.ok("catch-up", TASK, *span, *who, "--dry-run")
    actions = [(d["due"], d["action"]) for d in plan["dues"]]
    assert actions == [
        (dues[0].text, "none"),
        (dues[1].text, "retry"),
        (dues[2].text, "launch"),
        (dues[3].text, "launch"),
    ]
    assert len(ledger.list_entries(task_key=TASK)[0]) == 2  # a dry run changes nothing

    first = box.ok("catch-up", TASK, *span, *who)
    assert (first["launched"], first["retried"], first["unchanged"]) == (2, 1, 1)
    for item, due in zip(first["dues"][2:], dues[2:], strict=True):
        entry = ledger.find(TASK, due.key)
        assert entry is not None and entry.id == item["entry_id"]
        assert (entry.trigger, entry.operator, entry.status) == (
            Trigger.MANUAL,
            "alice",
            Status.QUEUED,
        )
    retried = ledger.get(failed.id)
    assert retried is not None and retried.manual_retry_by == "alice"
    monkeypatch.setenv("DAGSTER_HOME", box.env["DAGSTER_HOME"])
    with dg.DagsterInstance.get() as instance:  # the runs wait in its queue (no daemon here)
        runs = instance.get_runs(dg.RunsFilter(tags={t.TAG_TASK: TASK}))
    queued = {r.tags.get(t.TAG_DUE) for r in runs if r.tags.get(t.TAG_TRIGGER) == Trigger.MANUAL}
    assert {dues[2].text, dues[3].text} <= queued

    second = box.ok("catch-up", TASK, *span, *who)
    assert (second["launched"], second["retried"]) == (0, 0)
    assert len(ledger.list_entries(task_key=TASK)[0]) == 5  # 2 before + 2 dues + 1 retry child


# --- concurrent operators: the database decides, one winner, one audit ------------------------

RACERS = 6
ROUNDS = 2


def _race(box: Box, *args: str) -> list[Ran]:
    """``dueledger ARGS`` as RACERS console-script processes started together."""
    with ThreadPoolExecutor(RACERS) as pool:
        return list(pool.map(lambda _: box.run(*args, "--json"), range(RACERS)))


def test_concurrent_pauses_and_resumes_have_one_winner_and_one_audit_each(box: Box) -> None:
    # On PostgreSQL, racing resumes once all exited 0, each writing an audit (131 audits for
    # 20 pauses), and a racing pause exited 1 on the open-pause index instead of 3.
    for _ in range(ROUNDS):
        for command in ("pause", "resume"):
            ran = _race(box, command, TASK, "--reason", "race", "--operator", "alice")
            codes = sorted(r.code for r in ran)
            assert codes == [0] + [3] * (RACERS - 1), [r.output[-400:] for r in ran]
            for loser in (r for r in ran if r.code == 3):
                assert json.loads(loser.out)["error"]  # a refusal naming why, not a traceback
    audits = {
        action: len(box.ledger.recent_audit(action=action))
        for action in ("task_paused", "task_resumed")
    }
    assert audits == {"task_paused": ROUNDS, "task_resumed": ROUNDS}
    (row,) = [r for r in box.ok("tasks") if r["key"] == TASK]
    assert row["paused"] == []


THREADS = 8
THREAD_ROUNDS = 10


def test_threads_racing_pause_and_resume_still_have_one_winner_each(box: Box) -> None:
    # The console scripts above start a second or so apart; threads released together by a
    # barrier hit the database in the same instant, where the races were found.
    from orchestration.declarations import registered_tasks
    from orchestration.pause import pause_task, resume_task
    from resources.core.errors import Refused
    from resources.ledger import Ledger

    ledgers = [Ledger.open(box.url) for _ in range(THREADS)]
    barrier = threading.Barrier(THREADS)
    specs = registered_tasks()

    def contend(ledger: Ledger, act) -> str:
        barrier.wait(timeout=60)
        try:
            act(ledger, specs, TASK, operator="alice", reason="race")
        except Refused:
            return "refused"
        return "won"

    try:
        with ThreadPoolExecutor(THREADS) as pool:
            for _ in range(THREAD_ROUNDS):
                for act in (pause_task, resume_task):
                    results = sorted(pool.map(functools.partial(contend, act=act), ledgers))
                    assert results == ["refused"] * (THREADS - 1) + ["won"], act.__name__
    finally:
        for ledger in ledgers:
            ledger.dispose()
    assert len(box.ledger.recent_audit(action="task_paused")) == THREAD_ROUNDS
    assert len(box.ledger.recent_audit(action="task_resumed")) == THREAD_ROUNDS


def _manual_runs_per_due(box: Box, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    monkeypatch.setenv("DAGSTER_HOME", box.env["DAGSTER_HOME"])
    with dg.DagsterInstance.get() as instance:
        runs = instance.get_runs(dg.RunsFilter(tags={t.TAG_TASK: TASK}))
    counts: dict[str, int] = {}
    for run in runs:
        if run.tags.get(t.TAG_TRIGGER) == Trigger.MANUAL:
            due = run.tags[t.TAG_DUE]
            counts[due] = counts.get(due, 0) + 1
    return counts


def test_overlapping_catch_ups_launch_one_dagster_run_per_due(
    box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two catch-ups of overlapping ranges once each launched their own run of the same dues
    # (20 runs for 12 dues): each run took the task's pool slot only to be refused.
    start = floor_to_slot(datetime.now(UTC), 15) - 12 * SLOT
    dues = [Due(start + i * SLOT) for i in range(12)]
    ranges = [(dues[0], dues[7]), (dues[4], dues[11])] * 2  # [from, to] inclusive
    who = ("--operator", "alice", "--reason", "race")

    def catch_up(span: tuple[Due, Due]) -> Ran:
        low, high = span
        return box.run(
            "catch-up", TASK, "--from", low.text, "--to", (high.at + SLOT).isoformat(), *who,
            "--only", "missed", "--json",
        )  # fmt: skip

    with ThreadPoolExecutor(len(ranges)) as pool:
        ran = list(pool.map(catch_up, ranges))
    for r in ran:
        assert r.code in (0, 3), r.output[-2000:]
        json.loads(r.out)  # one JSON document, a refusal included
    launched = [json.loads(r.out).get("launched", 0) for r in ran if r.code == 0]
    assert sum(launched) == len(dues)
    assert _manual_runs_per_due(box, monkeypatch) == {d.text: 1 for d in dues}
    entries = [e for e in box.ledger.list_entries(task_key=TASK)[0] if e.due is not None]
    assert len(entries) == len(dues)
    audited = sorted(a["entry_id"] for a in box.ledger.recent_audit(action="catch_up"))
    assert audited == sorted(e.id for e in entries)
    again = box.ok("catch-up", TASK, "--from", dues[0].text, "--to", dues[-1].text, *who)
    assert again["launched"] == 0
