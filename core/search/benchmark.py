"""Compare search policies on recorded projects, with no GPU: how many evaluations each needs to
come within 97 % of the best time the record knows.

For one record, one policy and one seed, a trial runs the optimiser against a ReplayPool of the
record (schedules it never measured are skipped, not counted) and notes the evaluation at which a
candidate first ran in at most best_known / 0.97. A trial that never gets there counts as
budget + 1. Per record, the score puts a policy's median on the scale where 0 is random search's
median and 1 is the optimum (the target on the first evaluation):

    score = (E_random - E_policy) / (E_random - 1)

Above 1 cannot happen; below 0 means slower than random search.

"random" is the random policy in the optimiser's loop: uniform random edits, each episode from the
best candidate found. "blind" is plain random sampling, the baseline of autotuners: the default
schedule first, then the record's other schedules in a random order (no optimiser; a trial is a
shuffle). Both are reported; the score's zero is "random".
"""
from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

TARGET_FRACTION = 0.97
BLIND = "blind"


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
    default_hit: bool | None = None    # the record's default schedule is already within the target


def generator_constraints(task: Any, program: Any) -> list[Any]:
    """The generator's constraints when the recorded program is what the generator makes today
    (a record of a hand-written program has none beyond the plan's own limits)."""
    key = (task.hash, program.content_hash())
    if key not in _CONSTRAINTS:
        try:
            from core.codegen import generate

            generated = generate(task)
        except Exception:     # no lowering for this task (any more): the plan's limits still apply
            generated = None
        same = (generated is not None and generated.program.tunables == program.tunables
                and generated.program.with_schedule(program.schedule).content_hash() == program.content_hash())
        _CONSTRAINTS[key] = generated.space_constraints if same else []
    return _CONSTRAINTS[key]


_CONSTRAINTS: dict[tuple[str, str], list[Any]] = {}     # generating is slow; trials repeat records


def run_trial(record: str | Path, policy: str, seed: int, budget: int,
              target_fraction: float = TARGET_FRACTION, weights: str | Path | None = None,
              memory_start: bool = True) -> Trial:
    from .policies import make_policy

    if policy == BLIND:
        return blind_trial(record, seed, budget, target_fraction)

    def build(space: Any) -> Any:
        return make_policy(policy, space, seed=seed, weights=weights if policy == "ppo" else None)

    return search_record(record, build, policy, seed, budget, "skip", target_fraction=target_fraction,
                         memory_start=memory_start)


def search_record(record: str | Path, build_policy: Callable[[Any], Any], label: str, seed: int, budget: int,
                  unrecorded: str, target_fraction: float = TARGET_FRACTION, max_idle_episodes: int = 50,
                  start: dict[str, int] | None = None, target_bonus: float = 0.0,
                  keep: str | Path | None = None, memory_start: bool = True) -> Trial:
    """Run the optimiser on a replay of one record, over the space of its default program
    (record_default), with build_policy(space) as the policy, in a
    throw-away project (or in `keep`, a new project file left behind); the Trial notes when a
    candidate first came within target_fraction of the record's best time. Training only: `start`
    is another schedule to start from (the default stays the program's), and `target_bonus` is paid
    once per episode for reaching the target (RewardConfig.target_bonus)."""
    from core.project import Project

    from .events import CandidateEvaluated
    from .optimizer import Budget, Optimizer
    from .replay import ReplayPool
    from .reward import RewardConfig
    from .space import ScheduleSpace

    with Project.open(record, readonly=True) as source:
        task = source.load_task()
        best = source.best(1)
        if not best:
            raise ValueError(f"{record} has no measured candidate to aim at")
        best_known = best[0].median_ms
        program, default = record_default(source)
        hardware = source.hardware
    default_hit = (default is not None and default.status == "measured"
                   and default.median_ms <= best_known / target_fraction)
    pool = ReplayPool.from_files([record])
    reached: list[int] = []

    def watch(event: Any) -> None:
        if (isinstance(event, CandidateEvaluated) and not reached and event.median_ms is not None
                and event.median_ms <= best_known / target_fraction):
            reached.append(event.evaluations)

    with tempfile.TemporaryDirectory() as folder:
        project = Project.create(Path(keep) if keep else Path(folder) / "trial.cuagent", task, hardware)
        try:
            space = ScheduleSpace.from_program(program, task, constraints=generator_constraints(task, program))
            opt = Optimizer(task, program, pool, project, build_policy(space), Budget(evaluations=budget), [watch],
                            seed=seed, space=space, unrecorded=unrecorded, resume=False,
                            max_idle_episodes=max_idle_episodes, start=start, memory_start=memory_start,
                            reward=RewardConfig(target_ms=best_known / target_fraction, target_bonus=target_bonus)
                            if target_bonus else None)
            summary = opt.run()
        finally:
            project.close()
    return Trial(str(record), task.name, label, seed, reached[0] if reached else None, summary.evaluations,
                 summary.best_ms, best_known, default_hit)


def record_default(source: Any) -> tuple[Any, Any]:
    """(the program at the default schedule where the recorded search started, its record or None).
    That is the record's first candidate, unless that run started elsewhere (from the memory's pick)
    and noted the default in the start's extra["default"]."""
    from core.program import KernelProgram

    first = next(source.candidates(limit=1))
    program = KernelProgram.from_json(first.program)
    default = first.extra.get("default")
    if not default:
        return program, first
    program = program.with_schedule(default)
    h = program.content_hash()
    return program, next((r for r in source.candidates() if r.candidate_hash == h), None)


def blind_trial(record: str | Path, seed: int, budget: int, target_fraction: float = TARGET_FRACTION) -> Trial:
    """Random sampling without the optimiser: the record's default schedule (record_default) when
    it was measured, then its other distinct candidates in an order shuffled by `seed`, each one
    evaluation."""
    import random

    from core.project import Project

    from .optimizer import FINAL
    from .replay import NOT_RECORDED

    with Project.open(record, readonly=True) as source:
        task_name = source.load_task().name
        best = source.best(1)
        if not best:
            raise ValueError(f"{record} has no measured candidate to aim at")
        best_known = best[0].median_ms
        seen: dict[str, float | None] = {}
        _, default = record_default(source)
        if default is not None and default.status in FINAL and default.reason != NOT_RECORDED:
            seen[default.candidate_hash] = default.median_ms if default.status == "measured" else None
        for rec in source.candidates(status=FINAL):
            if rec.kind == "program" and rec.reason != NOT_RECORDED:
                seen.setdefault(rec.candidate_hash, rec.median_ms if rec.status == "measured" else None)
    times = list(seen.values())
    rest = times[1:]
    random.Random(seed).shuffle(rest)
    order = times[:1] + rest
    reached = next((i + 1 for i, ms in enumerate(order[:budget])
                    if ms is not None and ms <= best_known / target_fraction), None)
    found = [ms for ms in order[:budget] if ms is not None]
    default_hit = bool(order) and order[0] is not None and order[0] <= best_known / target_fraction
    return Trial(str(record), task_name, BLIND, seed, reached, min(budget, len(order)),
                 min(found) if found else None, best_known, default_hit)


def median_to_target(trials: Iterable[Trial], budget: int) -> float:
    return statistics.median(t.to_target if t.to_target is not None else budget + 1 for t in trials)


def score(policy_median: float, random_median: float) -> float | None:
    """0 = random search, 1 = the optimum (target at the first evaluation); None when random search
    itself hits the target at once and no policy can do better."""
    if random_median <= 1:
        return None
    return (random_median - policy_median) / (random_median - 1)


def compare(records: list[str | Path], policies: list[str], seeds: int, budget: int,
            progress: Callable[[Trial], None] | None = None, weights: str | Path | None = None,
            memory_start: bool = True) -> list[Trial]:
    """Every policy (random and blind sampling always, first) on every record with seeds
    0..seeds-1; `weights` are the PPO weights "ppo" starts from (default: the shipped ones);
    memory_start False starts a policy with a memory from the default, as the others."""
    trials = []
    for record in records:
        for policy in dict.fromkeys(["random", BLIND, *policies]):      # random first: the scale's zero
            for seed in range(seeds):
                trial = run_trial(record, policy, seed, budget, weights=weights, memory_start=memory_start)
                trials.append(trial)
                if progress:
                    progress(trial)
    return trials


def overall(trials: list[Trial], budget: int) -> dict[str, float]:
    """Per policy, the median evaluations-to-target over every (record, seed) trial."""
    return {p: median_to_target([t for t in trials if t.policy == p], budget)
            for p in dict.fromkeys(t.policy for t in trials)}


def default_misses(trials: list[Trial]) -> list[Trial]:
    """The trials of records whose first candidate (the default schedule) is not already within the
    target: on the others a policy that measures the default first scores 1, which says little."""
    met = {t.record for t in trials if (t.default_hit if t.default_hit is not None else t.to_target == 1)}
    return [t for t in trials if t.record not in met]


def markdown(trials: list[Trial], budget: int, trained_on: Iterable[str] = ()) -> str:
    """The per-record table, a row over all trials, and the ratios the RL issue asks about.
    Tasks in `trained_on` (the PPO weights learned from their records) are marked with *."""
    trained = set(trained_on)
    policies = list(dict.fromkeys(t.policy for t in trials))
    lines = ["| task | " + " | ".join(f"{p}: median evals to 97 %" for p in policies) + " | "
             + " | ".join(f"{p} score" for p in policies if p != "random") + " |",
             "|---|" + "---|" * (len(policies) * 2 - 1)]

    def row(name: str, medians: dict[str, float]) -> str:
        scores = [score(medians[p], medians["random"]) for p in policies if p != "random"]
        return (f"| {name} | " + " | ".join(f"{medians[p]:g}" for p in policies) + " | "
                + " | ".join("-" if s is None else f"{s:.2f}" for s in scores) + " |")

    for record in dict.fromkeys(t.record for t in trials):
        mine = [t for t in trials if t.record == record]
        name = mine[0].task + (" *" if mine[0].task in trained else "")
        lines.append(row(name, {p: median_to_target([t for t in mine if t.policy == p], budget) for p in policies}))
    everything = overall(trials, budget)
    if len({t.record for t in trials}) > 1:
        lines.append(row("**all trials**", everything))
        informative = default_misses(trials)
        n = len({t.record for t in informative})
        if informative and n < len({t.record for t in trials}):
            lines.append(row(f"**tasks whose default misses the target ({n})**", overall(informative, budget)))
    lines.append("")
    lines.append(f"Evaluations until a candidate runs within {TARGET_FRACTION:.0%} of the record's best time "
                 f"(a trial that never gets there counts as {budget + 1}); score 0 = random search, 1 = optimum.")
    if trained:
        lines.append("* = the PPO weights were trained on this task's record (not held out).")
    if BLIND in everything:
        lines.append(f"random = random edits in the optimiser's loop; {BLIND} = random sampling of the "
                     "record's schedules, the default first.")
    for label, subset in (("all trials", trials), ("the tasks whose default misses the target",
                                                    default_misses(trials))):
        medians = overall(subset, budget) if subset else {}
        if medians.get("ppo") and medians.get("random"):
            parts = [f"{medians['ppo'] / medians['random']:.0%} of random search's evaluations"]
            if medians.get(BLIND):
                parts.append(f"{medians['ppo'] / medians[BLIND]:.0%} of {BLIND} sampling's")
            if "ppo-untrained" in medians:
                parts.append(f"{medians['ppo-untrained'] / medians['ppo']:.2f}x fewer than untrained PPO")
            lines.append(f"Median over {label}: ppo needs " + ", ".join(parts) + ".")
    return "\n".join(lines) + "\n"
