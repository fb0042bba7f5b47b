"""docs/adding-a-task.md, run as it stands: its scaffold command, then its files, then its tests.

In a copy of the project (the copy ahead of the installed package on PYTHONPATH), the page's
``dg scaffold defs`` command runs, each code block that starts with a ``# <path>`` comment is
written to that path, ``dg check defs`` and ``dueledger tasks`` accept the task, and pytest runs
the page's test file there. A page edit that breaks the example fails this test.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from resources.core.settings import PROJECT_ROOT

DOC = PROJECT_ROOT / "docs" / "adding-a-task.md"
BIN = Path(sys.executable).parent
#: A fenced block whose first line names the file it is: ``# assets/x/tasks.py``.
FILE_BLOCK = re.compile(r"^```(?:python|yaml)\n# (?P<path>[\w/.]+)\n(?P<body>.*?)^```", re.M | re.S)
SCAFFOLD = re.compile(r"^uv run (dg scaffold defs .+)$", re.M)


def _run(copy: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args), cwd=copy, env=env, capture_output=True, text=True, timeout=600
    )


def _files(text: str) -> dict[str, str]:
    return {m["path"]: f"# {m['path']}\n{m['body']}" for m in FILE_BLOCK.finditer(text)}


def test_the_page_names_its_files():
    files = _files(DOC.read_text(encoding="utf-8"))
    assert set(files) == {
        "assets/overdue_digest/defs.yaml",
        "assets/overdue_digest/tasks.py",
        "tests/assets/test_overdue_digest.py",
    }


@pytest.mark.slow
def test_the_page_builds_a_task_whose_tests_pass(tmp_path: Path):
    text = DOC.read_text(encoding="utf-8")
    copy = tmp_path / "project"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("orchestration", "assets", "sensors", "resources"):
        shutil.copytree(PROJECT_ROOT / package, copy / package, ignore=ignore)
    for name in ("pyproject.toml", "workspace.yaml"):
        shutil.copyfile(PROJECT_ROOT / name, copy / name)
    home = tmp_path / "home"
    home.mkdir()
    shutil.copyfile(PROJECT_ROOT / "dagster.yaml.local", home / "dagster.yaml")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "VIRTUAL_ENV": sys.prefix,
        # The copy ahead of the editable install (whose finder comes last on sys.meta_path).
        "PYTHONPATH": str(copy),
    }

    (command,) = SCAFFOLD.findall(text)
    argv = shlex.split(command)
    scaffold = _run(copy, env, str(BIN / argv[0]), *argv[1:])
    assert scaffold.returncode == 0, scaffold.stdout[-3000:] + scaffold.stderr[-3000:]
    assert (copy / "assets" / "overdue_digest" / "tasks.py").is_file()

    for path, body in _files(text).items():
        target = copy / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body, encoding="utf-8")

    check = _run(copy, env, str(BIN / "dg"), "check", "defs")
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    tasks = _run(copy, env, str(BIN / "dueledger"), "tasks", "--json")
    assert tasks.returncode == 0, tasks.stderr[-3000:]
    (listed,) = [t for t in json.loads(tasks.stdout) if t["key"] == "overdue_digest"]
    assert (listed["timezone"], listed["overlap_policy"]) == ("Europe/Berlin", "skip")

    tests = _run(
        copy,
        env,
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "tests/assets/test_overdue_digest.py",
    )
    assert tests.returncode == 0, tests.stdout[-5000:] + tests.stderr[-3000:]
    assert "2 passed" in tests.stdout, tests.stdout[-3000:]
