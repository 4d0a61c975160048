"""What compile-ahead saves when compiles are slow compared with evaluations (CPU, replay; a model).

    PYTHONPATH=. python scripts/compile_ahead_sim.py RECORD.cuagent [--policies random ppo] \
        [--compile-s 0.3 1.0 2.5] [--eval-s 0.14] [--ahead 6] [--evaluations 120] \
        [--variants episode-end:6 fixed:6 adaptive:6 adaptive:10]

The loop of `cuda-agent run` on a replay of RECORD, proposing only recorded schedules (every
candidate correct, as in a generator's space on a GPU, where no prediction goes wrong by a failure). Compiles go through a real CompilePool whose
workers run scripts/sim_compile.py instead of NVRTC: every new source (the candidate's source and
compile options, as the compile cache keys them) takes between 0.4 and 1.6 times COMPILE_S (fixed
per source, mean COMPILE_S). An evaluation waits for its compile, then takes EVAL_S. The pool's
priorities, joins, withdrawals and reserved worker are the product's; the delays are a model, and
the real figures are bench/throughput.py's on a GPU.

Variants, NAME:WORKERS (compile processes):
- episode-end: predictions stop at the episode's end, compile_ahead of them (before 2026-12-05);
- fixed: predictions go on into the next episode, compile_ahead of them (2026-12-05);
- adaptive: as many as compiles need (Optimizer._ahead_depth), and from 3 workers on one
  worker is kept for compiles the loop waits for (CompilePool.reserved_urgent): the product now.
Prints candidates per minute and the seconds the loop waited for compiles.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from core.program import KernelProgram
from core.project import Project
from core.search.benchmark import generator_constraints
from core.search.optimizer import Budget, Optimizer
from core.search.policies import make_policy
from core.search.replay import ReplayPool
from core.search.space import ScheduleSpace
from core.toolchain import CompilePool


class TimedPool:
    """A ReplayPool behind a CompilePool of modelled compiles and a fixed evaluation time."""

    def __init__(self, pool: ReplayPool, compile_s: float, eval_s: float, workers: int, reserve: bool):
        self.pool, self.compile_s, self.eval_s = pool, compile_s, eval_s
        self.compiler = CompilePool(workers=workers, cache=None, compile_fn="scripts.sim_compile:compile")
        self.compiler.reserved_urgent = reserve and self.compiler.reserved_urgent
        self.done: set[tuple] = set()          # the compile cache: sources compiled once
        self.lock = threading.Lock()
        self.waited = 0.0

    def __contains__(self, key) -> bool:      # recorded: the loop proposes only these (unrecorded="mask")
        return key in self.pool

    def warm(self) -> None:
        """Start every worker before the run, as a long-running product's pool would be."""
        futures = [self.compiler.submit(f"warm{i}", options=["--sim-seconds=0.3"]) for i in range(self.compiler.workers)]
        for f in futures:
            f.result()

    def _job(self, candidate) -> tuple[tuple, str, list[str]]:
        options = list(candidate.compile_options())
        key = (candidate.source, tuple(options))
        u = int(hashlib.sha256(repr(key).encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        return key, candidate.source, options + [f"--sim-seconds={self.compile_s * (0.4 + 1.2 * u):.3f}"]

    def _compile(self, candidate, speculative: bool) -> dict:
        key, source, options = self._job(candidate)
        with self.lock:
            if key in self.done:
                return {"compile_cached": True, "compile_seconds": 0.0}
        result = self.compiler.compile(source, options=options, speculative=speculative)
        with self.lock:
            self.done.add(key)
        return {"compile_cached": False, "compile_seconds": result.seconds}

    def prepare(self, candidate, speculative: bool = False):
        return None, None, self._compile(candidate, speculative)

    def withdraw(self, candidate) -> bool:
        _, source, options = self._job(candidate)
        return self.compiler.withdraw(source, options=options)

    def evaluate(self, candidate):
        t0 = time.perf_counter()
        info = self._compile(candidate, False)
        self.waited += time.perf_counter() - t0
        time.sleep(self.eval_s)
        return dataclasses.replace(self.pool.evaluate(candidate), eval_seconds=time.perf_counter() - t0, **info)

    def baselines(self):
        return self.pool.baselines()

    def close(self) -> None:
        self.compiler.close()


class FixedDepth(Optimizer):
    """compile_ahead predictions, however long compiles take (before this session)."""

    def _ahead_depth(self) -> int:
        return self.compile_ahead


class StopAtEpisodeEnd(FixedDepth):
    """Predictions never past the episode's last edit (before 2026-12-05)."""

    def _predict(self, *args, branch_id=None, **kwargs):
        return super()._predict(*args, **kwargs)


VARIANTS = {"episode-end": StopAtEpisodeEnd, "fixed": FixedDepth, "adaptive": Optimizer}


def replay_setup(record: Path) -> tuple[Any, Any, Any, ScheduleSpace]:
    """(task, program, hardware, space) of a search on a replay of `record`: its first candidate's
    program, as `cuda-agent bench-search` walks it."""
    with Project.open(record, readonly=True) as source:
        task = source.load_task()
        program = KernelProgram.from_json(next(source.candidates(limit=1)).program)
        hardware = source.hardware
    return task, program, hardware, ScheduleSpace.from_program(program, task,
                                                               constraints=generator_constraints(task, program))


def run(record: Path, policy: str, compile_s: float, eval_s: float, variant: str, workers: int, ahead: int,
        evaluations: int, seed: int) -> tuple[float, float]:
    task, program, hardware, space = replay_setup(record)
    pool = TimedPool(ReplayPool.from_files([record]), compile_s, eval_s, workers, reserve=variant == "adaptive")
    with tempfile.TemporaryDirectory() as folder:
        project = Project.create(Path(folder) / "sim.cuagent", task, hardware)
        try:
            pool.warm()
            opt = VARIANTS[variant](task, program, pool, project, make_policy(policy, space, seed=seed),
                                    Budget(evaluations=evaluations), [], seed=seed, space=space, unrecorded="mask",
                                    resume=False, compile_ahead=ahead)
            t0 = time.perf_counter()
            summary = opt.run()
            seconds = time.perf_counter() - t0
        finally:
            project.close()
            pool.close()
    return summary.evaluations / seconds * 60, pool.waited


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("record", type=Path)
    ap.add_argument("--policies", nargs="+", default=["random", "ppo"])
    ap.add_argument("--compile-s", nargs="+", type=float, default=[0.3, 1.0, 2.5])
    ap.add_argument("--eval-s", type=float, default=0.14)
    ap.add_argument("--ahead", type=int, default=6)
    ap.add_argument("--evaluations", type=int, default=120)
    ap.add_argument("--variants", nargs="+", default=["episode-end:6", "fixed:6", "adaptive:6", "adaptive:10"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    variants = [(v.split(":")[0], int(v.split(":")[1])) for v in args.variants]
    for name, _ in variants:
        if name not in VARIANTS:
            ap.error(f"unknown variant {name!r}: one of {', '.join(VARIANTS)}")
    heads = " | ".join(f"{name}, {workers} workers" for name, workers in variants)
    print(f"Per minute (compile waits s), eval {args.eval_s} s, {args.ahead} ahead, {args.evaluations} evaluations\n\n"
          f"| policy | compile s | {heads} |\n|---|---|" + "---|" * len(variants), flush=True)
    for policy in args.policies:
        for compile_s in args.compile_s:
            cells = []
            for name, workers in variants:
                per_min, waited = run(args.record, policy, compile_s, args.eval_s, name, workers, args.ahead,
                                      args.evaluations, args.seed)
                cells.append(f"{per_min:.0f} ({waited:.1f})")
            print(f"| {policy} | {compile_s:g} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
