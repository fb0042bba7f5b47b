"""Make the bench scripts importable (``run``, ``scheduling``, ``reclaim_scan``, ...).

bench/ goes LAST on sys.path: bench/assets.py would otherwise shadow the ``assets`` package.
"""

import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH_DIR) not in sys.path:
    sys.path.append(str(BENCH_DIR))
