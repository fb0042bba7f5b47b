"""A light code location: loading the definitions imports no pandas or numpy.

Every code server, run worker and sensor evaluation loads ``orchestration.definitions``
before it does anything; only the domain rules' runs use pandas, so the rule modules are
imported in the asset bodies (``assets/automation.py``, ``assets/domain_assets.py``) and
the policies validated at load live in ``assets/policies.py``. The asset tests
(tests/assets/) run the bodies, so they cover the lazy imports doing the work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HEAVY = ("pandas", "numpy")

_PROBE = """
import json, sys
import orchestration.definitions as d
jobs = sorted(job.name for job in d.defs.resolve_all_job_defs())
print(json.dumps({"jobs": jobs, "loaded": sorted(m for m in sys.argv[1:] if m in sys.modules)}))
"""


def test_loading_the_definitions_imports_neither_pandas_nor_numpy(tmp_path: Path) -> None:
    # A fresh interpreter: this test process has imported pandas long ago.
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path),
        "DUELEDGER_DATABASE_URL": f"sqlite:///{tmp_path / 'ledger.sqlite'}",
        "DUELEDGER_SOURCE_URL": f"sqlite:///{tmp_path / 'source.sqlite'}",
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
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "billing_maintenance_job" in result["jobs"]  # the location really loaded
    assert result["loaded"] == [], (
        f"loading orchestration.definitions imported {result['loaded']}; import them where "
        f"the work runs (inside the asset body or the function that computes)"
    )
