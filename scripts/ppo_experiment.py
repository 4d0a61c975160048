"""One PPO training experiment on whole-space records, with `cuda-agent train`'s split and measure
(docs/results/ppo-experiments-2026-12-04.md). CPU only.

    PYTHONPATH=. python scripts/ppo_experiment.py RECORDS_DIR --out W.json --report R.md \
        [--rounds 30] [--budget 40] [--random-starts F] [--target-bonus B] [--set entropy_coef=0.003 ...] \
        [--cache TRIALS.json]

Trains exactly as `cuda-agent train` does (same split, same train()), then runs the held-out trials.
Trials that do not depend on the trained weights (random, blind, and ppo-untrained, which --set
does not change) are read from --cache when it has them for the same records, seeds
and budget, and written there otherwise, so an experiment that changes only training reruns only
the ppo trials. The held-out table is benchmark.markdown's, as `cuda-agent train --report` writes it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from core.search.benchmark import Trial, compare, default_misses, markdown, overall
from core.search.training import describe_records, split_records, train


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("records")
    ap.add_argument("--out", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--eval-budget", type=int, default=100)
    ap.add_argument("--random-starts", type=float, default=0.0)
    ap.add_argument("--target-bonus", type=float, default=0.0)
    ap.add_argument("--no-memory", action="store_true", help="train without the memory (core/search/memory.py)")
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="PPOConfig fields for training")
    ap.add_argument("--weights", help="start training from these weights instead of fresh ones")
    ap.add_argument("--cache", help="trials of random, blind and ppo-untrained (read and written)")
    ap.add_argument("--validate", nargs="+", type=float, metavar="T",
                    help="choose a temperature without the held-out tasks: split the training records again "
                         "(every third of each family), train on the rest, and compare ppo at these "
                         "temperatures with random search on that validation split; no held-out trials")
    ap.add_argument("--fold", type=int, default=1, choices=(0, 1, 2),
                    help="with --validate: which third of each family validates (1, the default, is the "
                         "split `cuda-agent train` itself uses for its held-out tasks)")
    args = ap.parse_args()

    from core.search.features import ACTION_SIZE, STATE_SIZE
    from core.search.policies.ppo import PPOConfig, PPOPolicy, load_weights

    files = sorted(Path(args.records).glob("*.cuagent"))
    training, held = split_records(describe_records(files), 3)
    if args.validate:
        training, held = split_records(training, 3, fold=args.fold)
        print("validation: training on " + ", ".join(r.task for r in training) + "; validating on "
              + ", ".join(r.task for r in held), flush=True)
    overrides = {}
    for item in args.set:
        key, value = item.split("=", 1)
        overrides[key] = type(getattr(PPOConfig(), key))(value)
    config = PPOConfig(**overrides)
    policy = (load_weights(args.weights, seed=args.seed, config=config) if args.weights
              else PPOPolicy(STATE_SIZE, ACTION_SIZE, seed=args.seed, config=config))
    t0 = time.monotonic()
    policy, report = train(training, rounds=args.rounds, budget=args.budget, seed=args.seed, policy=policy,
                           random_starts=args.random_starts, target_bonus=args.target_bonus,
                           memory=not args.no_memory)
    train_s = time.monotonic() - t0
    medians = report.round_medians(args.budget)
    print(f"trained in {train_s:.0f} s, {report.updates} updates; per-round medians: "
          + " ".join(f"{m:g}" for m in medians), flush=True)
    policy.meta["held_out"] = [r.task for r in held]
    policy.save(args.out)
    if args.validate:
        return validate(args, held)

    key = {"records": [str(r.path) for r in held], "seeds": args.seeds, "budget": args.eval_budget}
    cached: list[Trial] = []
    cache = Path(args.cache) if args.cache else None
    if cache and cache.is_file():
        data = json.loads(cache.read_text())
        if data.get("key") == key:
            cached = [Trial(**t) for t in data["trials"]]
    # ppo-untrained is fresh weights with PPOConfig's defaults: --set changes only the trained policy.
    # A change of the features or of the defaults needs a new cache file.
    fixed = ["random", "blind", "ppo-untrained"]
    have = {t.policy for t in cached}
    t0 = time.monotonic()
    trials = compare([r.path for r in held], ["ppo"], args.seeds, args.eval_budget, weights=args.out) \
        if have >= set(fixed) else compare([r.path for r in held], ["ppo", "ppo-untrained"], args.seeds,
                                           args.eval_budget, weights=args.out)
    if have >= set(fixed):
        trials = [t for t in trials if t.policy == "ppo"] + [t for t in cached if t.policy in fixed]
    elif cache:
        cache.write_text(json.dumps({"key": key, "trials": [dataclasses.asdict(t) for t in trials
                                                             if t.policy in fixed]}))
    eval_s = time.monotonic() - t0
    order = {"random": 0, "blind": 1, "ppo": 2, "ppo-untrained": 3}
    trials.sort(key=lambda t: ([r.path for r in held].index(Path(t.record)), order[t.policy], t.seed))
    table = markdown(trials, args.eval_budget)
    Path(args.report).write_text(table)
    print(table)
    for label, subset in (("all", trials), ("default misses", default_misses(trials))):
        m = overall(subset, args.eval_budget)
        print(f"{label}: " + ", ".join(f"{p} {v:g}" for p, v in m.items())
              + f"; ppo/random {m['ppo'] / m['random']:.0%}, untrained/ppo {m['ppo-untrained'] / m['ppo']:.2f}x")
    print(f"held-out trials in {eval_s:.0f} s", flush=True)
    return 0


def validate(args: argparse.Namespace, held: list) -> int:
    """ppo at each temperature (the trained weights with PPOConfig.temperature set) against random
    search on the validation records; medians over records and seeds, all and default-misses."""
    state = json.loads(Path(args.out).read_text())
    records = [r.path for r in held]
    trials = [t for t in compare(records, [], args.seeds, args.eval_budget) if t.policy == "random"]
    results = {}
    for temperature in args.validate:
        state["config"]["temperature"] = temperature
        path = Path(args.out).with_suffix(f".t{temperature:g}.json")
        path.write_text(json.dumps(state))
        mine = [dataclasses.replace(t, policy=f"ppo@{temperature:g}")
                for t in compare(records, ["ppo"], args.seeds, args.eval_budget, weights=path) if t.policy == "ppo"]
        results[temperature] = mine
        trials += mine
    table = markdown(trials, args.eval_budget)
    Path(args.report).write_text(table)
    print(table)
    for label, subset in (("all", trials), ("default misses", default_misses(trials))):
        m = overall(subset, args.eval_budget)
        print(f"validation, {label}: " + ", ".join(f"{p} {v:g}" for p, v in m.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
