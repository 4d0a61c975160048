"""How often a PPO policy jumps (docs/search.md, "Memory") in held-out-style replay trials.

    PYTHONPATH=. python scripts/jump_share.py RECORD.cuagent ... [--budget 30] [--seed 0] [--weights W.json]

Prints, per record, the evaluation at which the trial came within 97 % of the record's best, the
kinds of its first moves (start / jump / edits) and how many of its moves were jumps.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from core.search import optimizer
from core.search.benchmark import search_record
from core.search.events import CandidateProposed
from core.search.policies import make_policy


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("records", nargs="+")
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--weights")
    args = ap.parse_args()
    labels: list[str] = []

    class Watched(optimizer.Optimizer):
        def _emit(self, event):
            if isinstance(event, CandidateProposed):
                labels.append(event.action)
            super()._emit(event)

    optimizer.Optimizer = Watched      # search_record builds its optimiser from this module
    for record in args.records:
        labels.clear()
        trial = search_record(record, lambda space: make_policy("ppo", space, seed=args.seed, weights=args.weights),
                              "ppo", args.seed, args.budget, "skip")
        kinds = ["start" if label.startswith("start") else "jump" if label.startswith("memory") else "edits"
                 for label in labels]
        moves = [k for k in kinds if k != "start"]
        print(f"{Path(record).stem:28} to target: {trial.to_target}; first moves {kinds[:6]}; "
              f"jumps {moves.count('jump')} of {len(moves)} moves", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
