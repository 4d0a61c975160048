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
class BestConfirmed:
    """The run's best re-measured interleaved with eager (DESIGN section 4), after the last candidate:
    a speed-up measured in one window, free of drift between the baseline's session and now."""

    candidate_id: int
    rounds: int
    median_ms: float | None       # the candidate's median over the interleaved rounds
    eager_ms: float | None        # eager's median over the same rounds
    reason: str = ""              # why the re-measure failed ("" when it ran)

    @property
    def speedup_eager(self) -> float | None:
        return self.eager_ms / self.median_ms if self.median_ms and self.eager_ms else None


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


Event = (RunStarted | CandidateProposed | CandidateEvaluated | NewBest | BestConfirmed | PolicyUpdated | Paused | Resumed
         | Forked | Finished | RunError)
Observer = Callable[[Any], None]
