"""Two processes of one Dagster run: only the first acts.

Two active daemons can dequeue the same queued run at once and launch it twice (dagster
#33962: "the job runs on 2 pids"); a cluster can restart a run's worker while the first still
runs. Both processes carry the same run id, so the ledger's claim -- re-entrant for its owner
-- would let both act under one fencing token (the history checker's ``shared_claim``). The
claim wrapper therefore acts only on a claim it made itself: the second process does nothing
and its attempt is traced on the entry. Real ledger (SQLite and PostgreSQL), two real
executions of the task with one run id, the second while the first holds the entry.
"""

# No ``from __future__ import annotations``: Dagster reads the asset's annotations as objects.
import threading
import uuid
from datetime import UTC, datetime, timedelta

import dagster as dg

from orchestration.services.hooks.registry import Hooks
from orchestration.services.hooks.vocabulary import HookRegistry
from orchestration.task_defs import run_task
from orchestration.task_run import TaskRun
from orchestration.task_spec import TaskSpec
from orchestration.timetable import EverySlots
from resources.core import tags as t
from resources.core.due import format_due
from resources.core.entry import Status, Trigger
from resources.ledger import RunLedger

SPEC = TaskSpec(
    key="twice_task",
    rule=EverySlots(1),
    declared_cadence="every slot",
    timeout=timedelta(minutes=1),
    lease_ttl=timedelta(minutes=2),
)
DUE = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
#: How long one process of the run may take to start or end (a loaded 2-core machine: each
#: sets up a Dagster instance of its own).
PATIENCE = 300
claimed = threading.Event()
second_done = threading.Event()
acted: list[str] = []


#: The threads (each plays a process of the run) whose body ran.
bodies_ran: set[int] = set()


def work(context: dg.AssetExecutionContext, run: TaskRun):
    bodies_ran.add(threading.get_ident())
    claimed.set()
    assert second_done.wait(timeout=PATIENCE), "the second process never ran"
    acted.append("did the work")
    yield from ()


@dg.asset(name="twice_task", output_required=False)
def twice_task(context: dg.AssetExecutionContext, ledger: RunLedger):
    hooks = Hooks.of(HookRegistry())
    yield from run_task(context, ledger, SPEC, work, hooks=hooks, tasks=[SPEC])
    if threading.get_ident() not in bodies_ran:  # a second process of the run: it did nothing
        ((entry,), _) = ledger.list_entries(limit=1)
        acted.append(f"refused: {entry.summary['late_job_rejections'][-1]['reason']}")


JOB = dg.define_asset_job("twice_job", selection=[twice_task])


def test_a_second_process_of_the_same_run_does_nothing(ledger: RunLedger) -> None:
    claimed.clear()
    second_done.clear()
    acted.clear()
    job = dg.Definitions(
        assets=[twice_task], jobs=[JOB], resources={"ledger": ledger}
    ).resolve_job_def("twice_job")
    run_id = str(uuid.uuid4())
    tags = {t.TAG_TASK: SPEC.key, t.TAG_TRIGGER: Trigger.SCHEDULE.value, t.TAG_DUE: format_due(DUE)}
    results: list[dg.ExecuteInProcessResult] = []

    def first() -> None:
        # Each process has its own view of Dagster's storage; the ledger is shared.
        with dg.instance_for_test() as instance:
            results.append(job.execute_in_process(run_id=run_id, instance=instance, tags=tags))

    worker = threading.Thread(target=first)
    worker.start()
    assert claimed.wait(timeout=PATIENCE), "the first process did not claim"
    with dg.instance_for_test() as instance:
        second = job.execute_in_process(run_id=run_id, instance=instance, tags=tags)
    second_done.set()
    worker.join(timeout=PATIENCE)
    assert not worker.is_alive(), f"the first process did not end within {PATIENCE} s"

    assert second.success and results and results[0].success
    assert acted[0].startswith("refused") and "another process" in acted[0], acted
    assert acted[1:] == ["did the work"], acted
    (entry,) = ledger.list_entries(limit=5)[0]
    assert entry.status == Status.SUCCESS and entry.run_ids == (run_id,)
    assert entry.claim_generation == 1
    (traced,) = entry.summary["late_job_rejections"]
    assert traced["run_id"] == run_id and "another process" in traced["reason"]
