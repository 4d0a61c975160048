"""Train the PPO policy from recorded projects, with no GPU (`cuda-agent train`).

Each recorded project is an environment: the optimiser runs on a ReplayPool of it, and the
policy may only propose schedules the record can answer (unrecorded="mask"), so every step
teaches it something true. Records are split by task into a training set and a held-out set
(every third task of each family, in name order, by default); the policy trains on the first
for a number of rounds (each round visits every training record once, in a shuffled order,
for a budget of evaluations) and the weights are written with the names of both sets, so
`cuda-agent bench-search` can report on tasks the policy never saw.

The policy also remembers the training records' near-best schedules (core/search/memory.py,
shipped with the weights); during training a visit sees the votes of the other records only.

Two training-only options (off by default; docs/search.md, "Training"): `random_starts`, the
fraction of visits whose first episode starts from a schedule drawn at random from the record's
measured ones instead of the default, so every record teaches moves from slow schedules too (on
most records the default is already near the best); and `target_bonus`, a reward paid once per
episode when a candidate comes within 97 % of the record's best, which only a record knows.
"""
from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from .benchmark import search_record


@dataclass(frozen=True)
class RecordInfo:
    path: Path
    task: str
    family: str
    measured: int


@dataclass
class Episode:
    """One visit of one training record: how soon the policy came within 97 % of the record's best."""

    round: int
    task: str
    to_target: int | None
    evaluations: int


@dataclass
class TrainReport:
    train: list[RecordInfo]
    held_out: list[RecordInfo]
    episodes: list[Episode] = field(default_factory=list)
    updates: int = 0

    def round_medians(self, budget: int) -> list[float]:
        """Per round, the median evaluations-to-target over the training records (budget+1 = missed)."""
        rounds = sorted({e.round for e in self.episodes})
        return [statistics.median(e.to_target if e.to_target is not None else budget + 1
                                  for e in self.episodes if e.round == r) for r in rounds]


def describe_records(paths: Iterable[str | Path]) -> list[RecordInfo]:
    """Task name, family and measured count of each record; records with nothing measured are left out."""
    from core.project import Project

    infos = []
    for path in paths:
        with Project.open(path, readonly=True) as project:
            task = project.load_task()
            measured = project.count(status="measured")
        if measured:
            infos.append(RecordInfo(Path(path), task.name, task.family or task.name.split("_")[0], measured))
    return infos


def split_records(records: list[RecordInfo], held_out_every: int = 3,
                  fold: int | None = None) -> tuple[list[RecordInfo], list[RecordInfo]]:
    """(train, held out): within each family, in task-name order, every `held_out_every`-th task is
    held out (the second, fifth, ...), so each family with two tasks or more has one on each side.
    With `fold`, the tasks at that position of every `held_out_every` are held out instead (the
    folds 0 .. held_out_every-1 together hold out every task once)."""
    train, held = [], []
    by_family: dict[str, list[RecordInfo]] = {}
    for r in sorted(records, key=lambda r: (r.family, r.task)):
        by_family.setdefault(r.family, []).append(r)
    for family in sorted(by_family):
        for i, r in enumerate(by_family[family]):
            position = fold if fold is not None else min(1, held_out_every - 1)
            (held if held_out_every > 0 and i % held_out_every == position else train).append(r)
    return train, held


def recorded_schedules(path: str | Path) -> list[dict[str, int]]:
    """The distinct schedules a record measured correctly, in the record's order, over the knobs of
    its first candidate's program (the space a search of the record walks)."""
    from .memory import measured_schedules

    measured = measured_schedules(path)
    return [dict(key) for key in measured[2]] if measured is not None else []


def train(records: list[RecordInfo], *, rounds: int = 10, budget: int = 40, seed: int = 0, policy: Any = None,
          progress: Callable[[Episode], None] | None = None, random_starts: float = 0.0,
          target_bonus: float = 0.0, memory: bool = True) -> tuple[Any, TrainReport]:
    """Train `policy` (default: a fresh PPO) on the records; returns it and the per-episode report.
    The split is the caller's: pass only training records here. `random_starts` (0..1) of the
    visits start from a random measured schedule of the record; `target_bonus` is paid for reaching
    97 % of the record's best (both 0: every visit from the default, the run's reward). With
    `memory`, the policy remembers the records' near-best schedules (core/search/memory.py); a visit
    sees the votes of every other training task, never its own, as a new task will."""
    from .features import ACTION_SIZE, STATE_SIZE
    from .memory import ScheduleMemory
    from .policies.ppo import PPOPolicy

    policy = policy or PPOPolicy(STATE_SIZE, ACTION_SIZE, seed=seed)
    if memory and hasattr(policy, "memory"):
        policy.memory = ScheduleMemory.from_records(r.path for r in records)
    report = TrainReport(list(records), [])
    rng = random.Random(seed)
    starts = {r.path: recorded_schedules(r.path) for r in records} if random_starts > 0 else {}
    for round_index in range(rounds):
        order = list(records)
        rng.shuffle(order)
        for record in order:
            start = None
            if random_starts > 0 and starts[record.path] and rng.random() < random_starts:
                start = rng.choice(starts[record.path])
            policy.memory_exclude = {record.task}
            # Two episodes in a row with nothing new end the visit: the record has no more to teach here.
            trial = search_record(record.path, lambda space: policy, "ppo", rng.randrange(1 << 30), budget, "mask",
                                  max_idle_episodes=2, start=start, target_bonus=target_bonus)
            policy.update()     # what a short visit gathered: learned once a batch is full
            episode = Episode(round_index, record.task, trial.to_target, trial.evaluations)
            report.episodes.append(episode)
            if progress:
                progress(episode)
    policy.memory_exclude = set()
    report.updates = getattr(policy, "updates", 0)
    policy.meta = {**policy.meta, "trained_on": sorted({r.task for r in records}), "rounds": rounds,
                   "budget": budget, "seed": seed}
    if random_starts > 0:
        policy.meta["random_starts"] = random_starts
    if target_bonus:
        policy.meta["target_bonus"] = target_bonus
    return policy, report
