"""Export a project's candidate: the one path the CLI (`cuda-agent export`) and the GUI share.

Opens the project read-only (a live run may be writing it), picks the candidate (the fastest
measured one unless an id is given), writes NAME.cu, the loader snippet, the ModelNew file and
REPORT.md into the output folder, and says what it wrote.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from .export import ExportError, export_record
from .report import render_report
from .store import Project


class NothingToExport(ExportError):
    """The project has no measured candidate yet."""


class NoSuchCandidate(ExportError):
    """The requested candidate id is not in the project."""


@dataclass(frozen=True)
class CandidateChoice:
    """One line of the GUI's candidate list."""

    id: int
    branch: str
    status: str
    origin: str
    median_ms: float | None
    speedup_eager: float | None
    speedup_compile: float | None


@dataclass(frozen=True)
class ShippedCandidate:
    candidate_id: int
    status: str
    task_name: str
    files: list[Path]


def exportable_candidates(path: str | Path, limit: int = 200) -> list[CandidateChoice]:
    """Measured candidates, fastest first (at most `limit`)."""
    with Project.open(path, readonly=True) as project:
        branches = {b.id: b.name for b in project.branches()}
        rows = []
        for rec in project.best(limit):
            m = rec.measurement or {}
            rows.append(CandidateChoice(rec.id, branches.get(rec.branch_id, str(rec.branch_id)), rec.status,
                                        rec.origin, rec.median_ms, m.get("speedup_eager"), m.get("speedup_compile")))
        return rows


def export_from_project(path: str | Path, out_dir: str | Path, candidate_id: int | None = None,
                        overwrite: bool = False) -> ShippedCandidate:
    """Write the candidate's files and the project's report into out_dir.

    Raises ProjectError for a file that is not a readable project, NothingToExport,
    NoSuchCandidate, or ExportError (files exist and overwrite is off, a program the launcher
    cannot express).
    """
    with Project.open(path, readonly=True) as project:
        if candidate_id is None:
            best = project.best(1)
            if not best:
                raise NothingToExport(f"{path} has no measured candidate yet")
            record = best[0]
        else:
            record = project.candidate(candidate_id)
            if record is None:
                raise NoSuchCandidate(f"no candidate {candidate_id} in {path}")
        task = project.load_task()
        gpu = (project.hardware or {}).get("name")
        branches = {b.id: b.name for b in project.branches()}
        result = export_record(asdict(record), task, out_dir, gpu=gpu, branch=branches.get(record.branch_id),
                               overwrite=overwrite)
        keys = project.baseline_keys()
        baselines = project.baselines(keys[0]) if keys else None
        summary = {"task": project.task_name, "task_hash": project.task_hash, "gpu": gpu, "branches": branches,
                   "baselines": {k: asdict(t) for k, t in (("eager", getattr(baselines, "eager", None)),
                                                         ("compile", getattr(baselines, "compile", None))) if t}}
        report = render_report(summary, [asdict(c) for c in project.candidates()], out_dir)
        return ShippedCandidate(record.id, record.status, project.task_name, [*result.files, Path(report)])
