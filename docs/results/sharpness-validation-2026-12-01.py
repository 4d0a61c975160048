"""Choose the PPO scorer's sharpness on a validation split of the training records (never the held-out ones)."""
import glob, statistics, sys, time
sys.path.insert(0, '/work/main')
import torch
from core.search.training import describe_records, split_records, train
from core.search.features import ACTION_SIZE, STATE_SIZE
from core.search.policies.ppo import PPOConfig, PPOPolicy, load_weights
from core.search.benchmark import search_record

records = describe_records(sorted(glob.glob('/tmp/dense/records/*.cuagent')))
tr, held = split_records(records)
tr2, val = split_records(tr)
print("train", [r.task for r in tr2], "\nvalidate", [r.task for r in val], flush=True)
t0 = time.time()
policy = PPOPolicy(STATE_SIZE, ACTION_SIZE, seed=0, config=PPOConfig())
policy, report = train(tr2, rounds=30, budget=40, seed=0, policy=policy)
policy.save('/tmp/tv/val_weights.json')
print("trained in", round(time.time() - t0), "s", flush=True)
for scale in (1.0, 2.0, 4.0, 8.0):
    def build(space, seed):
        p = load_weights('/tmp/tv/val_weights.json', seed=seed)
        with torch.no_grad():
            last = p.net.scorer[-1]
            last.weight.mul_(scale); last.bias.mul_(scale)
        return p
    res = {}
    for r in val:
        for seed in range(5):
            t = search_record(r.path, lambda space: build(space, seed), 'ppo', seed, 100, 'skip')
            res.setdefault(t.task, []).append(t.to_target or 101)
    allv = [v for vs in res.values() for v in vs]
    print(f"scale {scale}: median {statistics.median(allv)} per task", {k: statistics.median(v) for k, v in res.items()}, flush=True)
