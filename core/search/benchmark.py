"""Compare search policies on recorded projects, with no GPU: how many evaluations each needs to
come within 97 % of the best time the record knows.

For one record, one policy and one seed, a trial runs the optimiser against a ReplayPool of the
record (schedules it never measured are skipped, not counted) and notes the evaluation at which a
candidate first ran in at most best_known / 0.97. A trial that never gets there counts as
budget + 1. Per record, the score puts a policy's median on the scale where 0 is random search's
median and 1 is the optimum (the target on the first evaluation):

    score = (E_random - E_policy) / (E_random - 1)

Above 1 cannot happen; below 0 means slower than random search.
"""
from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

TARGET_FRACTION = 0.97


@dataclass(frozen=True)
class Trial:
    record: str
    task: str
    policy: str
    seed: int
    to_target: int | None        # evaluations until within 97 % of the best known; None: not reached
    evaluations: int
    best_ms: float | None
    best_known_ms: float


def run_trial(record: str | Path, policy: str, seed: int, budget: int,
              target_fraction: float = TARGET_FRACTION) -> Trial:
    from core.program import KernelProgram
    from core.project import Project

    from .events import CandidateEvaluated
    from .features import feature_size
    from .optimizer import Budget, Optimizer
    from .policies import make_policy
    from .replay import ReplayPool
    from .space import ScheduleSpace

    with Project.open(record, readonly=True) as source:
        task = source.load_task()
        best = source.best(1)
        if not best:
            raise ValueError(f"{record} has no measured candidate to aim at")
        best_known = best[0].median_ms
        first = next(source.candidates(limit=1))      # where the recorded search started: its default
        program = KernelProgram.from_json(first.program)
        hardware = source.hardware
    pool = ReplayPool.from_files([record])
    reached: list[int] = []

    def watch(event: Any) -> None:
        if (isinstance(event, CandidateEvaluated) and not reached and event.median_ms is not None
                and event.median_ms <= best_known / target_fraction):
            reached.append(event.evaluations)

    with tempfile.TemporaryDirectory() as folder:
        project = Project.create(Path(folder) / "trial.cuagent", task, hardware)
        try:
            space = ScheduleSpace.from_program(program, task)
            chosen = make_policy(policy, space, feature_size(space, task, hardware), seed=seed)
            opt = Optimizer(task, program, pool, project, chosen, Budget(evaluations=budget), [watch],
                            seed=seed, space=space, unrecorded="skip")
            summary = opt.run()
        finally:
            project.close()
    return Trial(str(record), task.name, policy, seed, reached[0] if reached else None, summary.evaluations,
                 summary.best_ms, best_known)


def median_to_target(trials: Iterable[Trial], budget: int) -> float:
    return statistics.median(t.to_target if t.to_target is not None else budget + 1 for t in trials)


def score(policy_median: float, random_median: float) -> float | None:
    """0 = random search, 1 = the optimum (target at the first evaluation); None when random search
    itself hits the target at once and no policy can do better."""
    if random_median <= 1:
        return None
    return (random_median - policy_median) / (random_median - 1)


def compare(records: list[str | Path], policies: list[str], seeds: int, budget: int,
            progress: Callable[[Trial], None] | None = None) -> list[Trial]:
    trials = []
    for record in records:
        for policy in dict.fromkeys(["random", *policies]):      # random first: the scale's zero
            for seed in range(seeds):
                trial = run_trial(record, policy, seed, budget)
                trials.append(trial)
                if progress:
                    progress(trial)
    return trials


def markdown(trials: list[Trial], budget: int) -> str:
    policies = list(dict.fromkeys(t.policy for t in trials))
    lines = ["| task | " + " | ".join(f"{p}: median evals to 97 %" for p in policies) + " | "
             + " | ".join(f"{p} score" for p in policies if p != "random") + " |",
             "|---|" + "---|" * (len(policies) * 2 - 1)]
    for record in dict.fromkeys(t.record for t in trials):
        mine = [t for t in trials if t.record == record]
        medians = {p: median_to_target([t for t in mine if t.policy == p], budget) for p in policies}
        scores = [score(medians[p], medians["random"]) for p in policies if p != "random"]
        lines.append(f"| {mine[0].task} | " + " | ".join(f"{medians[p]:g}" for p in policies) + " | "
                     + " | ".join("-" if s is None else f"{s:.2f}" for s in scores) + " |")
    lines.append("")
    lines.append(f"Evaluations until a candidate runs within {TARGET_FRACTION:.0%} of the record's best time "
                 f"(a trial that never gets there counts as {budget + 1}); score 0 = random search, 1 = optimum.")
    return "\n".join(lines) + "\n"
