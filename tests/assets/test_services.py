"""Service lifecycle: suspension and termination rules as named instants, and the write-back."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pandas as pd
import pytest
import sqlalchemy as sa
from fence_support import lost_guard, refusals

from assets.services.lifecycle import (
    LifecyclePlan,
    LifecyclePolicy,
    apply_lifecycle,
    candidate_services_query,
    plan_lifecycle,
)
from resources.core.fence import FenceLost
from resources.source_schema import automation_log, read_frame_from, services

AS_OF = datetime(2026, 3, 1, 12, 0)
SECOND = timedelta(seconds=1)
RETENTION = timedelta(days=30)
ENABLED = LifecyclePolicy(termination_enabled=True, termination_retention=RETENTION)
DISABLED = LifecyclePolicy()
LONG_AGO = AS_OF - timedelta(days=365)


def services_frame(*rows: tuple[int, str, datetime, datetime | None]) -> pd.DataFrame:
    """A hand-built services frame: (id, status, expires_at, suspended_at)."""
    frame = pd.DataFrame(rows, columns=["id", "status", "expires_at", "suspended_at"])
    frame["expires_at"] = pd.to_datetime(frame["expires_at"])
    frame["suspended_at"] = pd.to_datetime(frame["suspended_at"])
    return frame


def plan_ids(
    frame: pd.DataFrame, as_of: datetime = AS_OF, policy: LifecyclePolicy = ENABLED
) -> tuple[list[int], list[int]]:
    plan = plan_lifecycle(frame, as_of, policy)
    return plan.to_suspend["id"].tolist(), plan.to_terminate["id"].tolist()


# --- policy -------------------------------------------------------------------------------


def test_termination_is_disabled_by_default_with_a_30_day_retention():
    assert LifecyclePolicy() == LifecyclePolicy(
        termination_enabled=False, termination_retention=timedelta(days=30)
    )


@pytest.mark.parametrize("bad", [timedelta(0), -RETENTION, 30])
def test_a_non_positive_or_non_timedelta_retention_is_rejected_naming_the_field(bad):
    with pytest.raises(ValueError, match="termination_retention"):
        LifecyclePolicy(termination_enabled=True, termination_retention=bad)


def test_termination_enabled_must_be_a_real_bool_not_a_truthy_string():
    with pytest.raises(ValueError, match="termination_enabled"):
        LifecyclePolicy(termination_enabled="false")  # type: ignore[arg-type]


# --- suspension: named instants -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expires_at", "suspended"),
    [
        ("expires_one_second_after_as_of", AS_OF + SECOND, False),
        ("expires_at_as_of", AS_OF, True),
        ("expired_one_second_before_as_of", AS_OF - SECOND, True),
        ("expired_ten_days_ago", AS_OF - timedelta(days=10), True),
        ("expires_next_week", AS_OF + timedelta(days=7), False),
    ],
)
def test_an_active_service_is_suspended_once_it_has_expired(name, expires_at, suspended):
    frame = services_frame((1, "active", expires_at, None))
    assert plan_ids(frame) == (([1] if suspended else []), []), name


@pytest.mark.parametrize("status", ["suspended", "terminated"])
def test_an_expired_service_that_is_not_active_is_not_suspended_again(status):
    frame = services_frame((1, status, LONG_AGO, AS_OF - timedelta(days=1)))
    assert plan_ids(frame)[0] == []


# --- termination: named instants ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "suspended_at", "terminated"),
    [
        ("retention_ends_one_second_after_as_of", AS_OF - RETENTION + SECOND, False),
        ("retention_ends_at_as_of", AS_OF - RETENTION, True),
        ("retention_ended_one_second_before_as_of", AS_OF - RETENTION - SECOND, True),
        ("suspended_yesterday", AS_OF - timedelta(days=1), False),
        ("suspended_at_as_of", AS_OF, False),
    ],
)
def test_a_suspended_service_is_terminated_once_retention_since_suspension_has_passed(
    name, suspended_at, terminated
):
    frame = services_frame((1, "suspended", LONG_AGO, suspended_at))
    assert plan_ids(frame) == ([], [1] if terminated else []), name


def test_termination_counts_retention_from_suspension_not_from_expiry():
    # Expired 90 days ago but suspended only 10 days ago (e.g. the task was off): the
    # customer still gets the full 30-day grace period from the suspension.
    frame = services_frame(
        (1, "suspended", AS_OF - timedelta(days=90), AS_OF - timedelta(days=10)),
        (2, "suspended", AS_OF - timedelta(days=31), AS_OF - timedelta(days=31)),
    )
    assert plan_ids(frame) == ([], [2])


def test_nothing_is_terminated_when_termination_is_disabled_by_default():
    frame = services_frame((1, "suspended", LONG_AGO, AS_OF - timedelta(days=300)))
    assert plan_ids(frame, policy=DISABLED) == ([], [])


def test_a_suspended_service_without_suspended_at_is_never_terminated():
    frame = services_frame((1, "suspended", LONG_AGO, None))
    assert plan_ids(frame) == ([], [])


def test_a_longer_retention_moves_the_termination_boundary():
    policy = LifecyclePolicy(termination_enabled=True, termination_retention=timedelta(days=60))
    frame = services_frame(
        (1, "suspended", LONG_AGO, AS_OF - timedelta(days=45)),
        (2, "suspended", LONG_AGO, AS_OF - timedelta(days=60)),
    )
    assert plan_ids(frame, policy=policy) == ([], [2])


def test_a_service_suspended_in_this_run_is_not_terminated_in_the_same_run():
    # Expired a year ago, far past any retention, but still active: this run suspends it
    # and its retention only starts now.
    frame = services_frame((1, "active", LONG_AGO, None))
    assert plan_ids(frame) == ([1], [])


def test_the_plan_records_its_as_of_and_the_termination_cutoff():
    plan = plan_lifecycle(services_frame(), AS_OF, ENABLED)
    assert (plan.as_of, plan.termination_cutoff) == (AS_OF, AS_OF - RETENTION)
    assert plan_lifecycle(services_frame(), AS_OF, DISABLED).termination_cutoff is None


def test_a_frame_without_suspended_at_is_rejected_with_the_missing_column_named():
    frame = pd.DataFrame({"id": [1], "status": ["active"], "expires_at": [AS_OF]})
    with pytest.raises(ValueError, match="suspended_at"):
        plan_lifecycle(frame, AS_OF, ENABLED)


# --- write-back -----------------------------------------------------------------------------


def insert_services(engine: sa.Engine, *rows: tuple[int, str, datetime, datetime | None]) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.insert(services),
            [
                {
                    "id": i,
                    "customer_id": 1,
                    "product": "vps-small",
                    "status": status,
                    "price_cents": 2499,
                    "auto_renew": False,
                    "expires_at": expires_at,
                    "suspended_at": suspended_at,
                    "updated_at": LONG_AGO,
                }
                for i, status, expires_at, suspended_at in rows
            ],
        )


def run_lifecycle(
    engine: sa.Engine, as_of: datetime, policy: LifecyclePolicy = ENABLED, entry: str = "e"
) -> dict[str, int]:
    plan = plan_lifecycle(read_frame_from(engine, services), as_of, policy)
    return apply_lifecycle(
        engine, plan, as_of, task_key="service_lifecycle", entry_key=entry, guard=None
    )


def state(engine: sa.Engine) -> dict[int, tuple[Any, ...]]:
    """id -> (status, suspended_at, terminated_at, updated_at), NaT as None, as stored."""
    rows: list[dict[Any, Any]] = read_frame_from(engine, services).to_dict("records")
    columns = ("status", "suspended_at", "terminated_at", "updated_at")
    return {row["id"]: tuple(None if pd.isna(row[c]) else row[c] for c in columns) for row in rows}


def test_applying_a_plan_suspends_and_terminates_with_timestamps_and_log_rows(engine):
    insert_services(
        engine,
        (1, "active", AS_OF - timedelta(days=1), None),
        (2, "suspended", LONG_AGO, AS_OF - timedelta(days=40)),
        (3, "active", AS_OF + timedelta(days=1), None),
    )

    assert run_lifecycle(engine, AS_OF, entry="e-5") == {"suspended": 1, "terminated": 1}

    at = pd.Timestamp(AS_OF)
    assert state(engine) == {
        1: ("suspended", at, None, at),
        2: ("terminated", pd.Timestamp(AS_OF - timedelta(days=40)), at, at),
        3: ("active", None, None, pd.Timestamp(LONG_AGO)),
    }
    log = read_frame_from(engine, automation_log)
    assert sorted(zip(log["object_id"], log["action"], strict=True)) == [
        (1, "suspend"),
        (2, "terminate"),
    ]
    assert set(log["task_key"]) == {"service_lifecycle"}
    assert set(log["entry_key"]) == {"e-5"}
    assert set(log["object_type"]) == {"service"}
    assert (log["at"] == at).all()


def test_a_missed_slot_is_compensated_by_the_next_run(engine):
    # The service expires at 09:10. The 09:15 run never happened; the 09:30 run must still
    # suspend it (a same-slot window would skip it forever).
    expires = datetime(2026, 3, 1, 9, 10)
    insert_services(engine, (1, "active", expires, None))
    assert run_lifecycle(engine, datetime(2026, 3, 1, 9, 0)) == {"suspended": 0, "terminated": 0}

    next_run = datetime(2026, 3, 1, 9, 30)
    assert run_lifecycle(engine, next_run) == {"suspended": 1, "terminated": 0}
    assert state(engine)[1][:2] == ("suspended", pd.Timestamp(next_run))


def test_a_service_suspended_late_is_terminated_a_full_retention_after_its_suspension(engine):
    insert_services(engine, (1, "active", LONG_AGO, None))
    assert run_lifecycle(engine, AS_OF) == {"suspended": 1, "terminated": 0}

    just_before = AS_OF + RETENTION - SECOND
    assert run_lifecycle(engine, just_before) == {"suspended": 0, "terminated": 0}
    assert run_lifecycle(engine, AS_OF + RETENTION) == {"suspended": 0, "terminated": 1}


def test_a_service_renewed_between_plan_and_apply_is_not_suspended(engine):
    insert_services(engine, (1, "active", AS_OF - timedelta(hours=1), None))
    plan = plan_lifecycle(read_frame_from(engine, services), AS_OF, ENABLED)
    assert plan.to_suspend["id"].tolist() == [1]
    with engine.begin() as conn:  # the customer renews; the status stays "active"
        conn.execute(
            sa.update(services)
            .where(services.c.id == 1)
            .values(expires_at=AS_OF + timedelta(days=365))
        )

    counts = apply_lifecycle(engine, plan, AS_OF, task_key="t", entry_key="e", guard=None)

    assert counts == {"suspended": 0, "terminated": 0}
    assert state(engine)[1][0] == "active"
    assert read_frame_from(engine, automation_log).empty


def test_a_service_reactivated_between_plan_and_apply_is_not_terminated(engine):
    insert_services(
        engine,
        (1, "suspended", LONG_AGO, AS_OF - timedelta(days=40)),
        (2, "suspended", LONG_AGO, AS_OF - timedelta(days=40)),
    )
    plan = plan_lifecycle(read_frame_from(engine, services), AS_OF, ENABLED)
    assert plan.to_terminate["id"].tolist() == [1, 2]
    with engine.begin() as conn:
        # 1: paid and reactivated; 2: reactivated and suspended again yesterday, so its
        # grace period restarted even though the status is still "suspended".
        conn.execute(
            sa.update(services)
            .where(services.c.id == 1)
            .values(status="active", suspended_at=None, expires_at=AS_OF + timedelta(days=30))
        )
        conn.execute(
            sa.update(services)
            .where(services.c.id == 2)
            .values(suspended_at=AS_OF - timedelta(days=1))
        )

    counts = apply_lifecycle(engine, plan, AS_OF, task_key="t", entry_key="e", guard=None)

    assert counts == {"suspended": 0, "terminated": 0}
    assert [s[0] for s in state(engine).values()] == ["active", "suspended"]


def test_applying_the_same_plan_twice_changes_and_logs_nothing_the_second_time(engine):
    insert_services(
        engine,
        (1, "active", AS_OF - timedelta(days=1), None),
        (2, "suspended", LONG_AGO, AS_OF - timedelta(days=40)),
    )
    plan = plan_lifecycle(read_frame_from(engine, services), AS_OF, ENABLED)
    assert apply_lifecycle(engine, plan, AS_OF, task_key="t", entry_key="e-1", guard=None) == {
        "suspended": 1,
        "terminated": 1,
    }
    assert apply_lifecycle(engine, plan, AS_OF, task_key="t", entry_key="e-2", guard=None) == {
        "suspended": 0,
        "terminated": 0,
    }
    assert set(read_frame_from(engine, automation_log)["entry_key"]) == {"e-1"}


def test_a_plan_applied_at_a_different_as_of_than_planned_is_refused(engine):
    plan = plan_lifecycle(services_frame(), AS_OF, ENABLED)
    with pytest.raises(ValueError, match="as_of"):
        apply_lifecycle(
            engine, plan, AS_OF + timedelta(days=1), task_key="t", entry_key="e", guard=None
        )


def test_a_hand_built_plan_never_terminates_a_service_suspended_at_or_after_as_of(engine):
    insert_services(
        engine,
        (1, "suspended", LONG_AGO, AS_OF),
        (2, "suspended", LONG_AGO, AS_OF - timedelta(days=1)),
    )
    frame = read_frame_from(engine, services)
    plan = LifecyclePlan(to_suspend=frame.iloc[0:0], to_terminate=frame)
    counts = apply_lifecycle(engine, plan, AS_OF, task_key="t", entry_key="e", guard=None)
    assert counts == {"suspended": 0, "terminated": 1}
    assert [s[0] for s in state(engine).values()] == ["suspended", "terminated"]


@pytest.mark.parametrize("policy", [ENABLED, DISABLED], ids=["enabled", "disabled"])
def test_the_candidate_query_finds_exactly_the_services_the_plan_picks(engine, policy):
    insert_services(
        engine,
        (1, "active", AS_OF + SECOND, None),
        (2, "active", AS_OF, None),
        (3, "suspended", LONG_AGO, AS_OF - RETENTION + SECOND),
        (4, "suspended", LONG_AGO, AS_OF - RETENTION),
        (5, "terminated", LONG_AGO, LONG_AGO),
        (6, "suspended", LONG_AGO, None),
    )
    full = plan_lifecycle(read_frame_from(engine, services), AS_OF, policy)
    candidates = read_frame_from(engine, candidate_services_query(AS_OF, policy))
    narrowed = plan_lifecycle(candidates, AS_OF, policy)
    expected = [2, 4] if policy.termination_enabled else [2]
    assert candidates["id"].tolist() == expected
    assert narrowed.to_suspend["id"].tolist() == full.to_suspend["id"].tolist() == [2]
    assert narrowed.to_terminate["id"].tolist() == full.to_terminate["id"].tolist()


def test_a_run_that_lost_its_lease_suspends_and_terminates_nothing(engine, tmp_path):
    # A worker paused past its lease used to commit after the reclaim.
    insert_services(
        engine,
        (1, "active", AS_OF - timedelta(days=1), None),
        (2, "suspended", LONG_AGO, AS_OF - timedelta(days=40)),
    )
    before = state(engine)
    plan = plan_lifecycle(read_frame_from(engine, services), AS_OF, ENABLED)
    guard, ledger = lost_guard(tmp_path, "service_lifecycle_maintenance")
    with pytest.raises(FenceLost):
        apply_lifecycle(engine, plan, AS_OF, task_key="t", entry_key="e", guard=guard)
    assert state(engine) == before
    assert read_frame_from(engine, automation_log).empty
    assert len(refusals(ledger, guard)) == 1
