"""Does the PPO get better as a user's runs are remembered? A replay of a user's sequence of tasks.

    PYTHONPATH=. python scripts/memory_sequence.py RECORD.cuagent ... [--seeds 5] [--budget 100]

The records are taken as one user's tasks, in the order given and in the reverse order. Each task is
searched once per seed by `ppo` (the shipped weights) in replay, as `cuda-agent run` would on a GPU:
with "recall", the policy recalls the runs of the tasks before it in the order (each run's project
is remembered as `cuda-agent run` remembers it, memory.remember); without, it recalls nothing. The
measure is the held-out one: evaluations until a candidate runs within 97 % of the record's best.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from core.search.benchmark import search_record
from core.search.memory import MIN_MEASURED, ScheduleMemory, entry_from_record
from core.search.policies import make_policy


def sequence(records: list[Path], seed: int, budget: int, recall: bool, folder: Path) -> dict[str, int]:
    """Evaluations to the target per task name (budget + 1 = not reached), the tasks run in order."""
    memory = ScheduleMemory()
    out: dict[str, int] = {}
    for i, record in enumerate(records):
        def build(space, memory=memory):
            policy = make_policy("ppo", space, seed=seed)
            if recall:
                policy.recall = ScheduleMemory(list(memory.entries))
            return policy

        kept = folder / f"s{seed}-{int(recall)}-{i}-{record.stem}.cuagent"
        trial = search_record(record, build, "ppo", seed, budget, "skip", keep=kept)
        out[trial.task] = trial.to_target if trial.to_target is not None else budget + 1
        entry = entry_from_record(kept, min_measured=MIN_MEASURED)
        if entry is not None:
            memory.add(entry)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("records", nargs="+", type=Path)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=100)
    args = ap.parse_args()
    results: dict[str, list[dict[str, int]]] = {"no recall": [], "recall, in order": [], "recall, reversed": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for seed in range(args.seeds):
            results["no recall"].append(sequence(args.records, seed, args.budget, False, folder))
            results["recall, in order"].append(sequence(args.records, seed, args.budget, True, folder))
            results["recall, reversed"].append(sequence(args.records[::-1], seed, args.budget, True, folder))
            print(f"seed {seed} done", flush=True)
    tasks = list(results["no recall"][0])
    print("| task | " + " | ".join(results) + " |")
    print("|---|" + "---|" * len(results))
    for task in tasks:
        print(f"| {task} | " + " | ".join(f"{statistics.median(r[task] for r in runs):g}"
                                         for runs in results.values()) + " |")
    print("| **all trials** | " + " | ".join(f"{statistics.median(v for r in runs for v in r.values()):g}"
                                           for runs in results.values()) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
