"""Invalid task specs fail at definition load, naming the task and the field."""

from dataclasses import replace
from datetime import timedelta

import pytest

from orchestration.task_spec import (
    MissedSlotPolicy,
    TaskSpec,
    TaskSpecError,
    build_views,
    task_keys_of_run,
)
from orchestration.timetable import Cron, EverySlots, NthSlotOfDay

GOOD = TaskSpec(
    key="nightly_report",
    rule=Cron("0 2 * * *"),
    declared_cadence="daily",
    timeout=timedelta(minutes=5),
    lease_ttl=timedelta(minutes=10),
)


def test_a_good_spec_builds_a_view_with_defaults():
    (view,) = build_views([GOOD], 15, "UTC")
    assert view.spec.max_attempts == 3
    assert view.spec.missed_slot_policy == "strict_current_slot"
    assert view.spec.overlap_policy == "queue"
    assert view.effective.label == "daily"


@pytest.mark.parametrize(
    ("name", "change", "field", "words"),
    [
        ("bad_cron", {"rule": Cron("61 * * * *")}, "rule", "invalid cron"),
        ("six_field_cron", {"rule": Cron("0 0 2 * * *")}, "rule", "invalid cron"),
        ("zero_slots", {"rule": EverySlots(0)}, "rule", "n >= 1"),
        ("slot_past_end_of_day", {"rule": NthSlotOfDay(96)}, "rule", "0..95"),
        (
            "lease_ttl_equal_to_timeout",
            {"lease_ttl": timedelta(minutes=5)},
            "lease_ttl",
            "greater than timeout",
        ),
        (
            "lease_ttl_below_timeout",
            {"lease_ttl": timedelta(minutes=1)},
            "lease_ttl",
            "greater than timeout",
        ),
        ("camel_case_key", {"key": "nightlyReport"}, "key", "snake_case"),
        ("dashed_key", {"key": "nightly-report"}, "key", "snake_case"),
        (
            "unknown_missed_slot_policy",
            {"missed_slot_policy": "skip"},
            "missed_slot_policy",
            "unknown policy 'skip'",
        ),
        (
            "unknown_overlap_policy",
            {"overlap_policy": "cancel_other"},
            "overlap_policy",
            "unknown policy 'cancel_other'",
        ),
        # The scheduling policies fail at load, naming the field.
        ("allow_without_concurrent_safe", {"overlap_policy": "allow"}, "overlap_policy", "allow"),
        ("zero_pause_after_failures", {"pause_after_failures": 0}, "pause_after_failures", "1"),
        ("bool_pause_after_failures", {"pause_after_failures": True}, "pause_after_failures", "1"),
        ("zero_deadline", {"deadline": timedelta(0)}, "deadline", "(0, "),
        ("negative_deadline", {"deadline": timedelta(minutes=-5)}, "deadline", "(0, "),
        ("deadline_of_a_month", {"deadline": timedelta(days=30)}, "deadline", "7 days"),
        ("unknown_zone", {"timezone": "Mars/Olympus_Mons"}, "timezone", "zoneinfo"),
        ("empty_zone", {"timezone": ""}, "timezone", "IANA"),
        (
            "catch_up_without_window",
            {"missed_slot_policy": MissedSlotPolicy.CATCH_UP},
            "catch_up_window",
            "bounded window",
        ),
        (
            "catch_up_window_unbounded",
            {
                "missed_slot_policy": MissedSlotPolicy.CATCH_UP,
                "catch_up_window": timedelta(days=30),
            },
            "catch_up_window",
            "bounded window",
        ),
        ("zero_attempts", {"max_attempts": 0}, "max_attempts", ">= 1"),
    ],
)
def test_each_bad_spec_names_its_task_and_field(name, change, field, words):
    spec = replace(GOOD, **change)
    with pytest.raises(TaskSpecError) as err:
        build_views([spec], 15, "UTC")
    message = str(err.value)
    assert f"task {spec.key!r}" in message
    assert f": {field}:" in message
    assert words in message


def test_a_duplicate_key_is_refused():
    with pytest.raises(TaskSpecError, match="declared twice"):
        build_views([GOOD, replace(GOOD, rule=Cron("0 3 * * *"))], 15, "UTC")


def test_a_declared_cadence_finer_than_the_slot_warns_at_load():
    fine = replace(
        GOOD, key="tick_every_minute", rule=Cron("* * * * *"), declared_cadence="every minute"
    )
    with pytest.warns(UserWarning, match="declares every minute .* runs every 15 minutes"):
        (view,) = build_views([fine], 15, "UTC")
    assert view.warnings


def test_catch_up_with_a_bounded_window_is_accepted():
    spec = replace(
        GOOD, missed_slot_policy=MissedSlotPolicy.CATCH_UP, catch_up_window=timedelta(hours=2)
    )
    (view,) = build_views([spec], 15, "UTC")
    assert view.as_json()["catch_up_window_seconds"] == 7200


# --- attribution by what Dagster records ----------------------------------------------------
def _attribution_specs() -> list[TaskSpec]:
    return [
        TaskSpec(key=k, rule=EverySlots(1), declared_cadence="every slot")
        for k in ("alpha", "beta")
    ]


ATTRIBUTIONS = [
    # (name, job name, assets executed, tags, tasks)
    ("tag_wins", "beta_job", ["beta"], {"dueledger/task": "alpha"}, ("alpha",)),
    ("launchpad_of_a_task_job", "alpha_job", ["alpha"], {"dagster/from_ui": "true"}, ("alpha",)),
    ("catalog_materialize_of_one_asset", "__ASSET_JOB", ["beta"], {}, ("beta",)),
    ("materialize_of_two_task_assets", "__ASSET_JOB", ["beta", "alpha"], {}, ("alpha", "beta")),
    ("partitioned_asset_job_variant", "__ASSET_JOB_0", ["alpha"], {}, ("alpha",)),
    ("asset_of_no_task", "__ASSET_JOB", ["raw_orders"], {}, ()),
    ("another_asset_job_with_a_task_asset", "reporting_job", ["alpha"], {}, ("alpha",)),
    ("an_op_job", "cleanup_ops_job", None, {}, ()),
]


@pytest.mark.parametrize(
    ("job", "assets", "tags", "expected"),
    [case[1:] for case in ATTRIBUTIONS],
    ids=[case[0] for case in ATTRIBUTIONS],
)
def test_a_run_belongs_to_the_tasks_of_its_tag_job_or_assets(job, assets, tags, expected):
    assert task_keys_of_run(_attribution_specs(), job, assets, tags) == expected
