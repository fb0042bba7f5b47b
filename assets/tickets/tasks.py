"""The tickets domain's task: ``ticket_auto_close`` (declared in defs.yaml beside this file).
The pure pandas rule (``auto_close.py``) is imported by the run that computes, never at load.
"""

from collections.abc import Iterator

import dagster as dg

from assets.domain_config import DomainRules
from assets.metadata import run_metadata
from orchestration.task_run import TaskRun
from resources.source_store import SourceStore


def ticket_auto_close(
    context: dg.AssetExecutionContext,
    run: TaskRun,
    source: SourceStore,
    rules: DomainRules,
) -> Iterator[dg.MaterializeResult]:
    # The pandas rule loads with the run that uses it, not with the code location.
    from assets.tickets.auto_close import (
        candidate_tickets_query,
        close_tickets,
        select_tickets_to_close,
    )

    policy = rules.ticket_policy()
    candidates = source.read_frame(candidate_tickets_query(run.as_of, policy))
    to_close = select_tickets_to_close(candidates, run.as_of, policy)
    closed = close_tickets(
        source.engine(),
        to_close["id"],
        run.as_of,
        policy,
        task_key=run.task_key,
        entry_key=run.entry_key,
        guard=run.guard,
    )
    yield dg.MaterializeResult(
        metadata={
            **run_metadata(run),
            "due_for_close": len(to_close),
            "closed": len(closed),
            "skipped_changed_meanwhile": len(to_close) - len(closed),
        }
    )
