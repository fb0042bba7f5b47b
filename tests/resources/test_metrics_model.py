"""The metric model (resources/core/metric_model.py): which ledger numbers become which family, of
which type, with zeros written out; the histogram; the reason words of skipped dues."""

from __future__ import annotations

import math

import pytest

from resources.core import metric_model as m
from resources.core.entry import TRIGGERS, FailureKind, Status, Trigger

INFO = m.TaskInfo("order_cleanup", "every 15 minutes", "strict_current_slot", "queue", "core")


def by_name(snap: m.MetricsSnapshot) -> dict[str, dict[tuple[str, ...], object]]:
    return {f.spec.name: dict(f.samples) for f in m.families(snap)}


def test_terminal_statuses_are_counted_and_open_ones_are_gauges():
    snap = m.MetricsSnapshot(
        slot_seconds=900.0,
        tasks=[INFO],
        entry_counts={
            ("order_cleanup", Status.SUCCESS, "", Trigger.SCHEDULE): 4,
            # a success after a failed attempt keeps that attempt's kind on its entry
            ("order_cleanup", Status.SUCCESS, FailureKind.ERROR, Trigger.SCHEDULE): 1,
            ("order_cleanup", Status.FAILED, FailureKind.LEASE_RECLAIMED, Trigger.MANUAL): 2,
            ("order_cleanup", Status.QUEUED, "", Trigger.SCHEDULE): 3,
            ("gone_task", Status.DISPATCH_FAILED, FailureKind.DISPATCH, Trigger.SCHEDULE): 1,
        },
    )
    got = by_name(snap)
    entries = got["dueledger_entries_total"]
    assert entries[("order_cleanup", "success", "", "schedule")] == 5.0
    assert entries[("order_cleanup", "failed", "lease_reclaimed", "manual")] == 2.0
    # Open statuses are no counter: an entry leaves them.
    assert not [k for k in entries if k[1] in m.OPEN_STATUSES]
    # Zeros for every registered task, trigger and failure kind, none for an unknown task.
    assert entries[("order_cleanup", "failed", "timeout", "backfill")] == 0.0
    assert not [k for k in entries if k[0] == "gone_task"]
    assert len(entries) == len(TRIGGERS) * (1 + len(m.FAILED_KINDS))
    opened = got["dueledger_open_entries"]
    assert opened[("order_cleanup", "queued")] == 3.0
    assert opened[("order_cleanup", "running")] == 0.0
    # A task only the ledger knows (no longer registered) still shows its open entries.
    assert opened[("gone_task", "dispatch_failed")] == 1.0
    assert got["dueledger_lease_reclaims_total"] == {("order_cleanup",): 2.0, ("gone_task",): 0.0}
    assert got["dueledger_slot_seconds"] == {(): 900.0}
    assert got["dueledger_skipped_dues_total"] == {
        ("order_cleanup", "overlap"): 0.0,
        ("order_cleanup", "paused"): 0.0,
    }
    assert got["dueledger_task_info"][
        ("order_cleanup", "every 15 minutes", "strict_current_slot", "queue", "core")
    ] == (1.0)


def test_every_family_of_the_catalog_is_written_in_order_with_its_type():
    fams = m.families(m.MetricsSnapshot(slot_seconds=900.0, tasks=[INFO]))
    assert [f.spec for f in fams] == list(m.CATALOG)
    for spec in m.CATALOG:
        assert spec.name.startswith("dueledger_")
        assert spec.name.endswith("_total") == (spec.kind == m.COUNTER), spec.name


def test_no_heartbeat_is_an_infinite_age():
    got = by_name(m.MetricsSnapshot(slot_seconds=900.0))
    assert math.isinf(got["dueledger_scheduler_heartbeat_age_seconds"][()])  # type: ignore[arg-type]
    got = by_name(m.MetricsSnapshot(slot_seconds=900.0, heartbeat_age=4.5))
    assert got["dueledger_scheduler_heartbeat_age_seconds"] == {(): 4.5}


def test_alert_deliveries_and_hook_failures_are_written_out_with_zeros():
    snap = m.MetricsSnapshot(
        slot_seconds=900.0,
        deliveries={("webhook", "delivered"): 3, ("email", "failed"): 1},
        hook_failures={"task_before": 2},
        hook_events=("task_before", "task_after"),
    )
    got = by_name(snap)
    # Both channels, configured or not, so a fresh deployment's scrape shows the family.
    assert got["dueledger_alert_deliveries_total"] == {
        ("email", "delivered"): 0.0,
        ("email", "given_up"): 0.0,
        ("webhook", "delivered"): 3.0,
        ("webhook", "given_up"): 0.0,
    }
    assert got["dueledger_alert_deliveries_waiting"][("email", "failed")] == 1.0
    assert got["dueledger_hook_failures_total"] == {("task_after",): 0.0, ("task_before",): 2.0}


def test_the_lag_histogram_is_cumulative_and_clamps_a_clock_ahead_of_the_due():
    h = m.histogram([-5.0, 10.0, 15.0, 16.0, 100_000.0], bounds=(15.0, 60.0))
    assert h.cumulative == (3, 4, 5)
    assert (h.count, h.total) == (5, 100_041.0)
    assert m.histogram([]).count == 0


@pytest.mark.parametrize(
    ("kind", "text", "reason"),
    [
        (None, "overlap: entry 4 running", "overlap"),
        (None, "paused by alice: maintenance window", "paused"),
        ("paused", "anything", "paused"),
        (None, None, "unspecified"),
        (None, "«weird» text", "unspecified"),
    ],
)
def test_a_skipped_due_is_labelled_by_its_reason_word(kind, text, reason):
    assert m.skip_reason(kind, text) == reason


def test_refused_runs_are_rejected_claims_and_refused_reexecutions_only():
    rejections = [
        {"action": "claim"},
        {"action": "reject"},
        {"action": "succeed"},
        {"action": "side_effect"},
        "junk",
    ]
    assert m.refused_runs(rejections) == 2
    assert m.refused_runs(None) == 0
    outcomes = [
        {"event": "task_before", "outcome": "error"},
        {"event": "task_before", "outcome": "timeout"},
        {"event": "task_after", "outcome": "allow"},
        {"event": "task_after", "outcome": "invalid"},
    ]
    assert m.hook_failures(outcomes) == {"task_before": 2, "task_after": 1}
