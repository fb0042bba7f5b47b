"""Liveness: the daemon's scheduler heartbeat and the latest slot evaluation, fresh or stale.

Heartbeats are written the way the daemon writes them; scheduled runs come from the real
scheduler daemon path. ``check_liveness`` takes ``now``; the CLI reads the wall clock, so its
tests place heartbeats and runs relative to the wall clock, never at absolute times.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
from click.testing import CliRunner
from dagster_internals import (
    daemon_instance,
    daemon_workspace,
    run_scheduler_tick,
    write_daemon_heartbeat,
)
from sensor_support import fixture_module, target, utc_now

from orchestration.cli import main
from orchestration.services.liveness import SCHEDULER_DAEMON, check_liveness
from resources.core.due import floor_to_slot

pytestmark = pytest.mark.daemon

D0 = datetime(2026, 11, 30, 20, 0, tzinfo=UTC)
LIMIT = timedelta(seconds=180)


@pytest.fixture(scope="module")
def scheduled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dg.DagsterInstance]:
    """An instance whose scheduler created the runs of due D0 (and nothing after)."""
    with (
        daemon_instance(
            "mocked", temp_dir=tmp_path_factory.mktemp("live") / "instance"
        ) as instance,
        daemon_workspace(instance, target("audit_defs")) as ctx,
    ):
        run_scheduler_tick(ctx, D0 - timedelta(minutes=1))
        run_scheduler_tick(ctx, D0 + timedelta(seconds=5))
        yield instance


def views():
    module = fixture_module()
    return module.views_of(module.STRICT, module.CATCH_UP_TASK)


CASES = [
    # name, now, heartbeat age (None: no heartbeat), stale checks
    ("both fresh", D0 + timedelta(minutes=2), timedelta(seconds=10), []),
    (
        "heartbeat too old",
        D0 + timedelta(minutes=2),
        timedelta(seconds=400),
        ["scheduler_heartbeat"],
    ),
    ("no heartbeat ever", D0 + timedelta(minutes=2), None, ["scheduler_heartbeat"]),
    (
        "next due unscheduled, within the limit",
        D0 + timedelta(minutes=16),
        timedelta(seconds=5),
        [],
    ),
    (
        "next due unscheduled for 20 minutes",
        D0 + timedelta(minutes=35),
        timedelta(seconds=5),
        ["slot_evaluation"],
    ),
    (
        "both stale",
        D0 + timedelta(hours=2),
        timedelta(hours=1),
        ["scheduler_heartbeat", "slot_evaluation"],
    ),
]


@pytest.mark.parametrize(
    ("now", "age", "stale"), [pytest.param(n, a, s, id=i) for i, n, a, s in CASES]
)
def test_liveness_names_each_stale_check(scheduled, now, age, stale):
    scheduled.wipe_daemon_heartbeats()
    if age is not None:
        write_daemon_heartbeat(scheduled, SCHEDULER_DAEMON, (now - age).timestamp())
    report = check_liveness(scheduled, views(), now, LIMIT)
    assert report.stale == stale
    assert report.ok is (stale == [])
    slot = next(c for c in report.checks if c.name == "slot_evaluation")
    assert "2026-11-30T20:00:00Z" in slot.detail  # the latest scheduled due, named


def test_without_any_scheduled_run_the_slot_evaluation_is_stale(tmp_path):
    with daemon_instance("mocked", temp_dir=tmp_path / "instance") as instance:
        write_daemon_heartbeat(instance, SCHEDULER_DAEMON, D0.timestamp())
        report = check_liveness(instance, views(), D0 + timedelta(seconds=1), LIMIT)
    assert report.stale == ["slot_evaluation"]


# --- the command line: exit 0 fresh, 1 stale, 2 invalid input ------------------------------------


@pytest.fixture(scope="module")
def live_instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dg.DagsterInstance]:
    """DAGSTER_HOME points at an instance whose scheduler evaluated the current slot."""
    due = floor_to_slot(utc_now(), 15)
    with (
        daemon_instance("mocked", temp_dir=tmp_path_factory.mktemp("cli") / "instance") as instance,
        daemon_workspace(instance, target("audit_defs")) as ctx,
    ):
        run_scheduler_tick(ctx, due - timedelta(seconds=1))
        run_scheduler_tick(ctx, due)
        yield instance


def _liveness(*args: str):
    result = CliRunner().invoke(main, ["liveness", *args])
    return result.exit_code, result


def test_liveness_exits_0_with_a_fresh_heartbeat_and_slot(live_instance):
    write_daemon_heartbeat(live_instance, SCHEDULER_DAEMON, utc_now().timestamp())
    code, result = _liveness("--json")
    assert code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is True and data["stale"] == []


def test_liveness_exits_1_naming_a_stale_heartbeat(live_instance):
    write_daemon_heartbeat(
        live_instance, SCHEDULER_DAEMON, (utc_now() - timedelta(hours=1)).timestamp()
    )
    code, result = _liveness("--json", "--max-age-seconds", "120")
    assert code == 1
    data = json.loads(result.stdout)
    assert data["stale"] == ["scheduler_heartbeat"] and data["max_age_seconds"] == 120
    code, result = _liveness()
    assert code == 1 and "scheduler_heartbeat: STALE" in result.stdout


def test_liveness_refuses_a_bad_max_age_with_exit_2():
    code, result = _liveness("--max-age-seconds", "soon", "--json")
    assert code == 2
    assert "max-age-seconds" in json.loads(result.stdout)["error"]
