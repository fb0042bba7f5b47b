"""Re-executions started from the Dagster UI follow the manual-retry rules.

A real Dagster instance (synchronous in-process launcher) and the real claim wrapper run
the task assets of ``tests/fixtures/retry_defs.py`` against a real ledger. Runs are
started with the GraphQL mutations the UI itself sends: ``launchRun`` (the launchpad) and
``launchRunReexecution`` (the "Re-execute" button, which calls
``DagsterInstance.create_reexecuted_run``), so each run executes exactly as a UI
re-execution would, claim-time rule included.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster_graphql.cli import execute_query
from dagster_internals import CodeTarget, daemon_instance, daemon_workspace
from fixtures.retry_defs import EFFECTS_ENV, FAIL_ENV, LOCATION, SPECS
from run_support import refused

from orchestration.retry import (
    ACTION_MANUAL_RETRY,
    ACTION_RETRY_RUN,
    ACTION_UI_REEXECUTION,
    CHECK_MANUAL_TRIGGER,
    CHECK_NOT_RETRIED,
    CHECK_RECORDED,
    CHECK_ROLE_RETRIER,
    CHECK_STATUS,
    retry_entry,
)
from orchestration.services.launch import (
    REEXECUTE_MUTATION,
    reexecution_variables,
    run_id_from_reexecution,
)
from resources.core import tags as t
from resources.core.due import parse_due
from resources.core.entry import (
    ACTION_RUN_REFUSED,
    Entry,
    Status,
    Trigger,
    dedup_key_for_due,
    dedup_key_for_retry,
)
from resources.core.operators import UI_OPERATOR, load_operators
from resources.core.settings import ENV_DATABASE_URL, ENV_OPERATORS
from resources.ledger import RunLedger

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "retry_defs.py"
DUE = "2026-11-30T22:45:00Z"
DUE_AT = parse_due(DUE)
UI_TASK, LOCKED_TASK, PATIENT_TASK = "ui_task", "locked_task", "patient_task"

LAUNCH_MUTATION = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on Error { message }
  }
}
"""


@dataclass
class Harness:
    instance: dg.DagsterInstance
    ctx: Any  # the daemon's WorkspaceProcessContext (tests/dagster_internals.py)
    ledger: RunLedger
    effects_file: Path
    fail_file: Path

    def failing(self, on: bool) -> None:
        if on:
            self.fail_file.write_text("fail")
        else:
            self.fail_file.unlink(missing_ok=True)

    def launch(self, task: str, tags: Mapping[str, str] | None = None) -> str:
        """A scheduled run of ``task``: the tags its schedule's run carries, the schedule's name
        included (the scheduler daemon adds it); executes synchronously."""
        all_tags = {
            t.TAG_TASK: task,
            t.TAG_TRIGGER: Trigger.SCHEDULE.value,
            t.TAG_DUE: DUE,
            t.DAGSTER_SCHEDULE_NAME: f"{task}_schedule",
        }
        all_tags.update(tags or {})
        return self._launch_run(f"{task}_job", all_tags)

    def launch_from_ui(
        self, task: str, job_name: str | None = None, assets: list[str] | None = None
    ) -> str:
        """Exactly what the launchpad sends: the job and ``dagster/from_ui``, no other tag
        (Dagster 1.13's ``launchRun`` does not apply the job's run tags either)."""
        return self._launch_run(job_name or f"{task}_job", {"dagster/from_ui": "true"}, assets)

    def _launch_run(
        self, job_name: str, tags: Mapping[str, str], assets: list[str] | None = None
    ) -> str:
        """GraphQL ``launchRun``, the UI's own mutation; the run executes synchronously."""
        selector: dict[str, Any] = {
            "repositoryLocationName": LOCATION,
            "repositoryName": "__repository__",
            "jobName": job_name,
        }
        if assets:
            selector["assetSelection"] = [{"path": [a]} for a in assets]
        tag_list = [{"key": k, "value": v} for k, v in tags.items()]
        result = execute_query(
            self.ctx,
            LAUNCH_MUTATION,
            {"params": {"selector": selector, "executionMetadata": {"tags": tag_list}}},
        )
        payload = result["data"]["launchRun"]
        assert payload["__typename"] == "LaunchRunSuccess", result
        return str(payload["run"]["runId"])

    def reexecute(self, run_id: str, extra_tags: Mapping[str, str] | None = None) -> str:
        """What the UI's "Re-execute" button does; the new run executes synchronously."""
        result = execute_query(
            self.ctx, REEXECUTE_MUTATION, reexecution_variables(run_id, extra_tags or {})
        )
        return run_id_from_reexecution(result)

    def run(self, run_id: str) -> dg.DagsterRun:
        run = self.instance.get_run_by_id(run_id)
        assert run is not None
        return run

    def effects(self) -> list[tuple[str, str, int]]:
        """(task, run id, entry id) of every run that got past its claim."""
        if not self.effects_file.exists():
            return []
        rows = [line.split("\t") for line in self.effects_file.read_text().splitlines()]
        return [(task, run, int(entry)) for task, run, entry in rows]

    def entry(self, task: str, dedup_key: str) -> Entry:
        found = self.ledger.find(task, dedup_key)
        assert found is not None, dedup_key
        return found

    def scheduled_entry(self, task: str = UI_TASK) -> Entry:
        return self.entry(task, dedup_key_for_due(DUE_AT))


@pytest.fixture
def harness(ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    monkeypatch.setenv(ENV_DATABASE_URL, ledger_url)
    monkeypatch.setenv(EFFECTS_ENV, str(tmp_path / "effects.tsv"))
    monkeypatch.setenv(FAIL_ENV, str(tmp_path / "fail"))
    monkeypatch.delenv(ENV_OPERATORS, raising=False)
    ledger = RunLedger(database_url=ledger_url)
    ledger.migrate()
    target = CodeTarget.from_file(FIXTURE, location_name=LOCATION)
    # Run retries as the project's dagster.yaml sets them: on, 0 unless a run's
    # dagster/max_retries tag says otherwise (a launchpad run carries none).
    retries = {"run_retries": {"enabled": True, "max_retries": 0}}
    with (
        daemon_instance("sync", temp_dir=tmp_path / "dagster_home", overrides=retries) as instance,
        daemon_workspace(instance, target) as ctx,
    ):
        yield Harness(instance, ctx, ledger, tmp_path / "effects.tsv", tmp_path / "fail")
    ledger.dispose()


def _failed_scheduled_run(h: Harness, task: str = UI_TASK) -> tuple[str, Entry]:
    h.failing(True)
    run_id = h.launch(task)
    h.failing(False)
    assert h.run(run_id).status == dg.DagsterRunStatus.FAILURE
    entry = h.scheduled_entry(task)
    assert entry.status == Status.FAILED
    return run_id, entry


def _ui_audit(h: Harness, entry: Entry) -> list[dict[str, Any]]:
    return [a for a in h.ledger.audit_for(entry.id) if a["action"] == ACTION_UI_REEXECUTION]


def _refused_rule(audit: dict[str, Any]) -> str:
    assert audit["outcome"].startswith("refused: "), audit
    return str(audit["outcome"].split(":")[1].strip())


# --- allowed -------------------------------------------------------------------------------------


def test_re_executing_a_failed_run_is_a_manual_retry_by_dagster_ui(harness: Harness) -> None:
    h = harness
    first, parent = _failed_scheduled_run(h)

    rerun = h.reexecute(first)

    run = h.run(rerun)
    assert run.status == dg.DagsterRunStatus.SUCCESS
    child = h.entry(UI_TASK, dedup_key_for_retry(parent.id))
    assert (child.trigger, child.parent_id, child.operator) == (
        Trigger.MANUAL_RETRY,
        parent.id,
        UI_OPERATOR,
    )
    assert child.status == Status.SUCCESS and child.run_ids == (rerun,)
    assert rerun in (child.reason or "") and first in (child.reason or "")
    assert h.effects() == [(UI_TASK, first, parent.id), (UI_TASK, rerun, child.id)]
    after = h.ledger.get(parent.id)
    assert after is not None
    assert (after.status, after.error) == (Status.FAILED, parent.error)  # keeps its error
    assert after.manual_retry_by == UI_OPERATOR
    [audit] = _ui_audit(h, parent)
    assert audit["outcome"].startswith(f"allowed: created child entry {child.id}")
    assert audit["operator"] == UI_OPERATOR and audit["child_entry_id"] == child.id
    assert all(c["passed"] for c in audit["checks"])
    # Dagster's lineage, and dueledger's tags added at claim time for the UI to show.
    assert (run.parent_run_id, run.root_run_id) == (first, first)
    assert run.tags[t.TAG_TRIGGER] == Trigger.MANUAL_RETRY
    assert run.tags[t.TAG_PARENT_ENTRY] == str(parent.id)
    assert run.tags[t.TAG_OPERATOR] == UI_OPERATOR


def test_re_executing_a_failed_retry_run_retries_the_child(harness: Harness) -> None:
    h = harness
    first, parent = _failed_scheduled_run(h)
    h.failing(True)
    second = h.reexecute(first)
    h.failing(False)
    child = h.entry(UI_TASK, dedup_key_for_retry(parent.id))
    assert child.status == Status.FAILED

    third = h.reexecute(second)  # the parent run is the child's run now

    grandchild = h.entry(UI_TASK, dedup_key_for_retry(child.id))
    assert grandchild.parent_id == child.id and grandchild.status == Status.SUCCESS
    assert h.effects()[-1] == (UI_TASK, third, grandchild.id)
    assert (h.run(third).parent_run_id, h.run(third).root_run_id) == (second, first)


def test_a_parent_run_that_never_reached_the_ledger_gets_its_first_attempt(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, ledger_url: str
) -> None:
    h = harness
    # The ledger is unreachable for the first run: it fails before claiming anything.
    monkeypatch.setenv(ENV_DATABASE_URL, "postgresql+psycopg2://nobody@127.0.0.1:9/none")
    first = h.launch(UI_TASK)
    assert h.run(first).status == dg.DagsterRunStatus.FAILURE
    monkeypatch.setenv(ENV_DATABASE_URL, ledger_url)
    assert h.ledger.find(UI_TASK, dedup_key_for_due(DUE_AT)) is None

    rerun = h.reexecute(first)

    entry = h.scheduled_entry()
    assert entry.status == Status.SUCCESS and entry.run_ids == (rerun,)
    assert h.effects() == [(UI_TASK, rerun, entry.id)]
    [audit] = _audit_without_entry(h)
    assert audit["action"] == ACTION_UI_REEXECUTION and audit["operator"] == UI_OPERATOR
    assert "executes it as its first attempt" in audit["outcome"] and rerun in audit["outcome"]


def _audit_without_entry(h: Harness) -> list[dict[str, Any]]:
    """Audit records with no entry id (audit_for() cannot name them): read the table."""
    import sqlalchemy as sa

    from resources.ledger.schema import audit

    engine = sa.create_engine(h.ledger.url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(audit).where(audit.c.entry_id.is_(None))).mappings()
            return [dict(r) for r in rows]
    finally:
        engine.dispose()


# --- refused: before any side effect, audited, traced on the parent ----------------------------


def test_a_second_re_execution_of_the_same_failed_run_does_nothing(harness: Harness) -> None:
    h = harness
    first, parent = _failed_scheduled_run(h)
    h.reexecute(first)
    effects_before = h.effects()

    again = h.reexecute(first)

    assert refused(h.instance, again)  # it ran, did nothing, and ended CANCELED saying why
    assert h.effects() == effects_before
    assert len(h.ledger.children(parent.id)) == 1
    refusal = _ui_audit(h, parent)[-1]
    assert _refused_rule(refusal) == CHECK_NOT_RETRIED
    assert again in refusal["outcome"]
    after = h.ledger.get(parent.id)
    assert after is not None
    [rejection] = after.summary["late_job_rejections"]
    assert rejection["run_id"] == again and CHECK_NOT_RETRIED in rejection["reason"]
    assert t.TAG_PARENT_ENTRY not in h.run(again).tags  # only allowed retries get the tags


@pytest.mark.parametrize("outcome", ["success", "retry_success"])
def test_re_executing_a_successful_run_is_refused(harness: Harness, outcome: str) -> None:
    h = harness
    if outcome == "success":
        target = h.launch(UI_TASK)
        entry = h.scheduled_entry()
    else:  # re-executing the successful retry run: its entry is the (successful) child
        first, parent = _failed_scheduled_run(h)
        target = h.reexecute(first)
        entry = h.entry(UI_TASK, dedup_key_for_retry(parent.id))
    effects_before = h.effects()

    h.reexecute(target)

    assert h.effects() == effects_before
    assert h.ledger.children(entry.id) == []
    assert _refused_rule(_ui_audit(h, entry)[-1]) == CHECK_STATUS


def test_a_task_that_is_not_manually_triggerable_is_refused(harness: Harness) -> None:
    h = harness
    assert not next(s for s in SPECS if s.key == LOCKED_TASK).manual_trigger
    first, parent = _failed_scheduled_run(h, LOCKED_TASK)

    h.reexecute(first)

    assert h.ledger.children(parent.id) == []
    assert _refused_rule(_ui_audit(h, parent)[-1]) == CHECK_MANUAL_TRIGGER
    assert len(h.effects()) == 1


def test_an_allow_list_without_dagster_ui_refuses_ui_retries(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    first, parent = _failed_scheduled_run(h)
    ops = tmp_path / "operators.toml"
    ops.write_text('[operators]\nalice = ["admin"]\n')
    monkeypatch.setenv(ENV_OPERATORS, str(ops))

    h.reexecute(first)

    assert h.ledger.children(parent.id) == []
    refusal = _ui_audit(h, parent)[-1]
    assert _refused_rule(refusal) == CHECK_ROLE_RETRIER
    assert "'dagster-ui' is not on the allow-list" in refusal["outcome"]

    ops.write_text('[operators]\nalice = ["admin"]\n"dagster-ui" = ["retrier"]\n')
    h.reexecute(first)
    assert len(h.ledger.children(parent.id)) == 1


# --- runs that are not UI re-executions -------------------------------------------------------


def test_dagster_automatic_retries_stay_attempts_of_their_entry(harness: Harness) -> None:
    h = harness
    first, parent = _failed_scheduled_run(h)

    # What Dagster's retry daemon launches: a re-execution with dagster/retry_number.
    auto = h.reexecute(first, {t.DAGSTER_RETRY_NUMBER: "1"})

    assert h.ledger.children(parent.id) == []
    assert _ui_audit(h, parent) == []
    after = h.ledger.get(parent.id)
    assert after is not None
    # The entry's single attempt is used up: a late run, refused by the ledger's claim.
    assert [r["run_id"] for r in after.summary["late_job_rejections"]] == [auto]


class InProcessLauncher:
    """The CLI's launch, without the subprocess: the same mutation and variables."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def reexecute(self, parent_run_id: str, extra_tags: Mapping[str, str]) -> str:
        result = execute_query(
            self.ctx, REEXECUTE_MUTATION, reexecution_variables(parent_run_id, extra_tags)
        )
        return run_id_from_reexecution(result)

    def launch_new(self, job_name: str, run_id: str, tags: Mapping[str, str]) -> str:
        raise AssertionError("the parent has a Dagster run: a re-execution is expected")


def test_a_run_launched_by_runs_retry_claims_the_child_the_cli_created(harness: Harness) -> None:
    h = harness
    first, parent = _failed_scheduled_run(h)

    result = retry_entry(
        h.ledger,
        parent.id,
        specs=SPECS,
        operator="alice",
        reason="upstream fixed",
        operators=load_operators(None),
        acknowledge_side_effects=False,
        instance=h.instance,
        launcher=InProcessLauncher(h.ctx),
    )

    child = h.entry(UI_TASK, dedup_key_for_retry(parent.id))
    assert result.record.child.id == child.id
    assert child.status == Status.SUCCESS and child.run_ids == (result.run_id,)
    assert child.operator == "alice"
    run = h.run(result.run_id)
    assert (run.parent_run_id, run.root_run_id) == (first, first)
    assert run.tags[t.TAG_OPERATOR] == "alice" and run.tags[t.TAG_REASON] == "upstream fixed"
    actions = [a["action"] for a in h.ledger.audit_for(parent.id)]
    assert actions == [ACTION_MANUAL_RETRY, "manual_retry_launch"]  # no ui_reexecution


def test_a_run_merely_tagged_as_a_retry_claims_nothing(harness: Harness) -> None:
    """Regression: tags typed into the launchpad must not create a retry past the rules."""
    h = harness
    _, parent = _failed_scheduled_run(h)
    effects_before = h.effects()
    forged = {
        t.TAG_TRIGGER: Trigger.MANUAL_RETRY.value,
        t.TAG_PARENT_ENTRY: str(parent.id),
        t.TAG_OPERATOR: "mallory",
    }

    run_id = h.launch(UI_TASK, forged)

    assert refused(h.instance, run_id)  # ran, did nothing, ended CANCELED saying why
    assert h.effects() == effects_before
    assert h.ledger.children(parent.id) == []
    audits = h.ledger.audit_for(parent.id)
    # The rule's refusal, and the refused run (every refused run is audited once).
    assert [a["action"] for a in audits] == [ACTION_RETRY_RUN, ACTION_RUN_REFUSED]
    audit = audits[0]
    assert (audit["action"], audit["operator"]) == (ACTION_RETRY_RUN, "mallory")
    assert audit["outcome"].startswith(f"refused: {CHECK_RECORDED}: ")
    after = h.ledger.get(parent.id)
    assert after is not None and after.manual_retry_at is None
    assert [r["run_id"] for r in after.summary["late_job_rejections"]] == [run_id]

    orphan = h.launch(UI_TASK, {**forged, t.TAG_PARENT_ENTRY: "987654"})
    assert h.run(orphan).status == dg.DagsterRunStatus.FAILURE
    assert h.run(orphan).tags[t.DAGSTER_MAX_RETRIES] == "0"  # and Dagster will not retry it
    assert h.ledger.find(UI_TASK, dedup_key_for_retry(987654)) is None


# --- launches from the UI carry no dueledger tags --------------------------------------------


def test_a_launchpad_run_without_dueledger_tags_is_a_manual_launch_by_dagster_ui(
    harness: Harness,
) -> None:
    # Regression: such a run failed at its step ("has no dueledger/task tag").
    h = harness
    run_id = h.launch_from_ui(UI_TASK)

    run = h.run(run_id)
    assert run.status == dg.DagsterRunStatus.SUCCESS
    assert t.TAG_TASK not in run.tags  # what Dagster recorded: the job, not our tags
    entry = h.entry(UI_TASK, f"manual:{run_id}")
    assert (entry.trigger, entry.operator, entry.status) == (
        Trigger.MANUAL,
        UI_OPERATOR,
        Status.SUCCESS,
    )
    assert entry.run_ids == (run_id,)
    assert h.effects() == [(UI_TASK, run_id, entry.id)]
    assert run.tags[t.TAG_ENTRY] == str(entry.id)  # the Runs page can filter on it
    assert t.TAG_OUTCOME not in run.tags
    [materialization] = [
        e.asset_materialization
        for e in h.instance.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
        ).records
        if e.asset_materialization is not None
    ]
    metadata = materialization.metadata
    assert metadata["ledger_entry"].value == entry.id
    assert metadata["ledger_entry_runs"].value == t.entry_runs_path(entry.id)


def test_a_ui_launch_that_fails_is_a_failed_entry_the_summary_counts(harness: Harness) -> None:
    h = harness
    h.failing(True)
    run_id = h.launch_from_ui(UI_TASK)
    h.failing(False)

    assert h.run(run_id).status == dg.DagsterRunStatus.FAILURE
    entry = h.entry(UI_TASK, f"manual:{run_id}")
    assert (entry.status, entry.operator) == (Status.FAILED, UI_OPERATOR)
    assert h.ledger.summary_counts()["failed_window"] == 1


def test_re_executing_a_failed_ui_launch_is_a_manual_retry_and_is_refused_the_second_time(
    harness: Harness,
) -> None:
    h = harness
    h.failing(True)
    first = h.launch_from_ui(UI_TASK)
    h.failing(False)
    parent = h.entry(UI_TASK, f"manual:{first}")

    rerun = h.reexecute(first)
    again = h.reexecute(first)

    child = h.entry(UI_TASK, dedup_key_for_retry(parent.id))
    assert (child.status, child.parent_id, child.run_ids) == (Status.SUCCESS, parent.id, (rerun,))
    assert h.run(rerun).tags[t.TAG_ENTRY] == str(child.id)
    # Not a silent green: the run ended CANCELED, tagged refused (the Runs list shows it), and
    # nothing counts it as a failure.
    assert refused(h.instance, again)
    assert h.ledger.summary_counts()["refused_window"] == 1
    assert h.effects() == [(UI_TASK, first, parent.id), (UI_TASK, rerun, child.id)]


def test_a_refused_re_execution_of_a_success_is_tagged_refused(harness: Harness) -> None:
    h = harness
    first = h.launch_from_ui(UI_TASK)

    rerun = h.reexecute(first)

    assert refused(h.instance, rerun)
    assert t.TAG_OUTCOME not in h.run(first).tags
    assert len(h.effects()) == 1


def test_a_catalog_materialize_runs_the_implicit_asset_job_and_is_attributed_by_its_asset(
    harness: Harness,
) -> None:
    h = harness
    # What the Catalog's "Materialize" sends: the implicit asset job and the asset.
    run_id = h.launch_from_ui(UI_TASK, job_name="__ASSET_JOB", assets=[UI_TASK])

    run = h.run(run_id)
    assert run.status == dg.DagsterRunStatus.SUCCESS, run.tags
    entry = h.entry(UI_TASK, f"manual:{run_id}")
    assert (entry.status, entry.operator) == (Status.SUCCESS, UI_OPERATOR)


# --- every rule on the UI path, and what a person sees -----------------------------------------


def _messages(h: Harness, run_id: str) -> list[str]:
    """The run's event log as the run page shows it: each event's message."""
    return [e.message for e in h.instance.all_logs(run_id) if e.message]


def test_a_launchpad_run_of_a_task_that_is_not_manually_triggerable_is_refused_visibly(
    harness: Harness,
) -> None:
    # Regression: log_archive (manual_trigger=False) ran from the launchpad; only
    # `dueledger launch` checked the flag.
    h = harness
    run_id = h.launch_from_ui(LOCKED_TASK)

    assert refused(h.instance, run_id)  # CANCELED, never a green Success
    assert h.effects() == []
    assert h.ledger.list_entries(task_key=LOCKED_TASK)[0] == []  # no entry was made
    messages = _messages(h, run_id)
    why = next(m for m in messages if "not manually triggerable" in m)
    assert "Set manual_trigger: true where the task is declared (its defs.yaml)" in why
    assert any(m.startswith("refused: task 'locked_task'") for m in messages)  # cancel reason
    counts = h.ledger.summary_counts()
    assert (counts["refused_window"], counts["failed_window"]) == (1, 0)
    (audit,) = h.ledger.recent_audit(action=ACTION_RUN_REFUSED)
    assert (audit["checks"]["run_id"], audit["operator"]) == (run_id, UI_OPERATOR)


def test_hand_typed_schedule_tags_do_not_make_a_launchpad_run_scheduled(harness: Harness) -> None:
    h = harness
    typed = {t.TAG_TASK: LOCKED_TASK, t.TAG_TRIGGER: Trigger.SCHEDULE.value, t.TAG_DUE: DUE}

    run_id = h._launch_run(f"{LOCKED_TASK}_job", typed)

    assert refused(h.instance, run_id)
    assert h.effects() == []
    assert h.ledger.find(LOCKED_TASK, dedup_key_for_due(parse_due(DUE))) is None


def test_a_failed_ui_launch_no_retry_will_follow_is_failed_at_once_and_re_executes_at_once(
    harness: Harness,
) -> None:
    # Regression: the launchpad run of a 3-attempt task left its entry `retrying` although
    # Dagster would never retry it, so the first "Re-execute" was refused ("is retrying").
    h = harness
    h.failing(True)
    first = h.launch_from_ui(PATIENT_TASK)
    h.failing(False)
    parent = h.entry(PATIENT_TASK, f"manual:{first}")
    assert (parent.status, parent.attempt, parent.max_attempts) == (Status.FAILED, 1, 3)

    rerun = h.reexecute(first)  # at once: no sensor needed to settle anything first
    again = h.reexecute(first)

    child = h.entry(PATIENT_TASK, dedup_key_for_retry(parent.id))
    assert (child.status, child.parent_id) == (Status.SUCCESS, parent.id)
    assert refused(h.instance, again)
    # The parent's lineage filter lists every run that followed it, the refused one too.
    lineage = h.instance.get_runs(dg.RunsFilter(tags={t.TAG_LINEAGE: str(parent.id)}))
    assert {r.run_id for r in lineage} == {first, rerun, again}
    assert h.run(rerun).tags[t.TAG_ENTRY] == str(child.id)


def test_a_failed_scheduled_run_whose_retry_will_come_waits_retrying(harness: Harness) -> None:
    h = harness
    h.failing(True)
    # As the task job's run tags set it: Dagster retries a failure twice.
    run_id = h.launch(PATIENT_TASK, {t.DAGSTER_MAX_RETRIES: "2"})
    h.failing(False)

    entry = h.scheduled_entry(PATIENT_TASK)
    assert (entry.status, entry.run_ids) == (Status.RETRYING, (run_id,))
