"""Task pools: one run of a task at a time, whatever launched it (DESIGN: overlap).

Every task asset is in a Dagster pool named after its task (``pool=`` in ``assets/``), and
the instance's ``concurrency.pools`` (``dagster.yaml.local``, ``deploy/dagster.yaml``)
gives pools one slot at run granularity, so the run queue holds a second run of a task
whether or not it carries ``dueledger/task`` (UI launches and asset backfills do not).

Dagster creates a pool's limit the first time its run queue sees a run of it, and in that
same pass it does not hold the pool's runs back yet: two runs of a task queued before the
pool existed (a Catalog "Materialize" next to a scheduled run right after a fresh start)
would both start. :func:`ensure_task_pools` creates every task's pool ahead of that; the
outcome sensor calls it on each evaluation (a set lookup once the pools exist).
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from orchestration.task_spec import TaskView

#: Slots of a task pool when the instance sets no ``concurrency.pools.default_limit``.
TASK_POOL_SLOTS = 1


def ensure_task_pools(instance: dg.DagsterInstance, views: Sequence[TaskView]) -> list[str]:
    """Create the pool of every ``queue`` task that has none yet; returns the pools created
    (tasks under another overlap policy have no pool: the ledger decides at claim).

    A pool that exists is left as it is (an operator's `dagster instance concurrency set`
    wins). A new one gets the instance's default limit, or TASK_POOL_SLOTS without one.
    """
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return []
    existing = storage.get_concurrency_keys()
    created = []
    pooled = {v.spec.key for v in views if v.spec.uses_task_pool}
    for pool in sorted(pooled - existing):
        if instance.global_op_concurrency_default_limit:
            storage.initialize_concurrency_limit_to_default(pool)
        else:
            storage.set_concurrency_slots(pool, TASK_POOL_SLOTS)
        created.append(pool)
    return created
