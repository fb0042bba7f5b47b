"""The one rule every reader uses to judge a due (resources/core/dues.py), as a table of
named instants (regression: a fresh deployment reported the due before its start as missed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestration.missed_dues import DueVerdict, Scheduling, due_verdict, missed
from orchestration.pause import Pause

SLOT = timedelta(minutes=15)
started_at_1453 = datetime(2026, 12, 4, 14, 53, tzinfo=UTC)
due_before_start = datetime(2026, 12, 4, 14, 45, tzinfo=UTC)
first_due_after_start = datetime(2026, 12, 4, 15, 0, tzinfo=UTC)
pause = Pause(
    start=datetime(2026, 12, 4, 15, 20, tzinfo=UTC),
    end=datetime(2026, 12, 4, 16, 0, tzinfo=UTC),
    by="dagster-ui",
    reason="schedule order_cleanup_schedule stopped in Dagster",
)
due_inside_pause = datetime(2026, 12, 4, 15, 30, tzinfo=UTC)
due_at_pause_end = datetime(2026, 12, 4, 16, 0, tzinfo=UTC)
running = Scheduling(since=started_at_1453, pauses=(pause,))


@pytest.mark.parametrize(
    ("due", "scheduling", "accounted", "verdict"),
    [
        pytest.param(due_before_start, running, False, DueVerdict.NOT_EXPECTED, id="fresh start"),
        pytest.param(first_due_after_start, running, False, DueVerdict.MISSED, id="downtime"),
        pytest.param(first_due_after_start, running, True, DueVerdict.ACCOUNTED, id="ran"),
        pytest.param(due_inside_pause, running, False, DueVerdict.PAUSED, id="paused"),
        pytest.param(due_inside_pause, running, True, DueVerdict.ACCOUNTED, id="ran in pause"),
        pytest.param(due_at_pause_end, running, False, DueVerdict.MISSED, id="resumed"),
        pytest.param(
            first_due_after_start, Scheduling(None), False, DueVerdict.NOT_EXPECTED, id="never ran"
        ),
        pytest.param(
            due_inside_pause,
            Scheduling(started_at_1453, (Pause(pause.start, None, "alice", "freeze"),)),
            False,
            DueVerdict.PAUSED,
            id="still paused",
        ),
    ],
)
def test_every_due_gets_one_verdict(
    due: datetime, scheduling: Scheduling, accounted: bool, verdict: DueVerdict
) -> None:
    assert due_verdict(due, scheduling, accounted=accounted)[0] is verdict


def test_the_verdict_says_why() -> None:
    assert (
        "before the task's schedule first ran here (since 2026-12-04T14:53:00Z)"
        in (due_verdict(due_before_start, running, accounted=False)[1])
    )
    assert due_verdict(due_inside_pause, running, accounted=False)[1] == (
        "paused by dagster-ui: schedule order_cleanup_schedule stopped in Dagster"
    )


def test_missed_keeps_only_the_missed_dues() -> None:
    dues = [due_before_start + i * SLOT for i in range(6)]  # 14:45 .. 16:00
    seen = {first_due_after_start + SLOT}  # 15:15 ran
    assert missed(dues, running, seen) == [first_due_after_start, due_at_pause_end]
