"""Operator commands killed at random instants leave their change and its audit together.

Each round starts the real console script (`dueledger pause`, `resume`, `catch-up`), kills
its whole process group with SIGKILL after a random delay -- before it started, while it
writes, after it finished -- and then holds the ledger's state against its audit: every
pause has its `task_paused` record and every closed pause its `task_resumed`; every due a
catch-up created has its `catch_up` record. A command killed halfway once left a pause with
no audit (22 of 60 kills), and a catch-up's entries without theirs.

CI size: KILL_ROUNDS rounds per command on each ledger (about a minute each).
``DUELEDGER_KILL_ROUNDS=N`` sets the rounds (full size: 200); ``DUELEDGER_KILL_SEED`` replays.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cli_process import DUELEDGER, PROJECT_ROOT, base_env

from orchestration.pause import PAUSE_CLI, task_pauses
from resources.core.due import format_due
from resources.core.entry import Trigger
from resources.core.settings import ENV_DATABASE_URL
from resources.ledger import RunLedger

KILL_ROUNDS = int(os.environ.get("DUELEDGER_KILL_ROUNDS") or 8)
TASK = "order_cleanup"


@pytest.fixture
def env(ledger: RunLedger, ledger_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    home = tmp_path / "dagster_home"
    home.mkdir()
    yield base_env(DAGSTER_HOME=str(home), **{ENV_DATABASE_URL: ledger_url})


@pytest.fixture
def rng() -> random.Random:
    seed = int(os.environ.get("DUELEDGER_KILL_SEED") or time.time_ns() % 1_000_000)
    print(f"kill seed {seed}")
    return random.Random(seed)


def _start(args: list[str], env: dict[str, str], *, own_group: bool) -> subprocess.Popen:
    """`dueledger ARGS`, quiet; ``own_group``: in a process group of its own."""
    return subprocess.Popen(
        [str(DUELEDGER), *args],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=own_group,
    )


def _killed(args: list[str], env: dict[str, str], delay: float) -> int | None:
    """Run `dueledger ARGS`, SIGKILL its process group after ``delay`` seconds unless it ended
    by then; its exit code, or None when it was killed."""
    proc = _start(args, env, own_group=True)  # its launcher children die with it
    try:
        return proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        return None


def _lifetime(args: list[str], env: dict[str, str]) -> float:
    """How long the command takes here, run once to its end: the kills fall within it."""
    started = time.monotonic()
    _killed(args, env, 600)
    return time.monotonic() - started


def _audits(ledger: RunLedger, action: str) -> list[dict]:
    return ledger.recent_audit(action=action, limit=10_000)


def test_a_killed_pause_or_resume_leaves_its_change_and_its_audit_together(
    env: dict[str, str], ledger: RunLedger, rng: random.Random
) -> None:
    killed = 0
    commands = {
        command: [command, TASK, "--reason", "kill test", "--operator", "alice"]
        for command in ("pause", "resume")
    }
    lifetime = max(_lifetime(args, env) for args in commands.values())
    for _ in range(KILL_ROUNDS):
        for args in commands.values():
            killed += _killed(args, env, rng.uniform(0, lifetime)) is None
            pauses = [p for p in task_pauses(ledger, TASK) if p.source == PAUSE_CLI]
            paused = _audits(ledger, "task_paused")
            resumed = _audits(ledger, "task_resumed")
            assert sorted(a["checks"]["pause_id"] for a in paused) == sorted(
                p.id for p in pauses
            ), (pauses, paused)
            closed = sorted(p.id for p in pauses if p.end is not None)
            assert sorted(i for a in resumed for i in a["checks"]["pause_ids"]) == closed
    assert killed > 0, "no command was killed: the delays were all longer than the commands"


def test_a_killed_catch_up_leaves_every_entry_it_made_with_its_audit(
    env: dict[str, str], ledger: RunLedger, rng: random.Random
) -> None:
    end = datetime.now(UTC).replace(second=0, microsecond=0)
    start = end - timedelta(hours=6)
    args = ["catch-up", TASK, "--from", start.isoformat(), "--to", end.isoformat()]
    args += ["--only", "missed", "--operator", "alice", "--reason", "kill test"]
    killed = 0
    # The first run is killed too: its lifetime is only known from a dry run's.
    lifetime = _lifetime([*args, "--dry-run"], env) * 3
    for _ in range(max(2, KILL_ROUNDS // 2)):
        killed += _killed(args, env, rng.uniform(0, lifetime)) is None
        entries = [
            e
            for e in ledger.list_entries(task_key=TASK, limit=500)[0]
            if e.trigger == Trigger.MANUAL and e.due is not None
        ]
        audited = [a["entry_id"] for a in _audits(ledger, "catch_up")]
        assert sorted(audited) == sorted(e.id for e in entries)
    assert killed > 0, "no catch-up was killed: the delays were all longer than the commands"
    # Run to its end, the catch-up finishes what the killed ones left, never a due twice.
    assert _killed(args, env, 600) == 0
    runs = _catch_up_runs(env)
    assert runs and all(count == 1 for count in runs.values()), runs
    assert len(runs) == len(_dues_between(start, end))


def _dues_between(start: datetime, end: datetime) -> list[datetime]:
    from orchestration.declarations import task_views
    from orchestration.timetable import plan_dues

    (view,) = [v for v in task_views() if v.spec.key == TASK]
    return plan_dues(view.plan, view.slot_minutes, start, end)


def _task_runs(env: dict[str, str]) -> list:
    """The task's Dagster runs in the test's DAGSTER_HOME."""
    import dagster as dg

    from resources.core import tags as t

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", env["DAGSTER_HOME"])
        with dg.DagsterInstance.get() as instance:
            return list(instance.get_runs(dg.RunsFilter(tags={t.TAG_TASK: TASK})))


def _count_by(runs: list, tag: str) -> dict[str, int]:
    """How many of ``runs`` carry each value of ``tag`` (runs without it left out)."""
    counts: dict[str, int] = {}
    for run in runs:
        value = run.tags.get(tag)
        if value is not None:
            counts[value] = counts.get(value, 0) + 1
    return counts


def _catch_up_runs(env: dict[str, str]) -> dict[str, int]:
    """Dagster runs per due of the task's manual (catch-up) runs."""
    from resources.core import tags as t

    manual = [r for r in _task_runs(env) if r.tags.get(t.TAG_TRIGGER) == Trigger.MANUAL]
    return _count_by(manual, t.TAG_DUE)


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2 :].split()[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def test_a_catch_up_killed_while_launching_leaves_no_launcher_and_no_due_twice(
    env: dict[str, str], ledger: RunLedger
) -> None:
    # Killed with kill -9 (the command alone, not its group), a catch-up's Dagster launcher
    # once went on launching; running the catch-up again then launched 190 more runs for
    # 196 dues.
    end = datetime.now(UTC).replace(second=0, microsecond=0)
    start = end - timedelta(hours=24)  # 96 dues: their launch outlasts the wait below
    args = ["catch-up", TASK, "--from", start.isoformat(), "--to", end.isoformat()]
    args += ["--only", "missed", "--operator", "alice", "--reason", "kill test"]
    proc = _start(args, env, own_group=False)  # killed alone below, not its group
    deadline = time.monotonic() + 300
    launchers: list[int] = []
    while not launchers and proc.poll() is None:
        assert time.monotonic() < deadline, "the catch-up never started its launcher"
        launchers = _children(proc.pid)
        time.sleep(0.05)
    assert launchers, "the catch-up ended before it was killed"
    time.sleep(0.5)  # into the launcher's work
    proc.kill()
    proc.wait(timeout=30)
    # Killed with it, the launcher is gone at once; left alive it would work on for seconds.
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in launchers):
        assert time.monotonic() < deadline, f"launcher {launchers} outlived its catch-up"
        time.sleep(0.1)
    assert _killed(args, env, 600) == 0  # run again at once: the killed one's claims are free
    runs = _catch_up_runs(env)
    assert runs == {format_due(d): 1 for d in _dues_between(start, end)}


def test_a_killed_reclaim_leaves_every_reclaimed_lease_with_its_audit(
    env: dict[str, str], ledger: RunLedger, rng: random.Random, tmp_path: Path
) -> None:
    # With an allow-list a reclaim is audited; the record once came after all the reclaims,
    # so a kill between them left reclaimed leases no record named.
    from resources.core.entry import FailureKind, Status, dedup_key_for_due
    from resources.core.settings import ENV_IDENTITY, ENV_OPERATORS

    team = tmp_path / "operators.toml"
    team.write_text('[operators]\nbob = ["retrier"]\n')
    env = {**env, ENV_OPERATORS: str(team), ENV_IDENTITY: "bob"}
    lifetime = _lifetime(["reclaim"], env)
    base = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(days=2)
    killed = 0
    for round_ in range(KILL_ROUNDS):
        for i in range(20):  # leases that expired a day ago
            due = base + timedelta(minutes=15 * (round_ * 20 + i))
            entry = ledger.ensure_entry(
                task_key=TASK, trigger=Trigger.SCHEDULE, dedup_key=dedup_key_for_due(due)
            )
            assert ledger.claim(
                entry.id, f"run-{entry.id}", lease_ttl=timedelta(minutes=1), now=due
            )
        killed += _killed(["reclaim"], env, rng.uniform(0, lifetime * 2)) is None
        reclaimed = sorted(
            e.id
            for e in ledger.list_entries(task_key=TASK, limit=1000)[0]
            if e.status == Status.FAILED and e.failure_kind == FailureKind.LEASE_RECLAIMED
        )
        audited = sorted(a["entry_id"] for a in _audits(ledger, "reclaim") if a["entry_id"])
        assert audited == reclaimed
    assert killed > 0, "no reclaim was killed: the delays were all longer than the commands"
    assert _killed(["reclaim"], env, 600) == 0  # to its end: every lease reclaimed, audited
    assert len(_audits(ledger, "reclaim")) >= KILL_ROUNDS * 20


def test_a_killed_retry_leaves_its_stamp_its_child_and_its_audit_together(
    env: dict[str, str], ledger: RunLedger, rng: random.Random
) -> None:
    # `runs retry` stamps the parent, creates the child entry and writes its audit record in
    # one transaction; its launch comes after (a child whose launch was killed is a stranded
    # launch the sweep records). Killed at any instant: all three or none.
    from resources.core.entry import dedup_key_for_due

    base = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(days=1)
    parents = []
    for i in range(max(3, KILL_ROUNDS // 2)):
        due = base + timedelta(minutes=15 * i)
        entry = ledger.ensure_entry(
            task_key=TASK, trigger=Trigger.SCHEDULE, dedup_key=dedup_key_for_due(due)
        )
        assert ledger.claim(entry.id, f"run-{i}", lease_ttl=timedelta(minutes=5)).claimed
        ledger.fail(entry.id, f"run-{i}", error="boom", retry_coming=False)
        parents.append(entry.id)
    who = ["--operator", "alice", "--reason", "kill test", "--json"]
    lifetime = _lifetime(["runs", "retry", str(parents[0]), *who], env)
    killed = 0
    for parent_id in parents[1:]:
        args = ["runs", "retry", str(parent_id), *who]
        killed += _killed(args, env, rng.uniform(0, lifetime)) is None
    for parent_id in parents:
        parent = ledger.get(parent_id)
        assert parent is not None
        children = ledger.children(parent_id)
        allowed = [
            a
            for a in ledger.audit_for(parent_id)
            if a["action"] == "manual_retry" and str(a["outcome"]).startswith("allowed")
        ]
        stamped = parent.manual_retry_at is not None
        assert (stamped, len(children), len(allowed)) in ((False, 0, 0), (True, 1, 1)), parent_id
        if children:
            assert allowed[0]["child_entry_id"] == children[0].id
    assert killed > 0, "no retry was killed: the delays were all longer than the commands"


def _manual_runs(env: dict[str, str]) -> dict[str, int]:
    """Dagster runs per request id of the task's manual launches."""
    from resources.core import tags as t

    return _count_by(_task_runs(env), t.TAG_REQUEST_ID)


def test_a_killed_launch_leaves_no_run_without_its_entry_and_its_repeat_launches_once(
    env: dict[str, str], ledger: RunLedger, rng: random.Random
) -> None:
    # A manual launch's record is its entry: it names the operator and the reason in the
    # insert that creates it, before Dagster is asked for a run. Killed at any instant, a
    # launch leaves no run whose entry is missing; repeating its request id launches it
    # once, whatever the killed one got done.
    from resources.core.entry import dedup_key_for_request

    def args(request: str) -> list[str]:
        who = ["--operator", "alice", "--reason", "kill test"]
        return ["launch", TASK, "--request-id", request, *who]

    lifetime = _lifetime(args("kill-0"), env)
    requests = [f"kill-{i}" for i in range(1, max(2, KILL_ROUNDS // 3) + 1)]
    killed = 0
    for request in requests:
        killed += _killed(args(request), env, rng.uniform(0, lifetime)) is None
        runs = _manual_runs(env)
        entries = {
            e.dedup_key: e
            for e in ledger.list_entries(task_key=TASK, limit=500)[0]
            if e.trigger == Trigger.MANUAL
        }
        for launched in runs:
            entry = entries.get(dedup_key_for_request(launched))
            assert entry is not None, f"request {launched} has a run and no entry"
            assert (entry.operator, entry.reason) == ("alice", "kill test")
    assert killed > 0, "no launch was killed: the delays were all longer than the commands"
    for request in requests:  # each repeated to its end
        assert _killed(args(request), env, 600) == 0
    assert _manual_runs(env) == {request: 1 for request in ["kill-0", *requests]}


def test_a_killed_liveness_alert_leaves_every_alert_it_recorded_with_its_audit(
    env: dict[str, str], ledger: RunLedger, rng: random.Random, tmp_path: Path
) -> None:
    # With an allow-list, `liveness --alert` records each stale check's alert (once per
    # outage) and its audit record, which names the alerts it recorded, in one
    # transaction. Each round starts a new outage: a scheduled run of a later due that the
    # scheduler then left alone, so the slot check goes stale on new evidence.
    import re

    import dagster as dg
    from alert_sinks import WebhookSink, start

    from resources.core import tags as t
    from resources.core.alerting import ENV_WEBHOOK_URL, KIND_LIVENESS
    from resources.core.settings import ENV_IDENTITY, ENV_OPERATORS

    team = tmp_path / "operators.toml"
    team.write_text('[operators]\nbob = ["retrier"]\n')
    base = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(days=2)

    def new_outage(number: int) -> None:
        due = base + timedelta(minutes=15 * number)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("DAGSTER_HOME", env["DAGSTER_HOME"])
            with dg.DagsterInstance.get() as instance:
                instance.add_run(
                    dg.DagsterRun(
                        job_name=f"{TASK}_job",
                        run_id=f"outage-{number:04d}-0000-0000-000000000000",
                        status=dg.DagsterRunStatus.SUCCESS,
                        tags={
                            t.TAG_TASK: TASK,
                            t.TAG_TRIGGER: Trigger.SCHEDULE.value,
                            t.TAG_DUE: format_due(due),
                        },
                    )
                )

    def recorded() -> tuple[list[str], list[str]]:
        """Subjects of the liveness deliveries, and those the allowed audits name."""
        delivered = [r.subject for r in ledger.list_alert_deliveries(kind=KIND_LIVENESS)]
        named = [
            subject
            for a in _audits(ledger, "liveness_alert")
            for subject in re.findall(r"check:\w+@[\w:-]+", a["outcome"].split("recorded")[-1])
        ]
        return sorted(delivered), sorted(named)

    with start(WebhookSink()) as sink:
        env = {**env, ENV_OPERATORS: str(team), ENV_IDENTITY: "bob", ENV_WEBHOOK_URL: sink.url()}
        args = ["liveness", "--alert", "--json"]
        new_outage(0)
        lifetime = _lifetime(args, env)
        killed = 0
        for number in range(1, KILL_ROUNDS + 1):
            new_outage(number)
            killed += _killed(args, env, rng.uniform(0, lifetime)) is None
            delivered, named = recorded()
            assert delivered == named
        assert killed > 0, "no probe was killed: the delays were all longer than the commands"
        assert _killed(args, env, 600) == 1  # to its end: stale, the last outage recorded
        delivered, named = recorded()
        assert delivered == named
        last_due = format_due(base + timedelta(minutes=15 * KILL_ROUNDS))
        assert f"check:slot_evaluation@{last_due}" in delivered
