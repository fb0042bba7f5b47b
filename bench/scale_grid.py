"""The generated tasks of ``bench/scale.py``: N task keys and crons spread over the slot grid
as a real platform's are -- a few every slot, some hourly, most daily -- with every slot of
the day getting the same number of dues (within one), so two measurement windows at
different times of day see as many dues.

Standard library only: the plain Dagster location imports it too, and must not pay for
anything of dueledger's.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Shares of the N tasks (every slot, hourly; the rest daily).
EVERY_SLOT_SHARE = 0.01
HOURLY_SHARE = 0.09
#: Slot lengths the grid supports: divisors of an hour, and a day (the drain: all at 00:00).
SLOT_CHOICES = (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60, 1440)


@dataclass(frozen=True)
class GridTask:
    """One generated task: its key, its cron (UTC, on the slot grid) and declared cadence."""

    key: str
    cron: str
    cadence: str


def task_key(i: int) -> str:
    return f"scale_{i:04d}"


def _every_slot(slot_minutes: int) -> str:
    if slot_minutes == 1:
        return "* * * * *"
    if slot_minutes < 60:
        return f"*/{slot_minutes} * * * *"
    return "0 * * * *"


def grid(n: int, slot_minutes: int) -> list[GridTask]:
    """``n`` tasks on ``slot_minutes``-minute slots (``SLOT_CHOICES``), deterministic.

    At least one task runs every slot; ``HOURLY_SHARE`` run hourly, at slots of the hour
    spread evenly; the rest daily, at slots of the day spread evenly. On day-long slots
    (``1440``) every task runs daily at 00:00."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if slot_minutes not in SLOT_CHOICES:
        raise ValueError(f"slot_minutes must be one of {SLOT_CHOICES}, got {slot_minutes}")
    if slot_minutes == 1440:
        return [GridTask(task_key(i), "0 0 * * *", "daily") for i in range(n)]
    every = max(1, round(n * EVERY_SLOT_SHARE))
    hourly = min(n - every, round(n * HOURLY_SHARE))
    daily = n - every - hourly
    per_hour, per_day = max(1, 60 // slot_minutes), 1440 // slot_minutes
    out = [GridTask(task_key(i), _every_slot(slot_minutes), "every slot") for i in range(every)]
    for j in range(hourly):
        minute = (j * per_hour // hourly) * slot_minutes % 60
        out.append(GridTask(task_key(every + j), f"{minute} * * * *", "hourly"))
    for j in range(daily):
        at = (j * per_day // daily) * slot_minutes
        out.append(GridTask(task_key(every + hourly + j), f"{at % 60} {at // 60} * * *", "daily"))
    return out


def dues_per_day(tasks: list[GridTask], slot_minutes: int) -> int:
    """How many dues ``tasks`` have in a day: one ledger entry (and one run) each."""
    per_day = 1440 // slot_minutes if slot_minutes < 1440 else 1
    counts = {"every slot": per_day, "hourly": 24 if slot_minutes <= 60 else 1, "daily": 1}
    return sum(counts[t.cadence] for t in tasks)
