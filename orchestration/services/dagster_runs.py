"""What Dagster's run records say about task runs, for the services that keep the ledger
true and the checks that watch it: which tasks a run belongs to, and whether Dagster will
still retry a run that ended (``ledger_sensor`` (outcomes) settles the entries whose retry
will never come; the ``no_lost_retries`` check reports the ones it has not settled).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final

import dagster as dg

from orchestration.services.launch import manual_run_id
from orchestration.task_spec import TaskView, task_keys_of_run
from resources.core import tags as t
from resources.core.entry import SUMMARY_DISPATCH_FAILURES, Entry, Origin

#: Dagster's retry daemon creates a retry seconds after a run fails (it polls every 5 s). A
#: failed run tagged ``dagster/will_retry=true`` that still has no retry this long after it
#: ended has lost it (the daemon can read the failure event before the run's status and tag
#: are written, and then passes over the run for good): nothing will launch that retry.
RETRY_LOST_AFTER: Final = timedelta(minutes=3)
#: Automatic retries followed from one run (Dagster's max_retries is far smaller).
MAX_RETRY_CHAIN: Final = 20
#: How a run Dagster gave up on ended: the statuses the ledger must hear about.
ENDED_STATUSES: Final = frozenset({dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED})


def attributed_tags(run: dg.DagsterRun, views: Sequence[TaskView]) -> list[Mapping[str, str]]:
    """The run's tags once per task it belongs to, each completed with ``dueledger/task``.

    A run started from the Dagster UI (launchpad, "Materialize", asset-graph backfill)
    carries no ``dueledger/task``: it is attributed by its job or the assets it executes
    (``registry.task_keys_of_run``), so its failure before claiming is not invisible.
    """
    assets = [key.to_user_string() for key in run.asset_selection or ()]
    keys = task_keys_of_run([v.spec for v in views], run.job_name, assets, run.tags)
    return [{**run.tags, t.TAG_TASK: key} for key in keys]


class RetryState(StrEnum):
    """Where Dagster stands on retrying one run."""

    RUNNING = "running"  # the run has not ended
    PENDING = "pending"  # Dagster may still create one
    NOT_RETRIED = "not_retried"  # Dagster said it will not (or cannot) retry it
    LOST = "lost"  # announced (will_retry=true), not created within RETRY_LOST_AFTER


def dagster_retry_state(
    status: dg.DagsterRunStatus,
    tags: Mapping[str, str],
    ended_at: float | None,
    now: datetime,
) -> RetryState:
    """Pure: what Dagster will still do about retrying a run that has no automatic retry yet
    (``ended_at``: its end, epoch s). Dagster retries only failed runs: one that succeeded
    (a retry refused by the ledger, nothing done) is never retried."""
    if status == dg.DagsterRunStatus.SUCCESS:
        return RetryState.NOT_RETRIED
    if status not in ENDED_STATUSES:
        return RetryState.RUNNING
    announced = tags.get(t.DAGSTER_WILL_RETRY, "").lower()
    if status == dg.DagsterRunStatus.CANCELED or announced == "false":
        return RetryState.NOT_RETRIED
    if ended_at is not None and now.timestamp() - ended_at < RETRY_LOST_AFTER.total_seconds():
        return RetryState.PENDING
    return RetryState.LOST if announced == "true" else RetryState.NOT_RETRIED


def automatic_retry_of(instance: dg.DagsterInstance, run: dg.DagsterRun) -> dg.DagsterRun | None:
    """Dagster's automatic retry of ``run`` (its child with ``dagster/retry_number``), if any."""
    child_id = run.tags.get(t.DAGSTER_AUTO_RETRY_RUN_ID)
    if child_id:
        child = instance.get_run_by_id(child_id)
        if child is not None:
            return child
    children = instance.get_runs(
        filters=dg.RunsFilter(tags={t.DAGSTER_PARENT_RUN_ID: run.run_id}), limit=10
    )
    return next((c for c in children if t.DAGSTER_RETRY_NUMBER in c.tags), None)


def failed_ancestor(
    instance: dg.DagsterInstance, tags: Mapping[str, str], run_id: str
) -> dg.RunRecord | None:
    """``run_id``'s record when it is an ancestor of the run tagged ``tags`` along Dagster's
    chain of automatic retries, and every run from it down to the parent ended FAILURE
    (each was retried); else None. Follows at most MAX_RETRY_CHAIN parents."""
    ancestor = tags.get(t.DAGSTER_PARENT_RUN_ID)
    for _ in range(MAX_RETRY_CHAIN):
        if not ancestor:
            return None
        record = instance.get_run_record_by_id(ancestor)
        if record is None or record.dagster_run.status != dg.DagsterRunStatus.FAILURE:
            return None
        if ancestor == run_id:
            return record
        if t.DAGSTER_RETRY_NUMBER not in record.dagster_run.tags:
            return None  # the chain's first run, and not the owner
        ancestor = record.dagster_run.tags.get(t.DAGSTER_PARENT_RUN_ID)
    return None


def newest_automatic_retry(instance: dg.DagsterInstance, run_id: str) -> dg.RunRecord | None:
    """The end of ``run_id``'s chain of automatic retries (the run itself when it has none);
    None when a run of the chain is gone or the chain is implausibly long."""
    record = instance.get_run_record_by_id(run_id)
    for _ in range(MAX_RETRY_CHAIN):
        if record is None:
            return None
        child = automatic_retry_of(instance, record.dagster_run)
        if child is None:
            return record
        record = instance.get_run_record_by_id(child.run_id)
    return None


def run_timed_out(record: dg.RunRecord | None, message: str) -> bool:
    """Run monitoring ended the run for exceeding ``dagster/max_runtime``."""
    if "maximum runtime" in message.lower():
        return True
    if record is None or record.start_time is None or record.end_time is None:
        return False
    limit = record.dagster_run.tags.get(t.DAGSTER_MAX_RUNTIME)
    try:
        return limit is not None and record.end_time - record.start_time >= float(limit)
    except ValueError:
        return False


def turn_off_dagster_retries(
    instance: dg.DagsterInstance, run_id: str | None, log: Any | None = None
) -> None:
    """The ledger has settled this run's entry (or taken it from the run): a Dagster retry of
    the run could only be refused by the ledger, so ask Dagster for none. Dagster reads
    ``dagster/max_retries`` when a failure decides ``dagster/will_retry``; a run that has
    already ended is left alone. Best effort: the ledger refuses such a retry anyway."""
    if not run_id:
        return
    try:
        run = instance.get_run_by_id(run_id)
        if run is not None and not run.is_finished:
            instance.add_run_tags(run_id, {t.DAGSTER_MAX_RETRIES: "0"})
    except Exception as exc:
        if log is not None:
            log.warning(f"could not turn off Dagster retries of run {run_id}: {exc}")


def last_dispatch_failure_canceled(instance: dg.DagsterInstance, entry: Entry) -> bool:
    """Was the run of the entry's newest dispatch failure canceled (by an operator)? Such an
    entry is not re-dispatched: someone stopped it on purpose."""
    items = entry.summary.get(SUMMARY_DISPATCH_FAILURES, [])
    run_id = items[-1].get("run_id") if items and isinstance(items[-1], Mapping) else None
    if not run_id:
        return False
    run = instance.get_run_by_id(str(run_id))
    return run is not None and run.status == dg.DagsterRunStatus.CANCELED


def dagster_will_retry_failure(instance: dg.DagsterInstance, run: dg.DagsterRun) -> bool:
    """Will Dagster retry ``run`` when its step fails now? Dagster decides it only after the
    run has failed (``dagster/will_retry``), but the claim wrapper must record the attempt
    before that: ``retrying`` only while a retry will really come. The same
    rule as Dagster's run retries: retries enabled on the instance, step failures retried
    (``dagster/retry_on_asset_or_op_failure``, else the instance's setting), and fewer runs
    in the run's group than ``dagster/max_retries`` + 1 (else the instance's max_retries; a
    launchpad run carries no tag, so usually none comes)."""
    if not instance.run_retries_enabled:
        return False
    on_step_failure = run.tags.get(t.DAGSTER_RETRY_ON_ASSET_OR_OP_FAILURE)
    if on_step_failure is None:
        if not instance.run_retries_retry_on_asset_or_op_failure:
            return False
    elif on_step_failure.strip().lower() in ("false", "none", "0", ""):
        return False  # Dagster reads any other value as true
    raw = run.tags.get(t.DAGSTER_MAX_RETRIES)
    try:
        max_retries = instance.run_retries_max_retries if raw is None else int(raw)
    except ValueError:
        return False  # Dagster does not retry a run whose max_retries tag is not a number
    if max_retries <= 0:
        return False
    group = instance.get_run_group(run.run_id)
    return group is None or len(list(group[1])) <= max_retries


def has_dispatched_run(instance: dg.DagsterInstance, entry: Entry) -> bool:
    """Whether a Dagster run was created for ``entry``'s current dispatch (it may still wait
    in the queue). A run whose failure the entry recorded belongs to an earlier dispatch: a
    re-dispatch whose launcher died before its run was created is stranded too."""
    ended = entry.dispatch_failure_run_ids
    if entry.origin == Origin.MANUAL:
        request_id = entry.dedup_key.removeprefix(f"{Origin.MANUAL}:")
        run = instance.get_run_by_id(manual_run_id(entry.task_key, request_id))
        if run is not None and run.run_id not in ended:
            return True
        found = instance.get_runs(
            filters=dg.RunsFilter(tags={t.TAG_TASK: entry.task_key, t.TAG_REQUEST_ID: request_id}),
            limit=1,
        )
        return bool(found) and found[0].run_id not in ended
    # A retry child's runs (new run or re-execution) carry its parent's id.
    found = instance.get_runs(
        filters=dg.RunsFilter(
            tags={t.TAG_TASK: entry.task_key, t.TAG_PARENT_ENTRY: str(entry.parent_id)}
        ),
        limit=1,
    )
    return bool(found)
