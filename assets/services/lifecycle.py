"""Service lifecycle: suspend expired services, terminate long-suspended ones.

Pure planning (`plan_lifecycle`) plus its write-back (`apply_lifecycle`). The Dagster
asset that runs them is a thin wrapper elsewhere; nothing here imports Dagster.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

import pandas as pd
import sqlalchemy as sa

from resources.core.fence import EffectGuard
from resources.effects import effect_transaction
from resources.source_schema import (
    SERVICE_ACTIVE,
    SERVICE_SUSPENDED,
    SERVICE_TERMINATED,
    naive_utc,
    naive_utc_series,
    services,
)
from resources.source_store import update_and_log

ACTION_SUSPEND: Final = "suspend"
ACTION_TERMINATE: Final = "terminate"
OBJECT_SERVICE: Final = "service"

_REQUIRED_COLUMNS: Final = ("id", "status", "expires_at", "suspended_at")


@dataclass(frozen=True)
class LifecyclePolicy:
    """Whether and when suspended services are terminated.

    Termination is off by default: it is the irreversible step, so an operator opts in.
    """

    termination_enabled: bool = False
    termination_retention: timedelta = timedelta(days=30)

    def __post_init__(self) -> None:
        # A string such as "false" is truthy; insist on a real bool for an irreversible step.
        if not isinstance(self.termination_enabled, bool):
            raise ValueError(
                f"LifecyclePolicy.termination_enabled must be True or False, "
                f"got {self.termination_enabled!r}"
            )
        if not isinstance(
            self.termination_retention, timedelta
        ) or self.termination_retention <= timedelta(0):
            raise ValueError(
                f"LifecyclePolicy.termination_retention must be a positive timedelta "
                f"(e.g. timedelta(days=30)), got {self.termination_retention!r}"
            )


@dataclass(frozen=True, eq=False)
class LifecyclePlan:
    """What one lifecycle run intends to change, decided at `as_of`.

    `as_of` and `termination_cutoff` (as_of - retention; None when termination is
    disabled) are kept so the write-back can check it applies the plan at the instant
    it was made for and re-check the cutoff at update time.
    """

    to_suspend: pd.DataFrame
    to_terminate: pd.DataFrame
    as_of: datetime | None = None
    termination_cutoff: datetime | None = None


def _require_columns(frame: pd.DataFrame, required: Iterable[str], what: str) -> None:
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise ValueError(f"{what} frame is missing column(s) {missing}; it needs {list(required)}")


def plan_lifecycle(
    services_frame: pd.DataFrame, as_of: datetime, policy: LifecyclePolicy
) -> LifecyclePlan:
    """Decide which services to suspend and which to terminate at `as_of`.

    - Suspend: `status == 'active'` and `expires_at <= as_of` (a service expiring
      exactly at `as_of` is suspended).
    - Terminate (only when `policy.termination_enabled`): `status == 'suspended'` and
      `suspended_at + termination_retention <= as_of`. Retention counts from the
      suspension, not the expiry, so a customer always gets the full grace period.

    A continuous scan, not a same-day window: everything overdue at `as_of` is picked
    up, so a run after a missed slot compensates for it. A service suspended by this
    plan is not terminated by it (it is `active` in the input; its suspension starts at
    `as_of`). `as_of` is naive UTC (an aware value is converted).
    """
    _require_columns(services_frame, _REQUIRED_COLUMNS, "services")
    at = naive_utc(as_of)
    at_ts = pd.Timestamp(at)
    status = services_frame["status"]
    expires_at = naive_utc_series(services_frame["expires_at"])
    to_suspend = services_frame.loc[(status == SERVICE_ACTIVE) & (expires_at <= at_ts)].copy()

    cutoff: datetime | None = None
    if policy.termination_enabled:
        cutoff = at - policy.termination_retention
        suspended_at = naive_utc_series(services_frame["suspended_at"])
        # NaT compares False, so a suspended row without suspended_at is never terminated:
        # without the start of the grace period we cannot prove it is over.
        terminate_mask = (status == SERVICE_SUSPENDED) & (suspended_at <= pd.Timestamp(cutoff))
        to_terminate = services_frame.loc[terminate_mask].copy()
    else:
        to_terminate = services_frame.iloc[0:0].copy()
    return LifecyclePlan(
        to_suspend=to_suspend, to_terminate=to_terminate, as_of=at, termination_cutoff=cutoff
    )


def candidate_services_query(as_of: datetime, policy: LifecyclePolicy) -> sa.Select[Any]:
    """SQL that narrows `services` to the rows `plan_lifecycle` can pick.

    Served by the (status, expires_at) and (status, suspended_at) indexes, so a run reads
    the candidates instead of the whole table. The pure rule stays the authority: pass
    the result through `plan_lifecycle`, which gives the same plan on the full table.
    """
    at = naive_utc(as_of)
    due = sa.and_(services.c.status == SERVICE_ACTIVE, services.c.expires_at <= at)
    if policy.termination_enabled:
        cutoff = at - policy.termination_retention
        due = sa.or_(
            due,
            sa.and_(services.c.status == SERVICE_SUSPENDED, services.c.suspended_at <= cutoff),
        )
    return sa.select(services).where(due).order_by(services.c.id)


def apply_lifecycle(
    engine: sa.Engine,
    plan: LifecyclePlan,
    as_of: datetime,
    *,
    task_key: str,
    entry_key: str,
    guard: EffectGuard | None,
) -> dict[str, int]:
    """Write `plan` back in one transaction; return `{"suspended": n, "terminated": m}`.

    Compare-and-set updates, so a concurrent change wins over the plan:
    - suspend `WHERE status='active' AND expires_at <= :as_of` (a service renewed
      since planning is not suspended), setting `suspended_at` and `updated_at`;
    - terminate `WHERE status='suspended' AND suspended_at <= :cutoff` (a service
      reactivated, or re-suspended more recently, is not terminated), setting
      `terminated_at` and `updated_at`.
    Each changed service gets one `automation_log` row. Termination runs first so a
    service suspended in this transaction can never also be terminated by it.
    """
    at = naive_utc(as_of)
    if plan.as_of is not None and naive_utc(plan.as_of) != at:
        raise ValueError(
            f"apply_lifecycle got as_of={at.isoformat()} for a plan made at "
            f"{naive_utc(plan.as_of).isoformat()}; apply a plan with the as_of it was planned for"
        )
    # Without a recorded cutoff (a hand-built plan) still refuse to terminate a service
    # suspended at or after as_of, i.e. one whose grace period has not even started.
    terminate_since = (
        services.c.suspended_at <= naive_utc(plan.termination_cutoff)
        if plan.termination_cutoff is not None
        else services.c.suspended_at < at
    )
    counts = {"suspended": 0, "terminated": 0}
    with effect_transaction(engine, guard, "suspend and terminate services") as conn:
        if not plan.to_terminate.empty:
            terminated = update_and_log(
                conn,
                services,
                plan.to_terminate["id"],
                condition=sa.and_(services.c.status == SERVICE_SUSPENDED, terminate_since),
                values={
                    "status": SERVICE_TERMINATED,
                    "terminated_at": at,
                    "updated_at": at,
                },
                at=at,
                task_key=task_key,
                entry_key=entry_key,
                action=ACTION_TERMINATE,
                object_type=OBJECT_SERVICE,
                detail={"from": SERVICE_SUSPENDED, "to": SERVICE_TERMINATED},
            )
            counts["terminated"] = len(terminated)
        if not plan.to_suspend.empty:
            suspended = update_and_log(
                conn,
                services,
                plan.to_suspend["id"],
                condition=sa.and_(
                    services.c.status == SERVICE_ACTIVE,
                    services.c.expires_at <= at,
                ),
                values={"status": SERVICE_SUSPENDED, "suspended_at": at, "updated_at": at},
                at=at,
                task_key=task_key,
                entry_key=entry_key,
                action=ACTION_SUSPEND,
                object_type=OBJECT_SERVICE,
                detail={"from": SERVICE_ACTIVE, "to": SERVICE_SUSPENDED},
            )
            counts["suspended"] = len(suspended)
    return counts
