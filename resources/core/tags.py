"""Run tags: dueledger's own (the public contract, docs/contract.md), the outcome values a run
the ledger did not let act carries, the Dagster tags dueledger reads or sets, and where the
Dagster UI shows a run or an entry's runs.

Every module uses these constants; string literals for them are not scattered around. The
values of an entry (statuses, triggers, failure kinds) are enums in ``resources/core/entry.py``.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import quote, urlencode

# --- dueledger tags -----------------------------------------------------------------
TAG_TASK: Final = "dueledger/task"
TAG_TRIGGER: Final = "dueledger/trigger"
TAG_DUE: Final = "dueledger/due"
TAG_REQUEST_ID: Final = "dueledger/request_id"
TAG_OPERATOR: Final = "dueledger/operator"
TAG_REASON: Final = "dueledger/reason"
TAG_PARENT_ENTRY: Final = "dueledger/parent_entry"
#: Added to a run when it claims an entry: the Runs page's tag filter lists every attempt.
TAG_ENTRY: Final = "dueledger/entry"
#: Added to a run the ledger did not let act (duplicate, late, a rule), so it is never a
#: silent green: such a run ends CANCELED with the reason as its message (docs/operators.md).
TAG_OUTCOME: Final = "dueledger/outcome"
OUTCOME_REFUSED: Final = "refused"
#: The task's overlap policy or a pause did not let the run's entry run: it ended ``skipped``.
OUTCOME_SKIPPED: Final = "skipped"
#: A newer run of the task replaced this one (overlap policy ``replace``).
OUTCOME_REPLACED: Final = "replaced"
#: Every outcome: a run carrying one was decided by the ledger (the outcome sensor and the
#: ``no_unledgered_failed_runs`` check leave it alone).
OUTCOMES: Final = (OUTCOME_REFUSED, OUTCOME_SKIPPED, OUTCOME_REPLACED)
#: On every run of an entry's lineage (its attempts, retries, manual retries and their
#: children): the root entry id, so the root's Runs filter lists every run that followed it.
TAG_LINEAGE: Final = "dueledger/lineage"
#: On runs of a task an installed plugin contributes: ``plugin:<name>``, so a ledger entry
#: still names its plugin after the plugin is gone (core tasks' runs carry no such tag).
TAG_SOURCE: Final = "dueledger/source"

# --- where a task comes from ------------------------------------------------------------
SOURCE_CORE: Final = "core"
SOURCE_PLUGIN_PREFIX: Final = "plugin:"

# --- Dagster's own tags that dueledger reads or sets ----------------------------------
DAGSTER_RUN_KEY: Final = "dagster/run_key"
DAGSTER_SCHEDULE_NAME: Final = "dagster/schedule_name"
DAGSTER_SENSOR_NAME: Final = "dagster/sensor_name"
DAGSTER_BACKFILL: Final = "dagster/backfill"
DAGSTER_PARTITION: Final = "dagster/partition"
DAGSTER_PARENT_RUN_ID: Final = "dagster/parent_run_id"
DAGSTER_ROOT_RUN_ID: Final = "dagster/root_run_id"
DAGSTER_RETRY_NUMBER: Final = "dagster/retry_number"
DAGSTER_AUTO_RETRY_RUN_ID: Final = "dagster/auto_retry_run_id"
DAGSTER_WILL_RETRY: Final = "dagster/will_retry"
DAGSTER_MAX_RETRIES: Final = "dagster/max_retries"
DAGSTER_RETRY_ON_ASSET_OR_OP_FAILURE: Final = "dagster/retry_on_asset_or_op_failure"
DAGSTER_MAX_RUNTIME: Final = "dagster/max_runtime"
DAGSTER_FAILURE_REASON: Final = "dagster/failure_reason"


# --- where the Dagster UI shows them (paths under the webserver's root) ---------------------
def run_path(run_id: str) -> str:
    """The Dagster UI page of one run."""
    return f"/runs/{quote(run_id)}"


def lineage_runs_path(root_entry_id: int) -> str:
    """The Dagster UI's Runs page filtered on ``dueledger/lineage=<root>``: every run of the
    root entry and of every retry that descends from it, refused ones included."""
    return "/runs?" + urlencode({"q[0]": f"tag:{TAG_LINEAGE}={root_entry_id}"})


def entry_runs_path(entry_id: int) -> str:
    """The Dagster UI's Runs page filtered on ``dueledger/entry=<entry_id>``: every run that
    claimed the entry (attempts, retries, re-executions) or was refused on it."""
    return "/runs?" + urlencode({"q[0]": f"tag:{TAG_ENTRY}={entry_id}"})
