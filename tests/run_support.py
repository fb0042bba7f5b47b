"""What the tests read off and give to Dagster runs the way Dagster itself does.

- :func:`scheduled` completes a schedule's RunRequest tags with the tag the scheduler daemon
  adds when it launches the run (``dagster/schedule_name``), for tests that execute a
  scheduled run in process instead of through the daemon;
- :func:`refused` says whether a run ended the way a run the ledger refused ends: CANCELED,
  tagged ``dueledger/outcome=refused``.
"""

from __future__ import annotations

from collections.abc import Mapping

import dagster as dg

from resources.core import tags as t


def scheduled(tags: Mapping[str, str]) -> dict[str, str]:
    """``tags`` of a schedule's RunRequest as the daemon launches them: plus the name of the
    task's schedule (``<task>_schedule``), which is how the claim knows a schedule issued it."""
    return {**tags, t.DAGSTER_SCHEDULE_NAME: f"{tags[t.TAG_TASK]}_schedule"}


def refused(instance: dg.DagsterInstance, run_id: str) -> bool:
    """Did the run end as a run the ledger did not let act (CANCELED, tagged refused)?"""
    run = instance.get_run_by_id(run_id)
    assert run is not None, run_id
    return (
        run.status == dg.DagsterRunStatus.CANCELED
        and run.tags.get(t.TAG_OUTCOME) == t.OUTCOME_REFUSED
    )
