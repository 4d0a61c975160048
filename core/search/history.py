"""A recorded project as the event stream a live run would have produced.

The app shows an opened project with the same views as a live run: it streams these events
through the same 30 Hz buffer, so a 50,000-candidate project fills the views without freezing
the window. Read-only; the project may be open for writing elsewhere.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from .events import CandidateEvaluated, CandidateProposed, Forked, NewBest, RunStarted

FINAL = ("measured", "compile_error", "wrong", "crashed", "timeout", "rejected")


def project_events(path: str | Path, page: int = 2000) -> Iterator[object]:
    """RunStarted, then per evaluated candidate (id order) CandidateProposed + CandidateEvaluated,
    a Forked before a branch's first candidate, and NewBest whenever the fastest time improves."""
    from core.project import Project

    with Project.open(path, readonly=True) as project:
        keys = project.baseline_keys()
        baselines = project.baselines(keys[0]) if keys else None
        eager = baselines.eager.median_ms if baselines is not None and baselines.eager else None
        compiled = baselines.compile.median_ms if baselines is not None and baselines.compile else None
        total = sum(n for status, n in project.counts_by_status().items() if status in FINAL)
        policies = sorted({str(r.meta.get("policy")) for r in project.runs() if r.meta and r.meta.get("policy")})
        yield RunStarted(0, "+".join(policies) or "recorded", project.task_name, total or None, None, None,
                         eager, compiled)
        branches = {b.id: b for b in project.branches()}
        announced = {1}
        best_ms: float | None = None
        n = 0
        last = 0
        while True:
            batch = project.summaries(status=FINAL, since_id=last, limit=page)
            if not batch:
                return
            for rec in batch:
                last = rec.id
                n += 1
                if rec.branch_id not in announced and rec.branch_id in branches:
                    b = branches[rec.branch_id]
                    announced.add(rec.branch_id)
                    yield Forked(b.id, b.name, b.parent_candidate_id or 0)
                yield CandidateProposed(rec.id, rec.branch_id, rec.parent_id, rec.origin, dict(rec.schedule), 0)
                median = rec.median_ms if rec.status == "measured" else None
                yield CandidateEvaluated(rec.id, rec.branch_id, rec.status, rec.reason, median,
                                         rec.reward if rec.reward is not None else float("nan"), n)
                if median is not None and (best_ms is None or median < best_ms):
                    best_ms = median
                    speedup = rec.speedup_eager
                    yield NewBest(rec.id, median, speedup if speedup else (eager / median if eager else None))
