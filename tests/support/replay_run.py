"""Replay fixtures for the search tests, and a script that runs the optimiser on a replay pool.

TEST DATA, NOT MEASUREMENTS: `record_project` writes made-up times from a fixed formula
(`made_up_ms`) for every schedule of an extended act_gelu program, so the loop can be driven
with no GPU. Nothing here was timed on any device.

    python -m tests.support.replay_run RECORD PROJECT [--budget N] [--delay SECONDS] [--policy NAME]

Runs the optimiser with a ReplayPool over RECORD, writing to PROJECT (created when missing). Prints
"run N" first, then "evaluated ID" after each candidate's verdict is committed (flushed), and "done".
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import sys
import time
from pathlib import Path

from core.evaluation.evaluator import Baselines
from core.evaluation.results import KernelStats, Measurement, Timing
from core.program import KernelProgram
from core.project import CandidateRecord, Project
from core.tasks import load_task

ROOT = Path(__file__).resolve().parents[2]
TASK_PATH = ROOT / "resources" / "tasks" / "act_gelu.py"
PROGRAM_PATH = ROOT / "resources" / "programs" / "act_gelu.json"
GPU_KEY = "test-gpu"
EAGER_MS, COMPILE_MS = 1.2, 1.0


def search_program() -> KernelProgram:
    """act_gelu with more knobs (the kernel ignores UNROLL; -DUNROLL only changes the hash).
    BLOCK=2048 never resolves (over 1024 threads), so it is always masked."""
    base = KernelProgram.load(PROGRAM_PATH)
    d = base.to_dict()
    d["tunables"] = {"BLOCK": [256, 128, 512, 64, 1024, 2048], "UNROLL": [1, 2, 4, 8]}
    d["schedule"] = {"BLOCK": 256, "UNROLL": 1}
    return KernelProgram.from_json(d)


def made_up_ms(schedule: dict[str, int]) -> float:
    """Made-up time: best at BLOCK=512, UNROLL=4. Test data only."""
    block, unroll = schedule["BLOCK"], schedule["UNROLL"]
    return 1.0 * (1 + 0.3 * abs(math.log2(block / 512))) * (1 + 0.15 * abs(math.log2(unroll / 4)))


def made_up_fails(schedule: dict[str, int]) -> bool:
    return schedule["BLOCK"] == 1024 and schedule["UNROLL"] == 8


def record_project(path: Path) -> Path:
    """A project holding one made-up verdict per legal schedule of search_program(), plus baselines."""
    task = load_task(TASK_PATH)
    program = search_program()
    records = []
    names = sorted(program.tunables)
    for values in itertools.product(*(program.tunables[n] for n in names)):
        schedule = dict(zip(names, values))
        if schedule["BLOCK"] > 1024:
            continue
        p = program.with_schedule(schedule)
        rec = CandidateRecord.from_program(p, origin="test-data (made up, not measured)")
        if made_up_fails(schedule):
            rec.status, rec.reason = "compile_error", "made-up failure for tests"
        else:
            ms = made_up_ms(schedule)
            m = Measurement(Timing(ms, ms * 0.98, ms * 1.05, ms * 0.99, ms * 1.01, 20), eager_ms=EAGER_MS,
                            compile_ms=COMPILE_MS, speedup_eager=EAGER_MS / ms, speedup_compile=COMPILE_MS / ms,
                            roofline_fraction=0.5 / ms,
                            kernels=[KernelStats("gelu_f32", 32, 0, 0, 0, 0, 0, schedule["BLOCK"], 0.75)])
            rec.status, rec.measurement = "measured", dataclasses.asdict(m)
        records.append(rec)
    with Project.create(path, task) as project:
        project.set_baselines(GPU_KEY, Baselines(eager=Timing(EAGER_MS, EAGER_MS, EAGER_MS, EAGER_MS, EAGER_MS, 20),
                                                 compile=Timing(COMPILE_MS, COMPILE_MS, COMPILE_MS, COMPILE_MS,
                                                                COMPILE_MS, 20),
                                                 task_hash=task.hash, gpu="test"))
        project.add_candidates(records)
    return path


def main(argv: list[str] | None = None) -> int:
    from core.search.features import feature_size
    from core.search.optimizer import Budget, Optimizer
    from core.search.policies import make_policy
    from core.search.replay import ReplayPool
    from core.search.space import ScheduleSpace

    ap = argparse.ArgumentParser()
    ap.add_argument("record")
    ap.add_argument("project")
    ap.add_argument("--budget", type=int, default=1000)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--policy", default="random")
    args = ap.parse_args(argv)
    task = load_task(TASK_PATH)
    program = search_program()
    pool = ReplayPool.from_files([args.record])
    evaluate = pool.evaluate

    def slow_evaluate(candidate):
        time.sleep(args.delay)
        return evaluate(candidate)

    pool.evaluate = slow_evaluate  # type: ignore[method-assign]
    path = Path(args.project)
    project = Project.open(path) if path.exists() else Project.create(path, task)
    space = ScheduleSpace.from_program(program, task)
    policy = make_policy(args.policy, space, feature_size(space, task))

    def observer(event):
        name = type(event).__name__
        if name == "RunStarted":
            print(f"run {event.run_id}", flush=True)
        elif name == "CandidateEvaluated" and not event.from_record:
            print(f"evaluated {event.candidate_id}", flush=True)

    # Print after the verdict is committed: CandidateEvaluated is emitted after record_result.
    Optimizer(task, program, pool, project, policy, Budget(evaluations=args.budget), [observer],
              space=space, max_idle_episodes=5).run()
    project.close()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
