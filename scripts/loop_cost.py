"""The search loop's own time per evaluation in replay (no GPU time in it), per policy.

    PYTHONPATH=. python scripts/loop_cost.py RECORD.cuagent ... [--evaluations 60] [--seeds 3]
        [--no-memory-weights W.json]

For each record: random search, ppo with the shipped weights and, with --no-memory-weights, ppo
with weights trained without a memory (`cuda-agent train --no-memory`); the median over seeds of
wall time / evaluations of one held-out-style trial (benchmark.run_trial).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from core.search.benchmark import run_trial


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("records", nargs="+")
    ap.add_argument("--evaluations", type=int, default=60)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--no-memory-weights", help="PPO weights trained with --no-memory")
    args = ap.parse_args()
    runs = [("random", "random", None), ("ppo (memory)", "ppo", None)]
    if args.no_memory_weights:
        runs.append(("ppo (no memory)", "ppo", args.no_memory_weights))
    for record in args.records:
        run_trial(record, "random", 0, 5)          # the task's program is generated once, outside the timing
        for label, policy, weights in runs:
            per = []
            for seed in range(args.seeds):
                t0 = time.perf_counter()
                trial = run_trial(record, policy, seed, args.evaluations, weights=weights)
                per.append((time.perf_counter() - t0) / max(trial.evaluations, 1) * 1e3)
            print(f"{Path(record).stem:28} {label:16} {statistics.median(per):6.1f} ms per evaluation", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
