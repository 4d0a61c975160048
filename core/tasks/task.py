"""The Task: a loaded KernelBench-format reference with the shapes and dtypes of its tensors.

A Task keeps the executed module of its file so it can build fresh models and draw fresh
inputs under any seed and on any device. Loading lives in `loader.py`.
"""

from __future__ import annotations

import copy
import random
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch


class TaskError(Exception):
    """A task file that cannot be used. The message is one paragraph naming the file and the problem."""

    def __init__(self, message: str, *, path: Path | str | None = None, name: str | None = None):
        super().__init__(message)
        self.path = Path(path) if path is not None else None
        self.name = name


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without "torch.", e.g. "float32", "int64", "bfloat16"

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorSpec:
        return cls(tuple(int(s) for s in tensor.shape), dtype_name(tensor.dtype))

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return self.torch_dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(s) for s in self.shape)}]"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# (atol, rtol) per output dtype; see DESIGN.md section 4.
_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "complex128": (1e-7, 1e-7),
    "float32": (1e-4, 1e-4),
    "complex64": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (1e-2, 1e-2),
}
_FLOAT8_TOLERANCE = (1e-1, 1e-1)


def dtype_tolerance(dtype: str) -> tuple[float, float]:
    """(atol, rtol) for one dtype name; integers and bool compare exactly."""
    if dtype in _TOLERANCES:
        return _TOLERANCES[dtype]
    if dtype.startswith("float8"):
        return _FLOAT8_TOLERANCE
    return (0.0, 0.0)


def seed_everything(seed: int) -> None:
    """Seed torch (every device), python's random and numpy's global generator."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


@dataclass(eq=False)
class Task:
    name: str  # file stem
    path: Path | None
    source: str = field(repr=False)  # full text of the KernelBench file
    hash: str  # sha256 hex of the source text
    input_names: list[str]  # Model.forward parameter names (excluding self), in order
    input_specs: list[TensorSpec | None]  # None where get_inputs() gives a non-tensor
    output_specs: list[TensorSpec]  # forward returns a tensor or a tuple/list of tensors
    param_specs: dict[str, TensorSpec]  # state_dict key -> spec (parameters and buffers)
    init_inputs: list  # get_init_inputs() result
    description: str = ""  # first line of the module docstring
    family: str | None = None  # from the "# family: ..." header line, when present
    min_bytes: int | None = None  # declared in the header: inputs + weights + outputs, once each
    flops: int | None = None  # declared in the header: floating-point operations per forward
    specs_from: str = "meta"  # "meta" or "cpu": how output and weight shapes were found
    module: types.ModuleType | None = field(default=None, repr=False)  # the executed task file

    # ---- factories -----------------------------------------------------------------------------

    def make_model(self, seed: int, device: str | torch.device = "cpu") -> torch.nn.Module:
        """Seed, build Model(*init_inputs) with `device` as the default device, move it there.

        The module's mode is left as Model built it (train() by default); eval() is not forced.
        """
        model_cls = self._attr("Model")
        seed_everything(seed)
        init_inputs = _copy_inputs(self.init_inputs)
        try:
            with torch.device(device):
                model = model_cls(*init_inputs)
            return model.to(device)
        except torch.OutOfMemoryError:
            raise   # the evaluator makes room and tries again; a TaskError would hide that
        except Exception as exc:
            raise TaskError(
                f"{self._where()}: building Model(*get_init_inputs()) on device {str(device)!r} "
                f"failed: {exception_text(exc)}.", path=self.path, name=self.name) from exc

    def make_inputs(self, seed: int, device: str | torch.device = "cpu") -> list:
        """Seed torch/random/numpy, call get_inputs() with `device` as the default device.

        Tensors that get_inputs() put elsewhere are moved to `device`; python scalars and other
        values are returned as they are. Same seed, device type and torch version give the same
        values.
        """
        get_inputs = self._attr("get_inputs")
        seed_everything(seed)
        try:
            with torch.device(device):
                values = list(get_inputs())
            return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]
        except torch.OutOfMemoryError:
            raise   # the evaluator makes room and tries again; a TaskError would hide that
        except Exception as exc:
            raise TaskError(
                f"{self._where()}: get_inputs() on device {str(device)!r} failed: "
                f"{exception_text(exc)}.", path=self.path, name=self.name) from exc

    # ---- derived facts -------------------------------------------------------------------------

    def tolerance(self) -> tuple[float, float]:
        """(atol, rtol): the loosest over the output dtypes."""
        pairs = [dtype_tolerance(spec.dtype) for spec in self.output_specs]
        return (max(a for a, _ in pairs), max(r for _, r in pairs))

    def io_bytes(self) -> int:
        """Bytes of every tensor input, weight and output, each counted once."""
        specs = [s for s in self.input_specs if s is not None]
        specs += list(self.param_specs.values()) + list(self.output_specs)
        return sum(s.nbytes for s in specs)

    def output_names(self) -> list[str]:
        if len(self.output_specs) == 1:
            return ["output"]
        return [f"output[{i}]" for i in range(len(self.output_specs))]

    def describe(self) -> str:
        """A few lines for the CLI and the GUI: inputs, outputs, weights, dtypes, tolerance."""
        head = self.name + (f"  ({self.family})" if self.family else "")
        lines = [head]
        if self.description:
            lines.append(f"  {self.description}")
        ins = [f"{n}: {s if s is not None else 'scalar'}"
               for n, s in zip(self.input_names, self.input_specs)]
        lines.append("  inputs:  " + ", ".join(ins))
        outs = [f"{n}: {s}" for n, s in zip(self.output_names(), self.output_specs)]
        lines.append("  outputs: " + ", ".join(outs))
        params = [f"{k}: {s}" for k, s in self.param_specs.items()]
        if len(params) > 6:
            params = params[:6] + [f"... and {len(params) - 6} more"]
        lines.append("  weights: " + (", ".join(params) if params else "none"))
        if self.init_inputs:
            init = repr(self.init_inputs)
            lines.append("  init:    " + (init if len(init) <= 80 else init[:77] + "..."))
        atol, rtol = self.tolerance()
        lines.append(f"  tolerance: atol {atol:g}, rtol {rtol:g};  "
                     f"memory: {self.io_bytes() / 2**20:.1f} MiB")
        return "\n".join(lines)

    # ---- plumbing ------------------------------------------------------------------------------

    def __reduce__(self):
        # A task travels as its source text and is loaded again on the other side.
        from core.tasks.loader import load_task_from_source

        return (load_task_from_source, (self.source, self.name, self.path))

    def _where(self) -> str:
        return where_text(self.name, self.path)

    def _attr(self, name: str) -> Any:
        if self.module is None or not hasattr(self.module, name):
            raise TaskError(f"{self._where()}: this Task has no loaded module with {name}; "
                            f"load it with load_task() or load_task_from_source().",
                            path=self.path, name=self.name)
        return getattr(self.module, name)


def where_text(name: str, path: Path | str | None) -> str:
    return f"Task file '{path}'" if path is not None else f"Task '{name}' (given as source text)"


def exception_text(exc: BaseException, limit: int = 400) -> str:
    """`Type: message` on one line, cut to `limit` characters (torch messages can be pages long)."""
    text = " ".join(str(exc).split()) or "(no message)"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}"


def _copy_inputs(values: list) -> list:
    # Model(...) must not be able to change the init inputs later builds see.
    try:
        return copy.deepcopy(values)
    except Exception:
        return list(values)
