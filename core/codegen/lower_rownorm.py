"""The row-normalise family: reductions over rows and the elementwise work that uses them, in one kernel.

A group is a set of reductions (the anchors) over the same rows of one index space S, the pointwise
ops that feed them, the pointwise ops on their per-row results, and the pointwise ops that combine
those results with the row's elements again. Layer, RMS, group and instance norms, logsumexp,
softmax over a middle dim, cosine similarity and triplet-margin distances are such groups: one kernel reads each row once (or
keeps it on chip between passes) instead of a reduction kernel followed by a pointwise kernel that
reads the input again.

What the sub-graph holds (the partitioner builds it; partition.py, "row groups"):
- inputs with layouts of S's rank (dims 1 = broadcast, or S's size);
- anchors: sum.dim_IntList, mean.dim, amax, amin, var/std (.correction/.dim), var_mean/std_mean,
  linalg_vector_norm, each reducing an S-shaped value over the same dims R with keepdim=True, so
  every per-row value has the shape K (S with R set to 1); getitems pick var_mean's results;
- pointwise ops (pointwise_ops.is_pointwise). A value is *row-constant* when its shape is 1 on every
  reduced dim of size > 1 (anchor results, ops on them, per-row inputs: computed once per row) and
  *row-varying* otherwise (computed per element);
- outputs: row-varying values of shape S, and row-constant values (one per row).

Rows: the kept dims of S (size > 1) give the row index r, the reduced dims the index j in the row,
both row-major. Every input is read at kept_off(r) + red_off(j) (div/mod by literal sizes, merged
where dims are contiguous), with 16-byte vector loads along the innermost dim when aligned (a
uniform run-time check falls back to scalar accesses). Two layouts:
- rows: the innermost dim is reduced (a row is made of contiguous runs): a block (ROW_MODE 0) or a
  warp (ROW_MODE 1) per row, each thread VEC neighbouring elements of the row at a time;
- cols: it is kept (strided rows, a softmax over a middle dim): each thread takes VEC neighbouring
  rows, adjacent in memory, and walks j with the BLOCK/COLW threads of its column of the block.
Sizes are literals in the source: a program serves the shapes it was generated for.

Passes: an anchor's phase is 1 + the latest phase whose results its operand needs (logsumexp: the
max in phase 1, the sum of exp(x - max) in phase 2). Each phase is one pass over the row that
accumulates its anchors per thread, then merges them across the row's threads (warp shuffles, then
one barrier and the warps' totals through shared memory, merged by every thread in the same order:
deterministic, no atomics). A last pass computes the row-varying outputs. An input read by two or
more passes is cached (knob CACHE): 0 = in registers (the whole row fits the block's ITEMS x VEC
elements per thread), 2 = in dynamic shared memory, 1 = not cached (later passes re-read it, mostly
from L2). Each thread reads back only the elements it cached itself, so the cache needs no barrier.

Numerics follow the reduce family (its accumulator code is reused): fp32 math for fp16/bf16/fp32
(double for fp64), sums, norms and variances accumulated in double per thread and through the
trees, variance from sums shifted by the row's first element, max/min propagating NaN. Results are
rounded to their dtype; every op's result too, as eager stores it.

Knobs: BLOCK threads per block; rows: ROW_MODE 0 = a block per row, 1 = a warp per row (BLOCK/32
rows per block); cols: COLW threads side by side over the rows; VEC elements (rows) or rows (cols)
per vector access; ITEMS vectors per thread per tile (the row in registers needs the tile to cover
it); CACHE (only when a pass re-reads an input).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from core.codegen.cuda_emit import COMPUTE_CTYPE, ITEMSIZE, PRELUDE, STORAGE_CTYPE, load_expr, round_to_storage, \
    store_expr
from core.codegen.errors import CodegenError
from core.codegen.graph import Graph, GraphInput, Node, Ref
# The reduce family's accumulators (one struct per reduction kind, its merge and shuffle, the result
# expressions) and element chains are reused as they are, each anchor in a namespace of its own.
from core.codegen.lower_pointwise import Lowering, _cname, fast_nodes, graph_readers
from core.codegen.lower_reduce import ANCHORS, _acc_code, _acc_fields, _Anchor, _emit_chain, _offset_expr, \
    _part_fields, part_group_steps, \
    _parse_anchor, _result_exprs, _var_helper
from core.codegen.pointwise_ops import IDENTITY_OPS, IOTA, is_pointwise
from core.codegen.schedule import Knob, ScheduleSpec

Shape = tuple[int, ...]

# Reductions a row group takes: kind (lower_reduce.ANCHORS) -> ops whose `dim` is a list.
ROW_KINDS = {"sum": ("sum.dim_IntList",), "mean": ("mean.dim",), "max": ("amax.default",),
             "min": ("amin.default",), "var": ("var.correction", "var.dim"), "std": ("std.correction", "std.dim"),
             "var_mean": ("var_mean.correction", "var_mean.dim"), "std_mean": ("std_mean.correction", "std_mean.dim"),
             "norm": ("linalg_vector_norm.default",)}
ROW_OPS = {op for ops in ROW_KINDS.values() for op in ops}
FLOATS = ("float32", "float16", "bfloat16", "float64")
# Few long rows do not fill the GPU with one block per row: the split reduction of the reduce family
# (and a pointwise pass) does better there. The same thresholds as the reduce family's split.
MIN_ROWS = 264
LONG_ROW = 8192
MAX_ACCESS_BYTES = 16
MAX_ITEMS = 16
# 32-bit registers per thread for the row kept in registers (CACHE=0). A block of 1024 threads has
# 64 registers per thread: 32 cached words spill there (measured with ptxas for sm_90).
MAX_CACHE_WORDS = {32: 32, 64: 32, 128: 32, 256: 32, 512: 32, 1024: 16}
MAX_SMEM_BYTES = 200 * 1024           # dynamic shared memory of a CACHE=2 block (227 KiB opt-in on sm_90)
# Rows re-read from global memory (CACHE=1) come back from L2 only while the rows in flight fit it
# (132 SMs x a row each, 50 MB of L2 on an H100/H200).
MAX_REREAD_ROW_BYTES = 256 * 1024
CACHE_REGISTERS, CACHE_NONE, CACHE_SHARED = 0, 1, 2


# ---- which reductions form row groups (the partitioner asks) ----------------------------------------

def row_signature(node: Node, graph: Graph) -> tuple[Shape, tuple[int, ...]] | None:
    """(S, reduced dims of size > 1) when `node` reduces rows that a row group can take, else None.
    Two reductions with the same signature reduce the same rows."""
    if node.op not in ROW_OPS:
        return None
    anchor = _parse_anchor(node, graph)
    if not isinstance(anchor, _Anchor) or anchor.rdt not in FLOATS or anchor.src.dtype not in FLOATS:
        return None
    if any(dt not in FLOATS for _, dt in anchor.results):
        return None
    shape = tuple(anchor.src.shape)
    red = tuple(d for d in anchor.dims if shape[d] > 1)
    return (shape, red) if rows_fit(shape, red) else None


def rows_fit(shape: Shape, reduced: tuple[int, ...]) -> bool:
    """Reducing these dims of this shape gives rows a row group takes: not a few long ones (a
    single short row is one: a batch of one). Rows are contiguous when the innermost dim of size > 1
    is reduced, and strided otherwise (a softmax over a middle dim: neighbouring rows are adjacent
    in memory)."""
    big = [d for d in range(len(shape)) if shape[d] > 1]
    red = [d for d in reduced if shape[d] > 1]
    kept = [d for d in big if d not in red]
    if not red:
        return False                  # nothing reduced
    n_rows, row_len = math.prod(shape[d] for d in kept), math.prod(shape[d] for d in red)
    return n_rows >= MIN_ROWS or row_len < LONG_ROW


# ---- the plan -------------------------------------------------------------------------------------

@dataclass
class _Input:
    value: GraphInput
    cname: str
    kind: str                         # row: constant along the row | vector: stride 1 along the innermost
                                      # dim (j in rows, neighbouring rows in cols) | chunk: row-varying, 0 there
    inner_stride: int                 # stride along the innermost dim of the space: 0 or 1
    kept_sizes: list[int]
    kept_strides: list[int]
    red_sizes: list[int]
    red_strides: list[int]

    @property
    def ctype(self) -> str:
        return STORAGE_CTYPE[self.value.dtype]

    def kept_off(self, var: str) -> str:
        return _offset_expr(var, self.kept_sizes, self.kept_strides)

    def red_off(self, var: str) -> str:
        return _offset_expr(var, self.red_sizes, self.red_strides)


@dataclass
class _Reduction:
    anchor: _Anchor
    index: int
    phase: int
    results: dict[str, int]           # value name -> result index

    @property
    def ns(self) -> str:
        return f"a{self.index}"


@dataclass
class _Plan:
    graph: Graph
    kernel: str
    layout: str                       # rows: the innermost dim is reduced | cols: it is kept (strided rows)
    space: Shape
    reduced: tuple[bool, ...]
    n_rows: int
    row_len: int
    inner: int                        # size of the innermost dim: VEC divides it
    idx_t: str
    inputs: list[_Input]
    outputs: list[_Input]             # as _Input: offsets of the outputs (kind row or vector)
    reductions: list[_Reduction]
    row_const: set[str]               # row-constant values (inputs, nodes, results)
    avail: dict[str, int]             # row-constant value -> phase after which it is known
    passes: list[tuple[int, list[str]]]   # (phase, sink values): phase n_phases + 1 writes the outputs
    pass_inputs: list[list[_Input]]   # row-varying inputs each pass reads
    cached: list[_Input]              # vector inputs read by two passes or more
    knobs: list[Knob] = field(default_factory=list)
    fast: set[str] = field(default_factory=set)   # nodes that may use FAST_OPS forms (approximable)

    @property
    def n_phases(self) -> int:
        return max((red.phase for red in self.reductions), default=0)

    @property
    def row_bytes(self) -> int:
        """Shared memory that caches one row of every cached input (each region 16-byte aligned)."""
        return sum(_round16(self.row_len * ITEMSIZE[i.value.dtype]) for i in self.cached)


def _round16(n: int) -> int:
    return (n + 15) // 16 * 16


def _error(graph: Graph, text: str, ops: list[str] | None = None) -> CodegenError:
    return CodegenError(f"Task '{graph.task}': {text}", task=graph.task, ops=ops or graph.ops())


def _aligned(shape: Shape, space: Shape) -> Shape | None:
    """shape right-aligned to the rank of space, or None when it does not broadcast into it."""
    if len(shape) > len(space):
        extra = shape[:len(shape) - len(space)]
        if any(s != 1 for s in extra):
            return None
        shape = shape[len(shape) - len(space):]
    out = (1,) * (len(space) - len(shape)) + tuple(shape)
    return out if all(a in (1, s) for a, s in zip(out, space)) else None


def _contiguous_strides(shape: Shape) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step if size > 1 else 0)
        step *= size
    return list(reversed(strides))


def _plan(graph: Graph, kernel: str) -> _Plan:
    values: dict[str, Any] = {v.name: v for v in graph.inputs}
    values.update({n.name: n for n in graph.nodes})
    anchors = [n for n in graph.nodes if n.op in ANCHORS]
    if not anchors:
        raise _error(graph, "the row-normalise family needs at least one reduction in the group.")
    bad = sorted({n.op for n in anchors if n.op not in ROW_OPS})
    if bad:
        raise _error(graph, f"the row-normalise family does not take the reductions {', '.join(bad)}.", bad)
    parsed = []
    for a in anchors:
        p = _parse_anchor(a, graph)
        if isinstance(p, str):
            raise _error(graph, f"the row-normalise family cannot lower node '{a.name}': {p}.", [a.op])
        parsed.append(p)
    space = tuple(parsed[0].src.shape)
    dims = {d for d in parsed[0].dims if space[d] > 1}
    for p in parsed:
        if tuple(p.src.shape) != space or {d for d in p.dims if space[d] > 1} != dims:
            raise _error(graph, f"the reductions '{anchors[0].name}' and '{p.node.name}' do not reduce the same rows "
                                f"({list(space)} over {sorted(dims)} vs {list(p.src.shape)} over {list(p.dims)}).",
                         [p.node.op])
        if p.rdt not in FLOATS or any(dt not in FLOATS for _, dt in p.results):
            raise _error(graph, f"the row-normalise family reduces floating-point values; '{p.node.name}' "
                                f"reduces {p.rdt}.", [p.node.op])
    big = [d for d in range(len(space)) if space[d] > 1]
    reduced = tuple(d in dims for d in range(len(space)))
    kept = [d for d in big if d not in dims]
    if not dims:
        raise _error(graph, f"the row-normalise family reduces rows (some dims of size > 1 reduced); "
                            f"{list(space)} over {sorted(dims)} is not.")
    n_rows = math.prod(space[d] for d in kept)
    row_len = math.prod(space[d] for d in sorted(dims))
    kept_sizes, red_sizes = [space[d] for d in kept], [space[d] for d in sorted(dims)]

    # Results and their anchors.
    result_of: dict[str, int] = {}
    for i, (a, p) in enumerate(zip(anchors, parsed)):
        if len(p.results) == 1:
            result_of[a.name] = i
    anchor_index = {a.name: i for i, a in enumerate(anchors)}
    getitem_index: dict[str, int] = {}
    for n in graph.nodes:
        if n.op == "getitem" and n.operands and isinstance(n.operands[0], Ref) and n.operands[0].name in anchor_index:
            i = anchor_index[n.operands[0].name]
            if len(parsed[i].results) == 1:
                raise _error(graph, f"'{n.name}' picks a result of the single-result '{anchors[i].op}'.")
            result_of[n.name] = i
            getitem_index[n.name] = int(n.attrs["index"])
    others = [n for n in graph.nodes if n.name not in result_of and n.name not in anchor_index]
    bad = sorted({n.op for n in others if not is_pointwise(n)})
    if bad:
        raise _error(graph, f"the row-normalise family fuses elementwise ops around reductions; this group also "
                            f"has {', '.join(bad)}.", bad)
    for n in graph.nodes:
        for o in n.operands:
            if isinstance(o, Ref) and o.name not in values:
                raise _error(graph, f"node '{n.name}' ({n.op}) reads '{o.name}', which is not in the group.", [n.op])

    # Row-constant or row-varying, and the phase each row-constant value is known after.
    row_const: set[str] = set()
    avail: dict[str, int] = {}
    need: dict[str, int] = {}          # row-varying value -> latest phase of the row constants it uses
    for v in graph.inputs:
        al = _aligned(tuple(v.shape), space)
        if al is None:
            raise _error(graph, f"input '{v.name}' {list(v.shape)} does not broadcast into the rows' space "
                                f"{list(space)}.")
        if all(al[d] == 1 for d in range(len(space)) if reduced[d]):
            row_const.add(v.name)
            avail[v.name] = 0
        else:
            need[v.name] = 0

    def level(name: str) -> int:
        return avail[name] if name in row_const else need[name]

    reductions: list[_Reduction] = []
    for n in graph.nodes:
        refs = [o.name for o in n.operands if isinstance(o, Ref)]
        if n.name in result_of and n.op == "getitem":
            row_const.add(n.name)
            avail[n.name] = reductions[result_of[n.name]].phase
            continue
        if n.name in anchor_index:
            i = anchor_index[n.name]
            phase = level(refs[0]) + 1
            res = {n.name: 0} if n.name in result_of else {}
            res.update({g: k for g, k in getitem_index.items() if result_of[g] == i})
            reductions.append(_Reduction(parsed[i], i, phase, res))
            if n.name in result_of:
                row_const.add(n.name)
                avail[n.name] = phase
            continue
        al = _aligned(tuple(n.shape), space)
        if al is None:
            raise _error(graph, f"node '{n.name}' ({n.op}) {list(n.shape)} does not broadcast into the rows' space "
                                f"{list(space)}.", [n.op])
        if all(al[d] == 1 for d in range(len(space)) if reduced[d]):
            if any(r not in row_const for r in refs):
                raise _error(graph, f"node '{n.name}' ({n.op}) is one value per row but reads a value of the "
                                    f"row's elements.", [n.op])
            row_const.add(n.name)
            avail[n.name] = max((avail[r] for r in refs), default=0)
        else:
            need[n.name] = max((level(r) for r in refs), default=0)

    # Outputs: row-varying ones have the whole space's shape; row-constant ones one value per row.
    out_info: list[tuple[str, Shape, bool]] = []
    for o in graph.outputs:
        if o not in values or isinstance(values[o], GraphInput):
            raise _error(graph, f"output '{o}' is not a value the group computes.")
        if o in anchor_index and o not in result_of:
            raise _error(graph, f"output '{o}' is the multi-result '{values[o].op}' itself; name its getitems.")
        if o in row_const:
            if math.prod(values[o].shape) != n_rows:
                raise _error(graph, f"output '{o}' {list(values[o].shape)} is constant along the rows but does not "
                                    f"have one value per row ({n_rows}).")
            out_info.append((o, tuple(1 if reduced[d] else space[d] for d in range(len(space))), True))
        else:
            if _aligned(tuple(values[o].shape), space) != space:
                raise _error(graph, f"output '{o}' {list(values[o].shape)} varies along the rows but does not "
                                    f"have the rows' full shape {list(space)}.")
            out_info.append((o, space, False))

    taken: set[str] = set()

    def access(v: Any, shape: Shape, prefix: str) -> _Input:
        al = _aligned(shape, space)
        st = _contiguous_strides(al)
        kind = "row" if all(al[d] == 1 for d in range(len(space)) if reduced[d]) else \
            "vector" if st[big[-1]] == 1 else "chunk"
        return _Input(v, _cname(prefix, v.name, taken), kind, st[big[-1]], kept_sizes, [st[d] for d in kept],
                      red_sizes, [st[d] for d in sorted(dims)])

    inputs = [access(v, tuple(v.shape), "in_") for v in graph.inputs]
    outputs = [access(values[o], shape, "out_") for o, shape, _ in out_info]
    for o, (_, _, const) in zip(outputs, out_info):
        if not const and o.kind != "vector":
            raise _error(graph, f"output '{o.value.name}' is not contiguous along the innermost dim.")
    used = {r.name for n in graph.nodes for r in n.operands if isinstance(r, Ref)}
    for v in list(graph.inputs) + graph.nodes:
        if (v.name in used or v.name in graph.outputs) and v.dtype not in STORAGE_CTYPE:
            raise _error(graph, f"'{v.name}' has dtype {v.dtype}, which the row-normalise family does not support.")

    n_phases = max(r.phase for r in reductions)
    passes: list[tuple[int, list[str]]] = []
    for phase in range(1, n_phases + 1):
        passes.append((phase, [r.anchor.src.name for r in reductions if r.phase == phase]))
    varying_out = [o for o, _, const in out_info if not const]
    if varying_out:
        passes.append((n_phases + 1, varying_out))
    pass_inputs = []
    for _, sinks in passes:
        names = _varying_inputs(graph, sinks, row_const, values)
        pass_inputs.append([i for i in inputs if i.value.name in names])
    reads = [sum(1 for p in pass_inputs if i in p) for i in inputs]
    cached = [i for i, k in zip(inputs, reads) if k >= 2 and i.kind == "vector"]
    inner = space[big[-1]]
    total = n_rows * row_len + (1 << 22)
    idx_t = "int" if total < (1 << 31) else "long long"
    layout = "rows" if big[-1] in dims else "cols"
    return _Plan(graph, kernel, layout, space, reduced, n_rows, row_len, inner, idx_t, inputs, outputs, reductions,
                 row_const, avail, passes, pass_inputs, cached)


def _varying_inputs(graph: Graph, sinks: list[str], row_const: set[str], values: dict[str, Any]) -> set[str]:
    """Row-varying inputs that the sinks' per-element chains read."""
    seen: set[str] = set()
    found: set[str] = set()
    todo = list(sinks)
    while todo:
        name = todo.pop()
        if name in seen or name in row_const:
            continue
        seen.add(name)
        v = values[name]
        if isinstance(v, GraphInput):
            found.add(name)
            continue
        todo += [o.name for o in v.operands if isinstance(o, Ref)]
    return found


def _element_nodes(graph: Graph, sinks: list[str], row_const: set[str]) -> list[Node]:
    """The row-varying nodes the sinks need, in graph order (row constants are variables by then)."""
    by_name = {n.name: n for n in graph.nodes}
    seen: set[str] = set()
    todo = list(sinks)
    while todo:
        name = todo.pop()
        if name in seen or name in row_const or name not in by_name:
            continue
        seen.add(name)
        todo += [o.name for o in by_name[name].operands if isinstance(o, Ref)]
    return [n for n in graph.nodes if n.name in seen]


def _row_nodes(plan: _Plan) -> list[Node]:
    """The row-constant pointwise nodes something needs, in graph order."""
    graph = plan.graph
    by_name = {n.name: n for n in graph.nodes}
    results = {name for red in plan.reductions for name in red.results}
    sinks = list(graph.outputs) + [red.anchor.src.name for red in plan.reductions]
    element = {n.name for _, s in plan.passes for n in _element_nodes(graph, s, plan.row_const)}
    todo = list(sinks)
    for name in element:
        todo += [o.name for o in by_name[name].operands if isinstance(o, Ref)]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in by_name or name in results:
            continue
        seen.add(name)
        if name in plan.row_const:
            todo += [o.name for o in by_name[name].operands if isinstance(o, Ref)]
    return [n for n in graph.nodes if n.name in seen and n.name in plan.row_const and n.name not in results
            and n.op not in ANCHORS]


# ---- knobs and constraints --------------------------------------------------------------------------

def _pow2_ceil(x: float) -> int:
    p = 1
    while p < x:
        p *= 2
    return p


def _pow2_floor(x: float) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(x, 1)))))


def _widest(plan: _Plan) -> int:
    sizes = [ITEMSIZE[i.value.dtype] for i in plan.inputs if i.kind == "vector"]
    sizes += [ITEMSIZE[o.value.dtype] for o in plan.outputs if o.kind == "vector"]
    return max(sizes, default=4)


def _cache_words(plan: _Plan) -> float:
    """32-bit registers per cached element (all cached inputs)."""
    return sum(ITEMSIZE[i.value.dtype] for i in plan.cached) / 4


def _default_schedule(plan: _Plan, vec0: int) -> dict[str, int]:
    """Short rows (<= 1024) a warp each, longer rows a block. Rows read by several passes: in
    registers, at the first of (a warp per row,) 256, 512, 1024 threads that needs at most 16
    registers per thread for them, else at most the cap; else in shared memory at the block size
    that keeps about 2048 threads per SM; else re-read. One pass: 4, 2 or 1 loads in flight."""
    L, words = plan.row_len, _cache_words(plan)
    warp = 32 * min(8, _pow2_floor(plan.n_rows))
    shapes = ([(1, warp)] if L <= 1024 else []) + [(0, b) for b in (256, 512, 1024)]
    mode, block = shapes[0]
    cache = None
    if plan.cached:
        fits = []
        for k, (m, b) in enumerate(shapes):
            items = _pow2_ceil(-(-L // ((32 if m == 1 else b) * vec0)))
            if items <= MAX_ITEMS and items * vec0 * words <= MAX_CACHE_WORDS[b]:
                fits.append((items * vec0 * words > 16, k, items))
        if fits:
            _, k, items = min(fits)
            mode, block = shapes[k]
            return {"BLOCK": block, "ROW_MODE": mode, "VEC": vec0, "ITEMS": items, "CACHE": CACHE_REGISTERS}
        if mode == 0:
            per_sm = max(1, (MAX_SMEM_BYTES + 24 * 1024) // max(plan.row_bytes, 1))
            block = min(1024, max(256, _pow2_floor(2048 / per_sm)))
        smem = plan.row_bytes * (block // 32 if mode == 1 else 1)
        cache = CACHE_SHARED if smem <= MAX_SMEM_BYTES else CACHE_NONE
    steps = L / ((32 if mode == 1 else block) * vec0)
    items = 4 if steps >= 8 else 2 if steps >= 4 else 1
    out = {"BLOCK": block, "ROW_MODE": mode, "VEC": vec0, "ITEMS": items}
    if cache is not None:
        out["CACHE"] = cache
    return out


def _ordered(default: int, values: tuple[int, ...]) -> tuple[int, ...]:
    return (default,) + tuple(v for v in values if v != default)


def _knobs(plan: _Plan) -> list[Knob]:
    widest = _widest(plan)
    vecs = tuple(v for v in (1, 2, 4, 8) if v * widest <= MAX_ACCESS_BYTES)
    vec0 = next((v for v in reversed(vecs) if plan.inner % v == 0 and plan.row_len >= 32 * v), 1)
    d = _default_schedule(plan, vec0)
    knobs = [Knob("BLOCK", _ordered(d["BLOCK"], (256, 128, 512, 1024, 64, 32)), "threads per block"),
             Knob("ROW_MODE", _ordered(d["ROW_MODE"], (0, 1)),
                  "0: one block per row; 1: one warp per row, BLOCK/32 rows per block"),
             Knob("VEC", _ordered(vec0, vecs), "elements per vector access along the row"),
             Knob("ITEMS", _ordered(d["ITEMS"], (1, 2, 4, 8, 16)),
                  "vectors per thread per tile (loads in flight; with CACHE=0 the tile holds the whole row)")]
    if plan.cached:
        knobs.append(Knob("CACHE", _ordered(d["CACHE"], (CACHE_REGISTERS, CACHE_SHARED, CACHE_NONE)),
                          "where the row waits between passes: 0 registers, 2 shared memory, 1 nowhere "
                          "(re-read, mostly from L2)"))
    return knobs


def _constraints(plan: _Plan) -> list:
    widest = _widest(plan)
    L, words = plan.row_len, _cache_words(plan)
    default = {k.name: k.values[0] for k in plan.knobs}

    def lanes(s: Any) -> int:
        return 32 if s["ROW_MODE"] == 1 else s["BLOCK"]

    def vec_access(s: Any) -> str | None:
        if s["VEC"] * widest > MAX_ACCESS_BYTES:
            return f"VEC={s['VEC']} needs {s['VEC'] * widest}-byte accesses; the widest is {MAX_ACCESS_BYTES} bytes"
        if plan.inner % s["VEC"]:
            return f"VEC={s['VEC']} does not divide the innermost size {plan.inner}: a vector would cross rows"
        return None

    def cache_fits(s: Any) -> str | None:
        cache = s.get("CACHE")
        if cache == CACHE_REGISTERS:
            tile = lanes(s) * s["VEC"] * s["ITEMS"]
            if tile < L:
                return (f"CACHE=0 keeps the row in registers, but {lanes(s)} threads x VEC={s['VEC']} x "
                        f"ITEMS={s['ITEMS']} hold {tile} of its {L} elements")
            cap = MAX_CACHE_WORDS[s["BLOCK"]]
            if s["ITEMS"] * s["VEC"] * words > cap:
                return (f"CACHE=0 with ITEMS={s['ITEMS']} x VEC={s['VEC']} needs {s['ITEMS'] * s['VEC'] * words:g} "
                        f"registers per thread for the row (at most {cap} at BLOCK={s['BLOCK']})")
        if cache == CACHE_SHARED:
            nbytes = plan.row_bytes * (s["BLOCK"] // 32 if s["ROW_MODE"] == 1 else 1)
            if nbytes > MAX_SMEM_BYTES:
                return f"CACHE=2 needs {nbytes} bytes of shared memory per block (at most {MAX_SMEM_BYTES})"
        return None

    def idle(s: Any) -> str | None:
        if dict(s) == default:
            return None
        if s["ROW_MODE"] == 0 and s["BLOCK"] > 32 and s["BLOCK"] * s["VEC"] > L:
            return f"BLOCK={s['BLOCK']} threads x VEC={s['VEC']} for rows of {L} elements leaves threads idle"
        if s["ROW_MODE"] == 1 and s["BLOCK"] // 32 > plan.n_rows:
            return f"BLOCK={s['BLOCK']} gives {s['BLOCK'] // 32} warps for only {plan.n_rows} rows"
        steps = -(-L // (lanes(s) * s["VEC"]))          # vectors per thread in a row
        if s["ITEMS"] > 1 and s["ITEMS"] // 2 >= steps:
            return f"ITEMS={s['ITEMS']} is more than the {steps} vectors each thread takes in a row"
        return None

    return [vec_access, cache_fits, idle]


# ---- C emission -------------------------------------------------------------------------------------

def _helpers(plan: _Plan) -> str:
    ns = f"{plan.kernel}_ns"
    lines = [
        "#ifndef CA_DYNAMIC_SMEM",
        "#define CA_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]",
        "#endif",
        f"namespace {ns} {{",
        f"typedef {plan.idx_t} idx_t;",
        f"constexpr idx_t n_rows = {plan.n_rows};",
        f"constexpr idx_t row_len = {plan.row_len};   // elements of one row (the reduced dims)",
    ]
    offset = 0
    for i in plan.cached:
        lines.append(f"constexpr idx_t off_{i.cname} = {offset};   // '{i.value.name}' in a row's shared cache")
        offset += _round16(plan.row_len * ITEMSIZE[i.value.dtype])
    lines.append(f"constexpr idx_t row_bytes = {offset};")
    for red in plan.reductions:
        lines += [f"namespace {red.ns} {{   // '{red.anchor.node.name}' ({red.anchor.node.op}), phase {red.phase}",
                  "constexpr idx_t n_red = row_len;",
                  _acc_code(red.anchor), _var_helper(red.anchor).rstrip("\n"),
                  f"}}  // namespace {red.ns}"]
    lines += [f"}}  // namespace {ns}", ""]
    return "\n".join(lines)


def _load_vector(i: _Input, dst: str, ind: str) -> list[str]:
    return [f"{ind}if (vec_ok) {dst} = *reinterpret_cast<const vec_t<{i.ctype}, VEC>*>("
            f"{i.cname} + kb_{i.cname} + {i.red_off('c * VEC')});",
            f"{ind}else {{",
            f"{ind}    #pragma unroll",
            f"{ind}    for (int k = 0; k < VEC; ++k) {dst}.v[k] = {i.cname}[kb_{i.cname} + {i.red_off('(c * VEC + k)')}];",
            f"{ind}}}"]


def _emit_pass(plan: _Plan, index: int, var: dict[str, tuple[str, str]]) -> list[str]:
    """One pass over the row: accumulate this phase's reductions, or compute and store the outputs."""
    graph = plan.graph
    phase, sinks = plan.passes[index]
    ins = plan.pass_inputs[index]
    first = {i.value.name: next(k for k, p in enumerate(plan.pass_inputs) if i in p) == index for i in ins}
    reds = [r for r in plan.reductions if r.phase == phase]
    final = not reds
    out_values = {o: k for k, o in enumerate(graph.outputs)}
    stores = [plan.outputs[out_values[s]] for s in sinks] if final else []
    L = [f"    // ---- pass {index + 1}: " + (f"phase {phase}: " + ", ".join(
        f"'{r.anchor.node.name}'" for r in reds) if reds else "the outputs") + " ----"]
    for r in reds:
        L.append(f"    a{r.index}::Acc A{r.index} = a{r.index}::acc_init();")
        if r.anchor.kind in ("var", "std", "var_mean", "std_mean"):
            L += [f"    double sh{r.index};   // the row's first element: shifted sums, no cancellation",
                  "    {"]
            local = dict(var)
            for i in plan.pass_inputs[index]:
                src = f"{i.cname}[kb_{i.cname} + {i.red_off('0')}]"
                L.append(f"        const {COMPUTE_CTYPE[i.value.dtype]} x_{i.cname} = {load_expr(i.value.dtype, src)};")
                local[i.value.name] = (f"x_{i.cname}", COMPUTE_CTYPE[i.value.dtype])
            L += _emit_chain(graph, _bind_iotas(plan, _element_nodes(graph, [r.anchor.src.name], plan.row_const),
                                                local, "0"), local, "s", "        ")
            L += [f"        sh{r.index} = (double)({_reduced_value(r, local)});", "    }"]
    L += ["    for (idx_t t = 0; t < n_tiles; ++t) {"]
    ind = " " * 8
    for i in ins:
        if i.kind == "chunk":
            L.append(f"{ind}{i.ctype} G_{i.cname}[ITEMS];")
        elif i in plan.cached:
            L += ["#if CACHE == 0",
                  f"{ind}vec_t<{i.ctype}, VEC> (&L_{i.cname})[ITEMS] = C_{i.cname};",
                  "#else",
                  f"{ind}vec_t<{i.ctype}, VEC> L_{i.cname}[ITEMS];",
                  "#endif"]
        else:
            L.append(f"{ind}vec_t<{i.ctype}, VEC> L_{i.cname}[ITEMS];")
    head = [f"{ind}#pragma unroll",
            f"{ind}for (int it = 0; it < ITEMS; ++it) {{",
            f"{ind}    const idx_t c = (t * ITEMS + it) * lanes + lane;   // this thread's vector of the row",
            f"{ind}    if (c * VEC < row_len) {{"]
    ind2 = ind + " " * 8
    L += head
    for i in ins:
        if i.kind == "chunk":
            L.append(f"{ind2}G_{i.cname}[it] = {i.cname}[kb_{i.cname} + {i.red_off('c * VEC')}];")
        elif i in plan.cached and first[i.value.name]:
            L += _load_vector(i, f"L_{i.cname}[it]", ind2)      # with CACHE=0, L_ is the register cache
            L += ["#if CACHE == 2", f"{ind2}S_{i.cname}[c] = L_{i.cname}[it];", "#endif"]
        elif i in plan.cached:
            L += ["#if CACHE == 2", f"{ind2}L_{i.cname}[it] = S_{i.cname}[c];", "#elif CACHE == 1"]
            L += _load_vector(i, f"L_{i.cname}[it]", ind2)
            L += ["#endif"]
        else:
            L += _load_vector(i, f"L_{i.cname}[it]", ind2)
    L += [f"{ind}    }}", f"{ind}}}"]
    parted = [r for r in reds if _part_fields(r.anchor)]
    L += [f"{ind}a{r.index}::Part P{r.index} = a{r.index}::part_init();" for r in parted]
    L += head
    for o in stores:
        L.append(f"{ind2}vec_t<{o.ctype}, VEC> O_{o.cname};")
    L += [f"{ind2}#pragma unroll", f"{ind2}for (int k = 0; k < VEC; ++k) {{"]
    elements = _element_nodes(graph, sinks, plan.row_const)
    if reds or any(n.op == IOTA for n in elements):
        L.append(f"{ind2}    const idx_t j = c * VEC + k;   // the element's index in the row")
    ind3 = ind2 + " " * 4
    local = dict(var)
    L += _element_code(plan, ins, elements, local, ind3)
    for r in reds:
        sh = f"sh{r.index}" if r.anchor.kind in ("var", "std", "var_mean", "std_mean") else "0.0"
        add, acc = ("part_add", f"P{r.index}") if r in parted else ("acc_add", f"A{r.index}")
        L.append(f"{ind3}a{r.index}::{add}({acc}, {_reduced_value(r, local)}, j, {sh});")
    values = {v.name: v for v in list(graph.inputs) + graph.nodes}
    for s, o in zip(sinks if final else [], stores):
        L.append(f"{ind3}O_{o.cname}.v[k] = {store_expr(values[s].dtype, local[s][0])};")
    L.append(f"{ind2}}}")
    for o in stores:
        L += [f"{ind2}if (vec_ok) *reinterpret_cast<vec_t<{o.ctype}, VEC>*>({o.cname} + kb_{o.cname} + "
              f"{o.red_off('c * VEC')}) = O_{o.cname};",
              f"{ind2}else {{",
              f"{ind2}    #pragma unroll",
              f"{ind2}    for (int k = 0; k < VEC; ++k) {o.cname}[kb_{o.cname} + {o.red_off('(c * VEC + k)')}] = "
              f"O_{o.cname}.v[k];",
              f"{ind2}}}"]
    L.append(f"{ind}    }}")
    if parted:   # a full group (or the tile's last item) goes into the double accumulators
        L += [f"{ind}    if ((it + 1) % {part_group_steps('VEC')} == 0 || it + 1 == ITEMS) {{"]
        L += [f"{ind}        a{r.index}::acc_take(A{r.index}, P{r.index}); P{r.index} = a{r.index}::part_init();"
              for r in parted]
        L.append(f"{ind}    }}")
    L += [f"{ind}}}", "    }"]
    if reds:
        L += _emit_merge(plan, reds, index)
        for r in reds:
            L += _emit_results(r, var)
    return L


def _element_code(plan: _Plan, ins: list[_Input], elements: list[Node], var: dict[str, tuple[str, str]],
                  indent: str) -> list[str]:
    """One element of each input this pass reads (its tile slot it, vector lane k) into a variable,
    then the row-varying nodes computed from them (element index j)."""
    lines = []
    for i in ins:
        raw = f"G_{i.cname}[it]" if i.kind == "chunk" else f"L_{i.cname}[it].v[k]"
        lines.append(f"{indent}const {COMPUTE_CTYPE[i.value.dtype]} x_{i.cname} = {load_expr(i.value.dtype, raw)};")
        var[i.value.name] = (f"x_{i.cname}", COMPUTE_CTYPE[i.value.dtype])
    return lines + _emit_chain(plan.graph, _bind_iotas(plan, elements, var, "j"), var, "e", indent, plan.fast)


def _bind_iotas(plan: _Plan, nodes: list[Node], var: dict[str, tuple[str, str]], j: str) -> list[Node]:
    """The element's index along a reduced dim (IOTA nodes) from its index j in the row: bound in
    `var`; returns the other nodes. j is the index along the reduced dims in both layouts (contiguous
    rows, and strided rows: a pick along a middle dim, as K-dim cross-entropy does). Rows reduced
    along more dims would need j split up; refused."""
    red = [d for d in range(len(plan.space)) if plan.reduced[d]]
    for n in nodes:
        if n.op == IOTA:
            d = int(n.attrs["dim"]) % len(plan.space)
            if tuple(n.shape) != plan.space or red != [d]:
                raise _error(plan.graph, f"the element index along dim {d} ('{n.name}', from a gather) is lowered "
                                         f"for rows reduced along that one dim; these rows are "
                                         f"{list(plan.space)} over {red}.", [n.op])
            var[n.name] = (f"((long long)({j}))", "long long")
    return [n for n in nodes if n.op != IOTA]


def _reduced_value(r: _Reduction, var: dict[str, tuple[str, str]]) -> str:
    """The element fed to an accumulator: the operand in the reduction's dtype, then its element type."""
    a = r.anchor
    value, ct = var[a.src.name]
    rdt_ct = COMPUTE_CTYPE[a.rdt]
    if rdt_ct != ct:
        value = round_to_storage(a.rdt, f"(({rdt_ct}){value})")   # the dtype= conversion
    return f"({a.xt})({value})"


def _emit_merge(plan: _Plan, reds: list[_Reduction], index: int) -> list[str]:
    """Every thread of the row gets the same merged accumulators: a butterfly in the warp (the merges
    commute, so all lanes agree), then in block mode the warps' totals merged in warp order."""
    L = ["    #pragma unroll", "    for (int o = 16; o > 0; o >>= 1) {"]
    L += [f"        a{r.index}::acc_merge(A{r.index}, a{r.index}::acc_shfl(A{r.index}, o));" for r in reds]
    L += ["    }", "#if ROW_MODE == 0", "    if (BLOCK > 32) {"]
    L += [f"        __shared__ a{r.index}::Acc W{index}_{r.index}[BLOCK / 32];" for r in reds]
    L += ["        if ((threadIdx.x & 31) == 0) {"]
    L += [f"            W{index}_{r.index}[threadIdx.x >> 5] = A{r.index};" for r in reds]
    L += ["        }",
          "        __syncthreads();   // each pass has arrays of its own: one barrier, no reuse hazard"]
    for r in reds:
        L += [f"        A{r.index} = a{r.index}::acc_init();",
              f"        for (int w = 0; w < BLOCK / 32; ++w) a{r.index}::acc_merge(A{r.index}, W{index}_{r.index}[w]);"]
    L += ["    }", "#endif"]
    return L


def _emit_results(r: _Reduction, var: dict[str, tuple[str, str]]) -> list[str]:
    a = r.anchor
    exprs = _result_exprs(a)
    L = []
    names = {k: name for name, k in r.results.items()}
    for k, (role, dtype) in enumerate(a.results):
        if k not in names:
            continue
        ct = COMPUTE_CTYPE[dtype]
        L.append(f"    {ct} R{r.index}_{k};   // '{names[k]}': {a.node.op} {role}")
    L += ["    {", f"        using namespace a{r.index};", f"        const Acc& a = A{r.index};"]
    for k, (role, dtype) in enumerate(a.results):
        if k not in names:
            continue
        ct = COMPUTE_CTYPE[dtype]
        L.append(f"        R{r.index}_{k} = ({ct})({exprs[k]});")
        rounded = round_to_storage(dtype, f"R{r.index}_{k}")
        if rounded != f"R{r.index}_{k}":
            L.append(f"        R{r.index}_{k} = {rounded};")
        var[names[k]] = (f"R{r.index}_{k}", ct)
    L.append("    }")
    return L


def _emit_kernel(plan: _Plan) -> str:
    graph = plan.graph
    values = {v.name: v for v in list(graph.inputs) + graph.nodes}
    params = [f"const {i.ctype}* __restrict__ {i.cname}" for i in plan.inputs]
    params += [f"{o.ctype}* __restrict__ {o.cname}" for o in plan.outputs]
    vec_ptrs = [i for i in plan.inputs if i.kind == "vector"] + [o for o in plan.outputs if o.kind == "vector"]
    checks = " && ".join(f"aligned_to<VEC * sizeof({i.ctype})>({i.cname})" for i in vec_ptrs) or "true"
    L = ['extern "C" __global__ void __launch_bounds__(BLOCK)',
         f"{plan.kernel}({', '.join(params)})",
         "{",
         f"    using namespace {plan.kernel}_ns;",
         "    constexpr int lanes = ROW_MODE == 1 ? 32 : BLOCK;   // threads that share one row",
         "    const int lane = ROW_MODE == 1 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;",
         "    const idx_t r = ROW_MODE == 1 ? (idx_t)blockIdx.x * (BLOCK / 32) + (idx_t)(threadIdx.x >> 5)",
         "                                  : (idx_t)blockIdx.x;",
         "    // Whole warps leave here, and only in ROW_MODE 1, which has no block barrier.",
         "    if (ROW_MODE == 1 && r >= n_rows) return;",
         "    constexpr idx_t n_tiles = (row_len + (idx_t)lanes * VEC * ITEMS - 1) / ((idx_t)lanes * VEC * ITEMS);",
         *(["#if CACHE == 0",
            '    static_assert(n_tiles == 1, "CACHE=0 keeps the whole row in registers: one tile");',
            "#endif"] if plan.cached else []),
         "    // Uniform: vector accesses when every vector-accessed pointer is aligned (VEC divides the rows).",
         f"    const bool vec_ok = {checks};",
         "    (void)vec_ok;"]
    for i in plan.inputs + plan.outputs:
        L.append(f"    const idx_t kb_{i.cname} = {i.kept_off('r')};   // the row's offset in '{i.value.name}'")
    var: dict[str, tuple[str, str]] = {}
    for i in plan.inputs:
        if i.kind == "row":
            ct = COMPUTE_CTYPE[i.value.dtype]
            L.append(f"    const {ct} h_{i.cname} = {load_expr(i.value.dtype, f'{i.cname}[kb_{i.cname}]')};"
                     f"   // one value per row")
            var[i.value.name] = (f"h_{i.cname}", ct)
    row_nodes = _row_nodes(plan)
    L += _emit_chain(graph, [n for n in row_nodes if plan.avail[n.name] == 0], var, "c0_", "    ")
    if plan.cached:
        L.append("#if CACHE == 0")
        L += [f"    vec_t<{i.ctype}, VEC> C_{i.cname}[ITEMS];   // '{i.value.name}': this thread's part of the row"
              for i in plan.cached]
        L += ["#elif CACHE == 2", "    CA_DYNAMIC_SMEM(ca_smem);",
              "    unsigned char* const row_smem = ca_smem + (ROW_MODE == 1 ? (threadIdx.x >> 5) * row_bytes : 0);"]
        L += [f"    vec_t<{i.ctype}, VEC>* const S_{i.cname} = reinterpret_cast<vec_t<{i.ctype}, VEC>*>("
              f"row_smem + off_{i.cname});" for i in plan.cached]
        L.append("#endif")
    for index, (phase, _) in enumerate(plan.passes):
        L += _emit_pass(plan, index, var)
        if phase <= plan.n_phases:
            L += _emit_chain(graph, [n for n in row_nodes if plan.avail[n.name] == phase], var, f"c{phase}_", "    ")
        if phase == plan.n_phases:
            L += _emit_row_outputs(plan, var, values)
    L.append("}")
    return "\n".join(L)


def _emit_row_outputs(plan: _Plan, var: dict[str, tuple[str, str]], values: dict[str, Any]) -> list[str]:
    lines = []
    for o, acc in zip(plan.graph.outputs, plan.outputs):
        if o in plan.row_const:
            lines.append(f"        {acc.cname}[kb_{acc.cname}] = {store_expr(values[o].dtype, var[o][0])};")
    return ["    if (lane == 0) {"] + lines + ["    }"] if lines else []

# ---- strided rows (cols): the innermost dim is kept ---------------------------------------------------

# A softmax over a middle dim: each row is strided, but neighbouring rows are adjacent in memory. A
# thread owns VEC neighbouring rows (one vector access covers them at each j) and walks j with the
# other BLOCK/COLW threads of its column of the block; COLW threads side by side cover COLW * VEC rows.
# Every per-row value is an array of VEC. Merges: shuffles between the lanes of a warp that share
# the rows, then one barrier and the warps' totals in shared memory, merged in warp order.

COLW_VALUES = (32, 16, 8, 4)
STATIC_SMEM_BYTES = 48 * 1024


def _acc_bytes(r: _Reduction) -> int:
    fields = _acc_fields(r.anchor)
    nbytes = sum(8 if ct in ("double", "long long") else 4 for _, ct in fields)
    return _round16(nbytes) if nbytes > 8 else nbytes


def _cols_static_smem(plan: _Plan, s: Any) -> int:
    """Shared memory of the merges: the warps' totals of every reduction (each phase its own)."""
    if s["BLOCK"] <= 32:
        return 0
    return sum((s["BLOCK"] // 32) * s["COLW"] * s["VEC"] * _acc_bytes(r) for r in plan.reductions)


def _cols_dynamic_smem(plan: _Plan, s: Any) -> int:
    return sum(_round16(plan.row_len * s["COLW"] * s["VEC"] * ITEMSIZE[i.value.dtype]) for i in plan.cached)


def _cols_registers(plan: _Plan, s: Any) -> float:
    """A rough count of a thread's registers: the cached elements, each row's accumulators and
    per-row values (VEC rows), addresses. Only the default's choice uses it."""
    state = sum(_acc_bytes(r) / 4 for r in plan.reductions) + len(plan.row_const)
    cached = s["ITEMS"] * s["VEC"] * _cache_words(plan) if s.get("CACHE") == CACHE_REGISTERS else 0
    return 24 + cached + s["VEC"] * state


# The cols default: each row read COLS_SEGMENT_BYTES wide by a block's COLW threads (two 32-byte
# sectors), BLOCK=COLS_DEFAULT_BLOCK, and the rows in registers only while a thread's registers stay
# within COLS_MAX_REGISTERS (1024 threads per SM). In the whole-space records of softmax_dim1_fp16
# (2026-11-30, H200) every schedule within 10 % of the best read 32-64 bytes of a row at 128-256
# threads, and the register-cached blocks of 512 threads the old default chose ran 2.8x slower.
COLS_SEGMENT_BYTES = 64
COLS_DEFAULT_BLOCK = 256
COLS_MAX_REGISTERS = 64


def _cols_default(plan: _Plan, vec0: int) -> dict[str, int]:
    L, words, block = plan.row_len, _cache_words(plan), COLS_DEFAULT_BLOCK
    colw = next((c for c in COLW_VALUES if c * vec0 * _widest(plan) <= COLS_SEGMENT_BYTES), COLW_VALUES[-1])
    while colw > COLW_VALUES[-1] and (colw * vec0 > plan.n_rows or _cols_static_smem(
            plan, {"VEC": vec0, "BLOCK": block, "COLW": colw}) > STATIC_SMEM_BYTES):
        colw //= 2                        # no more rows per block than there are; merges within static smem
    out = {"VEC": vec0, "BLOCK": block, "COLW": colw}
    items = _pow2_ceil(-(-L // (block // colw)))
    in_registers = {**out, "ITEMS": items, "CACHE": CACHE_REGISTERS}
    if plan.cached and items <= MAX_ITEMS and items * vec0 * words <= MAX_CACHE_WORDS[block] and \
            _cols_registers(plan, in_registers) <= COLS_MAX_REGISTERS:
        return in_registers
    steps = L / (block // colw)
    out["ITEMS"] = 4 if steps >= 8 else 2 if steps >= 4 else 1
    if plan.cached:
        out["CACHE"] = CACHE_SHARED if _cols_dynamic_smem(plan, {**out, "CACHE": 2}) <= MAX_SMEM_BYTES else CACHE_NONE
    return out


def _cols_knobs(plan: _Plan) -> list[Knob]:
    widest = _widest(plan)
    vecs = tuple(v for v in (1, 2, 4, 8) if v * widest <= MAX_ACCESS_BYTES)
    vec0 = next((v for v in reversed(vecs) if plan.inner % v == 0 and plan.n_rows >= 4 * v), 1)
    d = _cols_default(plan, vec0)
    knobs = [Knob("BLOCK", _ordered(d["BLOCK"], (256, 128, 512, 1024, 64, 32)), "threads per block"),
             Knob("COLW", _ordered(d["COLW"], COLW_VALUES),
                  "threads side by side over the rows (each VEC rows); BLOCK/COLW threads walk one row's elements"),
             Knob("VEC", _ordered(vec0, vecs), "neighbouring rows per thread (one vector access per element)"),
             Knob("ITEMS", _ordered(d["ITEMS"], (1, 2, 4, 8, 16)),
                  "elements per thread per tile (loads in flight; with CACHE=0 the tile holds the rows)")]
    if plan.cached:
        knobs.append(Knob("CACHE", _ordered(d["CACHE"], (CACHE_REGISTERS, CACHE_SHARED, CACHE_NONE)),
                          "where the rows wait between passes: 0 registers, 2 shared memory, 1 nowhere "
                          "(re-read, mostly from L2)"))
    return knobs


def _cols_constraints(plan: _Plan) -> list:
    widest = _widest(plan)
    L, words = plan.row_len, _cache_words(plan)
    default = {k.name: k.values[0] for k in plan.knobs}

    def vec_access(s: Any) -> str | None:
        if s["VEC"] * widest > MAX_ACCESS_BYTES:
            return f"VEC={s['VEC']} needs {s['VEC'] * widest}-byte accesses; the widest is {MAX_ACCESS_BYTES} bytes"
        if plan.inner % s["VEC"]:
            return (f"VEC={s['VEC']} does not divide the innermost size {plan.inner}: a vector would cross "
                    f"into other rows")
        return None

    def shape(s: Any) -> str | None:
        if s["COLW"] > s["BLOCK"]:
            return f"COLW={s['COLW']} is more than BLOCK={s['BLOCK']} threads"
        nbytes = _cols_static_smem(plan, s)
        if nbytes > STATIC_SMEM_BYTES:
            return (f"BLOCK={s['BLOCK']} x COLW={s['COLW']} x VEC={s['VEC']} merges need {nbytes} bytes of static "
                    f"shared memory (at most {STATIC_SMEM_BYTES})")
        return None

    def cache_fits(s: Any) -> str | None:
        cache = s.get("CACHE")
        rt = s["BLOCK"] // s["COLW"]
        if cache == CACHE_REGISTERS:
            if rt * s["ITEMS"] < L:
                return (f"CACHE=0 keeps the rows in registers, but {rt} threads x ITEMS={s['ITEMS']} hold {rt * s['ITEMS']} "
                        f"of their {L} elements")
            cap = MAX_CACHE_WORDS[s["BLOCK"]]
            if s["ITEMS"] * s["VEC"] * words > cap:
                return (f"CACHE=0 with ITEMS={s['ITEMS']} x VEC={s['VEC']} needs {s['ITEMS'] * s['VEC'] * words:g} "
                        f"registers per thread for the rows (at most {cap} at BLOCK={s['BLOCK']})")
        if cache == CACHE_SHARED and _cols_dynamic_smem(plan, s) > MAX_SMEM_BYTES:
            return f"CACHE=2 needs {_cols_dynamic_smem(plan, s)} bytes of shared memory per block (at most {MAX_SMEM_BYTES})"
        return None

    def idle(s: Any) -> str | None:
        if dict(s) == default:
            return None
        rt = s["BLOCK"] // s["COLW"]
        if s["COLW"] > 4 and s["COLW"] * s["VEC"] > plan.n_rows:
            return f"COLW={s['COLW']} x VEC={s['VEC']} rows per block is more than the {plan.n_rows} rows"
        if rt > L:
            return f"{rt} threads per row for rows of {L} elements leaves threads idle"
        steps = -(-L // rt)
        if s["ITEMS"] > 1 and s["ITEMS"] // 2 >= steps:
            return f"ITEMS={s['ITEMS']} is more than the {steps} elements each thread takes in a row"
        return None

    return [vec_access, shape, cache_fits, idle]


def _cols_row_chain(graph: Graph, nodes: list[Node], var: dict[str, tuple[str, str]], prefix: str) -> list[str]:
    """Row-constant nodes for the thread's VEC rows: arrays filled in a loop over the rows."""
    if not nodes:
        return []
    local = dict(var)
    body = _emit_chain(graph, nodes, local, prefix, "        ")
    L = [f"    {COMPUTE_CTYPE[n.dtype]} {prefix}{i}_r[VEC];" for i, n in enumerate(nodes)]
    L += ["    #pragma unroll", "    for (int k = 0; k < VEC; ++k) {"] + body
    for i, n in enumerate(nodes):
        L.append(f"        {prefix}{i}_r[k] = {prefix}{i};")
        var[n.name] = (f"{prefix}{i}_r[k]", COMPUTE_CTYPE[n.dtype])
    return L + ["    }"]


def _cols_load(i: _Input, dst: str, j: str, ind: str) -> list[str]:
    base = f"{i.cname} + kb_{i.cname} + {i.red_off(j)}"
    return [f"{ind}if (vec_ok) {dst} = *reinterpret_cast<const vec_t<{i.ctype}, VEC>*>({base});",
            f"{ind}else {{",
            f"{ind}    #pragma unroll",
            f"{ind}    for (int k = 0; k < VEC; ++k) {dst}.v[k] = ({base})[k];",
            f"{ind}}}"]


def _cols_element(i: _Input, j: str) -> str:
    """The raw element of input i at element j of the thread's row k (a scalar read)."""
    if i.kind == "row":
        return f"h_{i.cname}[k]"
    k = " + k" if i.inner_stride else ""
    return f"{i.cname}[kb_{i.cname} + {i.red_off(j)}{k}]"


def _emit_cols_pass(plan: _Plan, index: int, var: dict[str, tuple[str, str]]) -> list[str]:
    graph = plan.graph
    phase, sinks = plan.passes[index]
    ins = plan.pass_inputs[index]
    first = {i.value.name: next(k for k, p in enumerate(plan.pass_inputs) if i in p) == index for i in ins}
    reds = [r for r in plan.reductions if r.phase == phase]
    out_values = {o: k for k, o in enumerate(graph.outputs)}
    stores = [] if reds else [plan.outputs[out_values[s]] for s in sinks]
    L = [f"    // ---- pass {index + 1}: " + (f"phase {phase}: " + ", ".join(
        f"'{r.anchor.node.name}'" for r in reds) if reds else "the outputs") + " ----"]
    for r in reds:
        L += [f"    a{r.index}::Acc A{r.index}[VEC];",
              "    #pragma unroll",
              f"    for (int k = 0; k < VEC; ++k) A{r.index}[k] = a{r.index}::acc_init();"]
        if r.anchor.kind in ("var", "std", "var_mean", "std_mean"):
            local = dict(var)
            L += [f"    double sh{r.index}[VEC];   // each row's first element: shifted sums, no cancellation",
                  "    #pragma unroll", "    for (int k = 0; k < VEC; ++k) {"]
            for i in ins:
                src = f"(active ? {_cols_element(i, '0')} : ({i.ctype})0)"
                L.append(f"        const {COMPUTE_CTYPE[i.value.dtype]} x_{i.cname} = {load_expr(i.value.dtype, src)};")
                local[i.value.name] = (f"x_{i.cname}", COMPUTE_CTYPE[i.value.dtype])
            L += _emit_chain(graph, _bind_iotas(plan, _element_nodes(graph, [r.anchor.src.name], plan.row_const),
                                                local, "0"), local, "s",
                             "        ")
            L += [f"        sh{r.index}[k] = (double)({_reduced_value(r, local)});", "    }"]
    L.append("    for (idx_t t = 0; t < n_tiles; ++t) {")
    ind = " " * 8
    for i in ins:
        if i.kind == "chunk":
            L.append(f"{ind}{i.ctype} G_{i.cname}[ITEMS];")
        elif i in plan.cached:
            L += ["#if CACHE == 0", f"{ind}vec_t<{i.ctype}, VEC> (&L_{i.cname})[ITEMS] = C_{i.cname};",
                  "#else", f"{ind}vec_t<{i.ctype}, VEC> L_{i.cname}[ITEMS];", "#endif"]
        else:
            L.append(f"{ind}vec_t<{i.ctype}, VEC> L_{i.cname}[ITEMS];")
    head = [f"{ind}#pragma unroll",
            f"{ind}for (int it = 0; it < ITEMS; ++it) {{",
            f"{ind}    const idx_t j = (t * ITEMS + it) * rt + ty;   // this thread's element of its rows",
            f"{ind}    if (active && j < row_len) {{"]
    ind2 = ind + " " * 8
    L += head
    for i in ins:
        if i.kind == "chunk":
            L.append(f"{ind2}G_{i.cname}[it] = {i.cname}[kb_{i.cname} + {i.red_off('j')}];")
        elif i in plan.cached and first[i.value.name]:
            L += _cols_load(i, f"L_{i.cname}[it]", "j", ind2)     # with CACHE=0, L_ is the register cache
            L += ["#if CACHE == 2", f"{ind2}S_{i.cname}[j * COLW + tx] = L_{i.cname}[it];", "#endif"]
        elif i in plan.cached:
            L += ["#if CACHE == 2", f"{ind2}L_{i.cname}[it] = S_{i.cname}[j * COLW + tx];", "#elif CACHE == 1"]
            L += _cols_load(i, f"L_{i.cname}[it]", "j", ind2)
            L += ["#endif"]
        else:
            L += _cols_load(i, f"L_{i.cname}[it]", "j", ind2)
    L += [f"{ind}    }}", f"{ind}}}"]
    parted = [r for r in reds if _part_fields(r.anchor)]
    for r in parted:
        L += [f"{ind}a{r.index}::Part P{r.index}[VEC];", f"{ind}#pragma unroll",
              f"{ind}for (int k = 0; k < VEC; ++k) P{r.index}[k] = a{r.index}::part_init();"]
    L += head
    L += [f"{ind2}vec_t<{o.ctype}, VEC> O_{o.cname};" for o in stores]
    L += [f"{ind2}#pragma unroll", f"{ind2}for (int k = 0; k < VEC; ++k) {{   // row r0 + k"]
    ind3 = ind2 + " " * 4
    elements = _element_nodes(graph, sinks, plan.row_const)
    local = dict(var)
    L += _element_code(plan, ins, elements, local, ind3)
    for r in reds:
        sh = f"sh{r.index}[k]" if r.anchor.kind in ("var", "std", "var_mean", "std_mean") else "0.0"
        add, acc = ("part_add", f"P{r.index}[k]") if r in parted else ("acc_add", f"A{r.index}[k]")
        L.append(f"{ind3}a{r.index}::{add}({acc}, {_reduced_value(r, local)}, j, {sh});")
    values = {v.name: v for v in list(graph.inputs) + graph.nodes}
    for sink, o in zip(sinks if stores else [], stores):
        L.append(f"{ind3}O_{o.cname}.v[k] = {store_expr(values[sink].dtype, local[sink][0])};")
    L.append(f"{ind2}}}")
    for o in stores:
        base = f"{o.cname} + kb_{o.cname} + {o.red_off('j')}"
        L += [f"{ind2}if (vec_ok) *reinterpret_cast<vec_t<{o.ctype}, VEC>*>({base}) = O_{o.cname};",
              f"{ind2}else {{",
              f"{ind2}    #pragma unroll",
              f"{ind2}    for (int k = 0; k < VEC; ++k) ({base})[k] = O_{o.cname}.v[k];",
              f"{ind2}}}"]
    L.append(f"{ind}    }}")
    if parted:   # a full group (or the tile's last item) goes into the double accumulators
        L += [f"{ind}    if ((it + 1) % {part_group_steps('1')} == 0 || it + 1 == ITEMS) {{",
              f"{ind}        #pragma unroll", f"{ind}        for (int k = 0; k < VEC; ++k) {{"]
        L += [f"{ind}            a{r.index}::acc_take(A{r.index}[k], P{r.index}[k]); "
              f"P{r.index}[k] = a{r.index}::part_init();" for r in parted]
        L += [f"{ind}        }}", f"{ind}    }}"]
    L += [f"{ind}}}", "    }"]
    if reds:
        L += ["    // Merge the rows' accumulators: the lanes of a warp that share them (xor of COLW and up),",
              "    // then the warps' totals in warp order. Inactive threads take part with empty ones.",
              "    #pragma unroll", "    for (int o = 16; o >= COLW; o >>= 1) {",
              "        #pragma unroll", "        for (int k = 0; k < VEC; ++k) {"]
        L += [f"            a{r.index}::acc_merge(A{r.index}[k], a{r.index}::acc_shfl(A{r.index}[k], o));" for r in reds]
        L += ["        }", "    }", "    if (BLOCK > 32) {"]
        L += [f"        __shared__ a{r.index}::Acc W{index}_{r.index}[(BLOCK / 32) * COLW * VEC];" for r in reds]
        L += ["        if ((threadIdx.x & 31) < COLW) {",
              "            #pragma unroll", "            for (int k = 0; k < VEC; ++k) {"]
        L += [f"                W{index}_{r.index}[((threadIdx.x >> 5) * COLW + tx) * VEC + k] = A{r.index}[k];"
              for r in reds]
        L += ["            }", "        }",
              "        __syncthreads();   // each pass has arrays of its own: one barrier, no reuse hazard",
              "        #pragma unroll", "        for (int k = 0; k < VEC; ++k) {"]
        for r in reds:
            L += [f"            A{r.index}[k] = a{r.index}::acc_init();",
                  f"            for (int w = 0; w < BLOCK / 32; ++w) a{r.index}::acc_merge(A{r.index}[k], "
                  f"W{index}_{r.index}[(w * COLW + tx) * VEC + k]);"]
        L += ["        }", "    }"]
        for r in reds:
            L += _emit_cols_results(r, var)
    return L


def _emit_cols_results(r: _Reduction, var: dict[str, tuple[str, str]]) -> list[str]:
    a = r.anchor
    exprs = _result_exprs(a)
    names = {k: name for name, k in r.results.items()}
    L = [f"    {COMPUTE_CTYPE[dtype]} R{r.index}_{k}[VEC];   // '{names[k]}': {a.node.op} {role}"
         for k, (role, dtype) in enumerate(a.results) if k in names]
    L += ["    #pragma unroll", "    for (int k = 0; k < VEC; ++k) {", f"        using namespace a{r.index};",
          f"        const Acc& a = A{r.index}[k];"]
    for k, (_, dtype) in enumerate(a.results):
        if k not in names:
            continue
        ct = COMPUTE_CTYPE[dtype]
        L.append(f"        R{r.index}_{k}[k] = ({ct})({exprs[k]});")
        rounded = round_to_storage(dtype, f"R{r.index}_{k}[k]")
        if rounded != f"R{r.index}_{k}[k]":
            L.append(f"        R{r.index}_{k}[k] = {rounded};")
        var[names[k]] = (f"R{r.index}_{k}[k]", ct)
    return L + ["    }"]


def _emit_cols_kernel(plan: _Plan) -> str:
    graph = plan.graph
    values = {v.name: v for v in list(graph.inputs) + graph.nodes}
    params = [f"const {i.ctype}* __restrict__ {i.cname}" for i in plan.inputs]
    params += [f"{o.ctype}* __restrict__ {o.cname}" for o in plan.outputs]
    vec_ptrs = [i for i in plan.inputs if i.kind == "vector"] + [o for o in plan.outputs if o.kind == "vector"]
    checks = " && ".join(f"aligned_to<VEC * sizeof({i.ctype})>({i.cname})" for i in vec_ptrs) or "true"
    L = ['extern "C" __global__ void __launch_bounds__(BLOCK)',
         f"{plan.kernel}({', '.join(params)})",
         "{",
         f"    using namespace {plan.kernel}_ns;",
         "    constexpr int rt = BLOCK / COLW;   // threads that walk the elements of the same rows",
         "    const int tx = (int)(threadIdx.x % COLW), ty = (int)(threadIdx.x / COLW);",
         "    // This thread's VEC neighbouring rows r0 .. r0 + VEC - 1, adjacent in memory (VEC divides the",
         "    // innermost size). No early return: every thread reaches the merges' barriers.",
         "    const idx_t r0 = ((idx_t)blockIdx.x * COLW + tx) * VEC;",
         "    const bool active = r0 < n_rows;",
         "    constexpr idx_t n_tiles = (row_len + (idx_t)rt * ITEMS - 1) / ((idx_t)rt * ITEMS);",
         *(["#if CACHE == 0",
            '    static_assert(n_tiles == 1, "CACHE=0 keeps the whole rows in registers: one tile");',
            "#endif"] if plan.cached else []),
         "    // Uniform: vector accesses when every vector-accessed pointer is aligned.",
         f"    const bool vec_ok = {checks};",
         "    (void)vec_ok;"]
    for i in plan.inputs + plan.outputs:
        L.append(f"    const idx_t kb_{i.cname} = {i.kept_off('r0')};   // row r0's offset in '{i.value.name}'")
    var: dict[str, tuple[str, str]] = {}
    for i in plan.inputs:
        if i.kind == "row":
            ct = COMPUTE_CTYPE[i.value.dtype]
            k = " + k" if i.inner_stride else ""
            L += [f"    {ct} h_{i.cname}[VEC];   // one value per row",
                  "    #pragma unroll",
                  f"    for (int k = 0; k < VEC; ++k) h_{i.cname}[k] = active ? "
                  f"{load_expr(i.value.dtype, f'{i.cname}[kb_{i.cname}{k}]')} : ({ct})0;"]
            var[i.value.name] = (f"h_{i.cname}[k]", ct)
    row_nodes = _row_nodes(plan)
    L += _cols_row_chain(graph, [n for n in row_nodes if plan.avail[n.name] == 0], var, "c0_")
    if plan.cached:
        L.append("#if CACHE == 0")
        L += [f"    vec_t<{i.ctype}, VEC> C_{i.cname}[ITEMS];   // '{i.value.name}': this thread's part of its rows"
              for i in plan.cached]
        L += ["#elif CACHE == 2", "    CA_DYNAMIC_SMEM(ca_smem);"]
        offset = "0"
        for i in plan.cached:
            L.append(f"    vec_t<{i.ctype}, VEC>* const S_{i.cname} = reinterpret_cast<vec_t<{i.ctype}, VEC>*>("
                     f"ca_smem + {offset});")
            offset += f" + (row_len * COLW * VEC * sizeof({i.ctype}) + 15) / 16 * 16"
        L.append("#endif")
    for index, (phase, _) in enumerate(plan.passes):
        L += _emit_cols_pass(plan, index, var)
        if phase <= plan.n_phases:
            L += _cols_row_chain(graph, [n for n in row_nodes if plan.avail[n.name] == phase], var, f"c{phase}_")
        if phase == plan.n_phases:
            lines = []
            for o, acc in zip(graph.outputs, plan.outputs):
                if o in plan.row_const:
                    k = " + k" if acc.inner_stride else ""
                    lines.append(f"            {acc.cname}[kb_{acc.cname}{k}] = {store_expr(values[o].dtype, var[o][0])};")
            if lines:
                L += ["    if (active && ty == 0) {", "        #pragma unroll", "        for (int k = 0; k < VEC; ++k) {",
                      *lines, "        }", "    }"]
    L.append("}")
    return "\n".join(L)


# ---- the family entry point ----------------------------------------------------------------------

def reciprocal_divisors(graph: Graph) -> Graph:
    """The group with every division of a row's elements by a row-constant value (a softmax's sum, a
    row's norm) made a product with that value's reciprocal, which is then computed once per row
    (`reciprocal` of the divisor, in fp32, or fp64 when either side is fp64, never rounded to
    fp16/bf16). An IEEE division costs about ten instructions and a slow-path branch per element,
    a product one; the result differs from the quotient by at most one more rounding of the
    compute type (docs/codegen.md, numerics)."""
    anchors = [n for n in graph.nodes if n.op in ROW_OPS]
    parsed = _parse_anchor(anchors[0], graph) if anchors else None
    if not isinstance(parsed, _Anchor):
        return graph                         # _plan reports what is wrong with the group
    space = tuple(parsed.src.shape)
    reduced = [d for d in parsed.dims if space[d] > 1]

    def row_constant(name: str) -> bool:
        al = _aligned(tuple(graph.value(name).shape), space)
        return al is not None and all(al[d] == 1 for d in reduced)

    taken = {v.name for v in graph.inputs} | {n.name for n in graph.nodes}
    nodes: list[Node] = []
    for n in graph.nodes:
        ops = n.operands
        if (n.op == "div.Tensor" and n.attrs.get("rounding_mode") is None and len(ops) == 2
                and all(isinstance(o, Ref) for o in ops) and n.dtype in FLOATS
                and graph.value(ops[1].name).dtype in FLOATS
                and not row_constant(ops[0].name) and row_constant(ops[1].name)):
            divisor = graph.value(ops[1].name)
            wide = "float64" in (n.dtype, divisor.dtype, graph.value(ops[0].name).dtype)
            name, i = f"{n.name}_rcp", 0
            while name in taken:
                i += 1
                name = f"{n.name}_rcp{i}"
            taken.add(name)
            nodes.append(Node(name, "reciprocal.default", [ops[1]], {}, tuple(divisor.shape),
                              "float64" if wide else "float32"))
            nodes.append(Node(n.name, "mul.Tensor", [ops[0], Ref(name)], {}, n.shape, n.dtype))
        else:
            nodes.append(n)
    if len(nodes) == len(graph.nodes):
        return graph
    return Graph(graph.task, list(graph.inputs), nodes, list(graph.outputs), dict(graph.constants))


# Ops through which a value's relative error reaches their result unchanged (plus their own rounding).
RELATIVE_OPS = {"mul", "div", "reciprocal"} | IDENTITY_OPS
# FAST_OPS forms with a relative error of about 1e-6 (ex2.approx / rcp.approx); tanh.approx's 2^-10.9
# is only good when rounded to fp16/bf16 right after (fast_nodes).
PRECISE_ENOUGH = {"exp", "sigmoid", "silu"}
NONNEGATIVE = {"exp", "sigmoid"}


def approximable(graph: Graph) -> set[str]:
    """Nodes that may use pointwise_ops.FAST_OPS forms: those of lower_pointwise.fast_nodes (rounded
    to fp16/bf16 right after), and fp32 exp/sigmoid/silu nodes whose error reaches only fp16/bf16
    results, through products, quotients, conversions and sums or means of non-negative terms (a
    softmax's exp and its row sum). Each of those keeps a relative error bound: an error of ~2^-17
    (ex2.approx after the fp32 product x * log2(e), |x| <= 88) stays far below the 2^-11 (fp16) or
    2^-8 (bf16) of the final rounding. Anything else (an add, a log, an output in fp32) ends it."""
    readers = graph_readers(graph)
    fast = fast_nodes(graph)
    # carries: an fp32 value whose relative error only ever reaches fp16/bf16 roundings as such.
    carries: set[str] = set()

    def passes(n: Node, r: Node) -> bool:
        """n's relative error reaches r's result as such, and from there only fp16/bf16 roundings."""
        if r.base in RELATIVE_OPS:              # as numerator, divisor or reciprocal's operand alike
            return r.dtype in ("float16", "bfloat16") or r.name in carries
        if r.op in ROW_KINDS["sum"] + ROW_KINDS["mean"] and r.operands[0] == Ref(n.name):
            return n.base in NONNEGATIVE and r.name in carries
        return False

    for n in reversed(graph.nodes):
        if n.name in graph.outputs or not readers.get(n.name):
            continue
        if n.dtype != "float32" and not (n.dtype in ("float16", "bfloat16") and n.base in RELATIVE_OPS):
            continue
        if all(passes(n, r) for r in readers[n.name]):
            carries.add(n.name)
    return fast | {n.name for n in graph.nodes if n.name in carries and n.base in PRECISE_ENOUGH}


def lower_rownorm(graph: Graph, kernel: str) -> Lowering:
    """One kernel for a row group: reductions over the same rows and the elementwise ops around them."""
    graph = reciprocal_divisors(graph)
    plan = _plan(graph, kernel)
    plan.fast = approximable(graph)
    if plan.cached and plan.row_bytes > MAX_REREAD_ROW_BYTES:
        raise _error(graph, f"rows of {plan.row_bytes} bytes that {len(plan.passes)} passes read fit neither a "
                            f"block's registers or shared memory nor, for as many rows as run at once, the L2 "
                            f"cache; the reductions run as their own kernels instead.")
    cols = plan.layout == "cols"
    plan.knobs = _cols_knobs(plan) if cols else _knobs(plan)
    spec = ScheduleSpec(list(plan.knobs), _cols_constraints(plan) if cols else _constraints(plan))
    reason = spec.why_illegal(spec.default())
    if reason:
        raise _error(graph, f"the row-normalise family found no legal default schedule ({reason}).")
    source = PRELUDE + _helpers(plan) + (_emit_cols_kernel(plan) if cols else _emit_kernel(plan)) + "\n"
    values = {v.name: v for v in list(graph.inputs) + graph.nodes}
    buffers = [{"name": o, "shape": [int(s) for s in values[o].shape], "dtype": values[o].dtype}
               for o in graph.outputs]
    grid = f"{plan.n_rows} if ROW_MODE == 0 else cdiv({plan.n_rows}, BLOCK // 32)"
    shared: Any = 0
    if plan.cached:
        shared = f"{plan.row_bytes} * (BLOCK // 32 if ROW_MODE == 1 else 1) if CACHE == 2 else 0"
    if cols:
        grid = f"cdiv({plan.n_rows}, COLW * VEC)"
        if plan.cached:
            regions = " + ".join(f"cdiv({plan.row_len * ITEMSIZE[i.value.dtype]} * COLW * VEC, 16) * 16"
                                 for i in plan.cached)
            shared = f"{regions} if CACHE == 2 else 0"
    program = {
        "format": "cuda-agent/program@1",
        "name": kernel,
        "source": source,
        "tunables": {k.name: list(k.values) for k in plan.knobs},
        "schedule": {k.name: k.values[0] for k in plan.knobs},
        "buffers": buffers,
        "launches": [{"kernel": kernel, "grid": [grid], "block": ["BLOCK"], "shared_bytes": shared,
                      "args": [i.value.name for i in plan.inputs] + list(graph.outputs)}],
        "outputs": list(graph.outputs),
    }
    names = ", ".join(f"'{r.anchor.node.name}' ({r.anchor.node.op}, phase {r.phase})" for r in plan.reductions)
    notes = [f"row-normalise: {plan.n_rows} rows of {plan.row_len} elements of {list(plan.space)}; reductions "
             f"{names}; {len(plan.passes)} pass{'es' if len(plan.passes) > 1 else ''} over each row"]
    if plan.cached:
        notes.append(f"inputs read by several passes (cached per CACHE): "
                     f"{', '.join(i.value.name for i in plan.cached)}")
    for i in plan.inputs:
        how = {"row": "one value per row", "vector": "vector loads along the row",
               "chunk": "one load per vector of the row"}[i.kind]
        notes.append(f"input '{i.value.name}' {i.value.dtype}{list(i.value.shape)}: {how}")
    return Lowering(program, spec, notes)
