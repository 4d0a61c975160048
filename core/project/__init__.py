"""The project file (.cuagent): one SQLite database holding a task, its runs and every candidate.

See docs/project-file.md for the schema, versions and guarantees.
"""
from .export import (ExportError, ExportResult, check_program, export_candidate, export_record, provenance_from,
                     render_cu, render_loader_snippet, render_modelnew)
from .migrations import APPLICATION_ID, CURRENT_VERSION
from .records import STATUSES, Branch, CandidateRecord, CandidateSummary, PolicyCheckpoint, RunSession
from .report import render_report
from .store import Project, ProjectError, run_may_be_live

__all__ = [
    "ExportError",
    "ExportResult",
    "check_program",
    "export_candidate",
    "export_record",
    "provenance_from",
    "render_cu",
    "render_loader_snippet",
    "render_modelnew",
    "render_report",
    "APPLICATION_ID",
    "CURRENT_VERSION",
    "STATUSES",
    "Branch",
    "CandidateRecord",
    "CandidateSummary",
    "PolicyCheckpoint",
    "Project",
    "ProjectError",
    "RunSession",
    "run_may_be_live",
]
