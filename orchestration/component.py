"""``DueTask``: the dg component a task is declared as, in the ``defs.yaml`` beside its body.

``dg list components`` lists it (``[tool.dg.project] registry_modules`` in pyproject.toml), and
``dg scaffold defs orchestration.component.DueTask nightly_export`` writes a working task: a
folder ``assets/nightly_export/`` with its ``defs.yaml`` and its body in ``tasks.py``, which
``dg check defs`` accepts and ``dueledger tasks`` lists at once. docs/adding-a-task.md walks
through one.

The attributes are the task's declaration (``orchestration/declarations.py`` reads them, with
no Dagster, for the CLI and the sensors); this class gives them a schema for dg (``dg check
defs`` validates a ``defs.yaml`` against it) and builds the task's asset, job and schedule
through the one factory every task goes through (``orchestration/task_defs.py``).
"""

from __future__ import annotations

import textwrap
from typing import Any

import dagster as dg
from pydantic import BaseModel

from orchestration.declarations import task_registry, task_views
from orchestration.services.hooks.registry import Hooks
from orchestration.task_defs import task_definitions


class DueTaskScaffoldParams(BaseModel):
    """``dg scaffold defs orchestration.component.DueTask NAME [--every-slots N | --cron X]``."""

    every_slots: int = 1
    cron: str | None = None


class DueTaskScaffolder(dg.Scaffolder[DueTaskScaffoldParams]):
    """Writes a new task's folder: its declaration and a body that runs as it stands."""

    @classmethod
    def get_scaffold_params(cls) -> type[DueTaskScaffoldParams]:
        return DueTaskScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[DueTaskScaffoldParams]) -> None:
        key = request.target_path.name
        params = request.params
        rule = (
            f'{{cron: "{params.cron}"}}'
            if params.cron
            else f"{{every_slots: {params.every_slots}}}"
        )
        cadence = f"cron {params.cron}" if params.cron else f"every {params.every_slots} slot(s)"
        (request.target_path / "defs.yaml").write_text(
            textwrap.dedent(
                f"""\
                type: {request.type_name}
                attributes:
                  key: {key}
                  description: "What {key} does, in one sentence."
                  rule: {rule}
                  declared_cadence: "{cadence}"
                  timeout: 5m
                  lease_ttl: 10m
                  group_name: {key}
                """
            ),
            encoding="utf-8",
        )
        (request.target_path / "tasks.py").write_text(
            textwrap.dedent(
                f'''\
                """The body of task {key} (declared in defs.yaml beside this file)."""

                from collections.abc import Iterator

                import dagster as dg

                from orchestration.plugins import TaskRun, format_due


                def {key}(
                    context: dg.AssetExecutionContext, run: TaskRun
                ) -> Iterator[dg.MaterializeResult]:
                    # Runs only once this run holds its ledger entry; write side effects
                    # with run.guard, so a run that lost its lease commits nothing.
                    as_of = format_due(run.as_of)
                    context.log.info(f"{key} as of {{as_of}}, entry {{run.entry.id}}")
                    yield dg.MaterializeResult(
                        metadata={{"as_of": as_of, "ledger_entry": run.entry.id}}
                    )
                '''
            ),
            encoding="utf-8",
        )


@dg.scaffold_with(DueTaskScaffolder)
class DueTask(dg.Component, dg.Resolvable, dg.Model):
    """A dueledger task: a Dagster asset whose every run claims its due in the run ledger
    first, with its job (``<key>_job``) and due-keyed schedule (``<key>_schedule``). Its body
    is the function named ``key`` in the ``tasks.py`` beside this declaration."""

    key: str
    rule: dict[str, Any]
    declared_cadence: str
    description: str | None = None
    timeout: str | int | None = None
    lease_ttl: str | int | None = None
    max_attempts: int | None = None
    manual_trigger: bool | None = None
    missed_slot_policy: str | None = None
    catch_up_window: str | int | None = None
    overlap_policy: str | None = None
    concurrent_safe: bool | None = None
    pause_after_failures: int | None = None
    deadline: str | int | None = None
    retry_backoff: str | int | None = None
    timezone: str | None = None
    partitions: str | None = None
    group_name: str | None = None
    kinds: list[str] | None = None

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        registry = task_registry()
        declared = next((d for d in registry.declared if d.spec.key == self.key), None)
        if declared is None:
            raise ValueError(
                f"task {self.key!r} ({context.path}) is not among the tasks this code location "
                f"declares: dueledger tasks live in folders of assets/ (or an allowed plugin)"
            )
        view = next(v for v in task_views() if v.spec.key == self.key)
        hooks = Hooks.from_environment()
        return task_definitions(declared, view, hooks=hooks, registered=lambda: registry.tasks)
