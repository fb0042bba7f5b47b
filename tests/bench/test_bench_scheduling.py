"""bench/scheduling.py: both code locations go through the real scheduler daemon path and
every due schedule makes exactly one launched run."""

from __future__ import annotations

import dagster as dg
import pytest
import scheduling

from resources.core import tags as t

pytestmark = pytest.mark.daemon


@pytest.mark.parametrize("variant", scheduling.VARIANTS)
def test_one_due_makes_one_launched_run_per_schedule(tmp_path, variant):
    target = scheduling.write_location(tmp_path, variant, 1)
    timing, problems = scheduling.measure_once(target, variant, 1, tmp_path / "inst", None)
    assert problems == []
    assert timing.wall > 0 and timing.cpu > 0


def test_the_run_check_is_not_vacuous(tmp_path):
    # Two schedules fire, but the check is told to expect one: it must say so.
    target = scheduling.write_location(tmp_path, "plain", 2)
    _, problems = scheduling.measure_once(target, "plain", 1, tmp_path / "inst", None)
    assert problems == ["plain N=1: 2 runs, expected 1"]


def test_both_variants_schedule_the_same_jobs_on_the_same_cron():
    plain = scheduling.build_definitions("plain", 3)
    ledger = scheduling.build_definitions("dueledger", 3)
    for defs in (plain, ledger):
        schedules = [s for s in defs.schedules or [] if isinstance(s, dg.ScheduleDefinition)]
        assert len(schedules) == 3
        assert {s.cron_schedule for s in schedules} == {"*/15 * * * *"}
        assert {s.default_status for s in schedules} == {dg.DefaultScheduleStatus.RUNNING}
    ledger_job = ledger.resolve_job_def("bench_task_0000_job")
    assert ledger_job.run_tags[t.TAG_TASK] == "bench_task_0000"
    assert t.TAG_TASK not in plain.resolve_job_def("bench_task_0000_job").run_tags


@pytest.mark.parametrize("text", ["", "0", "1,x", "1,3000"])
def test_bad_sizes_are_refused(text, capsys):
    with pytest.raises(SystemExit) as info:
        scheduling.main(["--sizes", text])
    assert info.value.code == 2
    assert "--sizes" in capsys.readouterr().err


def test_small_sizes_get_enough_repeats_for_ten_dues_per_side():
    assert [scheduling.repeats_for(n, 3) for n in (1, 3, 5, 20, 200)] == [10, 4, 3, 3, 3]
