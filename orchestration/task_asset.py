"""One factory for the asset of every registered task: the claim wrapper around its body.

A task body is a generator of its materialization that gets the run it claimed::

    @task_asset("order_cleanup", group_name="hosting_automation", description="...")
    def order_cleanup(context, run: TaskRun, config: OrderCleanupConfig, source: SourceStore):
        ...  # runs only once the run has claimed its entry
        yield dg.MaterializeResult(metadata={...})

The factory writes what every task asset shares, once: the asset's name is the task key, and
so is its Dagster concurrency pool when the task's overlap policy is ``queue`` (DESIGN:
overlap; the other policies are the ledger's, at claim), the ``ledger`` resource is always
required, the spec comes from the registered tasks (core and allowed plugin tasks,
``orchestration.services.task_plugins.registered_tasks``), and the body runs inside
``orchestration.services.runtime.task_run`` -- a refused (late or duplicate) run never reaches
the body: it ends CANCELED saying why (``output_required=False``: a run that does nothing
materializes nothing). Every other parameter of the body (config,
resources such as ``source`` or ``rules``) is Dagster's, exactly as on ``@dg.asset``; a
body may also take ``ledger`` and ``hooks`` (the code location's plugin hooks).

``task_asset`` returns a :class:`TaskAsset`; ``build(hooks)`` makes the Dagster asset, so the
hooks object a code location builds once (``orchestration/definitions.py``) reaches the runs.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import dagster as dg

from orchestration.services.hooks import Hooks
from orchestration.services.runtime import SecondWorkerOfRun, TaskRun, task_run
from orchestration.services.task_plugins import registered_tasks
from orchestration.task_spec import TaskSpec, find_task, require_task
from resources.ledger import RunLedger

#: A task body: ``(context, run, **dagster_params)`` yielding its materialization.
TaskBody = Callable[..., Iterator[Any]]

_CONTEXT, _RUN, _LEDGER, _HOOKS = "context", "run", "ledger", "hooks"
#: Asset arguments the factory decides for every task asset.
_FIXED = ("name", "pool", "output_required")


@dataclass(frozen=True)
class TaskAsset:
    """The asset of task ``task_key``, to be built against a code location's hooks."""

    task_key: str
    body: TaskBody
    asset_kwargs: Mapping[str, Any]

    def build(self, hooks: Hooks, *, spec: TaskSpec | None = None) -> dg.AssetsDefinition:
        """The Dagster asset: ``body`` inside the claim wrapper, firing ``hooks``.

        ``spec``: the task's spec when the caller has it -- the plugin loader checks each
        plugin task's asset while it builds the registry, so it cannot ask the registry (that
        loaded the registry again for every plugin task: quadratic, and a RecursionError at a
        few hundred plugin tasks). Otherwise the registered spec decides the pool."""
        task_key, body = self.task_key, self.body
        signature = _dagster_signature(body)
        wants_ledger = _LEDGER in inspect.signature(body).parameters
        wants_hooks = _HOOKS in inspect.signature(body).parameters

        def compute(
            context: dg.AssetExecutionContext, ledger: RunLedger, **params: Any
        ) -> Iterator[Any]:
            spec = require_task(registered_tasks(), task_key)
            try:
                with task_run(context, ledger, spec, hooks=hooks) as run:
                    if wants_ledger:
                        params[_LEDGER] = ledger
                    if wants_hooks:
                        params[_HOOKS] = hooks
                    yield from body(context, run, **params)
            except SecondWorkerOfRun:
                return  # the run's other process holds the claim and does the work

        # Dagster reads resources and config off the signature: the body's, less what the
        # factory supplies, plus the ledger every task run claims against.
        compute.__signature__ = signature  # type: ignore[attr-defined]
        for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
            setattr(compute, attr, getattr(body, attr, None))
        # DESIGN overlap: a ``queue`` task's asset sits in a pool named after the task (one
        # slot: later runs wait in the run queue); under skip, buffer_one and replace a second
        # run must start to be decided by the ledger, and ``allow`` runs side by side.
        declared = spec if spec is not None else find_task(registered_tasks(), task_key)
        pool = task_key if declared is None or declared.uses_task_pool else None
        return dg.asset(name=task_key, pool=pool, output_required=False, **self.asset_kwargs)(
            compute
        )


def _dagster_signature(body: TaskBody) -> inspect.Signature:
    """``(context, <the body's Dagster parameters>, ledger)`` with resolved annotations."""
    signature = inspect.signature(body)
    names = list(signature.parameters)
    if names[:2] != [_CONTEXT, _RUN]:
        raise TypeError(
            f"task body {body.__qualname__} must start with (context, run: TaskRun, ...); "
            f"it takes ({', '.join(names)})"
        )
    hints = typing.get_type_hints(body)
    params = [
        p.replace(annotation=hints.get(name, p.annotation))
        for name, p in signature.parameters.items()
        if name not in (_RUN, _HOOKS)
    ]
    if _LEDGER not in signature.parameters:
        params.append(
            inspect.Parameter(
                _LEDGER, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=RunLedger
            )
        )
    return signature.replace(
        parameters=params, return_annotation=hints.get("return", inspect.Signature.empty)
    )


def task_asset(task_key: str, **asset_kwargs: Any) -> Callable[[TaskBody], TaskAsset]:
    """Decorator: the body of task ``task_key``'s asset (see the module docstring).

    ``asset_kwargs`` go to ``dg.asset`` (group_name, description, kinds, partitions_def,
    ...); name, pool and output_required are the factory's.
    """
    fixed = sorted(set(asset_kwargs) & set(_FIXED))
    if fixed:
        raise TypeError(
            f"task_asset({task_key!r}) sets {', '.join(fixed)} itself: the asset's name and "
            f"pool are the task key, and a refused run materializes nothing"
        )

    def wrap(body: TaskBody) -> TaskAsset:
        return TaskAsset(task_key, body, MappingProxyType(dict(asset_kwargs)))

    return wrap


__all__ = ["TaskAsset", "TaskBody", "TaskRun", "task_asset"]
