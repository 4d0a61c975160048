"""Export a candidate: a self-contained ``NAME.cu``, a loader snippet and a KernelBench ``ModelNew`` file.

``NAME.cu`` holds a provenance header, the schedule as ``#define``s, the program's CUDA source
unchanged, and a host launcher generated from the launch plan: ``NAME_forward(inputs...,
weights...) -> list of outputs``, bound to Python as ``forward``. It builds with
``torch.utils.cpp_extension.load(name, sources=["NAME.cu"])`` and with plain nvcc. The ModelNew
file subclasses the task's ``Model`` (same constructor, same state_dict) and runs the same
``.cu`` text through ``load_inline``. See docs/export.md.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from core.program import KernelProgram, ProgramError, TensorInfo
from core.program.cuda_source import strip_comments_and_strings
from core.project.cpp_codegen import (
    ATOM,
    CAST_CPP_TYPES,
    FLOAT_CASTS,
    INT_CASTS,
    SCALAR_TYPES,
    TENSOR,
    CppExpr,
    CppName,
    TranslationError,
    cpp_comment,
    cpp_identifier,
    cpp_string,
    defined_macros,
    helpers_source,
    identifiers_in,
    taken_identifiers,
    translate,
    whole_number,
)
from core.project.atomic import write_text_atomic

MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
DEFAULT_SHARED_LIMIT = 48 * 1024  # above this (dynamic + static) a kernel must opt in to more shared memory


class ExportError(Exception):
    """An export that cannot be made; the message is one paragraph naming the problem."""


@dataclass
class ExportResult:
    files: list[Path] = field(default_factory=list)  # what was written, in order

    def _named(self, suffix: str) -> Path | None:
        return next((p for p in self.files if p.name.endswith(suffix)), None)

    @property
    def cu(self) -> Path | None:
        return self._named(".cu")

    @property
    def loader(self) -> Path | None:
        return self._named("_loader.py")

    @property
    def modelnew(self) -> Path | None:
        return self._named("_modelnew.py")


# ---------------------------------------------------------------- names and signature


@dataclass(frozen=True)
class _Arg:
    """One parameter of the launcher: a forward input or a weight (state_dict entry)."""

    name: str  # the plan name: forward parameter name or state_dict key
    ident: str  # its C++ / Python keyword name
    kind: str  # "tensor", "int", "float" or "bool"
    dtype: str | None = None  # tensors only
    shape: tuple[int, ...] = ()  # tensors only: the task's shape
    role: str = "input"  # "input" or "weight"
    value: Any = None  # python-number inputs: the task's value (for resolve)

    @property
    def what(self) -> str:
        if self.role == "weight":
            suffix = f" (argument {self.ident})" if self.ident != self.name else ""
            return f"weight '{self.name}'{suffix}"
        return f"input '{self.name}'"

    @property
    def cpp_type(self) -> str:
        return {"tensor": "at::Tensor", "int": "int64_t", "float": "double", "bool": "bool"}[self.kind]


def identifier_name(text: str) -> str:
    """A file stem that is also a C++ and Python identifier: 'act-gelu.v2' -> 'act_gelu_v2'."""
    ident = re.sub(r"\W", "_", str(text), flags=re.ASCII).strip("_") or "kernel"
    ident = re.sub(r"_{2,}", "_", ident)
    return ident if not ident[0].isdigit() else "k_" + ident


def export_name(program: KernelProgram, name: str | None = None) -> str:
    """The NAME of an export: the name asked for, else the program's, as an identifier."""
    return identifier_name(name if name is not None else program.name)


def _scalar_values(task: Any) -> dict[str, Any]:
    """Values of the python-number forward inputs (their C++ type depends on int vs float)."""
    if all(spec is not None for spec in task.input_specs):
        return {}
    try:
        values = task.make_inputs(0, "meta")  # tensors on meta: no data drawn
    except Exception:
        values = task.make_inputs(0, "cpu")
    return {n: v for n, v, s in zip(task.input_names, values, task.input_specs) if s is None}


def _signature(task: Any, taken: set[str]) -> list[_Arg]:
    """The launcher's parameters: forward inputs in order, then every state_dict entry in order."""
    scalars = _scalar_values(task)
    args: list[_Arg] = []
    for name, spec in zip(task.input_names, task.input_specs):
        if spec is not None:
            args.append(_Arg(name, cpp_identifier(name, taken), TENSOR, spec.dtype, tuple(spec.shape)))
            continue
        value = scalars.get(name)
        if isinstance(value, bool):
            kind = "bool"
        elif isinstance(value, int):
            kind = "int"
        elif isinstance(value, float):
            kind = "float"
        else:
            raise ExportError(
                f"task '{task.name}': forward input '{name}' is a {type(value).__name__} ({value!r:.60}); the "
                "exported launcher takes tensors and Python numbers (int, float, bool) only"
            )
        args.append(_Arg(name, cpp_identifier(name, taken), kind, value=value))
    for key, spec in task.param_specs.items():
        args.append(_Arg(key, cpp_identifier(key, taken), TENSOR, spec.dtype, tuple(spec.shape), role="weight"))
    for a in args:
        if a.kind == TENSOR and a.dtype not in SCALAR_TYPES:
            raise ExportError(f"task '{task.name}': {a.what} has dtype {a.dtype}, which the export does not support")
    return args


def _resolve_env(args: list[_Arg]) -> dict[str, Any]:
    return {a.name: TensorInfo(a.shape, a.dtype) if a.kind == TENSOR else a.value for a in args}


def check_program(program: KernelProgram, task: Any) -> None:
    """Validate the program and resolve its plan for the task's shapes; ExportError if it fails."""
    try:
        program.validate()
        program.resolve(_resolve_env(_signature(task, taken_identifiers())))
    except ProgramError as e:
        raise ExportError(f"program '{program.name}' cannot be exported for task '{task.name}': {e}") from None


# ---------------------------------------------------------------- provenance


def cuda_agent_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("cuda-agent")
    except (ImportError, PackageNotFoundError):
        pass
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        match = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.MULTILINE)
    except OSError:
        match = None
    return match.group(1) if match else "unknown"


def _fmt_float(value: Any, spec: str) -> str | None:
    return format(float(value), spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def provenance_lines(program: KernelProgram, task: Any, provenance: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, text) rows of the provenance header, missing entries left out, in a fixed order.

    Known keys: candidate_id, branch, origin, program_hash (default: program.content_hash()), gpu,
    median_ms, eager_ms, compile_ms, speedup_eager, speedup_compile, roofline_fraction, gbps,
    below_floor, measured_at, exported_at (default: now, UTC), cuda_agent_version (default: the
    installed version). Any other key is listed after them as "key: value".
    """
    p = dict(provenance)
    rows: list[tuple[str, str]] = [("task", f"{task.name} (sha256 {task.hash})")]
    used = {"task", "task_name", "task_hash"}

    def take(key: str, label: str, text: str | None) -> None:
        used.add(key)
        if text is not None and p.get(key) is not None:
            rows.append((label, text))

    candidate = p.get("candidate_id")
    if candidate is not None:
        branch = p.get("branch")
        rows.append(("candidate", f"{candidate}" + (f" (branch {branch})" if branch is not None else "")))
    used.update({"candidate_id", "branch"})
    take("origin", "origin", str(p.get("origin")))
    rows.append(("program", f"{program.name} (content hash {p.get('program_hash') or program.content_hash()})"))
    used.add("program_hash")
    rows.append(("schedule", ", ".join(f"{k}={v}" for k, v in sorted(program.schedule.items())) or "(no tunables)"))
    take("gpu", "GPU", str(p.get("gpu")))
    median = _fmt_float(p.get("median_ms"), ".4f")
    take("median_ms", "median time", f"{median} ms" if median else None)
    eager, compiled = _fmt_float(p.get("speedup_eager"), ".2f"), _fmt_float(p.get("speedup_compile"), ".2f")
    eager_ms, compile_ms = _fmt_float(p.get("eager_ms"), ".4f"), _fmt_float(p.get("compile_ms"), ".4f")
    take("speedup_eager", "vs eager", f"{eager}x" + (f" (eager PyTorch {eager_ms} ms)" if eager_ms else "") if eager else None)
    take("speedup_compile", "vs compile", f"{compiled}x" + (f" (torch.compile {compile_ms} ms)" if compile_ms else "") if compiled else None)
    used.update({"eager_ms", "compile_ms"})
    if not eager and eager_ms:
        rows.append(("eager", f"{eager_ms} ms"))
    if not compiled and compile_ms:
        rows.append(("torch.compile", f"{compile_ms} ms"))
    fraction = p.get("roofline_fraction")
    take("roofline_fraction", "roofline", f"{100 * float(fraction):.1f}% of the roofline (floor time / measured time)"
         if _fmt_float(fraction, "g") else None)
    gbps = _fmt_float(p.get("gbps"), ".1f")
    take("gbps", "bandwidth", f"{gbps} GB/s" if gbps else None)
    if p.get("below_floor"):
        rows.append(("warning", "measured below the roofline floor: see the report before trusting this time"))
    used.add("below_floor")
    take("measured_at", "measured", str(p.get("measured_at")))
    rows.append(("exported", str(p.get("exported_at") or datetime.now(timezone.utc).isoformat(timespec="seconds"))))
    rows.append(("cuda-agent", str(p.get("cuda_agent_version") or cuda_agent_version())))
    used.update({"exported_at", "cuda_agent_version"})
    for key in sorted(k for k in p if k not in used and p[k] is not None):
        rows.append((str(key), str(p[key])))
    return rows


def _aligned(rows: list[tuple[str, str]]) -> list[tuple[str, str]]:
    width = max(len(label) for label, _ in rows) + 1
    return [((label + ":").ljust(width), text) for label, text in rows]


def provenance_from(candidate: Mapping[str, Any], *, gpu: str | None = None, **extra: Any) -> dict[str, Any]:
    """A provenance dict from a candidate record as a dict (dataclasses.asdict(CandidateRecord) fits).

    Keyword arguments are added and override: gpu="NVIDIA H200", branch="main" (a record only has
    the branch id), exported_at=... Entries that are None are dropped.
    """
    m = candidate.get("measurement") or {}
    timing = m.get("timing") or {}
    p: dict[str, Any] = {
        "candidate_id": candidate.get("id"),
        "branch": candidate.get("branch", candidate.get("branch_id")),
        "origin": candidate.get("origin") or None,
        "program_hash": candidate.get("candidate_hash") or None,
        "gpu": gpu,
        "median_ms": timing.get("median_ms"),
        "eager_ms": m.get("eager_ms"),
        "compile_ms": m.get("compile_ms"),
        "speedup_eager": m.get("speedup_eager"),
        "speedup_compile": m.get("speedup_compile"),
        "roofline_fraction": m.get("roofline_fraction"),
        "gbps": m.get("gbps"),
        "below_floor": m.get("below_floor") or None,
        "measured_at": candidate.get("evaluated_at"),
    }
    p.update(extra)
    return {k: v for k, v in p.items() if v is not None}


# ---------------------------------------------------------------- the .cu file


def qualified_kernel(source: str, kernel: str) -> str:
    """How the launcher, at global scope, names a kernel: a generated program of several fusion
    groups defines each group's kernel inside `namespace ca_g<i> { ... }  // namespace ca_g<i>`
    (core/codegen/generate.py), where extern "C" keeps its symbol but C++ needs the qualified name."""
    for m in re.finditer(r"namespace (\w+) \{(.*?)\n\}  // namespace \1\b", source, re.S):
        if re.search(rf"__global__[^;{{}}]*\b{re.escape(kernel)}\s*\(", m.group(2)):
            return f"{m.group(1)}::{kernel}"
    return kernel


class _Launcher:
    """Builds the host launcher text for one program, task and name."""

    def __init__(self, program: KernelProgram, task: Any, name: str) -> None:
        self.program, self.task, self.name = program, task, name
        self.function = f"{name}_forward"
        self.kernels = program.kernel_names()
        self.macros = defined_macros(program.source) | set(program.schedule)
        self.taken = taken_identifiers([*self.kernels, *self.macros, self.function, name])
        self.args = _signature(task, self.taken)
        self.names: dict[str, CppName] = {t: CppName("tunable", t) for t in program.schedule}
        for a in self.args:
            self.names[a.name] = CppName(a.kind, a.ident)
        self.lines: list[str] = []
        self.first_tensor: str | None = None  # buffers are made with its new_empty (lighter headers than at::empty)

    # ---- expressions

    def expr(self, source: Any, where: str) -> CppExpr:
        try:
            return translate(source, self.names)
        except TranslationError as e:
            raise ExportError(f"program '{self.program.name}': {where} = '{source}': {e}") from None

    def where(self, path: str, source: Any) -> str:
        return cpp_string(f"{path} = '{source}'")

    def checked(self, path: str, source: Any, wrap: str, *extra: str, low: int = 1, high: int | None = None) -> str:
        """ca::eval("path = 'expr'", [&] { return wrap(whole(expr), extra...); }), or the number itself
        for a constant that passes the check (check_program resolved the plan already)."""
        e = whole_number(self._numeric_or_fail(path, source))
        if re.fullmatch(r"\d+", e.code) and int(e.code) >= low and (high is None or int(e.code) <= high):
            return e.code
        inner = f"ca::{wrap}({', '.join([e.code, *extra])})"
        return f"ca::eval({self.where(path, source)}, [&] {{ return {inner}; }})"

    def _numeric_or_fail(self, path: str, source: Any) -> CppExpr:
        e = self.expr(source, path)
        if e.kind == TENSOR:
            raise ExportError(f"program '{self.program.name}': {path} = '{source}': a tensor is used as a number; "
                              f"use {source}.shape[i], {source}.numel or {source}.ndim")
        return e

    # ---- text

    def emit(self, line: str = "") -> None:
        self.lines.append(line)

    def render(self) -> str:
        emit = self.emit
        params = ", ".join(f"{a.cpp_type} {a.ident}" for a in self.args)
        emit(f"std::vector<at::Tensor> {self.function}({params}) {{")
        tensors = [a for a in self.args if a.kind == TENSOR]
        if tensors:
            emit("  // Tensors: on the GPU, of the task's dtype and rank, made contiguous.")
            for a in tensors:
                emit(f"  {a.ident} = ca::prepare({a.ident}, {cpp_string(a.what)}, {SCALAR_TYPES[a.dtype]}, {len(a.shape)});")
            first = tensors[0]
            emit(f"  const at::Device ca_device = {first.ident}.device();")
            self.first_tensor = first.ident
            for a in tensors[1:]:
                emit(f"  ca::same_device({a.ident}, ca_device, {cpp_string(a.what)});")
        else:
            emit("  const at::Device ca_device(at::kCUDA, c10::cuda::current_device());")
        emit("  const c10::cuda::CUDAGuard ca_guard(ca_device);")
        emit("  const cudaStream_t ca_stream = c10::cuda::getCurrentCUDAStream();")
        emit("  const at::TensorOptions ca_options = at::TensorOptions().device(ca_device);")
        self.buffers()
        for i, launch in enumerate(self.program.launches):
            self.launch(i, launch)
        outputs = ", ".join(self.names[o].ident for o in self.program.outputs)
        emit(f"  return {{{outputs}}};")
        emit("}")
        return "\n".join(self.lines)

    def buffers(self) -> None:
        for i, buffer in enumerate(self.program.buffers):
            where = f"buffers[{i}]"
            ident = cpp_identifier(buffer.name, self.taken)
            shape_text = ", ".join(str(s) for s in buffer.shape)
            self.emit()
            self.emit(f"  // {where} {cpp_comment(buffer.name)}: shape [{cpp_comment(shape_text)}], dtype {cpp_comment(buffer.dtype)}")
            dims = [self.checked(f"{where}.shape[{j}]", s, "buffer_dim") for j, s in enumerate(buffer.shape)]
            if dims:
                self.emit(f"  const std::vector<int64_t> ca_{ident}_shape = {{")
                for d in dims:
                    self.emit(f"      {d},")
                self.emit("  };")
            else:
                self.emit(f"  const std::vector<int64_t> ca_{ident}_shape;  // a 0-d tensor")
            dtype = self.dtype(buffer.dtype, where)
            # A zeroed buffer (arrival counters) is zeroed on every call: calls on other streams cannot share it.
            how = "zeros" if buffer.zeroed else "empty"
            if self.first_tensor is not None:
                self.emit(f"  at::Tensor {ident} = {self.first_tensor}.new_{how}(ca_{ident}_shape, ca_options.dtype({dtype}));")
            else:
                self.emit(f"  at::Tensor {ident} = at::{how}(ca_{ident}_shape, ca_options.dtype({dtype}));")
            self.names[buffer.name] = CppName(TENSOR, ident)  # later buffers and launches may use it

    def dtype(self, dtype: str, where: str) -> str:
        match = re.fullmatch(r"dtype\(\s*([A-Za-z_][\w.]*)\s*\)", dtype.strip())
        if match is None:
            return SCALAR_TYPES[dtype]
        name = self.names.get(match.group(1))
        if name is None or name.kind != TENSOR:
            raise ExportError(f"program '{self.program.name}': {where}.dtype = '{dtype}': '{match.group(1)}' is not a tensor")
        return f"{name.ident}.scalar_type()"

    def launch(self, i: int, launch: Any) -> None:
        emit, where = self.emit, f"launches[{i}]"
        kernel = launch.kernel
        summary = (f"{kernel}<<<[{', '.join(map(str, launch.grid))}], [{', '.join(map(str, launch.block))}], "
                   f"shared {launch.shared_bytes}>>>({', '.join(map(str, launch.args))})")
        emit()
        emit(f"  // {where}: {cpp_comment(summary)}")
        emit("  {")
        for part, limits in (("grid", MAX_GRID), ("block", MAX_BLOCK)):
            dims = [self.checked(f"{where}.{part}[{j}]", s, "launch_dim", str(limits[j]), cpp_string(f"{part} {'xyz'[j]}"),
                                 high=limits[j])
                    for j, s in enumerate(launch.grid if part == "grid" else launch.block)]
            dims += ["1"] * (3 - len(dims))
            if all(d.isdigit() for d in dims):
                emit(f"    const dim3 ca_{part}({', '.join(dims)});")
            else:
                emit(f"    const dim3 ca_{part}(")
                emit(",\n".join(f"        {d}" for d in dims) + ");")
        shared = self.checked(f"{where}.shared_bytes", launch.shared_bytes, "shared_bytes", low=0)
        constant = int(shared) if shared.isdigit() else None
        emit(f"    const size_t ca_shared = {shared};")
        pointers = []
        for j, source in enumerate(launch.args):
            path = f"{where}.args[{j}]"
            e = self.expr(source, path)
            if e.kind == TENSOR:
                tensor = e.code if e.prec == ATOM else f"({e.code})"
                emit(f"    void* ca_arg{j} = {tensor}.data_ptr();")
            elif e.kind in INT_CASTS or e.kind in FLOAT_CASTS:
                emit(f"    {CAST_CPP_TYPES[e.kind]} ca_arg{j} = ca::eval({self.where(path, source)}, [&] {{ return {e.code}; }});")
            else:
                cast = "float32" if e.kind == "float" else "int32"
                raise ExportError(
                    f"program '{self.program.name}': {path} = '{source}': an untyped number; scalar arguments need "
                    f"a type, e.g. {cast}({source})"
                )
            pointers.append(f"&ca_arg{j}")
        if pointers:
            emit(f"    void* ca_args[] = {{{', '.join(pointers)}}};")
        else:
            emit("    void** ca_args = nullptr;")
        what = cpp_string(f"{where} ({kernel})")
        function = qualified_kernel(self.program.source, kernel)
        if constant is None or constant > 0:
            # Past 48 KiB with the kernel's own static shared memory, dynamic shared memory needs an opt-in.
            emit("    if (ca_shared > 0) {")
            emit(f"      static const size_t ca_static = ca::static_shared((const void*){function}, {what});")
            emit(f"      if (ca_shared + ca_static > {DEFAULT_SHARED_LIMIT})")
            emit(f"        ca::check_cuda(cudaFuncSetAttribute((const void*){function}, cudaFuncAttributeMaxDynamicSharedMemorySize,")
            emit(f"                                            static_cast<int>(ca_shared)), {what});")
            emit("    }")
        emit(f"    ca::check_cuda(cudaLaunchKernel((const void*){function}, ca_grid, ca_block, ca_args, ca_shared, ca_stream), {what});")
        emit(f"    ca::check_cuda(cudaGetLastError(), {what});")
        emit("  }")


_BINDING_WORDS = " PYBIND11_MODULE TORCH_EXTENSION_NAME m def pybind11 arg "


def render_cu(program: KernelProgram, task: Any, provenance: Mapping[str, Any] | None = None, *,
              name: str | None = None) -> str:
    """The exported ``NAME.cu``: provenance header, schedule, kernels, host launcher, binding.

    provenance: optional entries for the header (see provenance_lines); missing ones are left out.
    Raises ExportError when the program does not validate or resolve for the task's shapes.
    """
    check_program(program, task)
    name = export_name(program, name)
    launcher = _Launcher(program, task, name)
    body = launcher.render()

    # A macro of the CUDA source would rewrite the launcher that follows it.
    used = identifiers_in(strip_comments_and_strings(body + _BINDING_WORDS))
    clashes = sorted((defined_macros(program.source) & used) - set(program.schedule))
    if clashes:
        raise ExportError(
            f"program '{program.name}': the CUDA source #defines {', '.join(clashes)}, which the generated host "
            "launcher uses as C++ names; rename the macro(s) in the source (or #undef them at its end)"
        )

    header = [f"// {name}.cu: CUDA kernels and PyTorch binding exported by CUDA Agent", "//"]
    header += [f"//   {label} {cpp_comment(text)}" for label, text in _aligned(provenance_lines(program, task, provenance or {}))]
    call = ", ".join(a.ident for a in launcher.args)
    header += [
        "//",
        f'// Build:  torch.utils.cpp_extension.load(name="{name}", sources=["{name}.cu"]), or plain nvcc:',
        f"//         nvcc -std=c++17 -c {name}.cu -I<each dir of torch.utils.cpp_extension.include_paths()> -I<Python include>",
        f"// Call:   outputs = module.forward({call})",
        f"//         -> a list of {len(program.outputs)} tensor{'s' if len(program.outputs) != 1 else ''}: "
        f"[{cpp_comment(', '.join(program.outputs))}]",
        "// Arguments: the forward inputs in order, then the weights in state_dict order:",
    ]
    width = max((len(a.ident) for a in launcher.args), default=0)
    for a in launcher.args:
        if a.kind == TENSOR:
            desc = f"{a.dtype} tensor on the GPU, task shape [{', '.join(map(str, a.shape))}]"
        else:
            desc = {"int": "Python int (int64_t)", "float": "Python float (double)", "bool": "Python bool"}[a.kind]
        origin = f"state_dict key '{a.name}'" if a.role == "weight" else "forward input"
        header.append(f"//   {a.ident.ljust(width)}  {cpp_comment(desc)}; {cpp_comment(origin)}")
    header += [
        "//",
        "// The kernels are the program's CUDA source, unchanged, after its schedule as #defines (the",
        "// search compiled them with NVRTC and -D options of the same values). The host launcher after",
        "// them was generated from the program's launch plan: it checks the tensors, evaluates the plan's",
        "// expressions with the same (Python) semantics, allocates the outputs and launches the kernels",
        "// on the current stream.",
    ]

    tunables = [f"#define {k} {v if v >= 0 else f'({v})'}" for k, v in sorted(program.schedule.items())]
    pybind_args = "".join(f', pybind11::arg("{a.ident}")' for a in launcher.args)
    doc = cpp_string(f"{name}: kernels for task {task.name} exported by CUDA Agent; forward({', '.join(a.ident for a in launcher.args)})")
    source = program.source if program.source.endswith("\n") else program.source + "\n"
    parts = [
        "\n".join(header),
        "",
        "// torch.utils.cpp_extension compiles .cu files with -D__CUDA_NO_HALF_OPERATORS__ and friends;",
        "// the kernels were written and tested without them.",
        "#undef __CUDA_NO_HALF_OPERATORS__",
        "#undef __CUDA_NO_HALF_CONVERSIONS__",
        "#undef __CUDA_NO_BFLOAT16_CONVERSIONS__",
        "#undef __CUDA_NO_HALF2_OPERATORS__",
        "",
        "#ifndef TORCH_EXTENSION_NAME",
        f"#define TORCH_EXTENSION_NAME {name}",
        "#endif",
        "",
        "// Host-only part: the device compilation pass does not need the PyTorch headers (faster builds).",
        "#ifndef __CUDA_ARCH__",
        "#include <ATen/core/Tensor.h>",
        *(["#include <ATen/ops/empty.h>"] if launcher.first_tensor is None else []),
        "#include <c10/cuda/CUDAFunctions.h>",
        "#include <c10/cuda/CUDAGuard.h>",
        "#include <c10/cuda/CUDAStream.h>",
        "#include <torch/csrc/utils/pybind.h>",
        "#include <cuda_runtime.h>",
        "",
        "#include <cmath>",
        "#include <cstdint>",
        "#include <cstdio>",
        "#include <stdexcept>",
        "#include <string>",
        "#include <vector>",
        "",
        helpers_source(launcher.function).rstrip("\n"),
        "#endif  // __CUDA_ARCH__",
        "",
        "// ---------------------------------------------------------------- schedule (tunables)",
        *(tunables or ["// (this program has no tunables)"]),
        "",
        "// ---------------------------------------------------------------- kernels (the program's source)",
        source.rstrip("\n"),
        "",
        "// ---------------------------------------------------------------- host launcher (generated)",
        "#ifndef __CUDA_ARCH__",
        body,
        "",
        "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {",
        f"  m.def(\"forward\", &{launcher.function}, {doc}{pybind_args});",
        "}",
        "#endif  // __CUDA_ARCH__",
        "",
    ]
    return "\n".join(parts)


# ---------------------------------------------------------------- Python files


def _py_comment(text: Any) -> str:
    """Text safe in a # comment: one line, no control characters."""
    return "".join(c for c in " ".join(str(text).split()) if c.isprintable())


def _py_string(text: str) -> str:
    """A Python literal for text: a readable raw triple-quoted string when that round-trips."""
    if '"""' not in text and not text.endswith("\\") and "\r" not in text:
        literal = 'r"""' + text + '"""'
        try:
            if ast.literal_eval(literal) == text:
                return literal
        except (SyntaxError, ValueError):
            pass
    return repr(text)


def render_loader_snippet(program: KernelProgram, task: Any, *, name: str | None = None) -> str:
    """A short runnable script: build NAME.cu with cpp_extension.load, call it, compare with Model."""
    name = export_name(program, name)
    atol, rtol = task.tolerance()
    expected = "[expected]" if len(program.outputs) == 1 else "list(expected)"
    return f'''"""Build and call the {name} kernels exported by CUDA Agent (task {task.name}).

Run it next to {name}.cu and {name}_modelnew.py (which provides the task's Model, get_inputs
and get_init_inputs). Needs a CUDA GPU, nvcc and a CUDA build of PyTorch.
"""
import sys
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from {name}_modelnew import Model, get_init_inputs, get_inputs  # noqa: E402

# Built once, then cached by torch (in ~/.cache/torch_extensions unless TORCH_EXTENSIONS_DIR is set).
module = load(name="{name}", sources=[str(HERE / "{name}.cu")])

model = Model(*get_init_inputs()).cuda()
inputs = [v.cuda() if isinstance(v, torch.Tensor) else v for v in get_inputs()]
state = model.state_dict()
weights = [state[key] for key in {tuple(task.param_specs)!r}]  # state_dict order

outputs = module.forward(*inputs, *weights)  # a list of tensors
with torch.no_grad():
    expected = model(*inputs)
expected = {expected}
for got, want in zip(outputs, expected):
    torch.testing.assert_close(got, want, atol={atol!r}, rtol={rtol!r})
print("outputs match the reference:", [tuple(o.shape) for o in outputs])
'''


_MODELNEW_TEMPLATE = '''\
# ---------------------------------------------------------------- CUDA Agent export
import functools as _ca_functools
import hashlib as _ca_hashlib
import inspect as _ca_inspect

from torch.utils.cpp_extension import load_inline as _ca_load_inline

# The exported @NAME@.cu, verbatim: kernels, generated host launcher and pybind11 binding.
_CA_CUDA_SOURCE = @SOURCE@

# state_dict keys of the weights the launcher takes after the inputs, in state_dict order.
_CA_WEIGHTS = @WEIGHTS@


@_ca_functools.lru_cache(maxsize=None)
def _ca_extension():
    """Build the extension once per process (torch also caches the build on disk)."""
    name = "@NAME@_" + _ca_hashlib.sha256(_CA_CUDA_SOURCE.encode()).hexdigest()[:16]
    options = {}
    if "no_implicit_headers" in _ca_inspect.signature(_ca_load_inline).parameters:
        options["no_implicit_headers"] = True  # the source includes what it needs
    return _ca_load_inline(
        name,
        cpp_sources=[],
        cuda_sources=[_CA_CUDA_SOURCE],
        extra_cuda_cflags=["-O3", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                           "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__"],
        **options,
    )


def _ca_weight(module, key):
    for part in key.split("."):
        module = getattr(module, part)
    return module


class ModelNew(Model):
    """The task's Model with forward computed by the exported kernels (same constructor and state_dict)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _ca_extension()

    __init__.__signature__ = _ca_inspect.signature(Model.__init__)

    def forward(@PARAMS@):
        _ca_outputs = _ca_extension().forward(@CALL@)
        return @RETURN@
'''


def render_modelnew(program: KernelProgram, task: Any, provenance: Mapping[str, Any] | None = None, *,
                    name: str | None = None, cu_text: str | None = None) -> str:
    """A KernelBench solution file: the task's source, then ModelNew(Model) running the exported .cu."""
    name = export_name(program, name)
    cu_text = cu_text if cu_text is not None else render_cu(program, task, provenance, name=name)
    rows = _aligned(provenance_lines(program, task, provenance or {}))
    header = [
        f"# {name}_modelnew.py: a KernelBench-style solution exported by CUDA Agent.",
        "#",
        *(f"#   {label} {_py_comment(text)}" for label, text in rows),
        "#",
        "# ModelNew subclasses the task's Model (its file follows unchanged), so it takes the same",
        "# constructor arguments and holds the same parameters under the same state_dict keys; its",
        "# forward runs the exported kernels, built from the embedded .cu text with",
        "# torch.utils.cpp_extension.load_inline on first construction (needs nvcc and a CUDA GPU).",
        "# get_inputs() and get_init_inputs() are the task's own.",
        "",
        "# ---------------------------------------------------------------- the task's reference (unchanged)",
    ]
    params = ", ".join(["self", *task.input_names])
    call = ", ".join([*task.input_names, "*[_ca_weight(self, key) for key in _CA_WEIGHTS]"])
    returned = "_ca_outputs[0]" if len(program.outputs) == 1 else "tuple(_ca_outputs)"
    tail = (_MODELNEW_TEMPLATE.replace("@NAME@", name)
            .replace("@WEIGHTS@", repr(tuple(task.param_specs)))
            .replace("@PARAMS@", params)
            .replace("@CALL@", call)
            .replace("@RETURN@", returned))
    # The source is substituted last: it may contain anything, placeholders included.
    head, rest = tail.split("@SOURCE@", 1)
    tail = head + _py_string(cu_text) + rest
    reference = task.source if task.source.endswith("\n") else task.source + "\n"
    return "\n".join(header) + "\n" + reference + "\n\n" + tail


# ---------------------------------------------------------------- writing files


def export_candidate(program: KernelProgram, task: Any, out_dir: str | Path, provenance: Mapping[str, Any] | None = None,
                     *, name: str | None = None, overwrite: bool = False) -> ExportResult:
    """Write NAME.cu, NAME_loader.py and NAME_modelnew.py into out_dir (created if needed)."""
    check_program(program, task)
    name = export_name(program, name)
    out = Path(out_dir)
    paths = [out / f"{name}.cu", out / f"{name}_loader.py", out / f"{name}_modelnew.py"]
    if not overwrite:
        existing = [str(p) for p in paths if p.exists()]
        if existing:
            raise ExportError(
                f"export of '{name}' would overwrite {', '.join(existing)}; choose another output folder or "
                "name, or allow overwriting (--force on the command line)"
            )
    cu_text = render_cu(program, task, provenance, name=name)
    texts = [
        cu_text,
        render_loader_snippet(program, task, name=name),
        render_modelnew(program, task, provenance, name=name, cu_text=cu_text),
    ]
    try:
        out.mkdir(parents=True, exist_ok=True)
        for path, text in zip(paths, texts):
            write_text_atomic(path, text)
    except OSError as e:
        raise ExportError(f"cannot write the export into {out}: {e.strerror or e}") from None
    return ExportResult(files=paths)


@dataclass
class BuildCheck:
    """What `build_check` found: built (True / False), or None when this machine cannot tell."""

    built: bool | None
    message: str
    seconds: float = 0.0

    def summary(self) -> str:
        """One line for a log or a terminal (nvcc's error lines follow a failure)."""
        if self.built is None:
            return f"build check not made: {self.message}"
        if self.built:
            return f"build check: {self.message} in {self.seconds:.0f} s"
        return f"build check failed:\n{self.message}"


def nvcc_build_command(cu: Path, obj: Path, extra_includes: list[Path], arch: str = "sm_90") -> list[str]:
    """nvcc compiling an exported NAME.cu to an object file: PyTorch's and Python's headers, no GPU."""
    import sysconfig

    from torch.utils.cpp_extension import include_paths

    from core.toolchain import find_nvcc

    includes = [*extra_includes, *map(Path, include_paths()), Path(sysconfig.get_paths()["include"])]
    return [find_nvcc() or "nvcc", "-std=c++17", "-c", f"-arch={arch}", "-DTORCH_EXTENSION_NAME=x",
            *(f"-I{d}" for d in includes), str(cu), "-o", str(obj)]


def build_tools_missing() -> str | None:
    """Why this machine cannot build an exported NAME.cu (None: it can): nvcc, PyTorch's C++
    headers or the Python development headers are missing."""
    import sysconfig

    from torch.utils.cpp_extension import include_paths

    from core.toolchain import find_nvcc

    if find_nvcc() is None:
        return "nvcc not found ($NVCC, $CUDA_HOME/bin, PATH)"
    torch_include = Path(include_paths()[0])
    if not (torch_include / "torch" / "csrc" / "utils" / "pybind.h").is_file():
        return f"PyTorch's C++ headers are missing under {torch_include}"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return "the Python development headers (Python.h) are missing"
    return None


def header_shim(folder: Path) -> Path:
    """`folder`, holding the one header a CPU build of torch lacks (CUDA builds generate it): an
    include dir that lets nvcc build an export against such a build."""
    from torch.utils.cpp_extension import include_paths

    if not (Path(include_paths()[0]) / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").is_file():
        (folder / "c10" / "cuda" / "impl").mkdir(parents=True, exist_ok=True)
        (folder / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").write_text("#pragma once\n")
    return folder


def build_check(cu: str | Path, arch: str = "sm_90", timeout: float = 600.0) -> BuildCheck:
    """Compile an exported NAME.cu with nvcc (kernels, launcher, binding; nothing runs): the check a
    user's own build would make first. None when nvcc or the headers are missing here."""
    import subprocess
    import tempfile
    import time

    missing = build_tools_missing()
    if missing:
        return BuildCheck(None, missing)
    with tempfile.TemporaryDirectory(prefix="cuda-agent-build-") as tmp:
        shim = header_shim(Path(tmp) / "shim")
        start = time.perf_counter()
        try:
            done = subprocess.run(nvcc_build_command(Path(cu), Path(tmp) / "build.o", [shim], arch),
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return BuildCheck(False, f"nvcc took longer than {timeout:.0f} s", timeout)
        seconds = time.perf_counter() - start
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines()[-10:]
        return BuildCheck(False, "\n".join(errors[:20]), seconds)
    return BuildCheck(True, f"nvcc built it for {arch}", seconds)


def export_record(record: Mapping[str, Any], task: Any, out_dir: str | Path, *, name: str | None = None,
                  overwrite: bool = False, **provenance: Any) -> ExportResult:
    """Export a candidate record given as a dict (dataclasses.asdict(CandidateRecord) fits).

    A "program" record gives the three files of export_candidate; a "modelnew" record (a Python
    solution, which brings its own CUDA code) gives NAME_modelnew.py: its source unchanged after a
    provenance comment. Keyword arguments go to the provenance (gpu=..., branch="main", ...).
    """
    details = provenance_from(record, **provenance)
    kind = record.get("kind", "program")
    if kind == "program":
        data = record.get("program")
        if not isinstance(data, Mapping):
            raise ExportError(f"candidate {record.get('id')}: the record has no program to export")
        try:
            program = KernelProgram.from_json(data)
        except ProgramError as e:
            raise ExportError(f"candidate {record.get('id')}: its program is not valid: {e}") from None
        return export_candidate(program, task, out_dir, details, name=name, overwrite=overwrite)
    if kind != "modelnew" or not isinstance(record.get("solution_source"), str):
        raise ExportError(f"candidate {record.get('id')}: a record of kind {kind!r} without a solution cannot be exported")
    stem = identifier_name(name or f"{task.name}_candidate{record.get('id')}")
    path = Path(out_dir) / f"{stem}_modelnew.py"
    if path.exists() and not overwrite:
        raise ExportError(f"export of '{stem}' would overwrite {path}; choose another output folder or name, "
                          "or allow overwriting (--force on the command line)")
    p = dict(details)
    rows = [("task", f"{task.name} (sha256 {task.hash})"), ("solution", f"sha256 {p.pop('program_hash', '') or '?'}")]
    rows += [(k, str(v)) for k, v in p.items()]
    rows.append(("exported", datetime.now(timezone.utc).isoformat(timespec="seconds")))
    rows.append(("cuda-agent", cuda_agent_version()))
    header = [f"# {stem}_modelnew.py: a Python solution exported by CUDA Agent (its source follows unchanged).", "#"]
    header += [f"#   {label} {_py_comment(text)}" for label, text in _aligned(rows)]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, "\n".join(header) + "\n\n" + record["solution_source"])
    except OSError as e:
        raise ExportError(f"cannot write the export into {path.parent}: {e.strerror or e}") from None
    return ExportResult(files=[path])


__all__ = [
    "ExportError",
    "ExportResult",
    "check_program",
    "cuda_agent_version",
    "export_candidate",
    "export_name",
    "export_record",
    "provenance_from",
    "provenance_lines",
    "render_cu",
    "render_loader_snippet",
    "render_modelnew",
]
