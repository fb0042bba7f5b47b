"""The logs domain's task: ``log_archive`` (declared in defs.yaml beside this file). The archive
rule (``archive.py``, pandas) is imported by the run that computes, never at load.
"""

from collections.abc import Iterator

import dagster as dg

from assets.domain_config import DomainRules
from assets.metadata import run_metadata, table_metadata
from orchestration.task_run import TaskRun
from resources.idempotency import create_domain_schema
from resources.source_store import SourceStore


def log_archive(
    context: dg.AssetExecutionContext,
    run: TaskRun,
    source: SourceStore,
    rules: DomainRules,
) -> Iterator[dg.MaterializeResult]:
    import pandas as pd

    # The archive rule loads with the run that uses it, not with the code location.
    from assets.logs.archive import ARCHIVED_LOGS, archive_log

    engine = source.engine()
    create_domain_schema(engine)
    policy = rules.archive_policy()
    manifests: list[dict[str, object]] = []
    for log in ARCHIVED_LOGS:
        manifests.extend(
            archive_log(
                engine,
                log,
                policy,
                run.as_of,
                task_key=run.task_key,
                entry_key=run.entry_key,
                guard=run.guard,
                entry_id=run.entry.id,
                attempt=run.entry.attempt,
            )
        )
    files = pd.DataFrame(
        manifests, columns=["table_name", "path", "rows", "deleted", "min_id", "max_id"]
    )
    per_table = {
        f"{log.table.name}/archived": int(
            files.loc[files["table_name"] == log.table.name, "rows"].sum()
        )
        for log in ARCHIVED_LOGS
    }
    yield dg.MaterializeResult(
        metadata={
            **run_metadata(run),
            "archive_dir": str(policy.directory),
            "retention_days": policy.retention.days,
            "files": len(files),
            "archived_rows": int(files["rows"].sum()),
            "deleted_rows": int(files["deleted"].sum()),
            **per_table,
            "archives": table_metadata(files, limit=20),
        }
    )
