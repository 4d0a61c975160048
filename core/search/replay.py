"""A pool that answers evaluations from recorded measurements, so search runs with no GPU.

Same shape as core.evaluation.Evaluator: evaluate(candidate) -> EvalResult, baselines(), close().
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

from core.evaluation.results import EvalResult, KernelStats, Measurement, Status, Timing

NOT_RECORDED = "not in the replay record"


def _fields(cls: type, d: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def measurement_from_dict(d: Mapping[str, Any] | None) -> Measurement | None:
    """Rebuild a Measurement from dataclasses.asdict(Measurement) as stored in a project."""
    if not d or not d.get("timing"):
        return None
    m = dict(_fields(Measurement, d))
    m["timing"] = Timing(**_fields(Timing, d["timing"]))
    m["kernels"] = [KernelStats(**_fields(KernelStats, k)) for k in d.get("kernels") or []]
    return Measurement(**m)


class ReplayPool:
    """Recorded verdicts by candidate content hash. Later records of the same hash win."""

    def __init__(self, records: Mapping[str, EvalResult] | None = None, baselines: Any = None):
        self._records: dict[str, EvalResult] = dict(records or {})
        self._baselines = baselines
        self.misses = 0     # candidates asked for that were not recorded
        self.hardware: dict[str, Any] | None = None    # GPU info of the first recorded project that has it
        self.baselines_key: str | None = None           # the GPU key the baselines were recorded under

    @classmethod
    def from_projects(cls, projects: Iterable[Any], gpu_key: str | None = None) -> "ReplayPool":
        """From open core.project.Project objects (read only: nothing is written)."""
        pool = cls()
        for project in projects:
            pool.add_project(project, gpu_key)
        return pool

    @classmethod
    def from_files(cls, paths: Iterable[Any], gpu_key: str | None = None) -> "ReplayPool":
        from core.project import Project

        pool = cls()
        for path in paths:
            with Project.open(path, readonly=True) as project:
                pool.add_project(project, gpu_key)
        return pool

    def add_project(self, project: Any, gpu_key: str | None = None) -> None:
        self.hardware = self.hardware or project.hardware
        final = ("measured", "compile_error", "wrong", "crashed", "timeout", "rejected")
        for rec in project.candidates(status=final):
            if not rec.candidate_hash or rec.reason == NOT_RECORDED:   # a miss is no verdict
                continue
            self._records[rec.candidate_hash] = EvalResult(
                Status(rec.status), rec.reason, measurement_from_dict(rec.measurement),
                compile_log=rec.extra.get("compile_log", ""), compile_seconds=rec.extra.get("compile_seconds", 0.0),
                compile_cached=True, candidate_hash=rec.candidate_hash, details={"replayed_from": rec.id})
        if self._baselines is None:
            keys = [gpu_key] if gpu_key else project.baseline_keys()
            for key in keys:
                b = project.baselines(key)
                if b is not None:
                    self._baselines, self.baselines_key = b, key
                    break

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, candidate_hash: str) -> bool:
        return candidate_hash in self._records

    def evaluate(self, candidate: Any) -> EvalResult:
        h = candidate.content_hash()
        recorded = self._records.get(h)
        if recorded is None:
            self.misses += 1
            return EvalResult(Status.REJECTED, NOT_RECORDED, candidate_hash=h, details={"replay_miss": True})
        return dataclasses.replace(recorded, details=dict(recorded.details), eval_seconds=0.0)

    def baselines(self) -> Any:
        return self._baselines

    def close(self) -> None:
        pass
