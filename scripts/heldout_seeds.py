"""How the held-out replay figure depends on the number of seeds (issue 4; CPU only).

    PYTHONPATH=. python scripts/heldout_seeds.py TRIALS.jsonl --run RECORD.cuagent ... \
        [--policies random ppo ppo-untrained] [--seeds 30] [--weights W.json] [--from-default]
    PYTHONPATH=. python scripts/heldout_seeds.py TRIALS.jsonl ...          # report only

With --run, runs benchmark.run_trial for every record, policy and seed 0..seeds-1 not yet in the
file (budget 100, as `cuda-agent bench-search`) and appends each trial as a JSON line, so two
processes can share the work with different records. Then prints, per policy, the median
evaluations-to-97 % over every (record, seed) of the first 5, 10, 20, ... seeds and of each block of
10 seeds, and PPO's ratios to random search and to untrained PPO.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

BUDGET = 100     # evaluations per trial, as `cuda-agent bench-search`'s default


def run(out: Path, records: list[str], policies: list[str], seeds: int, weights: str | None,
        memory_start: bool = True) -> None:
    from core.search.benchmark import run_trial

    done = {(t["record"], t["policy"], t["seed"]) for t in read([out])}
    with out.open("a") as f:
        for record in records:
            for policy in policies:
                for seed in range(seeds):
                    if (str(record), policy, seed) in done:
                        continue
                    trial = run_trial(record, policy, seed, BUDGET, weights=weights if policy == "ppo" else None,
                                      memory_start=memory_start)
                    f.write(json.dumps(dataclasses.asdict(trial)) + "\n")
                    f.flush()


def read(paths: list[Path]) -> list[dict]:
    return [json.loads(line) for p in paths if p.is_file() for line in p.read_text().splitlines() if line]


def report(trials: list[dict]) -> str:
    from core.search.benchmark import Trial, median_to_target

    policies = list(dict.fromkeys(t["policy"] for t in trials))
    seeds = max(t["seed"] for t in trials) + 1
    cuts = [(f"seeds 0-{n - 1}", 0, n) for n in (5, 10, 20, 30, 50) if n < seeds] + [(f"seeds 0-{seeds - 1}", 0, seeds)]
    cuts += [(f"seeds {lo}-{lo + 9}", lo, lo + 10) for lo in range(0, seeds - 9, 10)]
    lines = ["| trials | " + " | ".join(policies) + " | ppo / random | untrained / ppo |",
             "|---|" + "---|" * (len(policies) + 2)]
    for name, lo, hi in dict.fromkeys(cuts):
        med = {p: median_to_target([Trial(**t) for t in trials if t["policy"] == p and lo <= t["seed"] < hi], BUDGET)
               for p in policies}
        ratio = f"{100 * med['ppo'] / med['random']:.0f} %" if "ppo" in med and "random" in med else "-"
        x = f"{med['ppo-untrained'] / med['ppo']:.2f}x" if "ppo" in med and "ppo-untrained" in med else "-"
        lines.append(f"| {name} | " + " | ".join(f"{med[p]:g}" for p in policies) + f" | {ratio} | {x} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("trials", nargs="+", type=Path, help="JSON-lines files of trials (the first is written with --run)")
    ap.add_argument("--run", nargs="+", metavar="RECORD", help="records to run trials on first")
    ap.add_argument("--policies", nargs="+", default=["random", "ppo", "ppo-untrained"])
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--weights", help="PPO weights for 'ppo' (default: the shipped ones)")
    ap.add_argument("--from-default", action="store_true", help="ppo starts from the default, not the memory's pick")
    args = ap.parse_args()
    if args.run:
        run(args.trials[0], args.run, args.policies, args.seeds, args.weights, memory_start=not args.from_default)
    print(report(read(args.trials)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
