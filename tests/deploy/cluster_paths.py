"""Imported first by cluster_defs.py (loaded by a code server from its file): the project root,
then tests/ (for the history package) on sys.path. The root must come first: with tests/ alone,
its folder tests/sensors would shadow the real ``sensors`` package (see tests/conftest.py)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT / "tests", ROOT):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
