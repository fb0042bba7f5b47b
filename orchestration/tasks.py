"""The task registry: every scheduled unit of work, declared once.

Add a task by appending a TaskSpec here and writing its asset in ``assets/``; the
factory makes its job (``<key>_job``) and schedule (``<key>_schedule``). Validation
runs at definition load and names the task and field of any mistake.
"""

from __future__ import annotations

from datetime import timedelta

from orchestration.task_spec import PARTITIONS_DAILY, TaskSpec
from orchestration.timetable import Cron, EverySlots

TASKS: tuple[TaskSpec, ...] = (
    TaskSpec(
        key="order_cleanup",
        rule=EverySlots(1),
        declared_cadence="every slot",
        description="Cancel pending orders older than the configured age.",
        timeout=timedelta(minutes=5),
        lease_ttl=timedelta(minutes=10),
    ),
    TaskSpec(
        key="service_lifecycle_maintenance",
        rule=EverySlots(1),
        declared_cadence="every slot",
        description=(
            "Suspend services at expiry; terminate suspended ones after the retention "
            "period counted from suspension (termination off by default)."
        ),
        timeout=timedelta(minutes=10),
        lease_ttl=timedelta(minutes=15),
    ),
    # --- billing and account automation (issue 7; rules in assets/, wiring in
    # assets/domain_assets.py, tunables in assets/domain_config.py) -------------------
    TaskSpec(
        key="billing_maintenance",
        rule=Cron("0 * * * *"),
        declared_cadence="hourly",
        description=(
            "Overdue-invoice reminders (1, 3, 5 days after due) and renewal notices (7, 3, "
            "1 days before expiry) on each customer's channels, once per time point and "
            "channel; daily partitions so the UI can backfill by day."
        ),
        timeout=timedelta(minutes=20),
        lease_ttl=timedelta(minutes=30),
        partitions=PARTITIONS_DAILY,
    ),
    TaskSpec(
        key="service_auto_renew",
        rule=EverySlots(4),
        declared_cadence="every 4 slots",
        description=(
            "Renew auto-renew services near expiry when the balance covers the price "
            "(invoice paid from balance, expiry extended); else record insufficient balance."
        ),
        timeout=timedelta(minutes=20),
        lease_ttl=timedelta(minutes=30),
    ),
    TaskSpec(
        key="reconcile_account_balance",
        rule=EverySlots(4),
        declared_cadence="every 4 slots",
        description=(
            "Recompute balances from payments and invoices; report mismatches, never fix."
        ),
        timeout=timedelta(minutes=20),
        lease_ttl=timedelta(minutes=30),
    ),
    TaskSpec(
        key="ticket_auto_close",
        rule=Cron("0 0 * * *"),
        declared_cadence="daily at 00:00",
        description="Close tickets waiting on the customer for the configured number of days.",
        timeout=timedelta(minutes=10),
        lease_ttl=timedelta(minutes=15),
    ),
    TaskSpec(
        key="log_archive",
        rule=Cron("0 2 * * *"),
        declared_cadence="daily at 02:00",
        description=(
            "Archive automation and notification logs older than the retention to gzip "
            "CSV, verify, then delete exactly what was archived. Never touches the ledger."
        ),
        timeout=timedelta(minutes=60),
        lease_ttl=timedelta(minutes=90),
        # Deleting logs is not something to start by hand outside its window.
        manual_trigger=False,
    ),
    # --- the ledger's own health (issue 4; asset in assets/ledger_health.py) ------------
    TaskSpec(
        key="ledger_health",
        rule=EverySlots(1),
        declared_cadence="every slot",
        description=(
            "The run ledger's health as asset metadata: summary numbers, missed dues and a "
            "per-task table (read-only)."
        ),
        timeout=timedelta(minutes=5),
        lease_ttl=timedelta(minutes=10),
    ),
    # --- plugin slot events (issue 6; assets in assets/slot_ticks.py) -------------------
    # Each run fires one hook event for its slot, at most once (one attempt; a retry could
    # fire it twice). The two legacy names keep their names and declared cadences; on a
    # slot longer than their cron they fire once per slot, which `dueledger tasks` shows
    # as the effective cadence (and the load-time cadence warning names).
    TaskSpec(
        key="tick_every_slot",
        rule=EverySlots(1),
        declared_cadence="every slot",
        description="Fires the plugin hook event tick.every_slot once per slot.",
        timeout=timedelta(minutes=5),
        lease_ttl=timedelta(minutes=10),
        max_attempts=1,
        manual_trigger=False,
    ),
    TaskSpec(
        key="tick_every_minute",
        rule=Cron("* * * * *"),
        declared_cadence="every minute",
        description="Fires the legacy plugin hook event tick.every_minute, once per slot.",
        timeout=timedelta(minutes=5),
        lease_ttl=timedelta(minutes=10),
        max_attempts=1,
        manual_trigger=False,
    ),
    TaskSpec(
        key="tick_every_five_minutes",
        rule=Cron("*/5 * * * *"),
        declared_cadence="every 5 minutes",
        description="Fires the legacy plugin hook event tick.every_five_minutes, once per slot.",
        timeout=timedelta(minutes=5),
        lease_ttl=timedelta(minutes=10),
        max_attempts=1,
        manual_trigger=False,
    ),
)
