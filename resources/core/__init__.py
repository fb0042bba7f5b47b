"""Layer 1, the Dagster-free core: vocabulary (tags, statuses), due and slot math, settings.

Nothing here imports Dagster or any other dueledger package; every other layer may import it.
"""
