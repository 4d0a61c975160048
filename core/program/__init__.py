"""KernelProgram: CUDA source plus a declarative launch plan, and solution files.

See docs/program-format.md for the file format.
"""

from .cuda_source import KernelDecl, scan_kernels
from .errors import ProgramError
from .expressions import Expression, ExpressionError, TensorRef, parse_expression
from .program import (
    FORMAT,
    BufferSpec,
    KernelProgram,
    LaunchLimits,
    LaunchSpec,
    ResolvedBuffer,
    ResolvedLaunch,
    ResolvedPlan,
    human_bytes,
)
from .solution import ModelNewSolution, load_solution, parse_model_new
from .values import DTYPE_SIZES, SCALAR_CTYPES, ScalarArg, TensorArg, TensorInfo

__all__ = [
    "FORMAT",
    "DTYPE_SIZES",
    "SCALAR_CTYPES",
    "BufferSpec",
    "Expression",
    "ExpressionError",
    "KernelDecl",
    "KernelProgram",
    "LaunchLimits",
    "LaunchSpec",
    "ModelNewSolution",
    "ProgramError",
    "ResolvedBuffer",
    "ResolvedLaunch",
    "ResolvedPlan",
    "ScalarArg",
    "TensorArg",
    "TensorInfo",
    "TensorRef",
    "human_bytes",
    "load_solution",
    "parse_expression",
    "parse_model_new",
    "scan_kernels",
]
