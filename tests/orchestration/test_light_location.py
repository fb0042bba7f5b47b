"""A light code location: loading the definitions imports no pandas or numpy, and in a
Dagster process it brings no third-party package of its own but croniter.

Every code server, run worker and sensor evaluation loads ``orchestration.definitions``
before it does anything; only the domain rules' runs use pandas, so the rule modules are
imported in the asset bodies (``assets/automation.py``, ``assets/domain_assets.py``) and
the policies validated at load live in ``assets/policies.py``. The asset tests
(tests/assets/) run the bodies, so they cover the lazy imports doing the work.

SQLAlchemy is imported at load (the ledger resource, ``mask_url``) and stays so: such a
process has already imported it for Dagster's own storage when it opens its instance
(measured, bench/run_cost.py "load into a Dagster process"), so deferring ours would
save nothing there. The probe pins that premise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from run_support import scheduled

from orchestration.declarations import registered_tasks
from resources.core import tags as t
from resources.core.due import format_due
from resources.core.entry import Trigger

ROOT = Path(__file__).resolve().parents[2]

HEAVY = ("pandas", "numpy")
#: Third-party packages the definitions may add to a Dagster process (cron rules).
LOAD_DEPENDENCIES = {"croniter", "dateutil"}
PROJECT_PACKAGES = {"orchestration", "resources", "assets", "sensors"}

# As a code server or run worker: the instance first (Dagster's storage), then the location.
_PROBE = """
import json, sys
import dagster as dg
with dg.DagsterInstance.get() as instance:
    instance.get_runs(limit=1)
before = set(sys.modules)
import orchestration.definitions as d
jobs = sorted(job.name for job in d.defs().resolve_all_job_defs())
added = sorted({m.split(".")[0] for m in set(sys.modules) - before})
print(json.dumps({
    "jobs": jobs,
    "heavy": sorted(m for m in sys.argv[1:] if m in sys.modules),
    "added": [m for m in added if m not in sys.stdlib_module_names],
    "sqlalchemy_before": "sqlalchemy" in before,
}))
"""


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What one fresh Dagster process imported: this test process imported pandas long ago."""
    home = tmp_path_factory.mktemp("light_location")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "DUELEDGER_DATABASE_URL": f"sqlite:///{home / 'ledger.sqlite'}",
        "DUELEDGER_SOURCE_URL": f"sqlite:///{home / 'source.sqlite'}",
    }
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _PROBE, *HEAVY],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "billing_maintenance_job" in result["jobs"]  # the location really loaded
    return result


def test_loading_the_definitions_imports_neither_pandas_nor_numpy(loaded: dict[str, Any]) -> None:
    assert loaded["heavy"] == [], (
        f"loading orchestration.definitions imported {loaded['heavy']}; import them where "
        f"the work runs (inside the asset body or the function that computes)"
    )


def test_in_a_dagster_process_the_definitions_add_no_third_party_package_but_croniter(
    loaded: dict[str, Any],
) -> None:
    added = set(loaded["added"]) - PROJECT_PACKAGES - {"dagster"}
    assert added <= LOAD_DEPENDENCIES, (
        f"loading orchestration.definitions imported {sorted(added - LOAD_DEPENDENCIES)} into "
        f"every code server and run worker; import it where the work runs"
    )
    # Why SQLAlchemy is not deferred: Dagster's storage has imported it already. Should a
    # Dagster release make that lazy, deferring the ledger's would pay off: this says so.
    assert loaded["sqlalchemy_before"], "Dagster's instance no longer imports SQLAlchemy"


# A run worker: instance, location, the run's job executed in process (its resources, the
# claim, the step, the completion), then which heavy packages the process holds.
_RUN_PROBE = """
import json, sys
import dagster as dg
instance = dg.DagsterInstance.get()
import orchestration.definitions as d
job = d.defs().resolve_job_def(sys.argv[1])
result = job.execute_in_process(instance=instance, tags=json.loads(sys.argv[2]))
heavy = sorted(m for m in sys.argv[3:] if m in sys.modules)
print(json.dumps({"ok": result.success, "heavy": heavy}))
"""


def _tags(job: str) -> dict[str, str]:
    """A task that is not manually triggerable runs as its schedule launches it."""
    (spec,) = [s for s in registered_tasks() if f"{s.key}_job" == job]
    if spec.manual_trigger:
        return {}
    due = format_due(datetime(2026, 11, 30, 22, 45, tzinfo=UTC))
    return scheduled({t.TAG_TASK: spec.key, t.TAG_TRIGGER: Trigger.SCHEDULE.value, t.TAG_DUE: due})


@pytest.mark.parametrize(
    ("job", "heavy"), [("tick_every_slot_job", []), ("order_cleanup_job", ["numpy", "pandas"])]
)
def test_only_a_run_whose_asset_uses_pandas_imports_it(
    tmp_path: Path, job: str, heavy: list[str]
) -> None:
    # Every run worker loads the code location; a task whose asset does not use
    # pandas must not pay for it (1.8 CPU-s without compiled bytecode). order_cleanup's
    # domain rule does use it: the probe can tell.
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path),
        "DUELEDGER_DATABASE_URL": f"sqlite:///{tmp_path / 'ledger.sqlite'}",
        "DUELEDGER_SOURCE_URL": f"sqlite:///{tmp_path / 'source.sqlite'}",
    }
    seed = [str(Path(sys.executable).parent / "dueledger"), "sample-data", "--services", "5"]
    subprocess.run(seed, cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _RUN_PROBE, job, json.dumps(_tags(job)), *HEAVY],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"ok": True, "heavy": heavy}


def test_importing_the_location_module_builds_nothing_until_dagster_loads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A process that imports orchestration.definitions only for build_definitions or
    # build_resources (a test's own location, the scale bench's over its generated tasks)
    # must not build the whole location first: at 500 tasks that doubled a run worker's load.
    import importlib

    import dagster as dg

    import orchestration.definitions as location
    import orchestration.task_defs as task_defs

    built: list[str] = []
    real = task_defs.task_definitions

    def counting(declared: Any, *args: Any, **kwargs: Any) -> Any:
        built.append(declared.spec.key)
        return real(declared, *args, **kwargs)

    monkeypatch.setattr(task_defs, "task_definitions", counting)
    try:
        importlib.reload(location)  # the module's body, as a fresh import runs it
        assert built == [], f"importing the module built {len(built)} task(s)"
        loaded = location.defs()  # what Dagster calls when it loads the location
        assert isinstance(loaded, dg.Definitions)
        assert sorted(built) == sorted(spec.key for spec in registered_tasks())
    finally:
        monkeypatch.undo()
        importlib.reload(location)
