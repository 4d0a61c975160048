"""Solution files: a KernelProgram (.json) or a KernelBench-style ``ModelNew`` module (.py).

A ``ModelNew`` file defines ``class ModelNew(nn.Module)`` with the same constructor arguments
and forward signature as the task's ``Model``. It is only parsed here, never executed: running
it is the evaluator's business, in a fresh process of its own.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from pathlib import Path

from .errors import ProgramError
from .program import KernelProgram


@dataclass
class ModelNewSolution:
    name: str
    source: str
    path: Path | None = None

    def content_hash(self) -> str:
        """sha256 hex of the source text."""
        return hashlib.sha256(self.source.encode("utf-8")).hexdigest()


def parse_model_new(source: str, name: str, path: Path | None = None) -> ModelNewSolution:
    """Check (without running it) that source is Python defining a top-level class ModelNew."""
    where = str(path) if path is not None else name
    try:
        tree = ast.parse(source, filename=where)
    except SyntaxError as e:
        line = f" at line {e.lineno}" if e.lineno else ""
        raise ProgramError(f"{where}: the solution is not valid Python: {e.msg}{line}") from None
    except (ValueError, RecursionError, MemoryError):
        raise ProgramError(f"{where}: the solution cannot be parsed as Python") from None
    if not any(isinstance(node, ast.ClassDef) and node.name == "ModelNew" for node in tree.body):
        raise ProgramError(
            f"{where}: the solution does not define a top-level class ModelNew; a Python solution must "
            "define class ModelNew(nn.Module) with the same constructor arguments and forward signature as Model"
        )
    return ModelNewSolution(name=name, source=source, path=path)


def load_solution(path: str | Path) -> KernelProgram | ModelNewSolution:
    """Load a solution file: .json -> KernelProgram, .py -> ModelNewSolution."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        return KernelProgram.load(path)
    if suffix != ".py":
        raise ProgramError(
            f"{path}: unsupported solution file type '{path.suffix or '(none)'}'; expected a kernel program "
            "(.json, see docs/program-format.md) or a Python file defining class ModelNew (.py)"
        )
    try:
        source = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProgramError(f"{path}: solution file not found") from None
    except UnicodeDecodeError:
        raise ProgramError(f"{path}: the solution file is not UTF-8 text") from None
    except OSError as e:
        raise ProgramError(f"{path}: cannot read the solution file ({e.strerror or e})") from None
    return parse_model_new(source, path.stem, path)
