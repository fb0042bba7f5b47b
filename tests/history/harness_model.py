"""What the in-process fault harness (harness.py) is configured with and what it simulates:
the fault rates, the size, and one simulated Dagster run."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

FAULTS = (
    "kill_before_claim",
    "kill_after_claim",
    "kill_between_effects",
    "kill_after_effects",
    "pause_past_lease",
    "error_before_effects",
    "error_after_effects",
)


@dataclass(frozen=True)
class Rates:
    """Per-run probabilities of each fault (the rest run cleanly), and per-due ones."""

    kill_before_claim: float = 0.02
    kill_after_claim: float = 0.02
    kill_between_effects: float = 0.02
    kill_after_effects: float = 0.02
    pause_past_lease: float = 0.03
    error_before_effects: float = 0.02
    error_after_effects: float = 0.02
    duplicate: float = 0.10  # per due
    not_dispatched: float = 0.005  # per due (never the task's first)
    undetected_death: float = 0.3  # Dagster never notices the dead worker: reclaim only
    manual_retry: float = 0.5  # share of final failures an operator retries at the end
    skew_seconds: float = 30.0


@dataclass(frozen=True)
class HarnessConfig:
    tasks: int
    slots: int
    seed: int
    rates: Rates = Rates()
    lease_ttl: timedelta = timedelta(seconds=120)
    max_attempts: int = 2
    effects_per_due: int = 2
    start: datetime = datetime(2026, 1, 5, tzinfo=UTC)
    #: A due must be classified by due + window + lease TTL (the checker's deadline).
    window: timedelta = timedelta(minutes=5)

    @property
    def dues(self) -> int:
        return self.tasks * self.slots


SLOT = timedelta(minutes=1)
RECLAIM_EVERY = 10.0  # seconds between reclaim sensor ticks
MAX_REDISPATCHES = 3


@dataclass
class Run:
    """One simulated Dagster run (one worker process)."""

    run_id: str
    task: str
    due: datetime
    tags: dict[str, str]
    fault: str | None
    skew: float
    retry_number: int = 0
    status: str = "STARTED"
    outcome: str | None = None
    worker: str = ""


def due_text(due: datetime) -> str:
    return due.strftime("%Y-%m-%dT%H:%M:%SZ")
