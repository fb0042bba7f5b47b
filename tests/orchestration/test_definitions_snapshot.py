"""Snapshot of what the code location declares: an accidental change shows in review.

When a task is added or changed on purpose, update EXPECTED in the same commit.
"""

import dagster as dg

from orchestration.declarations import task_views
from orchestration.definitions import defs

DEFS = defs()  # the code location, built once for this module

EXPECTED = {
    "order_cleanup": {
        "job": "order_cleanup_job",
        "schedule": "order_cleanup_schedule",
        "cron": "*/15 * * * *",
        "timezone": "UTC",
        "effective_cadence": "every 15 minutes",
    },
    "service_lifecycle_maintenance": {
        "job": "service_lifecycle_maintenance_job",
        "schedule": "service_lifecycle_maintenance_schedule",
        "cron": "*/15 * * * *",
        "timezone": "UTC",
        "effective_cadence": "every 15 minutes",
    },
    "billing_maintenance": {
        "job": "billing_maintenance_job",
        "schedule": "billing_maintenance_schedule",
        "cron": "0 * * * *",
        "timezone": "UTC",
        "effective_cadence": "hourly",
    },
    "service_auto_renew": {
        "job": "service_auto_renew_job",
        "schedule": "service_auto_renew_schedule",
        "cron": "0 * * * *",
        "timezone": "UTC",
        "effective_cadence": "hourly",
    },
    "reconcile_account_balance": {
        "job": "reconcile_account_balance_job",
        "schedule": "reconcile_account_balance_schedule",
        "cron": "0 * * * *",
        "timezone": "UTC",
        "effective_cadence": "hourly",
    },
    "ticket_auto_close": {
        "job": "ticket_auto_close_job",
        "schedule": "ticket_auto_close_schedule",
        "cron": "0 0 * * *",
        "timezone": "UTC",
        "effective_cadence": "daily",
    },
    "log_archive": {
        "job": "log_archive_job",
        "schedule": "log_archive_schedule",
        "cron": "0 2 * * *",
        "timezone": "UTC",
        "effective_cadence": "daily",
    },
    "ledger_health": {
        "job": "ledger_health_job",
        "schedule": "ledger_health_schedule",
        "cron": "*/15 * * * *",
        "timezone": "UTC",
        "effective_cadence": "every 15 minutes",
    },
    # Plugin slot events: a legacy cron finer than the slot fires on the slot grid
    # (so the Automation list, "Next tick" and the timeline show what runs).
    "tick_every_slot": {
        "job": "tick_every_slot_job",
        "schedule": "tick_every_slot_schedule",
        "cron": "*/15 * * * *",
        "timezone": "UTC",
        "effective_cadence": "every 15 minutes",
    },
    "tick_every_minute": {
        "job": "tick_every_minute_job",
        "schedule": "tick_every_minute_schedule",
        "cron": "*/15 * * * *",
        "timezone": "UTC",
        "effective_cadence": "every 15 minutes",
    },
    "tick_every_five_minutes": {
        "job": "tick_every_five_minutes_job",
        "schedule": "tick_every_five_minutes_schedule",
        "cron": "*/15 * * * *",
        "timezone": "UTC",
        "effective_cadence": "every 15 minutes",
    },
}
#: Tasks with one attempt: a slot tick fires its event at most once per slot.
SINGLE_ATTEMPT = {"tick_every_slot", "tick_every_minute", "tick_every_five_minutes"}


def test_definitions_load():
    dg.Definitions.validate_loadable(DEFS)


def test_tasks_jobs_schedules_crons_and_cadences_match_the_snapshot():
    actual = {}
    for schedule in DEFS.schedules or []:
        metadata = schedule.metadata
        key = schedule.name.removesuffix("_schedule")
        actual[key] = {
            "job": schedule.job_name,
            "schedule": schedule.name,
            "cron": schedule.cron_schedule,
            "timezone": schedule.execution_timezone,
            "effective_cadence": metadata["dueledger/effective_cadence"].value,
        }
    assert actual == EXPECTED


def test_every_task_asset_is_in_its_tasks_pool_so_any_launch_waits_its_turn():
    # Regression: UI launches and asset backfills carry no dueledger/task, so the
    # run queue's tag limit did not hold for them; pools do not depend on tags.
    # Only `queue` tasks wait in a pool; the ledger decides the others' overlap at the claim.
    policies = {v.spec.key: v.spec.overlap_policy for v in task_views()}
    assert {k for k in EXPECTED if policies[k] != "queue"} == {
        "reconcile_account_balance",
        "log_archive",
    }
    for key in EXPECTED:
        job = DEFS.resolve_job_def(f"{key}_job")
        pools = {node.definition.pool for node in job.graph.node_dict.values()}
        assert pools == ({key} if policies[key] == "queue" else {None}), key


def test_every_task_job_tags_its_runs_for_the_ledger_and_the_queue():
    for key in EXPECTED:
        job = DEFS.resolve_job_def(f"{key}_job")
        assert job.run_tags["dueledger/task"] == key
        # max_attempts 3, or 1 for SINGLE_ATTEMPT tasks
        assert job.run_tags["dagster/max_retries"] == ("0" if key in SINGLE_ATTEMPT else "2")


#: The asset checks each task asset carries (the ledger in the Catalog, docs/operations.md).
LEDGER_HEALTH_CHECKS = {"no_stale_leases", "no_lost_retries", "no_unledgered_failed_runs"}


def test_asset_checks_match_the_snapshot():
    actual: dict[str, set[str]] = {}
    for checks_def in DEFS.asset_checks or []:
        for key in checks_def.check_keys:
            actual.setdefault(key.asset_key.to_user_string(), set()).add(key.name)
    expected = {key: {"latest_due_accounted_for"} for key in EXPECTED}
    expected["ledger_health"] |= LEDGER_HEALTH_CHECKS
    assert actual == expected


def test_a_policy_that_is_off_reads_none_in_the_uis_metadata():
    # Job and schedule metadata once showed `pause_after_failures 0` and `deadline_seconds 0`
    # where `dueledger tasks` says null: 0 reads as a value.
    for definition in (
        DEFS.resolve_job_def("order_cleanup_job"),
        DEFS.resolve_schedule_def("order_cleanup_schedule"),
    ):
        for key in ("dueledger/pause_after_failures", "dueledger/deadline_seconds"):
            assert definition.metadata[key].value == "none", (definition.name, key)
