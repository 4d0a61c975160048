"""The pointwise family: a whole chain of elementwise ops, with broadcasting, in one kernel.

Every output element is computed by one thread from the graph inputs it depends on; inputs of
lower rank or with size-1 dims are read with broadcast offsets. Each op's result is computed in
PyTorch's compute type (fp32 for fp16/bf16) and, when the op's dtype is fp16/bf16, rounded to it,
as eager PyTorch stores every intermediate result.

Knobs: BLOCK threads per block; VEC elements per aligned vector access (one 16-byte load at
most); ITEMS vector groups per thread per tile; GRID 0 = exact grid (one tile per block), else a
grid-stride loop over at most GRID blocks. The kernel checks divisibility and pointer
alignment at run time and falls back to a scalar grid-stride loop, so every schedule is correct
for every shape of the same broadcast pattern; the constraints mask the schedules that would
only take that fallback or break the access limits.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import torch

from core.codegen.cuda_emit import (COMPUTE_CTYPE, ITEMSIZE, PRELUDE, STORAGE_CTYPE, literal, load_expr,
                                    round_to_storage, store_expr)
from core.codegen.errors import CodegenError
from core.codegen.graph import Graph, GraphInput, Node, Ref
from core.codegen.pointwise_ops import (COMPARISONS, CONSTANT_OPS, IDENTITY_OPS, OPS, LoweringError,
                                        is_pointwise)
from core.codegen.schedule import Knob, ScheduleSpec

KNOBS = [
    Knob("BLOCK", (256, 64, 128, 512, 1024), "threads per block"),
    Knob("VEC", (1, 2, 4, 8), "elements per vector access (16 bytes at most)"),
    Knob("ITEMS", (1, 2, 4), "vector groups per thread in one tile"),
    Knob("GRID", (0, 1024, 4096, 16384), "0: exact grid; else grid-stride over at most GRID blocks"),
]
MAX_ACCESS_BYTES = 16


@dataclass
class _Access:
    """How the kernel reads one graph input."""

    value: GraphInput
    cname: str                   # C identifier of the pointer
    mode: str                    # full | suffix | scalar | general
    aligned: tuple[int, ...]     # shape left-padded with 1s to the output rank

    @property
    def ctype(self) -> str:
        return STORAGE_CTYPE[self.value.dtype]


@dataclass
class Lowering:
    """What a family produces: the program as JSON data, its schedule space, notes for people."""

    program: dict[str, Any]      # KernelProgram JSON dict
    spec: ScheduleSpec
    notes: list[str]


def _cname(prefix: str, name: str, taken: set[str]) -> str:
    base = prefix + re.sub(r"\W", "_", name)
    out, i = base, 1
    while out in taken:
        out, i = f"{base}_{i}", i + 1
    taken.add(out)
    return out


def _mode(aligned: tuple[int, ...], shape: tuple[int, ...]) -> str:
    if aligned == shape:
        return "full"
    if math.prod(aligned) == 1:
        return "scalar"
    for k in range(1, len(shape)):
        if all(a == 1 for a in aligned[:k]) and aligned[k:] == shape[k:]:
            return "suffix"
    return "general"


def _check_dtype(graph: Graph, dtype: str, what: str) -> None:
    if dtype not in STORAGE_CTYPE:
        raise CodegenError(f"Task '{graph.task}': {what} has dtype {dtype}, which the pointwise "
                           f"family does not support (float32/64, float16, bfloat16, integers, bool).",
                           task=graph.task)


def lower_pointwise(graph: Graph, kernel: str) -> Lowering:
    """A KernelProgram dict computing every output of a pure elementwise graph in one kernel."""
    bad = [n.op for n in graph.nodes if not is_pointwise(n)]
    if bad:
        raise CodegenError(f"Task '{graph.task}': the pointwise family has no lowering for "
                           f"{', '.join(sorted(set(bad)))}.", task=graph.task, ops=bad)
    values = {v.name: v for v in graph.inputs}
    values.update({n.name: n for n in graph.nodes})
    out_shapes = {tuple(values[o].shape) for o in graph.outputs}
    if len(out_shapes) != 1:
        raise CodegenError(f"Task '{graph.task}': the outputs have different shapes "
                           f"({', '.join(str(list(s)) for s in sorted(out_shapes))}); one pointwise "
                           f"kernel writes outputs of one shape.", task=graph.task)
    shape = out_shapes.pop()
    rank = len(shape)
    n_total = math.prod(shape)
    for v in list(graph.inputs) + graph.nodes:
        _check_dtype(graph, v.dtype, f"'{v.name}'")

    used = {o.name for n in graph.nodes for o in n.operands if isinstance(o, Ref)} | set(graph.outputs)
    taken: set[str] = set()
    accesses: list[_Access] = []
    for v in graph.inputs:
        if v.name not in used:
            continue
        aligned = (1,) * (rank - len(v.shape)) + tuple(v.shape)
        if len(v.shape) > rank or any(a not in (1, s) for a, s in zip(aligned, shape)):
            raise CodegenError(f"Task '{graph.task}': input '{v.name}' of shape {list(v.shape)} does "
                               f"not broadcast to the output shape {list(shape)}.", task=graph.task)
        accesses.append(_Access(v, _cname("in_", v.name, taken), _mode(aligned, tuple(shape)), aligned))
    reserved = {v.name for v in graph.inputs} | set(graph.constants) | {k.name for k in KNOBS}
    out_names = []
    for i, _ in enumerate(graph.outputs):
        name = "out" if len(graph.outputs) == 1 else f"out{i}"
        while name in reserved:
            name = "out_" + name
        reserved.add(name)
        out_names.append(name)
    out_cnames = [_cname("o_", n, taken) for n in out_names]

    body = _emit_body(graph, kernel, accesses, out_names, values)
    source = PRELUDE + body + _emit_kernel(graph, kernel, accesses, out_names, out_cnames, rank)
    dim_exprs = [_dim_expr(accesses, shape, d) for d in range(rank)]
    n_expr = f"{out_names[0]}.numel"
    args: list[str] = [a.value.name for a in accesses] + out_names + [f"int64({n_expr})"]
    args += [f"int64({a.value.name}.numel)" for a in accesses if a.mode == "suffix"]
    if any(a.mode == "general" for a in accesses):
        args += [f"int64({out_names[0]}.shape[{d}])" for d in range(rank)]
        for a in accesses:
            if a.mode == "general":
                args += [f"int64({_stride_expr(a, d, rank)})" for d in range(rank) if a.aligned[d] != 1]
    tiles = f"cdiv({n_expr}, BLOCK * VEC * ITEMS)"
    program = {
        "format": "cuda-agent/program@1",
        "name": kernel,
        "source": source,
        "tunables": {k.name: list(k.values) for k in KNOBS},
        "schedule": {k.name: k.values[0] for k in KNOBS},
        "buffers": [{"name": name, "shape": dim_exprs, "dtype": values[o].dtype}
                    for name, o in zip(out_names, graph.outputs)],
        "launches": [{"kernel": kernel, "grid": [f"{tiles} if GRID == 0 else min({tiles}, GRID)"],
                      "block": ["BLOCK"], "shared_bytes": 0, "args": args}],
        "outputs": out_names,
    }
    vector_dtypes = [a.value.dtype for a in accesses if a.mode in ("full", "suffix")]
    vector_dtypes += [values[o].dtype for o in graph.outputs]
    divisors = {"the element count": n_total, "the innermost size": shape[-1] if shape else 1}
    divisors.update({f"the size of '{a.value.name}'": math.prod(a.value.shape)
                     for a in accesses if a.mode == "suffix"})
    spec = ScheduleSpec(list(KNOBS), _constraints(n_total, vector_dtypes, divisors))
    notes = [f"pointwise: {len(graph.nodes)} ops fused into one kernel over {n_total} elements "
             f"of shape {list(shape)}"]
    notes += [f"input '{a.value.name}' {a.value.dtype}{list(a.value.shape)}: {a.mode} access" for a in accesses]
    return Lowering(program, spec, notes)


def _dim_expr(accesses: list[_Access], shape: tuple[int, ...], d: int) -> str:
    rank = len(shape)
    for a in accesses:
        offset = rank - len(a.value.shape)
        if d >= offset and a.aligned[d] == shape[d]:
            return f"{a.value.name}.shape[{d - offset}]"
    return str(shape[d])


def _stride_expr(a: _Access, d: int, rank: int) -> str:
    offset = rank - len(a.value.shape)
    later = [f"{a.value.name}.shape[{j - offset}]" for j in range(d + 1, rank)]
    return " * ".join(later) if later else "1"


def _constraints(n: int, vector_dtypes: list[str], divisors: dict[str, int]) -> list:
    widest = max(vector_dtypes, key=lambda dt: ITEMSIZE[dt])

    def access_bytes(s: Any) -> str | None:
        nbytes = s["VEC"] * ITEMSIZE[widest]
        if nbytes > MAX_ACCESS_BYTES:
            return (f"VEC={s['VEC']} needs {nbytes}-byte accesses of {widest}; the widest load or "
                    f"store is {MAX_ACCESS_BYTES} bytes")
        return None

    def divisible(s: Any) -> str | None:
        for what, size in divisors.items():
            if size % s["VEC"]:
                return (f"VEC={s['VEC']} does not divide {what} ({size}): the kernel would only "
                        f"take its scalar fallback")
        return None

    def tile_size(s: Any) -> str | None:
        tile = s["BLOCK"] * s["VEC"] * s["ITEMS"]
        if s["VEC"] * s["ITEMS"] > 1 and tile > n:
            return f"a tile of BLOCK*VEC*ITEMS = {tile} elements is larger than the tensor ({n})"
        return None

    def grid_cap(s: Any) -> str | None:
        tiles = -(-n // (s["BLOCK"] * s["VEC"] * s["ITEMS"]))
        if s["GRID"] and s["GRID"] >= tiles:
            return f"GRID={s['GRID']} caps nothing: the exact grid has only {tiles} blocks"
        return None

    return [access_bytes, divisible, tile_size, grid_cap]


# ---- C emission ---------------------------------------------------------------------------------

def _meta(value: Any, values: dict[str, Any]) -> Any:
    """A meta tensor (or the python scalar) standing for an operand, for torch's type promotion."""
    if isinstance(value, Ref):
        v = values[value.name]
        return torch.empty(v.shape, dtype=getattr(torch, v.dtype), device="meta")
    return value


def _promoted(node: Node, operands: list[Any], values: dict[str, Any]) -> str:
    """The dtype PyTorch compares two operands in (python scalars are weakly typed)."""
    a, b = (_meta(o, values) for o in operands)
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return node.dtype
    return str(torch.result_type(a, b)).removeprefix("torch.")


def _emit_body(graph: Graph, kernel: str, accesses: list[_Access], out_names: list[str],
               values: dict[str, Any]) -> str:
    params = [f"{a.ctype} r_{a.cname}" for a in accesses]
    params += [f"{STORAGE_CTYPE[values[o].dtype]}& r_{name}" for o, name in zip(graph.outputs, out_names)]
    lines = ["// The elementwise chain for one element: raw stored inputs in, raw stored outputs out.",
             f"CA_HD void {kernel}_body({', '.join(params)}) {{"]
    var: dict[str, tuple[str, str]] = {}   # value name -> (C variable, compute ctype)
    for a in accesses:
        ct = COMPUTE_CTYPE[a.value.dtype]
        lines.append(f"    const {ct} {a.cname} = {load_expr(a.value.dtype, 'r_' + a.cname)};")
        var[a.value.name] = (a.cname, ct)
    for i, node in enumerate(graph.nodes):
        ct = COMPUTE_CTYPE[node.dtype]
        cvar = f"v{i}"
        try:
            expr = _node_expr(node, ct, var, values)
        except LoweringError as exc:
            raise CodegenError(f"Task '{graph.task}': the pointwise family cannot lower "
                               f"'{node.op}' here: {exc} is not supported.", task=graph.task,
                               ops=[node.op]) from exc
        lines += assign_node(node, ct, cvar, expr, "    ")
        var[node.name] = (cvar, ct)
    for o, name in zip(graph.outputs, out_names):
        cvar, _ = var[o]
        lines.append(f"    r_{name} = {store_expr(values[o].dtype, cvar)};")
    lines.append("}\n")
    return "\n".join(lines) + "\n"


def assign_node(node: Node, ct: str, cvar: str, expr: str, indent: str) -> list[str]:
    """C lines computing one node into `cvar`, rounded to its dtype when that is fp16/bf16 (eager
    stores every intermediate result in the op's dtype). Shared by every family's element code."""
    lines = [f"{indent}{ct} {cvar} = {expr};  // {node.op}"]
    rounded = round_to_storage(node.dtype, cvar)
    if rounded != cvar:
        lines.append(f"{indent}{cvar} = {rounded};  // stored as {node.dtype} between ops, as eager does")
    return lines


def _convert(operand: Any, ct: str, var: dict[str, tuple[str, str]]) -> str:
    if isinstance(operand, Ref):
        cvar, have = var[operand.name]
        return cvar if have == ct else f"(({ct}){cvar})"
    if operand is None:
        raise LoweringError("a missing operand")
    return literal(operand, ct)


def _node_expr(node: Node, ct: str, var: dict[str, tuple[str, str]], values: dict[str, Any]) -> str:
    base = node.base
    operands = list(node.operands)
    if "Scalar" in node.op.partition(".")[2] and "other" in node.attrs:
        operands.append(node.attrs["other"])   # the *.Scalar overloads take `other` as a Scalar
    if base in CONSTANT_OPS:
        fill = node.attrs.get("s", node.attrs.get("fill_value"))
        if isinstance(fill, Ref) or fill is None:
            raise LoweringError(f"{base} with a tensor fill value")
        return literal(fill, ct)
    if base in IDENTITY_OPS:
        return _convert(operands[0], ct, var)
    if base in COMPARISONS:
        cmp_ct = COMPUTE_CTYPE[_promoted(node, operands[:2], values)]
        a, b = (_convert(o, cmp_ct, var) for o in operands[:2])
        return f"({a} {COMPARISONS[base]} {b})"
    if base == "where":
        cond = _convert(operands[0], "bool", var)
        a, b = (_convert(o, ct, var) for o in operands[1:3])
        return OPS[base](node, [cond, a, b], ct)
    args = [_convert(o, ct, var) for o in operands if o is not None]
    return OPS[base](node, args, ct)


def _emit_kernel(graph: Graph, kernel: str, accesses: list[_Access], out_names: list[str],
                 out_cnames: list[str], rank: int) -> str:
    values = {v.name: v for v in graph.inputs}
    values.update({n.name: n for n in graph.nodes})
    out_types = [STORAGE_CTYPE[values[o].dtype] for o in graph.outputs]
    params = [f"const {a.ctype}* __restrict__ {a.cname}" for a in accesses]
    params += [f"{t}* __restrict__ {c}" for t, c in zip(out_types, out_cnames)]
    params.append("long long n")
    params += [f"long long m_{a.cname}" for a in accesses if a.mode == "suffix"]
    general = [a for a in accesses if a.mode == "general"]
    if general:
        params += [f"long long d{d}" for d in range(rank)]
        for a in general:
            params += [f"long long s_{a.cname}_{d}" for d in range(rank) if a.aligned[d] != 1]

    def offset(a: _Access, e: str) -> str:
        if a.mode == "full":
            return e
        if a.mode == "suffix":
            return f"{e} % m_{a.cname}"
        if a.mode == "scalar":
            return "0"
        return f"off_{a.cname}"

    def general_offsets(e: str, indent: str) -> list[str]:
        if not general:
            return []
        lines = [f"{indent}long long rem = {e};"]
        lines += [f"{indent}long long off_{a.cname} = 0;" for a in general]
        for d in reversed(range(rank)):
            lines.append(f"{indent}{{ const long long c = rem % d{d}; rem /= d{d};"
                         + "".join(f" off_{a.cname} += c * s_{a.cname}_{d};"
                                   for a in general if a.aligned[d] != 1) + " }")
        return lines

    vec_checks = ["n % VEC == 0"]
    vec_checks += [f"m_{a.cname} % VEC == 0" for a in accesses if a.mode == "suffix"]
    vec_checks += [f"aligned_to<VEC * sizeof({a.ctype})>({a.cname})" for a in accesses
                   if a.mode in ("full", "suffix")]
    vec_checks += [f"aligned_to<VEC * sizeof({t})>({c})" for t, c in zip(out_types, out_cnames)]
    lines = [
        "extern \"C\" __global__ void __launch_bounds__(BLOCK)",
        f"{kernel}({', '.join(params)})",
        "{",
        "    const long long tile = (long long)BLOCK * VEC * ITEMS;",
        "    // Uniform per launch: vector accesses need whole, aligned groups of VEC elements.",
        f"    const bool vec_ok = {' && '.join(vec_checks)};",
        "    if (vec_ok) {",
        "        for (long long base = (long long)blockIdx.x * tile; base < n; base += (long long)gridDim.x * tile) {",
        "            #pragma unroll",
        "            for (int it = 0; it < ITEMS; ++it) {",
        "                const long long i = base + ((long long)it * BLOCK + threadIdx.x) * VEC;",
        "                if (i >= n) continue;",
    ]
    ind = " " * 16
    for a in accesses:
        if a.mode in ("full", "suffix"):
            lines.append(f"{ind}const vec_t<{a.ctype}, VEC> L_{a.cname} = "
                         f"*reinterpret_cast<const vec_t<{a.ctype}, VEC>*>({a.cname} + ({offset(a, 'i')}));")
    for t, c in zip(out_types, out_cnames):
        lines.append(f"{ind}vec_t<{t}, VEC> R_{c};")
    lines += [f"{ind}#pragma unroll", f"{ind}for (int k = 0; k < VEC; ++k) {{"]
    if general:
        lines += general_offsets("i + k", ind + "    ")
    call = []
    for a in accesses:
        call.append(f"L_{a.cname}.v[k]" if a.mode in ("full", "suffix") else f"{a.cname}[{offset(a, 'i + k')}]")
    call += [f"R_{c}.v[k]" for c in out_cnames]
    lines.append(f"{ind}    {kernel}_body({', '.join(call)});")
    lines.append(f"{ind}}}")
    for t, c in zip(out_types, out_cnames):
        lines.append(f"{ind}*reinterpret_cast<vec_t<{t}, VEC>*>({c} + i) = R_{c};")
    lines += ["            }", "        }", "    } else {",
              "        // Scalar fallback: any size, any alignment, any grid.",
              "        for (long long e = (long long)blockIdx.x * BLOCK + threadIdx.x; e < n; "
              "e += (long long)gridDim.x * BLOCK) {"]
    lines += general_offsets("e", " " * 12)
    call = [f"{a.cname}[{offset(a, 'e')}]" for a in accesses] + [f"{c}[e]" for c in out_cnames]
    lines += [f"            {kernel}_body({', '.join(call)});", "        }", "    }", "}", ""]
    return "\n".join(lines)
