"""Imported first by every bench script, run as a script or imported by tests/bench: the
project root and tests/ go first on sys.path, bench/ last (bench/assets.py must not shadow
the ``assets`` package)."""

import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
if str(BENCH_DIR) not in sys.path:
    sys.path.append(str(BENCH_DIR))
