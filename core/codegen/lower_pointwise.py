"""The pointwise family: a whole chain of elementwise ops, with broadcasting, in one kernel.

Every output element is computed by one thread from the graph inputs it depends on; inputs of
lower rank or with size-1 dims are read with broadcast offsets. Each op's result is computed in
PyTorch's compute type (fp32 for fp16/bf16) and, when the op's dtype is fp16/bf16, rounded to it,
as eager PyTorch stores every intermediate result (a rounding that the store or a clamp reading the
value repeats is skipped). Results that are rounded to fp16/bf16 anyway use the cheap forms of
pointwise_ops.FAST_OPS (fast_nodes). docs/codegen.md, "Element code", has the error bounds.

Knobs: BLOCK threads per block; VEC elements per aligned vector access (one 16-byte load at
most); ITEMS vector groups per thread per tile; GRID 0 = exact grid (one tile per block), else a
grid-stride loop over at most GRID blocks. The kernel checks divisibility and pointer
alignment at run time and falls back to a scalar grid-stride loop, so every schedule is correct
for every shape of the same broadcast pattern; the constraints mask the schedules that would
only take that fallback or break the access limits. The program's default schedule is 16-byte
vectors with ITEMS=2 where the constraints allow (default_schedule), not the knobs' first values.

Indexing: 32-bit (unsigned) when no index of the launch can pass INDEX32_LIMIT, else 64-bit,
decided once per launch. General-mode inputs are read through the output's dims merged where
every such input broadcasts alike (_Layout), with one offset per vector. At the shapes the program
was generated for, the kernel hands the element loops its sizes as literals, so every division is
a multiply and a shift; other shapes of the same pattern get run-time sizes and a scalar loop.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from core.codegen.cuda_emit import (COMPUTE_CTYPE, ITEMSIZE, PRELUDE, STORAGE_CTYPE, literal, load_expr,
                                    round_to_storage, store_expr)
from core.codegen.errors import CodegenError
from core.codegen.graph import Graph, GraphInput, Node, Ref
from core.codegen.pointwise_ops import (CLASSIFY, COMPARISONS, CONSTANT_OPS, FAST_OPS, IDENTITY_OPS, OPS, LoweringError,
                                        div_by_literal, is_pointwise)
from core.codegen.schedule import Knob, ScheduleSpec

KNOBS = [
    Knob("BLOCK", (256, 64, 128, 512, 1024), "threads per block"),
    Knob("VEC", (1, 2, 4, 8), "elements per vector access (16 bytes at most)"),
    Knob("ITEMS", (1, 2, 4), "vector groups per thread in one tile"),
    Knob("GRID", (0, 1024, 4096, 16384), "0: exact grid; else grid-stride over at most GRID blocks"),
]
MAX_ACCESS_BYTES = 16
MAX_TILE = max(KNOBS[0].values) * max(KNOBS[1].values) * max(KNOBS[2].values)   # BLOCK * VEC * ITEMS
# The largest index (grid-stride steps included) the 32-bit path may reach. The tests lower it to run
# the 64-bit path on small tensors.
INDEX32_LIMIT = 0xFFFFFFFF


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
class _Layout:
    """The output's dims as the general-mode accesses see them. Size-1 dims are dropped, and
    neighbours that every general access treats alike (broadcast along both, or along neither) are
    merged: [N, C, H, W] read with a [1, C, 1, 1] weight is [N, C, H*W], so the weight's offset is
    `(i / HW) % C`. Empty when no input is read in general mode."""

    sizes: list[int] = field(default_factory=list)    # merged dims at the generation shapes, outer first
    exprs: list[str] = field(default_factory=list)    # the same, as plan expressions
    masks: list[tuple[bool, ...]] = field(default_factory=list)  # distinct patterns: dims an access varies along
    mask_of: dict[str, int] = field(default_factory=dict)        # general access's cname -> its pattern
    first: int = 0                                    # the outermost merged dim any pattern varies along

    @property
    def passed(self) -> list[int]:
        """The merged dims whose sizes the kernel takes: `first` and those inside it, but never dim 0
        (its coordinate is the quotient left over)."""
        return list(range(max(self.first, 1), len(self.sizes))) if self.sizes else []

    def vector(self, a: _Access) -> bool:
        """A general access that varies along the innermost merged dim: VEC consecutive elements
        of it are consecutive in memory (a vector load). The others hold one value per vector."""
        return a.mode == "general" and self.masks[self.mask_of[a.cname]][-1]


def output_names(count: int, reserved: set[str]) -> list[str]:
    """Names for a kernel's output buffers ("out", or "out0", "out1", ...), clear of `reserved` (the
    group's inputs and other names), which they are added to."""
    names = []
    for i in range(count):
        name = "out" if count == 1 else f"out{i}"
        while name in reserved:
            name = "out_" + name
        reserved.add(name)
        names.append(name)
    return names


def _layout(shape: tuple[int, ...], out: str, accesses: list[_Access]) -> _Layout:
    general = [a for a in accesses if a.mode == "general"]
    if not general:
        return _Layout()
    groups: list[list[int]] = []
    for d in (d for d in range(len(shape)) if shape[d] != 1):
        if groups and all((a.aligned[d] != 1) == (a.aligned[groups[-1][-1]] != 1) for a in general):
            groups[-1].append(d)
        else:
            groups.append([d])
    layout = _Layout([math.prod(shape[d] for d in g) for g in groups],
                     [" * ".join(f"{out}.shape[{d}]" for d in g) for g in groups])
    for a in general:
        # Broadcast along some merged dims and not others (else it would be full or scalar mode).
        mask = tuple(a.aligned[g[0]] != 1 for g in groups)
        if mask not in layout.masks:
            layout.masks.append(mask)
        layout.mask_of[a.cname] = layout.masks.index(mask)
    layout.first = min(m.index(True) for m in layout.masks)
    return layout


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
    out_names = output_names(len(graph.outputs), reserved)
    out_cnames = [_cname("o_", n, taken) for n in out_names]

    layout = _layout(tuple(shape), out_names[0], accesses)
    body = _emit_body(graph, kernel, accesses, out_names, values)
    source = PRELUDE + body + _emit_kernel(graph, kernel, accesses, out_cnames, layout, n_total)
    dim_exprs = [_dim_expr(accesses, shape, d) for d in range(rank)]
    n_expr = f"{out_names[0]}.numel"
    args: list[str] = [a.value.name for a in accesses] + out_names + [f"int64({n_expr})"]
    args += [f"int64({a.value.name}.numel)" for a in accesses if a.mode == "suffix"]
    args += [f"int64({layout.exprs[g]})" for g in layout.passed]
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
    vector_dtypes = [a.value.dtype for a in accesses if a.mode in ("full", "suffix") or layout.vector(a)]
    vector_dtypes += [values[o].dtype for o in graph.outputs]
    divisors = {"the element count": n_total, "the innermost size": shape[-1] if shape else 1}
    divisors.update({f"the size of '{a.value.name}'": math.prod(a.value.shape)
                     for a in accesses if a.mode == "suffix"})
    spec = ScheduleSpec(list(KNOBS), _constraints(n_total, vector_dtypes, divisors))
    program["schedule"] = default_schedule(spec, vector_dtypes)
    notes = [f"pointwise: {len(graph.nodes)} ops fused into one kernel over {n_total} elements "
             f"of shape {list(shape)}"]
    notes += [f"input '{a.value.name}' {a.value.dtype}{list(a.value.shape)}: {a.mode} access" for a in accesses]
    return Lowering(program, spec, notes)


def default_schedule(spec: ScheduleSpec, vector_dtypes: list[str]) -> dict[str, int]:
    """The program's default: 16-byte accesses of the widest vector-accessed dtype (VEC=4 fp32, 8 fp16)
    and ITEMS=2, the shape of the best schedules of the H200 sweep (2026-11-30: BLOCK 128-256,
    16-byte VEC, ITEMS 2-4, exact grid; 1.7-2.6x faster than the scalar default). Narrower vectors,
    then fewer items, then smaller blocks where the constraints refuse it (small or oddly sized
    tensors); the knobs' first values (always legal) last. The knob value lists stay as they are."""
    widest = max(ITEMSIZE[dt] for dt in vector_dtypes)
    vecs = [v for v in sorted(KNOBS[1].values, reverse=True) if v * widest <= MAX_ACCESS_BYTES]
    first = spec.default()
    for vec in vecs:
        for items in (2, 1):
            for block in (256, 128, 64):
                candidate = {**first, "BLOCK": block, "VEC": vec, "ITEMS": items, "GRID": 0}
                if spec.legal(candidate):
                    return candidate
    return first


def _dim_expr(accesses: list[_Access], shape: tuple[int, ...], d: int) -> str:
    rank = len(shape)
    for a in accesses:
        offset = rank - len(a.value.shape)
        if d >= offset and a.aligned[d] == shape[d]:
            return f"{a.value.name}.shape[{d - offset}]"
    return str(shape[d])


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
    fast = fast_nodes(graph)
    read = {o.name for n in graph.nodes for o in n.operands if isinstance(o, Ref)}
    deferred = _rounded_by_reader(graph)
    for i, node in enumerate(graph.nodes):
        ct = COMPUTE_CTYPE[node.dtype]
        cvar = f"v{i}"
        try:
            expr = _node_expr(node, ct, var, values, fast=node.name in fast)
        except LoweringError as exc:
            raise CodegenError(f"Task '{graph.task}': the pointwise family cannot lower "
                               f"'{node.op}' here: {exc} is not supported.", task=graph.task,
                               ops=[node.op]) from exc
        if node.name in read and node.name not in deferred:
            lines += assign_node(node, ct, cvar, expr, "    ")
        else:   # the store, or the clamp reading it, rounds it: rounding here would convert twice
            lines.append(f"    {ct} {cvar} = {expr};  // {node.op}")
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


def graph_readers(graph: Graph) -> dict[str, list[Node]]:
    """Value name -> the nodes that read it, in graph order."""
    readers: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for o in n.operands:
            if isinstance(o, Ref):
                readers.setdefault(o.name, []).append(n)
    return readers


def fast_nodes(graph: Graph) -> set[str]:
    """Nodes whose float result is rounded to fp16/bf16 before anything reads it: fp16/bf16 nodes,
    and fp32 nodes read only by conversions to fp16/bf16 (a decomposition computing in fp32 and
    casting back, like hardswish's). Their math may use FAST_OPS, whose error (~1e-6 relative) is
    far below that rounding's (2^-11 fp16, 2^-8 bf16)."""
    readers = graph_readers(graph)
    fast: set[str] = set()
    for node in reversed(graph.nodes):
        if node.dtype in ("float16", "bfloat16"):
            fast.add(node.name)
        elif node.dtype == "float32" and node.name not in graph.outputs and readers.get(node.name) and all(
                r.name in fast and r.base in IDENTITY_OPS for r in readers[node.name]):
            fast.add(node.name)
    return fast


# Readers that commute with rounding to their own fp16/bf16 dtype when their bounds are values of it
# (rounding is monotone): round(clamp(x)) == clamp(round(x)), bit for bit, NaN included.
_CLAMPS = {"clamp": ("min", "max"), "clamp_min": ("min",), "clamp_max": ("max",),
           "hardtanh": ("min_val", "max_val"), "relu": ()}


def _rounded_by_reader(graph: Graph) -> set[str]:
    """fp16/bf16 nodes whose every reader is such a clamp of the same dtype reading them as its input
    (a node that is also an output is stored from its own, rounded, value): their rounding is left
    to the clamp's, saving one conversion pair per element."""
    readers = graph_readers(graph)

    def commutes(r: Node, name: str, dtype: str) -> bool:
        bounds = _CLAMPS.get(r.base)
        if bounds is None or r.dtype != dtype or not r.operands or r.operands[0] != Ref(name):
            return False
        if any(isinstance(o, Ref) for o in r.operands[1:]):
            return False
        for key in bounds:
            b = r.attrs.get(key)
            if isinstance(b, Ref):
                return False
            if b is not None and float(torch.tensor(float(b), dtype=getattr(torch, dtype)).item()) != float(b):
                return False
        return True

    return {n.name for n in graph.nodes if n.dtype in ("float16", "bfloat16") and n.name not in graph.outputs
            and readers.get(n.name) and all(commutes(r, n.name, n.dtype) for r in readers[n.name])}


def _convert(operand: Any, ct: str, var: dict[str, tuple[str, str]]) -> str:
    if isinstance(operand, Ref):
        cvar, have = var[operand.name]
        return cvar if have == ct else f"(({ct}){cvar})"
    if operand is None:
        raise LoweringError("a missing operand")
    return literal(operand, ct)


def _node_expr(node: Node, ct: str, var: dict[str, tuple[str, str]], values: dict[str, Any],
               fast: bool = False) -> str:
    """The C expression of one node. fast: its result is rounded to fp16/bf16 before it is read
    (see fast_nodes), so FAST_OPS forms may be used."""
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
    if base in CLASSIFY:
        if isinstance(operands[0], Ref):
            return CLASSIFY[base](*var[operands[0].name])
        raise LoweringError(f"{base} of a python number")
    if base in COMPARISONS:
        cmp_ct = COMPUTE_CTYPE[_promoted(node, operands[:2], values)]
        a, b = (_convert(o, cmp_ct, var) for o in operands[:2])
        return f"({a} {COMPARISONS[base]} {b})"
    if base == "where":
        cond = _convert(operands[0], "bool", var)
        a, b = (_convert(o, ct, var) for o in operands[1:3])
        return OPS[base](node, [cond, a, b], ct)
    if node.op == "clamp.Tensor":
        # min and max are each a tensor, a number or absent: keep their places.
        bounds = [None if o is None else _convert(o, ct, var) for o in (operands + [None, None])[1:3]]
        return OPS[node.op](node, [_convert(operands[0], ct, var), *bounds], ct)
    args = [_convert(o, ct, var) for o in operands if o is not None]
    if (base == "div" and node.attrs.get("rounding_mode") is None and len(operands) == 2
            and isinstance(operands[1], (int, float)) and not isinstance(operands[1], bool)):
        by_literal = div_by_literal(args[0], operands[1], ct)   # no IEEE division (FCHK + slow path)
        if by_literal is not None:
            return by_literal
    if fast and ct == "float" and base in FAST_OPS:
        return FAST_OPS[base](node, args, ct)
    return OPS[base](node, args, ct)


def _offset_lines(layout: _Layout, idx: str, indent: str) -> list[str]:
    """C lines computing `off<k>`, the offset of every general-mode pattern k, at output index `idx`.
    Coordinates come from the innermost merged dim outwards; the outermost one needed is what is
    left (no modulo), and dims further out are never divided by."""
    q, first = len(layout.sizes), layout.first
    used = {g for mask in layout.masks for g in range(q) if mask[g]}
    lines = [f"{indent}I r = {idx};"]
    for g in range(q - 1, first - 1, -1):
        step = ""
        if g in used:
            step = f"const I c{g} = {'r' if g == 0 else f'r % d{g}'};"
        if g > first:
            step += f" r /= d{g};"
        lines.append(indent + step.strip())
    for k, mask in enumerate(layout.masks):
        terms = []
        for g in range(q):
            if mask[g]:
                stride = [f"d{h}" for h in range(g + 1, q) if mask[h]]
                terms.append(f"c{g} * ({' * '.join(stride)})" if stride else f"c{g}")
        lines.append(f"{indent}const I off{k} = {' + '.join(terms)};")
    return lines


def _emit_kernel(graph: Graph, kernel: str, accesses: list[_Access], out_cnames: list[str], layout: _Layout,
                 n_total: int) -> str:
    values = {v.name: v for v in graph.inputs}
    values.update({n.name: n for n in graph.nodes})
    out_types = [STORAGE_CTYPE[values[o].dtype] for o in graph.outputs]
    suffix = [a for a in accesses if a.mode == "suffix"]
    sizes = ["n"] + [f"m_{a.cname}" for a in suffix] + [f"d{g}" for g in layout.passed]
    at_generation = [n_total] + [math.prod(a.value.shape) for a in suffix] + [layout.sizes[g] for g in layout.passed]
    pointers = [f"const {a.ctype}* __restrict__ {a.cname}" for a in accesses]
    pointers += [f"{t}* __restrict__ {c}" for t, c in zip(out_types, out_cnames)]
    vectors = [a for a in accesses if a.mode in ("full", "suffix") or layout.vector(a)]
    per_vector = [a for a in accesses if a.mode == "general" and not layout.vector(a)]
    scalars = [a for a in accesses if a.mode == "scalar"]

    def offset(a: _Access, e: str) -> str:
        if a.mode == "full":
            return e
        if a.mode == "suffix":
            return f"{e} % m_{a.cname}"
        return f"off{layout.mask_of[a.cname]}"

    vec_checks = ["n % VEC == 0"] + [f"m_{a.cname} % VEC == 0" for a in suffix]
    if layout.sizes:   # a vector must not cross the innermost merged dim: its broadcast offsets are per vector
        vec_checks.append(f"d{len(layout.sizes) - 1} % VEC == 0")
    vec_checks += [f"aligned_to<VEC * sizeof({a.ctype})>({a.cname})" for a in vectors]
    vec_checks += [f"aligned_to<VEC * sizeof({t})>({c})" for t, c in zip(out_types, out_cnames)]
    ind = " " * 12
    lines = [
        "#ifdef __CUDACC__  // device code (the host build of the element body in the CPU tests stops here)",
        f"// The element loops of {kernel}, generic in the index type I. The kernel passes the sizes of the",
        "// generation shapes as literals (division by a constant is a multiply and a shift); other sizes as",
        "// 32- or 64-bit values, to a scalar loop only (VECTORS = false) where that keeps the code small.",
        "template <typename I, bool VECTORS>",
        f"CA_HD void {kernel}_run({', '.join(pointers + [f'const I {s}' for s in sizes])})",
        "{",
        "    const I tile = (I)BLOCK * VEC * ITEMS;",
    ]
    lines += [f"    const {a.ctype} S_{a.cname} = {a.cname}[0];" for a in scalars]
    lines += [
        "    // Uniform per launch: vector accesses need whole, aligned groups of VEC elements (and VECTORS).",
        f"    const bool vec_ok = {' && '.join(['VECTORS'] + vec_checks)};",
        "    if (vec_ok) {",
        "        for (I base = (I)blockIdx.x * tile; base < n; base += (I)gridDim.x * tile) {",
    ]
    lines += [f"            vec_t<{a.ctype}, VEC> L_{a.cname}[ITEMS];" for a in vectors]
    lines += [f"            {a.ctype} B_{a.cname}[ITEMS];  // one value per vector (broadcast along it)"
              for a in per_vector]
    lines += [
        "            // Every load of the tile first: ITEMS vectors of each input in flight at once.",
        "            #pragma unroll",
        "            for (int it = 0; it < ITEMS; ++it) {",
        "                const I i = base + ((I)it * BLOCK + threadIdx.x) * VEC;",
        "                if (i >= n) continue;",
    ]
    if layout.sizes:
        lines += _offset_lines(layout, "i", ind + "    ")
    lines += [f"{ind}    L_{a.cname}[it] = *reinterpret_cast<const vec_t<{a.ctype}, VEC>*>"
              f"({a.cname} + ({offset(a, 'i')}));" for a in vectors]
    lines += [f"{ind}    B_{a.cname}[it] = {a.cname}[{offset(a, 'i')}];" for a in per_vector]
    lines += [
        "            }",
        "            #pragma unroll",
        "            for (int it = 0; it < ITEMS; ++it) {",
        "                const I i = base + ((I)it * BLOCK + threadIdx.x) * VEC;",
        "                if (i >= n) continue;",
    ]
    lines += [f"{ind}    vec_t<{t}, VEC> R_{c};" for t, c in zip(out_types, out_cnames)]
    call = [f"S_{a.cname}" if a.mode == "scalar" else f"B_{a.cname}[it]" if a in per_vector
            else f"L_{a.cname}[it].v[k]" for a in accesses]
    call += [f"R_{c}.v[k]" for c in out_cnames]
    lines += [f"{ind}    #pragma unroll", f"{ind}    for (int k = 0; k < VEC; ++k)",
              f"{ind}        {kernel}_body({', '.join(call)});"]
    lines += [f"{ind}    *reinterpret_cast<vec_t<{t}, VEC>*>({c} + i) = R_{c};" for t, c in zip(out_types, out_cnames)]
    lines += ["            }", "        }", "    } else {",
              "        // Scalar fallback: any size, any alignment, any grid.",
              "        for (I e = (I)blockIdx.x * BLOCK + threadIdx.x; e < n; e += (I)gridDim.x * BLOCK) {"]
    if layout.sizes:
        lines += _offset_lines(layout, "e", ind)
    call = [f"S_{a.cname}" if a.mode == "scalar" else f"{a.cname}[{offset(a, 'e')}]" for a in accesses]
    call += [f"{c}[e]" for c in out_cnames]
    lines += [f"{ind}{kernel}_body({', '.join(call)});", "        }", "    }", "}", "#endif", ""]

    names = [a.cname for a in accesses] + out_cnames
    divides = len(sizes) > 1                                 # suffix or general inputs: sizes to divide by
    big = n_total + (n_total + MAX_TILE) > INDEX32_LIMIT     # the generation shapes may need 64-bit indices
    fits = n_total + min(KNOBS[0].values) <= INDEX32_LIMIT   # they may take the 32-bit path

    def run(itype: str, vectors: bool, args: list[str]) -> str:
        return f"{kernel}_run<{itype}, {'true' if vectors else 'false'}>({', '.join(names + args)});"

    def literal(itype: str, suffix_: str, indent: str) -> list[str]:
        test = " && ".join(f"a_{s} == {v}LL" for s, v in zip(sizes, at_generation))
        return [f"{indent}if ({test}) {{  // the shapes the program was generated for",
                f"{indent}    {run(itype, True, [f'{v}{suffix_}' for v in at_generation])}",
                f"{indent}    return;", f"{indent}}}"]

    lines += [
        "extern \"C\" __global__ void __launch_bounds__(BLOCK)",
        f"{kernel}({', '.join(pointers + [f'long long a_{s}' for s in sizes])})",
        "{",
        f"    // Per launch, uniformly: 32-bit indices when none can pass {INDEX32_LIMIT} (grid-stride steps included).",
        f"    if (a_n + (long long)gridDim.x * (BLOCK * VEC * ITEMS) <= {INDEX32_LIMIT}LL) {{",
    ]
    if divides and fits:
        lines += literal("unsigned", "u", " " * 8)
    if divides:
        lines.append("        // Other shapes divide by run-time sizes: a scalar loop keeps the code small.")
    lines += [f"        {run('unsigned', not divides, [f'(unsigned)a_{s}' for s in sizes])}",
              "        return;", "    }"]
    if divides and big:
        lines += literal("unsigned long long", "ull", " " * 4)
    lines += [f"    {run('unsigned long long', big and not divides, [f'(unsigned long long)a_{s}' for s in sizes])}",
              "}", ""]
    return "\n".join(lines)


# ---- an anchor's elementwise epilogue (the pool and move families) ---------------------------------

def broadcast_offset(shape_in: tuple[int, ...], shape: tuple[int, ...]) -> str:
    """C offset into a contiguous tensor of shape `shape_in` of the element that broadcasts to
    flat index `e` of `shape`."""
    aligned = (1,) * (len(shape) - len(shape_in)) + tuple(shape_in)
    if aligned == shape:
        return "e"
    if math.prod(shape_in) == 1:
        return "0"
    terms = []
    for d, size in enumerate(shape):
        if aligned[d] == 1 or size == 1:
            continue
        inner = math.prod(shape[d + 1:])
        coord = "e" if inner == 1 else f"(e / {inner}LL)"
        if d > 0:
            coord = f"({coord} % {size}LL)"
        stride = math.prod(aligned[d + 1:])
        terms.append(coord if stride == 1 else f"{coord} * {stride}LL")
    return " + ".join(terms)


def epilogue_read_problem(g: GraphInput, shape: tuple[int, ...], n: Node) -> str | None:
    """Why an anchor's epilogue node n cannot read group input g as `shape` (None when it can): the
    shape must broadcast to the node's, and the dtype be one the kernels store."""
    out = tuple(n.shape)
    aligned = (1,) * (len(out) - len(shape)) + shape
    if len(shape) > len(out) or any(a not in (1, s) for a, s in zip(aligned, out)):
        return f"'{n.op}' (node '{n.name}') reads '{g.name}' as shape {list(shape)}, which does not broadcast to {list(out)}"
    if g.dtype not in STORAGE_CTYPE:
        return f"'{g.name}' has dtype {g.dtype}"
    return None


def emit_epilogue_chain(graph: Graph, nodes: list[Node], var: dict[str, tuple[str, str]], alias: dict[str, str],
                        reads: dict[str, tuple[str, tuple[int, ...]]], pointers: dict[str, str], family: str,
                        temp: str = "v") -> list[str]:
    """C statements computing an anchor's elementwise epilogue at flat output index `e`. `var` holds
    the anchor's results and gains each node's variable (`temp`<i>); `alias` maps the values that
    are (views of) the anchor's results or epilogue nodes to them; any other operand is a group
    input read broadcast, `reads` -> (input, shape read as), through its pointer in `pointers`."""
    values = {v.name: v for v in graph.inputs}
    values.update({n.name: n for n in graph.nodes})
    lines: list[str] = []
    loads = 0
    for i, node in enumerate(nodes):
        for op in node.operands:
            if not isinstance(op, Ref):
                continue
            if op.name in alias:
                var[op.name] = var[alias[op.name]]   # a view of an earlier value
                continue
            source, shape = reads[op.name]
            v = values[source]
            ptr = f"{pointers[source]}[{broadcast_offset(shape, tuple(node.shape))}]"
            lines.append(f"    const {COMPUTE_CTYPE[v.dtype]} a{loads} = {load_expr(v.dtype, ptr)};")
            var[op.name] = (f"a{loads}", COMPUTE_CTYPE[v.dtype])
            loads += 1
        ct = COMPUTE_CTYPE[node.dtype]
        try:
            expr = _node_expr(node, ct, var, values)
        except LoweringError as exc:
            raise CodegenError(f"Task '{graph.task}': the {family} family cannot lower the epilogue op "
                               f"'{node.op}' (node '{node.name}'): {exc} is not supported.",
                               task=graph.task, ops=[node.op]) from exc
        lines += assign_node(node, ct, f"{temp}{i}", expr, "    ")
        var[node.name] = (f"{temp}{i}", ct)
    return lines

