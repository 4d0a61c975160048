"""How often compile-ahead's prediction holds (CPU, replay; no compiles, no GPU).

    PYTHONPATH=. python scripts/prediction_misses.py RECORD.cuagent [RECORD ...] \
        [--policies random ppo] [--seeds 0 1] [--evaluations 120] [--ahead 6] [--by-move]

Runs the loop of `cuda-agent run` on a replay of each RECORD (proposing only recorded schedules,
every compile "done" at once) and, for every evaluated candidate, looks for it in the predictions the
loop made before: in the one made while the candidate before it was measured ("last", with its
position there), only in an earlier one ("older": its compile was queued, then the prediction
changed), or in none ("never"). A candidate outside the last prediction is one whose compile the
loop may wait for on a GPU. With --by-move, the moves (label and step) of the candidates outside it.
The counts behind docs/performance.md, 2026-12-05, seventeenth session.
"""
from __future__ import annotations

import argparse
import collections
import tempfile
from pathlib import Path

from core.project import Project
from core.search.optimizer import Budget, Optimizer
from core.search.policies import make_policy
from core.search.replay import ReplayPool
from scripts.compile_ahead_sim import replay_setup


class CountingOptimizer(Optimizer):
    """The product's loop, noting each prediction and where each evaluated candidate was in them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.predictions: list[list[str]] = []
        self.counts: collections.Counter = collections.Counter()
        self.outside: collections.Counter = collections.Counter()
        self.failed = 0          # candidates that were not correct: predictions assume they are
        self._move_label = ("", 0)

    def _evaluate(self, candidate, branch_id, parent_id, label, step, ahead=None, extra=None):
        self._move_label = (label, step)
        return super()._evaluate(candidate, branch_id, parent_id, label, step, ahead, extra)

    def _measure(self, candidate, ahead):
        key = self._hash(dict(candidate.schedule))
        last = self.predictions[-1] if self.predictions else []
        if key in last:
            self.counts[f"last[{last.index(key)}]"] += 1
        else:
            kind = "older" if any(key in p for p in self.predictions) else "never"
            self.counts[kind] += 1
            self.outside[f"{kind} at step {self._move_label[1]}: {self._move_label[0]}"] += 1
        result = super()._measure(candidate, ahead)
        self.failed += getattr(result.status, "value", result.status) != "measured"
        return result

    def _predict(self, *args, **kwargs):
        out = super()._predict(*args, **kwargs)
        self.predictions.append([self._hash(s) for s in out])
        return out

    def _predict_restart(self, *args, **kwargs):
        # Its inner _predict calls were noted one by one; the loop compiles their union.
        before = len(self.predictions)
        out = super()._predict_restart(*args, **kwargs)
        del self.predictions[before:]
        self.predictions.append([self._hash(s) for s in out])
        return out


def run(record: Path, policy: str, seed: int, evaluations: int, ahead: int) -> CountingOptimizer:
    task, program, hardware, space = replay_setup(record)
    pool = ReplayPool.from_files([record])
    pool.prepare = lambda candidate, speculative=False: (None, None, {"compile_cached": True})
    with tempfile.TemporaryDirectory() as folder:
        project = Project.create(Path(folder) / "probe.cuagent", task, hardware)
        try:
            opt = CountingOptimizer(task, program, pool, project, make_policy(policy, space, seed=seed),
                                    Budget(evaluations=evaluations), [], seed=seed, space=space,
                                    unrecorded="mask", resume=False, compile_ahead=ahead)
            opt.run()
        finally:
            opt._close_compiler()
            project.close()
    return opt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="+", type=Path)
    ap.add_argument("--policies", nargs="+", default=["random", "ppo"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--evaluations", type=int, default=120)
    ap.add_argument("--ahead", type=int, default=6)
    ap.add_argument("--by-move", action="store_true", help="list the moves of the candidates outside the last prediction")
    args = ap.parse_args()
    print("| record | policy | seed | evaluated | in the last prediction | older only | never | outside the last |")
    print("|---|---|---|---|---|---|---|---|")
    for record in args.records:
        for policy in args.policies:
            for seed in args.seeds:
                opt = run(record, policy, seed, args.evaluations, args.ahead)
                c = opt.counts
                inside = sum(v for k, v in c.items() if k.startswith("last"))
                print(f"| {record.stem} | {policy} | {seed} | {sum(c.values())} | {inside} | {c['older']} | "
                      f"{c['never']} | {c['older'] + c['never']} |", flush=True)
                if args.by_move:
                    for move, n in opt.outside.most_common():
                        print(f"    {n} x {move}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
