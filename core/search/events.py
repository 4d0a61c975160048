"""Typed events from the optimiser (DESIGN section 3). Plain data; observers are `(event) -> None`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class RunStarted:
    run_id: int
    policy: str
    task: str
    budget_evaluations: int | None
    budget_seconds: float | None
    resumed_from: int | None = None
    eager_ms: float | None = None         # the baselines the rewards are measured against
    compile_ms: float | None = None


@dataclass(frozen=True)
class CandidateProposed:
    candidate_id: int
    branch_id: int
    parent_id: int | None
    action: str
    schedule: dict[str, int]
    step: int


@dataclass(frozen=True)
class CandidateEvaluated:
    candidate_id: int
    branch_id: int
    status: str
    reason: str
    median_ms: float | None
    reward: float
    evaluations: int              # evaluations counted so far in this run (this one included)
    from_record: bool = False     # answered from an earlier identical candidate, not re-measured


@dataclass(frozen=True)
class NewBest:
    candidate_id: int
    median_ms: float
    speedup_eager: float | None


@dataclass(frozen=True)
class PolicyUpdated:
    policy: str
    updates: int
    metrics: dict[str, float] = field(default_factory=dict)
    checkpoint_id: int | None = None


@dataclass(frozen=True)
class Paused:
    evaluations: int


@dataclass(frozen=True)
class Resumed:
    evaluations: int


@dataclass(frozen=True)
class Forked:
    branch_id: int
    branch_name: str
    from_candidate_id: int


@dataclass(frozen=True)
class Finished:
    reason: str                   # "evaluations", "seconds", "stopped", "error", "exhausted"
    evaluations: int
    best_candidate_id: int | None
    best_ms: float | None


@dataclass(frozen=True)
class RunError:
    message: str


Event = (RunStarted | CandidateProposed | CandidateEvaluated | NewBest | PolicyUpdated | Paused | Resumed | Forked
         | Finished | RunError)
Observer = Callable[[Any], None]
