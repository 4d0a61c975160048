"""Load a solution file for the program pane and describe it in one line."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from core.program import KernelProgram, ModelNewSolution, load_solution


@dataclass
class LoadedProgram:
    solution: KernelProgram | ModelNewSolution
    path: Path
    source_path: Path     # where the shown text lives (a program's "source_file", or the file itself)
    language: str         # "cuda" or "python"

    @property
    def is_kernel_program(self) -> bool:
        return isinstance(self.solution, KernelProgram)

    @property
    def name(self) -> str:
        return self.solution.name

    @property
    def source(self) -> str:
        return self.solution.source


def load_program(path: str | Path) -> LoadedProgram:
    """load_solution() plus what the GUI shows; raises ProgramError with a clear message."""
    path = Path(path).resolve()
    solution = load_solution(path)
    if isinstance(solution, ModelNewSolution):
        return LoadedProgram(solution, path, path, "python")
    source_path = path
    try:  # the JSON already parsed once, so this cannot fail on content
        source_file = json.loads(path.read_text(encoding="utf-8")).get("source_file")
        if isinstance(source_file, str):
            source_path = (path.parent / source_file).resolve()
    except (OSError, ValueError, AttributeError):
        pass
    return LoadedProgram(solution, path, source_path, "cuda")


def summary(loaded: LoadedProgram) -> str:
    solution = loaded.solution
    if isinstance(solution, ModelNewSolution):
        return ("ModelNew solution (Python): its CUDA lives in Python strings and is compiled "
                "when the evaluator runs it")
    parts = [f"kernels: {', '.join(solution.kernel_names()) or 'none'}"]
    if solution.schedule:
        parts.append("schedule: " + ", ".join(f"{k}={v}" for k, v in solution.schedule.items()))
    count = len(solution.launches)
    parts.append(f"{count} launch{'es' if count != 1 else ''}")
    parts.append(f"outputs: {', '.join(solution.outputs)}")
    return "  ·  ".join(parts)


def compile_unavailable_reason(loaded: LoadedProgram | None) -> str:
    """Why Check compile is disabled, or '' when it is available."""
    if loaded is None:
        return "Open a kernel program (.json) to check that its CUDA source compiles."
    if not loaded.is_kernel_program:
        return ("A ModelNew solution carries its CUDA inside Python strings; the evaluator compiles it "
                "when it runs the solution.")
    return ""
