"""`cuda-agent run` as compile-ahead worked before the fifteenth session (2026-12-05): it predicts
exactly --compile-ahead candidates, and every compile process takes speculative compiles (none is
kept for the compiles the loop waits for). For bench/throughput.py's before/after rows on one loan.

    python3 bench/fixed_depth_run.py run TASK ... (the arguments of `cuda-agent`)
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.cli import main  # noqa: E402
from core.search.optimizer import Optimizer  # noqa: E402
from core.toolchain import pool  # noqa: E402

Optimizer._ahead_depth = lambda self: self.compile_ahead     # type: ignore[method-assign]
pool.RESERVE_URGENT_FROM = 1 << 30

if __name__ == "__main__":
    raise SystemExit(main())
