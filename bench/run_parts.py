"""Benchmark: where a task run's CPU goes, part by part, against a one-asset Dagster run.

    uv run --frozen python bench/run_parts.py [--repeat R] [--task tick_every_slot] [--json PATH]

A run worker (what the run launcher starts for every run) does, in order: start Python and
import Dagster, open its Dagster instance (storage), load the code location, resolve the
run's job, and execute it (resources, the step, the run's events). This script does the
same steps in a fresh process per run, timing each with ``time.process_time()`` (the
process's CPU), and the whole process with ``os.wait4`` (so interpreter start-up and exit
are counted too): dueledger's ``<task>_job`` from ``orchestration.definitions`` against
``bare_job`` from ``bench/bare_location.py``, each on its own throwaway SQLite
``DAGSTER_HOME`` (dueledger's with a SQLite ledger and ``dueledger sample-data``), one
untimed run per side first, then ``--repeat`` pairs alternating which side goes first.

The run executes with ``execute_in_process`` on the worker's instance -- the same resource
initialisation, step and event writes a run worker's in-process executor does, without
the launcher's bookkeeping (which is the same for both sides). Reported per part: medians
of each side and dueledger's extra CPU; and whether ``pandas`` was imported (a task whose
asset does not use it must not).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _paths import BENCH_DIR, ROOT  # first: puts the project and tests/ on sys.path

# isort: split

from run import Row, write_json
from run_cost import job_tags

PARTS = (
    "import dagster",
    "open the instance",
    "load the code location",
    "resolve the job",
    "execute the run",
)
PROBE = """
import json, sys, time
clock = time.process_time
marks = [clock()]
import dagster as dg
marks.append(clock())
instance = dg.DagsterInstance.get()
instance.get_runs(limit=1)
marks.append(clock())
import importlib
module = importlib.import_module(sys.argv[1])
# dueledger's defs is a @dg.definitions function, built when Dagster loads the location.
defs = module.defs() if callable(module.defs) else module.defs
marks.append(clock())
job = defs.resolve_job_def(sys.argv[2])
marks.append(clock())
tags = json.loads(sys.argv[3])
result = job.execute_in_process(instance=instance, tags=tags, raise_on_error=False)
marks.append(clock())
print(json.dumps({
    "parts": [b - a for a, b in zip(marks, marks[1:])],
    "ok": result.success,
    "pandas": "pandas" in sys.modules,
}))
"""


def measure(module: str, job: str, tags: dict[str, str], cwd: Path, env: dict[str, str]) -> dict:
    """One fresh process: its parts (CPU s), whole-process CPU s, success, pandas."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            [sys.executable, "-W", "ignore", "-c", PROBE, module, job, json.dumps(tags)],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.DEVNULL,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        out.seek(0)
        lines = out.read().decode(errors="replace").strip().splitlines()
    if os.waitstatus_to_exitcode(status) != 0 or not lines:
        return {"parts": [0.0] * len(PARTS), "ok": False, "pandas": False, "total": 0.0}
    found = json.loads(lines[-1])
    found["total"] = usage.ru_utime + usage.ru_stime
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--task", default="tick_every_slot", help="a core task key")
    parser.add_argument("--services", type=int, default=50, help="sample-data size")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    from orchestration.declarations import core_declarations  # this checkout's tasks

    TASKS = [declared.spec for declared in core_declarations()]

    spec = next((s for s in TASKS if s.key == args.task), None)
    if spec is None or args.repeat < 1:
        parser.error(f"--task must be one of {[s.key for s in TASKS]}, --repeat >= 1")
    work = Path(tempfile.mkdtemp(prefix="dueledger-run-parts-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "DUELEDGER_"))}
    led_env = {
        **base,
        "DAGSTER_HOME": str(work / "led"),
        "DUELEDGER_DATABASE_URL": f"sqlite:///{work / 'ledger.sqlite'}",
        "DUELEDGER_SOURCE_URL": f"sqlite:///{work / 'source.sqlite'}",
    }
    bare_env = {**base, "DAGSTER_HOME": str(work / "bare")}
    for env in (led_env, bare_env):
        Path(env["DAGSTER_HOME"]).mkdir()
    seed = [str(Path(sys.executable).parent / "dueledger"), "sample-data"]
    subprocess.run([*seed, "--services", str(args.services)], env=led_env, cwd=ROOT, check=True)
    sides = {
        "dueledger": ("orchestration.definitions", spec.job_name, ROOT, led_env),
        "bare": ("bare_location", "bare_job", BENCH_DIR, bare_env),
    }
    results: dict[str, list[dict]] = {"dueledger": [], "bare": []}

    def tags(name: str) -> dict[str, str]:
        # A task that is not manually triggerable runs as its schedule launches it, a due of
        # its own each time (by hand, the ledger refuses it before its body).
        found = job_tags(spec.key) if name == "dueledger" else None
        return json.loads(found) if found else {}

    for name, (module, job, cwd, env) in sides.items():  # untimed: creates the storages
        measure(module, job, tags(name), cwd, env)
    for i in range(args.repeat):
        for name in ("dueledger", "bare") if i % 2 == 0 else ("bare", "dueledger"):
            module, job, cwd, env = sides[name]
            results[name].append(measure(module, job, tags(name), cwd, env))
    failed = [n for n, rs in results.items() for r in rs if not r["ok"]]
    rows: list[Row] = []
    head = f"part (CPU s, medians of {args.repeat})"
    print(f"{head:<34} {'dueledger':>10} {'bare':>8} {'extra':>8}")
    labels = [*PARTS, "whole process (wait4)"]
    for i, label in enumerate(labels):

        def value(r: dict, i: int = i) -> float:
            return float(r["total"] if i == len(PARTS) else r["parts"][i])

        led = statistics.median(value(r) for r in results["dueledger"])
        bare = statistics.median(value(r) for r in results["bare"])
        print(f"{label:<34} {led:>10.3f} {bare:>8.3f} {led - bare:>+8.3f}")
        rows.append(
            Row(
                area="run parts",
                measurement=f"{spec.job_name} run worker: {label}, CPU s",
                size=f"{args.repeat} pairs",
                value=led,
                unit="s",
                backend="sqlite",
                baseline=bare,
                baseline_label="one-asset job, same step",
                ratio=led / bare if bare else None,
            )
        )
    pandas = {n: sorted({r["pandas"] for r in rs}) for n, rs in results.items()}
    print(f"pandas imported: {pandas}; failed runs: {failed or 'none'}")
    if args.json:
        write_json(args.json, "run_parts", rows)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
