"""A one-asset Dagster code location: the baseline of ``bench/idle.py`` (no sensors, no
schedules, nothing from dueledger), loaded by ``dagster dev`` exactly as dueledger's is."""

import dagster as dg


@dg.asset
def one_asset() -> int:
    return 1


defs = dg.Definitions(assets=[one_asset])
