"""Layer 3, services: the ledger operations that the CLI, the sensors and the assets share.

alerts (the alert line and clock), audit (the missed-due audit), summary (the ledger
summary), reclaim (lease reclaim), liveness (scheduler liveness), launch (putting dueledger's
own runs on the instance: manual launches and retries). Dagster is used here only
as a library (instance reads), never to define sensors or assets: those are the shells.
"""
