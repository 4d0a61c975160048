"""What compile-ahead saves when compiles are slow compared with evaluations (CPU, replay; a model).

    PYTHONPATH=. python scripts/compile_ahead_sim.py RECORD.cuagent [--policies random ppo] \
        [--compile-s 0.3 1.0 2.5] [--eval-s 0.14] [--workers 6] [--ahead 6] [--evaluations 120]

The loop of `cuda-agent run` on a replay of RECORD, with a pool that models the GPU side by fixed
delays: every new source (the candidate's source and compile options, as the compile cache keys
them) takes COMPILE_S on one of WORKERS compile workers; an evaluation waits for its compile, then
takes EVAL_S. Each setting runs twice: with predictions that stop at the episode's end (as before
2026-12-05) and with predictions that go on into the next episode (optimizer._predict's branch_id).
Prints candidates per minute and the seconds the loop waited for compiles. The delays are a
model: the real figures are bench/throughput.py's on a GPU.
"""
from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from core.program import KernelProgram
from core.project import Project
from core.search.benchmark import generator_constraints
from core.search.optimizer import Budget, Optimizer
from core.search.policies import make_policy
from core.search.replay import ReplayPool
from core.search.space import ScheduleSpace


class TimedPool:
    """A ReplayPool behind modelled compile and evaluation times."""

    def __init__(self, pool: ReplayPool, compile_s: float, eval_s: float, workers: int):
        self.pool, self.compile_s, self.eval_s = pool, compile_s, eval_s
        self.workers = threading.Semaphore(workers)
        self.compiles: dict[int, threading.Event] = {}
        self.lock = threading.Lock()
        self.waited = 0.0

    def __contains__(self, key) -> bool:
        return key in self.pool

    def _compiled(self, candidate) -> threading.Event:
        key = hash((candidate.source, tuple(candidate.compile_options())))
        with self.lock:
            done = self.compiles.get(key)
            if done is not None:
                return done
            done = self.compiles[key] = threading.Event()
        with self.workers:
            time.sleep(self.compile_s)
        done.set()
        return done

    def prepare(self, candidate, speculative: bool = False) -> None:
        self._compiled(candidate)

    def evaluate(self, candidate):
        t0 = time.perf_counter()
        self._compiled(candidate).wait()
        self.waited += time.perf_counter() - t0
        time.sleep(self.eval_s)
        return self.pool.evaluate(candidate)

    def baselines(self):
        return self.pool.baselines()

    def close(self) -> None:
        pass


class StopAtEpisodeEnd(Optimizer):
    """The loop as it predicted before: never past the episode's last edit."""

    def _predict(self, *args, branch_id=None, **kwargs):
        return super()._predict(*args, **kwargs)


def run(record: Path, policy: str, compile_s: float, eval_s: float, workers: int, ahead: int,
        evaluations: int, crossing: bool, seed: int) -> tuple[float, float]:
    with Project.open(record, readonly=True) as source:
        task = source.load_task()
        program = KernelProgram.from_json(next(source.candidates(limit=1)).program)
        hardware = source.hardware
    pool = TimedPool(ReplayPool.from_files([record]), compile_s, eval_s, workers)
    space = ScheduleSpace.from_program(program, task, constraints=generator_constraints(task, program))
    cls = Optimizer if crossing else StopAtEpisodeEnd
    with tempfile.TemporaryDirectory() as folder:
        project = Project.create(Path(folder) / "sim.cuagent", task, hardware)
        try:
            opt = cls(task, program, pool, project, make_policy(policy, space, seed=seed), Budget(evaluations=evaluations),
                      [], seed=seed, space=space, unrecorded="skip", resume=False, compile_ahead=ahead)
            t0 = time.perf_counter()
            summary = opt.run()
            seconds = time.perf_counter() - t0
        finally:
            project.close()
    return summary.evaluations / seconds * 60, pool.waited


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("record", type=Path)
    ap.add_argument("--policies", nargs="+", default=["random", "ppo"])
    ap.add_argument("--compile-s", nargs="+", type=float, default=[0.3, 1.0, 2.5])
    ap.add_argument("--eval-s", type=float, default=0.14)
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--ahead", type=int, default=6)
    ap.add_argument("--evaluations", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"| policy | compile s | per minute, stop at episode end | per minute, into the next episode | "
          f"compile waits s (before / after) |\n|---|---|---|---|---|", flush=True)
    for policy in args.policies:
        for compile_s in args.compile_s:
            before = run(args.record, policy, compile_s, args.eval_s, args.workers, args.ahead, args.evaluations,
                         False, args.seed)
            after = run(args.record, policy, compile_s, args.eval_s, args.workers, args.ahead, args.evaluations,
                        True, args.seed)
            print(f"| {policy} | {compile_s:g} | {before[0]:.0f} | {after[0]:.0f} | {before[1]:.1f} / {after[1]:.1f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
