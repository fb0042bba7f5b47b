"""The baseline of ``bench/run_cost.py``: a one-asset Dagster code location.

One trivial asset and its job on the same executor as dueledger's task jobs
(``dg.in_process_executor``, ``orchestration/factory.py: build_task_job``), nothing else:
what any Dagster code location costs to load and to run once.

    python -c "import bare_location"                                  # load (cwd bench/)
    dagster job execute -m bare_location -j bare_job                   # one run (cwd bench/)
"""

import dagster as dg


@dg.asset
def bare_asset() -> None:
    """Does nothing: the run's cost is Dagster's alone."""


bare_job = dg.define_asset_job(
    "bare_job", selection=[bare_asset], executor_def=dg.in_process_executor
)

defs = dg.Definitions(assets=[bare_asset], jobs=[bare_job])
