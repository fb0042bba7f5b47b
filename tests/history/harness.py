"""The in-process fault harness: thousands of dues with injected faults against the real ledger.

A discrete-event simulation on a virtual clock (so 10,000 dues take seconds, not hours), whose
every step is a call into the real code: each run walks the claim path every task asset walks
(``orchestration.task_run``: the entry its tags name, the UI re-execution and manual-launch
rules, a dead chain member's attempt settled and a dispatch failure resumed by Dagster's
retry, the task's pauses and overlap policy, the claim) and ends through its ``succeed`` and
``fail``; the ledger (``RunLedger`` on real SQLite or PostgreSQL), the fenced effect
transaction (``resources.effects`` with the claim's guard), the outcome reconciler of
``ledger_sensor`` (outcomes) (``orchestration.services.outcomes.reconcile_run``), the lease
reclaim (``orchestration.reclaim``), the manual retry (``orchestration.retry``) and
``summary`` (``ledger_summary``). Only Dagster itself is played by the simulation
(:class:`SimulatedRun`, the claim path's ``RunFacts``): which runs exist, when they start,
die, are detected dead and retried.

Per due, one scheduled run, and with the configured rates:

- a **duplicate delivery** (a second scheduled run of the same due, as a second daemon makes);
- **kill points**: before the claim, after it, between the effects, after them -- the worker
  stops for good; Dagster detects most deaths (the outcome reconciler, then an automatic
  retry while attempts are left), some it does not (the lease is reclaimed);
- a **pause past the lease** (a frozen worker resumes after the reclaim: its effects must be
  refused by the fence);
- **errors** before or after the effects (a failed attempt, then Dagster's retry);
- **clock skew**: every worker's ledger calls use its own clock, the true time +- ``skew``;
- **not dispatched**: the scheduler never fired the due (it must be reported missed).

At the end an operator manually retries a share of the failed entries, and the history --
runs, claims, heartbeats, commits, releases, the effect sink, every entry, the audit,
``summary`` and the missed dues -- is written for the checker. Reproducible from its seed.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from history.collect import (
    create_sink,
    due_records,
    history_effect_keys,
    history_effects,
    insert_ignoring_conflict,
    ledger_records,
    sink_records,
    summary_records,
)
from history.harness_model import (
    FAULTS,
    MAX_REDISPATCHES,
    RECLAIM_EVERY,
    SLOT,
    HarnessConfig,
    Run,
)
from history.harness_model import due_text as _due
from history.history_format import HistoryWriter, stamp

from orchestration.manual_launch import entry_request_from_tags
from orchestration.reclaim import reclaim_leases
from orchestration.retry import record_retry
from orchestration.services.outcomes import RunOutcome, reconcile_run
from orchestration.services.summary import ledger_summary
from orchestration.task_run import (
    WAIT_POLL_SECONDS,
    Claimed,
    Prepared,
    SecondWorker,
    Unclaimed,
    Waiting,
    claim,
    fail,
    prepare,
    succeed,
)
from orchestration.task_spec import TaskSpec, build_views
from orchestration.timetable import EverySlots
from resources.core import tags as t
from resources.core.entry import Status, Trigger
from resources.core.errors import Refused
from resources.core.fence import FenceLost
from resources.core.operators import Operators
from resources.effects import effect_transaction
from resources.ledger import RunLedger


class SimulatedRun:
    """What the simulated Dagster knows of one run: the claim path's ``RunFacts``."""

    def __init__(self, harness: Harness, run: Run) -> None:
        self.harness, self.run = harness, run
        self.run_id = run.run_id
        self.tags = run.tags

    def parent_tags(self, run_id: str) -> dict[str, str] | None:
        found = self.harness.run_by_id(run_id)
        return found.tags if found is not None else None

    def ended_ancestor(self, run_id: str) -> str | None:
        """``error`` when ``run_id`` is an ancestor of this run (its chain of automatic
        retries) that ended FAILURE, as Dagster's run records say."""
        ancestor = self.tags.get(t.DAGSTER_PARENT_RUN_ID)
        while ancestor:
            found = self.harness.run_by_id(ancestor)
            if found is None or found.status != "FAILURE":
                return None
            if ancestor == run_id:
                return "error"
            ancestor = found.tags.get(t.DAGSTER_PARENT_RUN_ID)
        return None

    def as_of_without_due(self) -> datetime:
        return self.run.due

    def now(self) -> datetime:
        return self.harness.now(self.run.skew)


@dataclass(order=True)
class _Event:
    at: float
    order: int
    step: Callable[[], Any] = field(compare=False)


class Harness:
    def __init__(self, config: HarnessConfig, ledger: RunLedger, effects: sa.Engine, out: Path):
        self.config, self.ledger, self.effects = config, ledger, effects
        self.rng = random.Random(config.seed)
        self.history = HistoryWriter(out)
        self.specs = tuple(
            TaskSpec(
                key=f"h{i:03d}",
                rule=EverySlots(1),
                declared_cadence="every slot",
                timeout=config.lease_ttl / 2,
                lease_ttl=config.lease_ttl,
                max_attempts=config.max_attempts,
                # Virtual seconds: a retry waits at its claim as in production.
                retry_backoff=timedelta(seconds=5),
            )
            for i in range(config.tasks)
        )
        self.views = build_views(self.specs, 1, "UTC")
        self.clock = 0.0  # virtual seconds since config.start (true time)
        self.events: list[_Event] = []
        self.order = itertools.count()
        self.seq = itertools.count()
        self.ids = itertools.count(1)
        self.runs: list[Run] = []
        self.by_id: dict[str, Run] = {}
        self.reclaiming = False

    # --- time and events --------------------------------------------------------------

    def now(self, skew: float = 0.0) -> datetime:
        return self.config.start + timedelta(seconds=self.clock + skew)

    def at(self, delay: float, step: Callable[[], Any]) -> None:
        heapq.heappush(self.events, _Event(self.clock + delay, next(self.order), step))

    def spawn(self, process: Iterator[float], delay: float = 0.0) -> None:
        def resume() -> None:
            wait = next(process, None)
            if wait is not None:
                self.at(wait, resume)

        self.at(delay, resume)

    def write(self, type_: str, **fields: Any) -> None:
        self.history.write(type_, seq=next(self.seq), at=self.now(), **fields)

    # --- runs ---------------------------------------------------------------------------

    def new_run(
        self, task: str, due: datetime, trigger: str, extra: dict[str, str] | None = None
    ) -> Run:
        run_id = f"r{next(self.ids):06d}"
        tags = {t.TAG_TASK: task, t.TAG_TRIGGER: trigger, t.TAG_DUE: _due(due), **(extra or {})}
        fault = None
        roll = self.rng.random()
        for name in FAULTS:
            roll -= getattr(self.config.rates, name)
            if roll < 0:
                fault = name
                break
        skew = self.rng.uniform(-self.config.rates.skew_seconds, self.config.rates.skew_seconds)
        run = Run(run_id, task, due, tags, fault, skew, worker=f"harness:{run_id}")
        run.retry_number = int(tags.get(t.DAGSTER_RETRY_NUMBER, "0"))
        self.runs.append(run)
        self.by_id[run_id] = run
        if fault:
            self.write("fault", kind=fault, target=run_id)
        if abs(skew) > 0:
            self.write("fault", kind="skew", target=run_id, seconds=round(skew, 3))
        self.spawn(self.worker(run), self.rng.uniform(0.0, 3.0))
        return run

    def end(self, run: Run, status: str, *, will_retry: bool = False, dead: bool = False) -> None:
        run.status = status
        if status == "FAILURE" and not dead:
            self.at(self.rng.uniform(2.0, 8.0), lambda: self.detected(run, will_retry))

    def kill(self, run: Run) -> None:
        run.status = "FAILURE"  # what run monitoring will say once it looks
        claimed = run.run_id in self.ledger_run_ids(run)
        # A claimed run's death may go unnoticed (its lease is reclaimed); an unclaimed one is
        # always ended by Dagster in the end (start timeout, max runtime).
        if not claimed or self.rng.random() >= self.config.rates.undetected_death:
            will_retry = claimed and run.retry_number < self.config.max_attempts - 1
            self.at(self.rng.uniform(5.0, 15.0), lambda: self.detected(run, will_retry))

    def run_by_id(self, run_id: str) -> Run | None:
        return self.by_id.get(run_id)

    def ledger_run_ids(self, run: Run) -> tuple[str, ...]:
        request = entry_request_from_tags(run.tags, run.run_id)
        entry = self.ledger.find(request.task_key, request.dedup_key)
        return entry.run_ids if entry else ()

    def detected(self, run: Run, will_retry: bool) -> None:
        """Dagster ended the run FAILURE: the outcome reconciler, then Dagster's retry."""
        request = entry_request_from_tags(run.tags, run.run_id)
        before = self.ledger.find(request.task_key, request.dedup_key)
        outcome = RunOutcome(run.run_id, "FAILURE", will_retry, "run worker died")
        done = reconcile_run(
            self.ledger,
            run.tags,
            outcome,
            {s.key: s.max_attempts for s in self.specs},
            now=self.now(),
        )
        after = done.entry
        self._released(before, after, "fail")
        if will_retry:
            extra = {
                t.DAGSTER_PARENT_RUN_ID: run.run_id,
                t.DAGSTER_ROOT_RUN_ID: run.tags.get(t.DAGSTER_ROOT_RUN_ID, run.run_id),
                t.DAGSTER_RETRY_NUMBER: str(run.retry_number + 1),
            }
            tags = {**run.tags, **extra}
            self.at(self.rng.uniform(2.0, 8.0), lambda: self.new_run_with(run, tags))
        elif after is not None and after.status == Status.DISPATCH_FAILED:
            self.redispatch(run, after.id)

    def new_run_with(self, parent: Run, tags: dict[str, str]) -> None:
        trigger = tags[t.TAG_TRIGGER]
        extra = {k: v for k, v in tags.items() if k not in (t.TAG_TASK, t.TAG_TRIGGER, t.TAG_DUE)}
        self.new_run(parent.task, parent.due, trigger, extra)

    def redispatch(self, run: Run, entry_id: int) -> None:
        """The re-dispatch sensor: within the due's slot, at most MAX_REDISPATCHES times."""
        entry = self.ledger.get(entry_id)
        if entry is None or self.now() >= run.due + SLOT:
            return
        failures = len(entry.summary.get("dispatch_failures", []))
        if failures > MAX_REDISPATCHES or not self.ledger.redispatch(entry_id, now=self.now()):
            return
        key = f"{_due(run.due)}#redispatch-{failures}"
        self.new_run(run.task, run.due, Trigger.SENSOR, {t.DAGSTER_RUN_KEY: key})

    def _released(self, before: Any, after: Any, how: str) -> None:
        if (
            before is not None
            and before.status == Status.RUNNING
            and (after is None or after.status != Status.RUNNING)
        ):
            self.write(
                "release",
                entry_id=before.id,
                run_id=before.lease_owner,
                token=before.claim_generation,
                how=how,
            )

    # --- the worker ---------------------------------------------------------------------

    def worker(self, run: Run) -> Iterator[float]:
        """One run as a task asset runs it: the real claim path, then the work."""
        ledger, ttl = self.ledger, self.config.lease_ttl
        spec = next(s for s in self.specs if s.key == run.task)
        facts = SimulatedRun(self, run)

        if run.fault == "kill_before_claim":
            self.kill(run)
            return
        before = self._entry_of(run)
        prepared = prepare(ledger, spec, self.specs, facts)
        self._released(before, self._entry_of(run), "fail")  # a dead chain member settled
        yield self.rng.uniform(0.0, 1.0)
        found: Prepared | Claimed | Unclaimed | Waiting | SecondWorker | object = prepared
        if isinstance(prepared, Prepared):
            found = claim(ledger, spec, prepared, facts)
            while isinstance(found, Waiting):  # an overlap policy's wait, in virtual time
                yield WAIT_POLL_SECONDS
                found = claim(ledger, spec, prepared, facts)
        if not isinstance(found, Claimed):
            reason = getattr(found, "message", str(found))
            entry = getattr(found, "entry", None)
            entry_id = entry.id if entry is not None else None
            self.write("claim_refused", entry_id=entry_id, run_id=run.run_id, reason=reason)
            run.outcome = t.OUTCOME_REFUSED
            self.end(run, "SUCCESS")
            return
        claimed = found
        entry, fence = claimed.run.entry, claimed.fence
        self.write(
            "claim", entry_id=entry.id, run_id=run.run_id, token=fence.token, worker=run.worker
        )
        beat = {"last": self.clock}

        def work(seconds: float) -> Iterator[float]:
            interval = ttl.total_seconds() / 4
            while seconds > 0:
                # Whole milliseconds: a float step below the clock's resolution would never
                # move it, and the loop would spin.
                step = min(seconds, max(round(interval - (self.clock - beat["last"]), 3), 0.001))
                yield step
                seconds -= step
                if self.clock - beat["last"] >= interval - 0.001:
                    ok = ledger.heartbeat(entry.id, run.run_id, lease_ttl=ttl, now=facts.now())
                    beat["last"] = self.clock
                    self.write(
                        "heartbeat", entry_id=entry.id, run_id=run.run_id, token=fence.token, ok=ok
                    )

        yield from work(self.rng.uniform(0.5, 5.0))
        if run.fault == "kill_after_claim":
            self.kill(run)
            return
        if run.fault == "pause_past_lease":
            frozen = ttl.total_seconds() + 2 * self.config.rates.skew_seconds + RECLAIM_EVERY
            yield frozen + self.rng.uniform(5.0, 60.0)  # no heartbeat while frozen
            beat["last"] = self.clock - ttl.total_seconds()  # it beats at once on waking
            yield from work(0.1)
        if run.fault == "error_before_effects":
            self.fail(run, claimed, RuntimeError("error before any effect"))
            return
        for number in range(self.config.effects_per_due):
            yield from work(self.rng.uniform(1.0, 25.0))
            if run.fault == "kill_between_effects" and number == 1:
                self.kill(run)
                return
            if not self.effect(run, claimed, f"notify-{number}"):
                self.end(run, "FAILURE")  # FenceLost fails the run, without a retry
                return
        if run.fault == "kill_after_effects":
            self.kill(run)
            return
        if run.fault == "error_after_effects":
            self.fail(run, claimed, RuntimeError("error after the effects"))
            return
        before = ledger.get(entry.id)
        if succeed(ledger, claimed, lease_lost=False, now=facts.now()) is None:
            self._released(before, ledger.get(entry.id), "success")
            self.end(run, "SUCCESS")
        else:
            self.end(run, "FAILURE")  # completion rejected: the entry moved on

    def _entry_of(self, run: Run) -> Any:
        request = entry_request_from_tags(run.tags, run.run_id)
        return self.ledger.find(request.task_key, request.dedup_key)

    def fail(self, run: Run, claimed: Claimed, error: BaseException) -> None:
        """The body raised: the claim path records the attempt; Dagster retries while the
        run's retry budget lasts (the simulation's ``dagster/max_retries``)."""
        entry_id = claimed.run.entry.id
        before = self.ledger.get(entry_id)
        coming = run.retry_number < self.config.max_attempts - 1
        failed = fail(self.ledger, claimed, error, retry_coming=coming, now=self.now(run.skew))
        self._released(before, self.ledger.get(entry_id), "fail")
        self.end(run, "FAILURE", will_retry=failed.status == Status.RETRYING)

    def effect(self, run: Run, claimed: Claimed, name: str) -> bool:
        """One side effect in its fenced transaction, keyed like the domain's effects."""
        due = _due(run.due)
        guard, entry_id, token = claimed.run.guard, claimed.run.entry.id, claimed.fence.token
        try:
            with effect_transaction(self.effects, guard, name) as conn:
                if insert_ignoring_conflict(
                    conn, history_effect_keys, task=run.task, due=due, effect=name
                ):
                    conn.execute(
                        sa.insert(history_effects).values(
                            task=run.task,
                            due=due,
                            effect=name,
                            entry_id=entry_id,
                            run_id=run.run_id,
                            token=token,
                            worker=run.worker,
                            seq=next(self.seq),
                            at=self.now(),
                        )
                    )
        except FenceLost:
            self.write(
                "commit",
                entry_id=entry_id,
                run_id=run.run_id,
                token=token,
                effect=name,
                committed=False,
            )
            return False
        self.write(
            "commit", entry_id=entry_id, run_id=run.run_id, token=token, effect=name, committed=True
        )
        return True

    # --- the system around the workers ----------------------------------------------------

    def reclaim_tick(self) -> None:
        """The reclaim sensor: every RECLAIM_EVERY seconds while anything may still need it."""
        for done in reclaim_leases(self.ledger, self.now()):
            entry = self.ledger.get(done.entry_id)
            token = entry.claim_generation if entry else 0
            self.write(
                "release", entry_id=done.entry_id, run_id=done.run_id, token=token, how="reclaim"
            )
        running = self.ledger.list_entries(statuses=[Status.RUNNING], limit=1)[0]
        if self.events or running:
            self.at(RECLAIM_EVERY, self.reclaim_tick)
        else:
            self.reclaiming = False

    def run(self) -> dict[str, Any]:
        """Simulate every due, then the operator's retries; write the history."""
        config = self.config
        self.history.write(
            "meta",
            source="in-process harness",
            backend=self.ledger.dialect_name,
            seed=config.seed,
            slot_seconds=SLOT.total_seconds(),
            window_seconds=config.window.total_seconds(),
            started_at=stamp(config.start),
        )
        for spec in self.specs:
            self.history.write(
                "task",
                task=spec.key,
                lease_ttl_seconds=config.lease_ttl.total_seconds(),
                max_attempts=spec.max_attempts,
            )
        dues = [config.start + k * SLOT for k in range(config.slots)]
        self.history.write_all(due_records([s.key for s in self.specs], dues))
        for k, due in enumerate(dues):
            for spec in self.specs:
                self.at((due - config.start).total_seconds(), self._dispatcher(spec.key, due, k))
        self._drain()
        self._manual_retries()
        self._drain()
        return self._finish(dues)

    def _dispatcher(self, task: str, due: datetime, k: int) -> Callable[[], None]:
        def dispatch() -> None:
            rates = self.config.rates
            if k > 0 and self.rng.random() < rates.not_dispatched:
                self.write("fault", kind="not_dispatched", target=f"{task}@{_due(due)}")
                return
            self.new_run(task, due, Trigger.SCHEDULE, {t.DAGSTER_RUN_KEY: _due(due)})
            if self.rng.random() < rates.duplicate:
                self.write("fault", kind="duplicate", target=f"{task}@{_due(due)}")
                self.new_run(task, due, Trigger.SCHEDULE, {t.DAGSTER_RUN_KEY: _due(due)})

        return dispatch

    def _drain(self) -> None:
        if not self.reclaiming:
            self.reclaiming = True
            self.at(0.0, self.reclaim_tick)
        while self.events:
            event = heapq.heappop(self.events)
            self.clock = max(self.clock, event.at)
            event.step()

    def _manual_retries(self) -> None:
        local = Operators(source="the harness (no allow-list)", local=True)
        failed = [
            e
            for e in self.ledger.list_entries(
                statuses=[Status.FAILED, Status.DISPATCH_FAILED], limit=500
            )[0]
        ]
        for entry in failed:
            if self.rng.random() >= self.config.rates.manual_retry or entry.due is None:
                continue
            try:
                record = record_retry(
                    self.ledger,
                    entry.id,
                    specs=self.specs,
                    operator="harness-operator",
                    reason="retried in the fault harness",
                    operators=local,
                    acknowledge_side_effects=True,
                    now=self.now(),
                )
            except Refused as refusal:  # audited by record_retry; the checker reads the audit
                self.write(
                    "fault", kind="manual_retry_refused", target=str(entry.id), detail=str(refusal)
                )
                continue
            extra = {
                t.TAG_PARENT_ENTRY: str(record.parent.id),
                t.TAG_OPERATOR: "harness-operator",
                t.TAG_REASON: "retried in the fault harness",
            }
            self.new_run(entry.task_key, entry.due, Trigger.MANUAL_RETRY, extra)

    def _finish(self, dues: list[datetime]) -> dict[str, Any]:
        self.clock += 2 * SLOT.total_seconds()  # so the audit sees the last slot as over
        for run in self.runs:
            self.history.write(
                "run",
                run_id=run.run_id,
                task=run.task,
                due=_due(run.due),
                trigger=run.tags[t.TAG_TRIGGER],
                status=run.status,
                outcome=run.outcome,
                parent_entry=run.tags.get(t.TAG_PARENT_ENTRY),
                parent_run_id=run.tags.get(t.DAGSTER_PARENT_RUN_ID),
                worker=run.worker,
            )
        _, records = ledger_records(self.ledger)
        self.history.write_all(records)
        self.history.write_all(sink_records(self.effects))
        summary = ledger_summary(self.ledger, self.views, self.now())
        self.history.write_all(summary_records(summary, [s.key for s in self.specs], dues))
        self.history.close()
        return {"runs": len(self.runs), "history": str(self.history.path)}


def run_harness(config: HarnessConfig, ledger_url: str, out: Path) -> dict[str, Any]:
    """Run the harness against the ledger at ``ledger_url`` (migrated here); the effect sink
    lives in the same database, as the production layout puts the source data there."""
    ledger = RunLedger(database_url=ledger_url)
    ledger.migrate()
    engine = sa.create_engine(ledger_url)
    create_sink(engine)
    try:
        return Harness(config, ledger, engine, out).run()
    finally:
        engine.dispose()
        ledger.dispose()
