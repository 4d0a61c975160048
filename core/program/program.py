"""KernelProgram: CUDA source plus a declarative launch plan (format "cuda-agent/program@1").

The plan is plain data (buffers, ordered launches, outputs) whose numbers are expressions over
the task's input shapes, its parameters and the program's tunables. ``resolve`` turns it into
concrete grids, blocks, buffer shapes and kernel arguments for one set of input shapes, checking
every limit on the way. The format is documented in docs/program-format.md.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import keyword
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Union

from .cuda_source import scan_kernels
from .errors import ProgramError
from .expressions import (
    RESERVED_NAMES,
    EnvValue,
    Expression,
    ExpressionError,
    TensorRef,
    parse_expression,
    quote,
)
from .values import DTYPE_SIZES, ScalarArg, TensorArg, TensorInfo

FORMAT = "cuda-agent/program@1"

# An expression as written in the file: text, or a plain JSON number.
Expr = Union[str, int, float]

_FIELDS = ("format", "name", "source", "source_file", "tunables", "schedule", "buffers", "launches", "outputs")
_BUFFER_FIELDS = ("name", "shape", "dtype", "zeroed")
_LAUNCH_FIELDS = ("kernel", "grid", "block", "shared_bytes", "args")

_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PROGRAM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
_DTYPE_OF = re.compile(r"dtype\(\s*([A-Za-z_][\w.]*)\s*\)")

# A tunable becomes "-DNAME=value": it must not redefine a C/C++/CUDA word.
_C_RESERVED = frozenset(
    """
    auto break case char const continue default do double else enum extern float for goto if inline
    int long register restrict return short signed sizeof static struct switch typedef union unsigned
    void volatile while bool true false class namespace template typename this new delete operator
    private protected public virtual friend using try catch throw const_cast static_cast
    dynamic_cast reinterpret_cast constexpr decltype noexcept nullptr static_assert alignas alignof
    and or not xor bitand bitor compl and_eq or_eq not_eq xor_eq explicit mutable thread_local
    threadIdx blockIdx blockDim gridDim warpSize half nv_bfloat16 size_t NULL
    """.split()
)


@dataclass
class BufferSpec:
    """An output or scratch buffer that the plan allocates before the launches run."""

    name: str
    shape: list[Expr]
    dtype: str  # a torch dtype name ("float32") or "dtype(x)"
    # All zeros when a run starts; the program must leave it so (docs/program-format.md): the
    # arrival counters of a reduction whose last block merges the others' partials.
    zeroed: bool = False


@dataclass
class LaunchSpec:
    """One kernel launch; launches run in order on one stream."""

    kernel: str
    grid: list[Expr]
    block: list[Expr]
    shared_bytes: Expr = 0
    args: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LaunchLimits:
    """Hardware limits a resolved plan must respect (defaults: sm_90)."""

    max_threads_per_block: int = 1024
    max_block: tuple[int, int, int] = (1024, 1024, 64)
    max_grid: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    max_shared_bytes: int = 227 * 1024
    max_buffer_bytes: int = 2**40


@dataclass(frozen=True)
class ResolvedBuffer:
    name: str
    shape: tuple[int, ...]
    dtype: str
    zeroed: bool = False


@dataclass(frozen=True)
class ResolvedLaunch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: tuple[TensorArg | ScalarArg, ...]


@dataclass(frozen=True)
class ResolvedPlan:
    buffers: tuple[ResolvedBuffer, ...]
    launches: tuple[ResolvedLaunch, ...]
    outputs: tuple[str, ...]


def human_bytes(count: int) -> str:
    """1536 -> '1.5 KiB'."""
    value = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{count} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _error(field_path: str, problem: str) -> ProgramError:
    return ProgramError(f"{field_path}: {problem}", field_path)


def _expression_error(field_path: str, error: ExpressionError) -> ProgramError:
    if error.expression is None:
        return _error(field_path, error.problem)
    return ProgramError(f"{field_path} = {quote(error.expression)}: {error.problem}", field_path)


def _parse(source: Expr, field_path: str) -> Expression:
    try:
        return parse_expression(source)
    except ExpressionError as e:
        raise _expression_error(field_path, e) from None


def _describe(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list, str, int, float, bool, type(None))) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unknown_fields(data: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise _error(
                f"{where}{key}", f"unknown field{hint}; the allowed fields are {', '.join(allowed)}"
            )


def _require(data: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise _error(f"{where}{key}", "this field is required but missing")
    return data[key]


def _list(value: Any, field_path: str, what: str) -> list:
    if not isinstance(value, list):
        raise _error(field_path, f"expected a list of {what}, got {_describe(value)}")
    return value


def _string(value: Any, field_path: str) -> str:
    if not isinstance(value, str):
        raise _error(field_path, f"expected a string, got {_describe(value)}")
    return value


def _boolean(value: Any, field_path: str) -> bool:
    if not isinstance(value, bool):
        raise _error(field_path, f"expected true or false, got {_describe(value)}")
    return value


def _expr(value: Any, field_path: str) -> Expr:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _error(
            field_path,
            f"expected an expression (a string such as \"x.shape[0]\" or a number), got {_describe(value)}",
        )
    return value


def _integer(value: Any, field_path: str) -> int:
    if isinstance(value, bool):
        raise _error(field_path, f"expected an integer, got {_describe(value)}")
    try:
        return operator.index(value)
    except TypeError:
        raise _error(field_path, f"expected an integer, got {_describe(value)}") from None


@dataclass
class KernelProgram:
    """CUDA source with one or more ``extern "C" __global__`` kernels and the plan to launch them."""

    name: str
    source: str
    tunables: dict[str, list[int]] = field(default_factory=dict)
    schedule: dict[str, int] = field(default_factory=dict)
    buffers: list[BufferSpec] = field(default_factory=list)
    launches: list[LaunchSpec] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # A tunable without a chosen value takes the first value of its list.
        defaults = {
            name: values[0] for name, values in self.tunables.items() if isinstance(values, list) and values
        }
        self.schedule = {**defaults, **self.schedule}

    # ------------------------------------------------------------ JSON

    @classmethod
    def from_json(cls, text_or_dict: str | bytes | Mapping[str, Any], base_dir: str | Path | None = None) -> KernelProgram:
        """Build and validate a program from JSON text or an already-decoded dict.

        ``base_dir`` is the folder that a relative "source_file" is read from; without it,
        "source_file" is refused (programs that arrive as text must carry their source inline).
        """
        return cls._from_json(text_or_dict, base_dir, None)

    @classmethod
    def load(cls, path: str | Path) -> KernelProgram:
        """Load a program file; errors name the file."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ProgramError(f"{path}: program file not found") from None
        except UnicodeDecodeError:
            raise ProgramError(f"{path}: the program file is not UTF-8 text") from None
        except OSError as e:
            raise ProgramError(f"{path}: cannot read the program file ({e.strerror or e})") from None
        try:
            return cls._from_json(text, path.parent, _safe_name(path.stem))
        except ProgramError as e:
            raise ProgramError(f"{path}: {e}", e.field) from None

    @classmethod
    def _from_json(
        cls, text_or_dict: str | bytes | Mapping[str, Any], base_dir: str | Path | None, default_name: str | None
    ) -> KernelProgram:
        if isinstance(text_or_dict, (str, bytes)):
            try:
                data = json.loads(text_or_dict)
            except json.JSONDecodeError as e:
                raise ProgramError(f"the program is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
            except UnicodeDecodeError:
                raise ProgramError("the program is not UTF-8 text") from None
        else:
            data = text_or_dict
        if not isinstance(data, Mapping):
            raise ProgramError(f"a program must be a JSON object, got {_describe(data)}")
        _unknown_fields(data, _FIELDS, "")

        fmt = _require(data, "format", "")
        if fmt != FORMAT:
            raise _error("format", f"expected \"{FORMAT}\", got {_describe(fmt)}")

        source = _read_source(data, base_dir)

        tunables: dict[str, list[int]] = {}
        raw_tunables = data.get("tunables", {})
        if not isinstance(raw_tunables, Mapping):
            raise _error(
                "tunables",
                f"expected an object mapping names to lists of integers, got {_describe(raw_tunables)}",
            )
        for name, values in raw_tunables.items():
            path = f"tunables.{name}"
            tunables[name] = [_integer(v, f"{path}[{i}]") for i, v in enumerate(_list(values, path, "integers"))]

        schedule: dict[str, int] = {}
        raw_schedule = data.get("schedule", {})
        if not isinstance(raw_schedule, Mapping):
            raise _error(
                "schedule",
                f"expected an object mapping tunable names to integers, got {_describe(raw_schedule)}",
            )
        for name, value in raw_schedule.items():
            schedule[name] = _integer(value, f"schedule.{name}")

        buffers = []
        for i, raw in enumerate(_list(_require(data, "buffers", ""), "buffers", "buffer objects")):
            where = f"buffers[{i}]"
            if not isinstance(raw, Mapping):
                raise _error(where, f"expected an object with name, shape and dtype, got {_describe(raw)}")
            _unknown_fields(raw, _BUFFER_FIELDS, where + ".")
            shape = _list(_require(raw, "shape", where + "."), f"{where}.shape", "expressions")
            buffers.append(
                BufferSpec(
                    name=_string(_require(raw, "name", where + "."), f"{where}.name"),
                    shape=[_expr(e, f"{where}.shape[{j}]") for j, e in enumerate(shape)],
                    dtype=_string(_require(raw, "dtype", where + "."), f"{where}.dtype"),
                    zeroed=_boolean(raw.get("zeroed", False), f"{where}.zeroed"),
                )
            )

        launches = []
        for i, raw in enumerate(_list(_require(data, "launches", ""), "launches", "launch objects")):
            where = f"launches[{i}]"
            if not isinstance(raw, Mapping):
                raise _error(
                    where,
                    f"expected an object with kernel, grid, block, shared_bytes and args, got {_describe(raw)}",
                )
            _unknown_fields(raw, _LAUNCH_FIELDS, where + ".")
            grid = _list(_require(raw, "grid", where + "."), f"{where}.grid", "expressions")
            block = _list(_require(raw, "block", where + "."), f"{where}.block", "expressions")
            args = _list(raw.get("args", []), f"{where}.args", "argument expressions")
            launches.append(
                LaunchSpec(
                    kernel=_string(_require(raw, "kernel", where + "."), f"{where}.kernel"),
                    grid=[_expr(e, f"{where}.grid[{j}]") for j, e in enumerate(grid)],
                    block=[_expr(e, f"{where}.block[{j}]") for j, e in enumerate(block)],
                    shared_bytes=_expr(raw.get("shared_bytes", 0), f"{where}.shared_bytes"),
                    args=[_expr(a, f"{where}.args[{j}]") for j, a in enumerate(args)],
                )
            )

        outputs = [
            _string(o, f"outputs[{i}]")
            for i, o in enumerate(_list(_require(data, "outputs", ""), "outputs", "buffer names"))
        ]

        if "name" in data:
            name = _string(data["name"], "name")
        else:
            name = default_name or (launches[0].kernel if launches else "program")
        program = cls(name, source, tunables, schedule, buffers, launches, outputs)
        program.validate()
        return program

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data; lists keep their order, maps are sorted by key."""
        return {
            "format": FORMAT,
            "name": self.name,
            "source": self.source,
            "tunables": {k: list(self.tunables[k]) for k in sorted(self.tunables)},
            "schedule": {k: self.schedule[k] for k in sorted(self.schedule)},
            # "zeroed" only where set: programs without it keep their JSON and content hash.
            "buffers": [{"name": b.name, "shape": list(b.shape), "dtype": b.dtype, **({"zeroed": True} if b.zeroed else {})}
                        for b in self.buffers],
            "launches": [
                {
                    "kernel": launch.kernel,
                    "grid": list(launch.grid),
                    "block": list(launch.block),
                    "shared_bytes": launch.shared_bytes,
                    "args": list(launch.args),
                }
                for launch in self.launches
            ],
            "outputs": list(self.outputs),
        }

    def to_json(self, indent: int | None = 2) -> str:
        """Canonical JSON: keys sorted, list order kept, the source always inline."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True, ensure_ascii=False)

    def content_hash(self, schedule: Mapping[str, int] | None = None) -> str:
        """sha256 of the canonical JSON of everything that changes behaviour (not the name). With
        `schedule`: the hash of with_schedule(schedule), without copying the program (the search
        hashes thousands of neighbours)."""
        data = self.to_dict()
        del data["name"]
        if schedule:
            merged = {**self.schedule, **{k: int(v) for k, v in schedule.items()}}
            data["schedule"] = {k: merged[k] for k in sorted(merged)}
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    # ------------------------------------------------------------ queries and edits

    def kernel_names(self) -> list[str]:
        """Names of all __global__ functions in the source, in source order."""
        return [k.name for k in scan_kernels(self.source)]

    def compile_options(self) -> list[str]:
        """["-DBLOCK=256", ...]: the schedule as compile-time constants, sorted by name."""
        return [f"-D{name}={self.schedule[name]}" for name in sorted(self.schedule)]

    def with_schedule(self, values: Mapping[str, int]) -> KernelProgram:
        """A copy with some tunables set to other values from their lists. The containers are new;
        their items (strings, numbers, specs nothing edits in place) are shared, which keeps this
        cheap for a search that checks thousands of schedules."""
        program = copy.copy(self)
        program.tunables = {k: list(v) for k, v in self.tunables.items()}
        program.schedule = dict(self.schedule)
        program.buffers = [replace(b, shape=list(b.shape)) for b in self.buffers]
        program.launches = [replace(launch, grid=list(launch.grid), block=list(launch.block), args=list(launch.args))
                            for launch in self.launches]
        program.outputs = list(self.outputs)
        for name, value in values.items():
            program.schedule[name] = _integer(value, f"schedule.{name}")
        program._check_schedule()
        return program

    # ------------------------------------------------------------ validation

    def validate(self) -> None:
        """Static checks (no shapes needed); raises ProgramError naming the field."""
        self._validate(None)

    def _validate(self, env: Mapping[str, EnvValue] | None) -> None:
        if not isinstance(self.name, str) or not _PROGRAM_NAME.fullmatch(self.name):
            raise _error(
                "name",
                f"{_describe(self.name)} is not a valid program name; use 1-128 letters, digits, '_', '.' or '-'",
            )
        if not isinstance(self.source, str) or not self.source.strip():
            raise _error("source", "the CUDA source is empty")
        kernels = {k.name: k for k in scan_kernels(self.source)}
        if not kernels:
            raise _error("source", 'no __global__ kernel found; declare kernels as extern "C" __global__ void name(...)')
        self._check_tunables(env, kernels)
        self._check_schedule()
        self._check_buffers(env)
        self._check_launches(kernels)
        self._check_outputs(env)

    def _check_tunables(self, env: Mapping[str, EnvValue] | None, kernels: Mapping[str, Any]) -> None:
        buffer_names = {b.name for b in self.buffers}
        for name, values in self.tunables.items():
            path = f"tunables.{name}"
            if not isinstance(name, str) or not _C_IDENTIFIER.fullmatch(name):
                raise _error(
                    path,
                    f"{_describe(name)} is not a valid C identifier (letters, digits and '_', not starting with a digit)",
                )
            if name in _C_RESERVED or keyword.iskeyword(name) or name in RESERVED_NAMES or name.startswith("__"):
                raise _error(
                    path,
                    f"'{name}' is a reserved word; tunables become -D{name}=... macros, so pick another name (UPPER_CASE is customary)",
                )
            if name in kernels:
                raise _error(path, f"'{name}' is also the name of a kernel; -D{name}=... would rename it")
            if name in buffer_names:
                raise _error(path, f"tunable '{name}' has the same name as a buffer")
            if env is not None and name in env:
                raise _error(
                    path,
                    f"tunable '{name}' has the same name as an input or parameter of the task; rename the tunable",
                )
            if not isinstance(values, list) or not values:
                raise _error(path, "a tunable needs a non-empty list of integer values")
            seen: set[int] = set()
            for i, value in enumerate(values):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise _error(f"{path}[{i}]", f"expected an integer, got {_describe(value)}")
                if not -(2**63) <= value < 2**63:
                    raise _error(f"{path}[{i}]", f"{value} does not fit in 64 bits")
                if value in seen:
                    raise _error(f"{path}[{i}]", f"the value {value} is listed twice")
                seen.add(value)

    def _check_schedule(self) -> None:
        for name, value in self.schedule.items():
            path = f"schedule.{name}"
            if name not in self.tunables:
                known = ", ".join(sorted(self.tunables)) or "none"
                raise _error(path, f"'{name}' is not a tunable (tunables: {known})")
            if isinstance(value, bool) or not isinstance(value, int):
                raise _error(path, f"expected an integer, got {_describe(value)}")
            if value not in self.tunables[name]:
                raise _error(path, f"{value} is not one of the allowed values {self.tunables[name]}")
        for name in self.tunables:
            if name not in self.schedule:
                raise _error(f"schedule.{name}", f"tunable '{name}' has no value")

    def _check_buffers(self, env: Mapping[str, EnvValue] | None) -> None:
        index_of: dict[str, int] = {}
        for i, buffer in enumerate(self.buffers):
            index_of.setdefault(buffer.name, i)
        for i, buffer in enumerate(self.buffers):
            where = f"buffers[{i}]"
            name = buffer.name
            if not isinstance(name, str) or not _C_IDENTIFIER.fullmatch(name) or keyword.iskeyword(name):
                raise _error(
                    f"{where}.name",
                    f"{_describe(name)} is not a valid buffer name (letters, digits and '_', not starting with a digit)",
                )
            if name in RESERVED_NAMES or name.startswith("__"):
                raise _error(f"{where}.name", f"'{name}' is a reserved name; pick another buffer name")
            if index_of[name] != i:
                raise _error(f"{where}.name", f"buffer '{name}' is already declared as buffers[{index_of[name]}]")
            if env is not None and name in env:
                raise _error(f"{where}.name", f"buffer '{name}' has the same name as an input or parameter of the task")
        for i, buffer in enumerate(self.buffers):
            where = f"buffers[{i}]"
            if not isinstance(buffer.shape, list):
                raise _error(f"{where}.shape", f"expected a list of expressions, got {_describe(buffer.shape)}")
            for j, source in enumerate(buffer.shape):
                path = f"{where}.shape[{j}]"
                expression = _parse(_expr(source, path), path)
                self._check_buffer_order(expression.refs, i, index_of, path, source)
            dtype_name = self._dtype_reference(buffer.dtype, f"{where}.dtype")
            if dtype_name is not None:
                self._check_buffer_order([tuple(dtype_name.split("."))], i, index_of, f"{where}.dtype", buffer.dtype)

    @staticmethod
    def _check_buffer_order(
        refs: Any, i: int, index_of: Mapping[str, int], path: str, source: Expr
    ) -> None:
        for parts in refs:
            j = index_of.get(parts[0])
            if j is not None and j >= i:
                when = "this buffer itself" if j == i else f"declared later (buffers[{j}])"
                raise ProgramError(
                    f"{path} = {quote(str(source))}: it uses buffer '{parts[0]}', which is {when}; "
                    "a buffer can only use inputs, parameters, tunables and earlier buffers",
                    path,
                )

    @staticmethod
    def _dtype_reference(dtype: Any, path: str) -> str | None:
        """Check a dtype field; return the tensor name of "dtype(x)", or None for a plain dtype."""
        if not isinstance(dtype, str):
            raise _error(path, f"expected a dtype name such as \"float32\" or \"dtype(x)\", got {_describe(dtype)}")
        if dtype in DTYPE_SIZES:
            return None
        match = _DTYPE_OF.fullmatch(dtype.strip())
        if match:
            return match.group(1)
        if dtype.startswith("torch.") and dtype[6:] in DTYPE_SIZES:
            raise _error(path, f"write \"{dtype[6:]}\", not \"{dtype}\"")
        raise _error(
            path,
            f"unknown dtype {_describe(dtype)}; use one of {', '.join(DTYPE_SIZES)} or dtype(x) for the dtype of tensor x",
        )

    def _check_launches(self, kernels: Mapping[str, Any]) -> None:
        if not isinstance(self.launches, list) or not self.launches:
            raise _error("launches", "a program needs at least one launch")
        for i, launch in enumerate(self.launches):
            where = f"launches[{i}]"
            kernel = kernels.get(launch.kernel)
            if kernel is None:
                defined = ", ".join(kernels)
                raise _error(
                    f"{where}.kernel",
                    f"there is no __global__ function named {_describe(launch.kernel)} in the source (it defines: {defined})",
                )
            if not kernel.extern_c:
                raise _error(
                    f"{where}.kernel",
                    f"kernel '{launch.kernel}' (source line {kernel.line}) is declared without extern \"C\", so its "
                    f"name is mangled and cannot be launched by name; write extern \"C\" __global__ void {launch.kernel}(...)",
                )
            for part in ("grid", "block"):
                dims = getattr(launch, part)
                if not isinstance(dims, list) or not 1 <= len(dims) <= 3:
                    raise _error(f"{where}.{part}", f"expected a list of 1 to 3 expressions, got {_describe(dims)}")
                for j, source in enumerate(dims):
                    path = f"{where}.{part}[{j}]"
                    _parse(_expr(source, path), path)
            _parse(_expr(launch.shared_bytes, f"{where}.shared_bytes"), f"{where}.shared_bytes")
            if not isinstance(launch.args, list):
                raise _error(f"{where}.args", f"expected a list of argument expressions, got {_describe(launch.args)}")
            for j, source in enumerate(launch.args):
                path = f"{where}.args[{j}]"
                expression = _parse(_expr(source, path), path)
                if expression.constant is not None:
                    raise _error(path, f"{_untyped_message(source, expression.constant)}")

    def _check_outputs(self, env: Mapping[str, EnvValue] | None) -> None:
        if not isinstance(self.outputs, list) or not self.outputs:
            raise _error("outputs", "a program needs at least one output (a buffer name)")
        buffer_names = [b.name for b in self.buffers]
        seen: set[str] = set()
        for i, name in enumerate(self.outputs):
            path = f"outputs[{i}]"
            if name not in buffer_names:
                if env is not None and name in env:
                    raise _error(
                        path,
                        f"output '{name}' aliases input '{name}'; an output must be a fresh buffer declared in "
                        "\"buffers\" (results that alias inputs are rejected)",
                    )
                # Without the task's names, an output that the plan also reads (an input, most likely)
                # is left for resolve(), which can say for certain that it aliases an input.
                if env is not None or name not in self._referenced_names():
                    known = ", ".join(buffer_names) or "none"
                    raise _error(
                        path,
                        f"{_describe(name)} is not a buffer declared in \"buffers\" (buffers: {known}); "
                        "an output must be a fresh buffer of this program",
                    )
            if name in seen:
                raise _error(path, f"output '{name}' is listed twice")
            if any(b.name == name and b.zeroed for b in self.buffers):
                raise _error(path, f"output '{name}' is a zeroed buffer; outputs are filled with NaN before each "
                             "run, so only scratch buffers can be zeroed")
            seen.add(name)

    def _referenced_names(self) -> set[str]:
        """Every (dotted) name, and each dotted prefix, that the plan's expressions read."""
        sources: list[Any] = [e for b in self.buffers for e in b.shape]
        for launch in self.launches:
            sources += [*launch.grid, *launch.block, launch.shared_bytes, *launch.args]
        names: set[str] = set()
        for source in sources:
            try:
                refs = parse_expression(source).refs
            except ProgramError:
                continue
            for parts in refs:
                names.update(".".join(parts[:k]) for k in range(1, len(parts) + 1))
        for b in self.buffers:
            match = _DTYPE_OF.fullmatch(b.dtype.strip()) if isinstance(b.dtype, str) else None
            if match:
                names.add(match.group(1))
        return names

    # ------------------------------------------------------------ resolve

    def resolve(self, env: Mapping[str, TensorInfo | int | float], limits: LaunchLimits = LaunchLimits()) -> ResolvedPlan:
        """Evaluate the plan for concrete inputs.

        ``env`` maps forward input names, state_dict keys and python-scalar inputs to
        TensorInfo or numbers. Buffers join the environment in order, so later buffers and
        the launches can use earlier buffers' shapes.
        """
        self._validate(env)
        scope: dict[str, EnvValue] = dict(env)
        scope.update(self.schedule)

        buffers = []
        total_bytes = 0
        for i, buffer in enumerate(self.buffers):
            where = f"buffers[{i}]"
            shape = []
            for j, source in enumerate(buffer.shape):
                path = f"{where}.shape[{j}]"
                size = _evaluate_int(source, path, scope)
                if size < 1:
                    raise ProgramError(
                        f"{path} = {quote(str(source))} evaluates to {size}; every buffer dimension must be at least 1",
                        path,
                    )
                shape.append(size)
            dtype = self._resolve_dtype(buffer.dtype, f"{where}.dtype", scope)
            count = 1
            for size in shape:
                count *= size
            nbytes = count * DTYPE_SIZES[dtype]
            total_bytes += nbytes
            if nbytes > limits.max_buffer_bytes:
                raise _error(
                    where,
                    f"oversized allocation: buffer '{buffer.name}' of shape {tuple(shape)} and dtype {dtype} asks "
                    f"for {human_bytes(nbytes)} ({nbytes} bytes), more than the limit of "
                    f"{human_bytes(limits.max_buffer_bytes)}",
                )
            if total_bytes > limits.max_buffer_bytes:
                raise _error(
                    "buffers",
                    f"oversized allocation: the buffers up to '{buffer.name}' ask for {human_bytes(total_bytes)} "
                    f"({total_bytes} bytes) together, more than the limit of {human_bytes(limits.max_buffer_bytes)}",
                )
            scope[buffer.name] = TensorInfo(tuple(shape), dtype)
            buffers.append(ResolvedBuffer(buffer.name, tuple(shape), dtype, buffer.zeroed))

        launches = [self._resolve_launch(i, launch, scope, limits) for i, launch in enumerate(self.launches)]
        return ResolvedPlan(tuple(buffers), tuple(launches), tuple(self.outputs))

    @classmethod
    def _resolve_dtype(cls, dtype: str, path: str, scope: Mapping[str, EnvValue]) -> str:
        name = cls._dtype_reference(dtype, path)
        if name is None:
            return dtype
        value = scope.get(name)
        if not isinstance(value, TensorInfo):
            what = "is not defined" if value is None else "is not a tensor"
            raise _error(
                path,
                f"{_describe(dtype)} refers to '{name}', which {what}; dtype() needs the name of an input, parameter or earlier buffer",
            )
        if value.dtype not in DTYPE_SIZES:
            raise _error(path, f"tensor '{name}' has dtype {value.dtype}, which buffers cannot have")
        return value.dtype

    @staticmethod
    def _resolve_launch(i: int, launch: LaunchSpec, scope: Mapping[str, EnvValue], limits: LaunchLimits) -> ResolvedLaunch:
        where = f"launches[{i}]"
        dims: dict[str, tuple[int, int, int]] = {}
        for part, maxima in (("grid", limits.max_grid), ("block", limits.max_block)):
            values = []
            for j, source in enumerate(getattr(launch, part)):
                path = f"{where}.{part}[{j}]"
                value = _evaluate_int(source, path, scope)
                if not 1 <= value <= maxima[j]:
                    raise ProgramError(
                        f"{path} = {quote(str(source))} evaluates to {value}; a {part} dimension "
                        f"{'xyz'[j]} must be between 1 and {maxima[j]}",
                        path,
                    )
                values.append(value)
            values += [1] * (3 - len(values))
            dims[part] = (values[0], values[1], values[2])
        bx, by, bz = dims["block"]
        if bx * by * bz > limits.max_threads_per_block:
            raise _error(
                f"{where}.block",
                f"{bx} x {by} x {bz} = {bx * by * bz} threads per block is more than the limit of {limits.max_threads_per_block}",
            )
        path = f"{where}.shared_bytes"
        shared = _evaluate_int(launch.shared_bytes, path, scope)
        if not 0 <= shared <= limits.max_shared_bytes:
            raise ProgramError(
                f"{path} = {quote(str(launch.shared_bytes))} evaluates to {shared} bytes; dynamic shared memory "
                f"must be between 0 and {limits.max_shared_bytes} bytes ({human_bytes(limits.max_shared_bytes)})",
                path,
            )
        args: list[TensorArg | ScalarArg] = []
        for j, source in enumerate(launch.args):
            path = f"{where}.args[{j}]"
            try:
                value = _parse(source, path).evaluate(scope)
            except ExpressionError as e:
                raise _expression_error(path, e) from None
            if isinstance(value, TensorRef):
                args.append(TensorArg(value.name))
            elif isinstance(value, ScalarArg):
                args.append(value)
            else:
                raise _error(path, _untyped_message(source, value))
        return ResolvedLaunch(launch.kernel, dims["grid"], dims["block"], shared, tuple(args))


def _evaluate_int(source: Expr, path: str, scope: Mapping[str, EnvValue]) -> int:
    try:
        return _parse(source, path).evaluate_int(scope)
    except ExpressionError as e:
        raise _expression_error(path, e) from None


def _untyped_message(source: Expr, value: Any) -> str:
    cast = "float32" if isinstance(value, float) else "int32"
    return (
        f"{quote(str(source))} is an untyped number ({value!r}); scalar arguments need a type, "
        f"e.g. {cast}({source})"
    )


def _safe_name(stem: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", stem)[:128] or "program"
    return name if _PROGRAM_NAME.fullmatch(name) else "p" + name[:127]


def _read_source(data: Mapping[str, Any], base_dir: str | Path | None) -> str:
    if "source" in data and "source_file" in data:
        raise _error("source_file", "give either \"source\" or \"source_file\", not both")
    if "source" in data:
        return _string(data["source"], "source")
    if "source_file" not in data:
        raise _error("source", "this field is required (or \"source_file\", a .cu file next to the program file)")
    relative = _string(data["source_file"], "source_file")
    if base_dir is None:
        raise _error(
            "source_file",
            "a program given as text must carry its CUDA code in \"source\"; \"source_file\" is only "
            "allowed when the program is loaded from a file",
        )
    path = Path(base_dir) / relative
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _error("source_file", f"{_describe(relative)} was not found (looked for {path})") from None
    except UnicodeDecodeError:
        raise _error("source_file", f"{path} is not UTF-8 text") from None
    except OSError as e:
        raise _error("source_file", f"cannot read {path} ({e.strerror or e})") from None
