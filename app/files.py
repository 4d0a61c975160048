"""Which kind of file the user gave us, and where the bundled examples live."""
from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLES_DIR = REPO_ROOT / "resources" / "tasks"
PROGRAMS_DIR = REPO_ROOT / "resources" / "programs"
DEMO_DIR = REPO_ROOT / "resources" / "demo"      # projects recorded on an H200 by `cuda-agent run`


def demo_project() -> Path | None:
    """The bundled demo project, or None when this installation has none."""
    found = sorted(DEMO_DIR.glob("*.cuagent"))
    return found[0] if found else None

TASK_FILTER = "Task files (*.py);;All files (*)"
PROGRAM_FILTER = "Kernel programs and ModelNew solutions (*.json *.py);;All files (*)"


def file_kind(path: str | Path) -> str:
    """"task", "program" or "project" for a path given on the command line or from Recent files.

    .cuagent is a project.
    .json is always a kernel program. A .py is a ModelNew solution when it defines class ModelNew
    and no class Model; anything else (including a file that does not parse) is treated as a task,
    so the task loader reports what is wrong with it.
    """
    path = Path(path)
    if path.suffix.lower() == ".cuagent":
        return "project"
    if path.suffix.lower() == ".json":
        return "program"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return "task"
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    return "program" if "ModelNew" in classes and "Model" not in classes else "task"
