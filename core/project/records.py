"""Plain records stored in a project file (docs/project-file.md): branches, candidates, runs,
policy checkpoints. No SQL here; the store turns rows into these and back."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

# core.evaluation.Status values plus the two states before a verdict (DESIGN section 3).
# Kept as literals so that reading a project never imports the evaluator; a test checks they match.
PENDING_STATUSES = ("queued", "compiled")
FINAL_STATUSES = ("measured", "compile_error", "wrong", "crashed", "timeout", "rejected")
STATUSES = PENDING_STATUSES + FINAL_STATUSES
KINDS = ("program", "modelnew")


def now_iso() -> str:
    """UTC timestamp, ISO 8601 with milliseconds: sorts as text and reads well in sqlite3."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class Branch:
    """A lineage of candidates; "main" exists in every project, forks start from a candidate."""

    id: int
    name: str
    parent_candidate_id: int | None = None
    created_at: str = ""


@dataclass
class CandidateRecord:
    """One proposed kernel and, once evaluated, its verdict and measurement.

    program: KernelProgram.to_dict() for kind "program"; solution_source: the ModelNew file
    text for kind "modelnew". measurement: dataclasses.asdict(Measurement) when measured.
    """

    id: int | None = None
    branch_id: int = 1
    parent_id: int | None = None
    origin: str = ""                      # who proposed it: "ppo:set BLOCK=256", "user", "llm", ...
    kind: str = "program"
    program: dict[str, Any] | None = None
    solution_source: str | None = None
    schedule: dict[str, Any] = field(default_factory=dict)
    candidate_hash: str = ""
    status: str = "queued"
    reason: str = ""
    measurement: dict[str, Any] | None = None
    reward: float | None = None
    created_at: str = ""
    evaluated_at: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median_ms(self) -> float | None:
        """Median time of the measurement, the number `best` sorts by."""
        timing = (self.measurement or {}).get("timing") or {}
        value = timing.get("median_ms")
        return float(value) if isinstance(value, (int, float)) else None

    @classmethod
    def from_program(cls, program: Any, *, branch_id: int = 1, parent_id: int | None = None,
                     origin: str = "user", status: str = "queued") -> "CandidateRecord":
        """A queued record for a KernelProgram (anything with to_dict, schedule and content_hash)."""
        return cls(branch_id=branch_id, parent_id=parent_id, origin=origin, kind="program",
                   program=program.to_dict(), schedule=dict(program.schedule),
                   candidate_hash=program.content_hash(), status=status)

    @classmethod
    def from_solution(cls, solution: Any, *, branch_id: int = 1, parent_id: int | None = None,
                      origin: str = "user", status: str = "queued") -> "CandidateRecord":
        """A queued record for a ModelNewSolution (anything with source and content_hash)."""
        return cls(branch_id=branch_id, parent_id=parent_id, origin=origin, kind="modelnew",
                   solution_source=solution.source, candidate_hash=solution.content_hash(), status=status)


@dataclass(frozen=True)
class CandidateSummary:
    """The few fields a history view needs, read without the program, source or measurement
    documents (a 50,000-candidate project streams in a fraction of the time)."""

    id: int
    branch_id: int
    parent_id: int | None
    origin: str
    schedule: dict[str, int]
    status: str
    reason: str
    median_ms: float | None
    reward: float | None
    speedup_eager: float | None


@dataclass
class PolicyCheckpoint:
    """Saved weights (or any state) of a policy, e.g. the PPO network after an update."""

    id: int | None
    policy: str
    created_at: str
    meta: dict[str, Any] = field(default_factory=dict)
    blob: bytes = b""


@dataclass
class RunSession:
    """One run of the optimiser on this project. stopped_at None: still live, or killed."""

    id: int
    started_at: str
    stopped_at: str | None = None
    clean: bool | None = None             # True: stopped normally; False: error or superseded
    pid: int | None = None
    host: str = ""
    resumed_from: int | None = None       # the earlier run this one continues
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.stopped_at is not None
