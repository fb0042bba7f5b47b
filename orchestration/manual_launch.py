"""Manual launches in their own namespace."""

from __future__ import annotations

from collections.abc import Mapping

from orchestration.task_run import EntryRequest
from orchestration.task_spec import TaskSpec
from resources.core import tags as t
from resources.core.entry import Trigger
from resources.core.operators import UI_OPERATOR


def unissued_launch(spec: TaskSpec, request: EntryRequest, tags: Mapping[str, str]) -> str | None:
    """Why a run of ``spec``'s task may not act: the task is not manually triggerable and the
    run was not launched by anything dueledger issued. None: it may act.

    Issued are: a run of the task's own schedule (Dagster tags it ``dagster/schedule_name``),
    a run of a sensor (``dagster/sensor_name``: re-dispatch, catch-up) and a backfill run
    (``dagster/backfill``); Dagster copies these tags onto its automatic retries. A manual
    retry is the retry rules' to decide (they check the manual trigger themselves). Anything
    else -- the launchpad, "Materialize", GraphQL ``launchRun``, ``dagster job launch``, a
    run with hand-typed dueledger tags -- is a manual launch, whatever it claims to be.
    """
    if spec.manual_trigger or request.trigger == Trigger.MANUAL_RETRY:
        return None
    if request.trigger == Trigger.BACKFILL and tags.get(t.DAGSTER_BACKFILL):
        return None
    if request.trigger == Trigger.SCHEDULE and tags.get(t.DAGSTER_SCHEDULE_NAME) == (
        spec.schedule_name
    ):
        return None
    if request.trigger == Trigger.SENSOR and tags.get(t.DAGSTER_SENSOR_NAME):
        return None
    who = request.operator or UI_OPERATOR
    return (
        f"task {spec.key!r} is not manually triggerable: only its schedule, dueledger's "
        f"sensors and backfills run it, and this run was launched by hand (operator {who}); "
        f"it does nothing. Set manual_trigger=True in orchestration/tasks.py if manual runs "
        f"are safe for it"
    )
