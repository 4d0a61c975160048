"""The reduce family: one reduction with its pointwise prologue and epilogue, in one kernel.

A group is: an optional pointwise prologue (elementwise nodes and views whose values feed the
reduction, evaluated per element of the reduction's input shape P), exactly one reduction (the
anchor: sum, mean, prod, amax/amin, max/min (values and indices), argmax/argmin, var/std and
var_mean/std_mean, linalg_vector_norm (any ord), any/all, over any set of dims, keepdim or not),
and an optional pointwise epilogue (evaluated per element of the reduction's output shape D). The
group's outputs are the reduction's results (or the getitem nodes that pick them) and epilogue
values with D's element count.

What a group may hold (for the partitioner):
- prologue values must have P's element count (read linearly: views of the same elements are
  free), one element, or broadcast into P with right-aligned dims; an input may broadcast only
  where its consumer has P's shape (up to leading 1s), not inside a reshape;
- epilogue values likewise against D (the anchor's own shape, keepdim or not): an input with D's
  element count is read linearly (e.g. a [N, 1] buffer squeezed to [N]), a smaller one must
  broadcast into D. Nothing of P's size can be computed after the reduction (x - mean(x) is a
  norm, not an epilogue): such a node raises CodegenError naming it;
- prologue values cannot be outputs (only D-sized values are written); a prologue node the
  epilogue also needs (D-sized) is recomputed there;
- elementwise = pointwise_ops.is_pointwise or a view (view, _unsafe_view, reshape, squeeze,
  unsqueeze, flatten).

Index space: the dims of P of size > 1 are kept (K) or reduced (R). Output q runs over K and the
reduction index j over R (both linear, row-major); every input's offset is kept_off(q) +
red_off(j), built from div/mod by the sizes. Sizes are baked into the source as literals (the
compiler turns div/mod by them into multiply-shifts, merged dims need none), so a program serves
the shapes it was generated for; buffer shapes are literals too. Two kernel shapes, by layout:
  rows: the innermost dim of P is reduced (rows of [.., R], dim=None, any R that ends innermost):
        one block (ROW_MODE 0) or one warp (ROW_MODE 1) per output, ROWS outputs one after
        another; threads stride over j with VEC-wide loads (run-time alignment check, scalar
        fallback); shuffles, then (a block) one shared slot per output and warp, a single barrier
        after all ROWS outputs, and warp r merges output r's slots;
  cols: the innermost dim of P is kept (mean over dim 0 of [N, C], sum over dim 1 of [B, R, C]):
        a thread owns VEC consecutive outputs and walks j (a warp reads 32 * VEC consecutive
        elements per step: coalesced), the BLOCK/COLW rows of threads of a block split j and are
        merged through shared memory.
With few outputs and a long reduction, the lowering splits j SPLIT ways: each block writes its
part's partial accumulators to scratch buffers (declared, not outputs) and counts its arrival in a
zeroed buffer (one counter per output, or per column tile); the last of the SPLIT blocks to arrive
merges the parts in a fixed order (gather_parts: a group of threads per output, the same bits
whichever block is last), runs the epilogue and sets the counter back to zero. One launch: the
second kernel this replaced cost 2.6-6.9 us and a launch (docs/performance.md, 2026-12-02 tenth
session). Whether a program splits is decided at lowering; SPLIT then tunes the parts.

Knobs: BLOCK threads per block; VEC elements per vector load (rows: along j; cols: consecutive
outputs); UNROLL vector loads each thread issues before accumulating them; ROW_MODE (rows, no
split) block or warp per output; ROWS (rows, no split: 1, 2, 4) outputs each block or warp
reduces one after another (a split program keeps one per block); COLW (cols) threads along the
outputs; SPLIT (split programs) parts of the reduction. The first value of each knob is a default
picked for the shapes. ROWS defaults to 1 with a block per output and to 2 with a warp per output
(see _default_rows: measured on an H200); ROWS > 1 is masked when the grid would hold fewer
threads than the GPU. ROWS does not change any output's reduction order: results are the same
bits at every ROWS.

Numerics: elements are computed in fp32 for fp16/bf16/fp32 (double for fp64); sums, products,
norms and variances accumulate in double per thread, through the tree and in the partials; results
are stored in the node's dtype (an explicit dtype= of sum/mean/prod/norm is honoured). Variance
uses shifted sums in double: s = sum(x - x0), ss = sum((x - x0)^2) with x0 the output's first
element, var = (ss - s^2/n) / max(n - correction, 0). One read of the input and no division per
element (per-element Welford divides, and its fp64 divisions would not keep up with HBM on fp32
data), partial results merge by plain addition (the split and the trees stay deterministic), and
the shift removes the cancellation a large mean would cause (|mean - x0| is of the order of the
standard deviation). max/min/argmax propagate NaN as PyTorch does (NaN is the extreme, the first
index wins ties, also between NaNs). No atomic adds of values: the one atomic counts a split's
arrivals, and the merge's order does not depend on which block is last, so results are bitwise
reproducible.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from core.codegen.cuda_emit import (COMPUTE_CTYPE, ITEMSIZE, PRELUDE, STORAGE_CTYPE, literal, load_expr,
                                    math_fn, round_to_storage, store_expr)
from core.codegen.errors import CodegenError
from core.codegen.graph import Graph, GraphInput, Node, Ref
# Private helpers of the pointwise family, imported rather than copied: one C expression per op
# (with PyTorch's promotion rules for comparisons) and unique C identifiers.
from core.codegen.lower_pointwise import Lowering, _cname, _node_expr, assign_node
from core.codegen.pointwise_ops import LoweringError, is_pointwise
from core.codegen.schedule import Knob, ScheduleSpec

# The anchor ops, by op name with overload -> reduction kind.
ANCHORS = {
    "sum.dim_IntList": "sum", "sum.default": "sum", "mean.dim": "mean", "mean.default": "mean",
    "prod.dim_int": "prod", "prod.default": "prod",
    "amax.default": "max", "amin.default": "min", "max.default": "max", "min.default": "min",
    "max.dim": "maxdim", "min.dim": "mindim", "argmax.default": "argmax", "argmin.default": "argmin",
    "var.correction": "var", "var.dim": "var", "var.default": "var",
    "std.correction": "std", "std.dim": "std", "std.default": "std",
    "var_mean.correction": "var_mean", "var_mean.dim": "var_mean",
    "std_mean.correction": "std_mean", "std_mean.dim": "std_mean",
    "linalg_vector_norm.default": "norm",
    "any.dim": "any", "any.dims": "any", "any.default": "any",
    "all.dim": "all", "all.dims": "all", "all.default": "all",
}
# Views that keep the element order: free in a contiguous index space.
VIEW_OPS = {"view", "_unsafe_view", "reshape", "squeeze", "unsqueeze", "flatten"}
FLOATS = ("float32", "float64", "float16", "bfloat16")
NUMERIC = FLOATS + ("int64", "int32", "int16", "int8", "uint8", "bool")
MAX_RANK = 8
MAX_ACCESS_BYTES = 16
STATIC_SHARED_BYTES = 48 * 1024
TARGET_BLOCKS = 1056                  # 8 blocks of 256 threads on each of 132 SMs (H200)
SM_THREADS = 2048                     # threads one SM holds (sm_80 and sm_90)
ROWS_VALUES = (1, 2, 4)                # outputs per block (or warp) of the rows kernel
ROWS_MIN_THREADS = 132 * 2048         # ROWS > 1 must leave a grid that can fill an H200 (132 SMs x 2048 threads)
SPLIT_VALUES = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
# Only powers of two: SPLIT = 33 x 2^m (grids of whole rounds of 132 blocks on an H200) measured
# 4-43 % slower than the power of two below it (red_mean_dim0, docs/performance.md, twelfth session).
PARTIAL_DTYPE = {"double": "float64", "float": "float32", "long long": "int64", "int": "int32"}
# fp32 elements a thread sums before the group's total goes into its double accumulator: a sum's
# conversion to double and double add (the GPU's quarter-rate conversion pipe, which also runs exp)
# once per group instead of once per element, at an error of at most 7 fp32 roundings of the
# group's magnitudes (docs/codegen.md, numerics).
PART_ELEMENTS = 8
INT_LIMITS = {"int": ("(-2147483647 - 1)", "2147483647"),
              "long long": ("(-9223372036854775807LL - 1)", "9223372036854775807LL")}


# ---- the anchor -----------------------------------------------------------------------------------

@dataclass
class _Anchor:
    node: Node
    kind: str                    # a value of ANCHORS
    src: GraphInput | Node       # the reduced value (shape P)
    dims: tuple[int, ...]        # reduced dims of P, sorted
    rdt: str                     # dtype elements are converted to before reducing
    xt: str                      # C type of one element fed to the accumulator
    at: str                      # C type of sum-like accumulators
    results: list[tuple[str, str]]  # (role, dtype) per result, in the op's result order
    ord: float = 2.0             # linalg_vector_norm
    correction: float = 1.0      # var / std
    it: str = "long long"        # C type of an arg-reduction's index (int where the reduced length fits)

    @property
    def extreme(self) -> str:
        return "min" if self.kind in ("min", "mindim", "argmin", "all") else "max"


def _dims(value: Any, rank: int) -> tuple[int, ...] | None:
    """Reduced dims, normalised and sorted; None/[] = every dim; None if invalid."""
    if value is None or value == []:
        return tuple(range(rank))
    items = [value] if isinstance(value, int) else value
    if not isinstance(items, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in items):
        return None
    if rank == 0:
        return () if all(d in (0, -1) for d in items) else None
    if not all(-rank <= d < rank for d in items):
        return None
    dims = sorted({d % rank for d in items})
    return tuple(dims) if len(dims) == len(items) else None


def _parse_anchor(node: Node, graph: Graph) -> _Anchor | str:
    """The anchor's description, or why this node is not a reduction the family can lower."""
    kind = ANCHORS.get(node.op)
    if kind is None:
        return f"'{node.op}' is not a reduction"
    if not node.operands or not isinstance(node.operands[0], Ref):
        return f"'{node.op}' does not reduce a tensor value"
    try:
        src = graph.value(node.operands[0].name)
    except KeyError:
        return f"'{node.op}' reads '{node.operands[0].name}', which is not in the group"
    rank = len(src.shape)
    if rank > MAX_RANK:
        return f"'{node.op}' reduces a rank-{rank} tensor (at most {MAX_RANK} dims)"
    if math.prod(src.shape) == 0:
        return f"'{node.op}' reduces an empty tensor"
    dims = _dims(node.attrs.get("dim"), rank)
    if dims is None:
        return f"'{node.op}' has dims {node.attrs.get('dim')!r} that do not fit a rank-{rank} input"
    rdt = node.attrs.get("dtype") if kind in ("sum", "mean", "prod", "norm") else None
    rdt = rdt or src.dtype
    if src.dtype not in NUMERIC or rdt not in NUMERIC:
        return f"'{node.op}' reduces {src.dtype} values (supported: {', '.join(NUMERIC)})"
    if kind in ("mean", "var", "std", "var_mean", "std_mean", "norm") and rdt not in FLOATS:
        return f"'{node.op}' of {rdt} values needs a floating-point dtype"
    results = node.attrs.get("results")
    if results:
        dtypes = [dt for _, dt in results]
    else:
        dtypes = [node.dtype]
    roles = {"maxdim": ["value", "index"], "mindim": ["value", "index"], "var_mean": ["var", "mean"],
             "std_mean": ["std", "mean"]}.get(kind, [kind])
    if len(dtypes) != len(roles) or any(dt not in NUMERIC for dt in dtypes):
        return f"'{node.op}' has results {dtypes} that the reduce family does not expect"
    xt = COMPUTE_CTYPE[rdt]
    xt = "int" if xt == "bool" else xt
    at = "double" if xt in ("float", "double") else "long long"
    anchor = _Anchor(node, kind, src, dims, rdt, xt, at, list(zip(roles, dtypes)))
    if math.prod(src.shape[d] for d in dims) < (1 << 31) - 1:   # INT_MAX stays free as the sentinel
        anchor.it = "int"
    if kind == "norm":
        ord_ = node.attrs.get("ord", 2)
        if isinstance(ord_, bool) or not isinstance(ord_, (int, float)):
            return f"'{node.op}' has ord={ord_!r}; a number is needed"
        anchor.ord = float(ord_)
    if kind in ("var", "std", "var_mean", "std_mean"):
        corr = node.attrs.get("correction")
        if corr is None:
            corr = 1 if node.attrs.get("unbiased", True) else 0
        if isinstance(corr, bool) or not isinstance(corr, (int, float)):
            return f"'{node.op}' has correction={corr!r}; a number is needed"
        anchor.correction = float(corr)
    return anchor


def is_reduce(node: Node, graph: Graph) -> bool:
    """True when this node is a reduction the reduce family lowers (the group's anchor)."""
    return isinstance(_parse_anchor(node, graph), _Anchor)


def _is_elementwise(node: Node) -> bool:
    return is_pointwise(node) or node.base in VIEW_OPS


# ---- index spaces -----------------------------------------------------------------------------------

def _strip(shape: tuple[int, ...]) -> tuple[int, ...]:
    i = 0
    while i < len(shape) and shape[i] == 1:
        i += 1
    return tuple(shape[i:])


def _aligns(shape: tuple[int, ...], domain: tuple[int, ...]) -> bool:
    """shape broadcasts into domain with right-aligned dims (extra leading 1s allowed)."""
    s = _strip(shape)
    if len(s) > len(domain):
        return False
    return all(a in (1, d) for a, d in zip(s, domain[len(domain) - len(s):]))


def _strides(shape: tuple[int, ...], domain: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a contiguous value read at each domain coordinate (0: broadcast)."""
    n, nv = math.prod(domain), math.prod(shape)
    if nv == n:
        aligned = tuple(domain)                  # same elements in the same order (a view at most)
    elif nv == 1:
        return (0,) * len(domain)
    else:
        s = _strip(shape)
        aligned = (1,) * (len(domain) - len(s)) + s
    strides, step = [], 1
    for size in reversed(aligned):
        strides.append(step if size > 1 else 0)
        step *= size
    return tuple(reversed(strides))


def _domain_reads(graph: Graph, nodes: list[Node], domain: tuple[int, ...], extra: list[str],
                  what: str) -> dict[str, tuple[int, ...]]:
    """Check that nodes evaluate per element of `domain`; the strides of each group input read.

    A value is read at a domain element either linearly (it has the domain's element count: same
    elements in the same order, a view at most), as a scalar, or with right-aligned broadcasting
    when its consumer's shape is itself right-aligned with the domain.
    """
    values = _values(graph)
    inputs = {v.name for v in graph.inputs}
    n = math.prod(domain)
    reads: dict[str, tuple[int, ...]] = {}
    for node in nodes:
        ns = math.prod(node.shape)
        aligned = _aligns(node.shape, domain)
        if ns not in (n, 1) and not aligned:
            raise CodegenError(f"Task '{graph.task}': {what} node '{node.name}' ({node.op}) has shape "
                               f"{list(node.shape)}, which does not broadcast against {list(domain)}; the "
                               f"reduce family computes it per element of that shape.",
                               task=graph.task, ops=[node.op])
        for op in node.operands:
            if not isinstance(op, Ref):
                continue
            v = values[op.name]
            nv = math.prod(v.shape)
            if nv not in (n, 1) and (not aligned or (node.base in VIEW_OPS and _strip(v.shape) != _strip(node.shape))):
                raise CodegenError(
                    f"Task '{graph.task}': {what} node '{node.name}' ({node.op}, shape {list(node.shape)}) "
                    f"reads '{v.name}' of shape {list(v.shape)} through a reshape of {list(domain)}; the reduce "
                    f"family only broadcasts operands that line up with {list(domain)}.",
                    task=graph.task, ops=[node.op])
            if op.name in inputs:
                reads[op.name] = _strides(tuple(v.shape), domain)
    for name in extra:
        reads[name] = _strides(tuple(values[name].shape), domain)
    return reads


def _offset_expr(var: str, sizes: list[int], strides: list[int]) -> str:
    """C offset of the element at linear index `var` over dims `sizes` (row-major) for a value
    with these per-dim strides (0: broadcast). Adjacent dims that merge need no div/mod."""
    dims: list[list[int]] = []
    for size, stride in zip(sizes, strides):
        if dims and ((dims[-1][1] == 0 and stride == 0) or
                     (stride != 0 and dims[-1][1] == stride * size)):
            dims[-1] = [dims[-1][0] * size, stride]
        else:
            dims.append([size, stride])
    terms = []
    for i, (size, stride) in enumerate(dims):
        if stride == 0:
            continue
        inner = math.prod(s for s, _ in dims[i + 1:])
        coord = var if inner == 1 else f"({var} / {inner})"
        if i > 0:
            coord = f"({coord} % {size})"
        terms.append(coord if stride == 1 else f"{coord} * {stride}")
    return " + ".join(terms) if terms else "0"


def _values(graph: Graph) -> dict[str, Any]:
    values: dict[str, Any] = {v.name: v for v in graph.inputs}
    values.update({nd.name: nd for nd in graph.nodes})
    return values


def _closure(graph: Graph, roots: list[str], stop: set[str]) -> list[Node]:
    """The group's nodes that roots depend on (stopping at `stop`), in graph order."""
    by_name = {nd.name: nd for nd in graph.nodes}
    seen: set[str] = set()
    todo = [r for r in roots if r in by_name and r not in stop]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for op in by_name[name].operands:
            if isinstance(op, Ref) and op.name in by_name and op.name not in stop:
                todo.append(op.name)
    return [nd for nd in graph.nodes if nd.name in seen]


def _uses(node: Node, targets: set[str], values: dict[str, Any]) -> bool:
    """Does node depend on any of targets (through the group's nodes)?"""
    todo, seen = [node], set()
    while todo:
        nd = todo.pop()
        for op in nd.operands:
            if not isinstance(op, Ref) or op.name in seen:
                continue
            if op.name in targets:
                return True
            seen.add(op.name)
            if isinstance(values.get(op.name), Node):
                todo.append(values[op.name])
    return False


# ---- the plan -----------------------------------------------------------------------------------

@dataclass
class _In:
    """How the main kernel reads one prologue input."""

    value: GraphInput
    cname: str
    kept_sizes: list[int]        # sizes of P's kept dims (of size > 1), outer to inner
    kept_strides: list[int]      # this input's element strides along them (0: broadcast)
    red_sizes: list[int]         # the same for the reduced dims
    red_strides: list[int]
    last: int                    # stride along the vector axis (the innermost dim of P): 0 or 1

    @property
    def ctype(self) -> str:
        return STORAGE_CTYPE[self.value.dtype]

    def kept_off(self, var: str) -> str:
        """Offset of output `var`'s first element (the part of the offset from the kept dims)."""
        return _offset_expr(var, self.kept_sizes, self.kept_strides)

    def red_off(self, var: str) -> str:
        """The part of the offset from reduction index `var`."""
        return _offset_expr(var, self.red_sizes, self.red_strides)

    @property
    def hoisted(self) -> bool:
        """Constant along the reduction: loaded once per output."""
        return all(s == 0 for s in self.red_strides)


@dataclass
class _EpiIn:
    value: GraphInput
    cname: str
    offset: str                  # C offset in q


@dataclass
class _Plan:
    graph: Graph
    kernel: str
    anchor: _Anchor
    pro_nodes: list[Node]
    epi_nodes: list[Node]
    result_names: dict[str, int]     # value name -> result index of the anchor
    pro_ins: list[_In]
    epi_ins: list[_EpiIn]
    outputs: list[str]               # group outputs (buffer names = node names)
    out_cnames: list[str]
    n_out: int
    n_red: int
    family: str                      # rows | cols
    inner: int                       # size of the vector axis (innermost dim of P of size > 1)
    split: bool
    idx_t: str
    knobs: list[Knob] = field(default_factory=list)
    partials: list[tuple[str, str, str, str]] = field(default_factory=list)  # (buffer, cname, field, ctype)
    arrivals: tuple[str, str] = ("", "")     # split: the zeroed counters' buffer and C name

    @property
    def vec_inputs(self) -> list[_In]:
        return [i for i in self.pro_ins if not i.hoisted and i.last == 1]


def _error(graph: Graph, text: str, ops: list[str] | None = None) -> CodegenError:
    return CodegenError(f"Task '{graph.task}': {text}", task=graph.task, ops=ops or graph.ops())


def _plan(graph: Graph, kernel: str) -> _Plan:
    anchors = [nd for nd in graph.nodes if nd.op in ANCHORS]
    if len(anchors) != 1:
        found = ", ".join(f"'{a.name}' ({a.op})" for a in anchors) or "none"
        raise _error(graph, f"the reduce family lowers a group with exactly one reduction; this group has "
                            f"{found}.")
    parsed = _parse_anchor(anchors[0], graph)
    if isinstance(parsed, str):
        raise _error(graph, f"the reduce family cannot lower node '{anchors[0].name}': {parsed}.", [anchors[0].op])
    anchor = parsed
    node = anchor.node
    result_names: dict[str, int] = {}
    multi = len(anchor.results) > 1
    if not multi:
        result_names[node.name] = 0
    for nd in graph.nodes:
        if nd.op == "getitem" and nd.operands and isinstance(nd.operands[0], Ref) and nd.operands[0].name == node.name:
            if not multi:
                raise _error(graph, f"'{nd.name}' picks a result of the single-result '{node.op}'.", [node.op])
            result_names[nd.name] = int(nd.attrs["index"])
    bad = sorted({nd.op for nd in graph.nodes
                  if nd is not node and nd.name not in result_names and not _is_elementwise(nd)})
    if bad:
        raise _error(graph, f"the reduce family fuses only elementwise ops and views around '{node.op}'; "
                            f"this group also has {', '.join(bad)}.", bad)
    values = _values(graph)
    for nd in graph.nodes:
        for op in nd.operands:
            if isinstance(op, Ref) and op.name not in values:
                raise _error(graph, f"node '{nd.name}' ({nd.op}) reads '{op.name}', which is neither an input nor "
                                    f"a node of the group.", [nd.op])
    for o in graph.outputs:
        if o not in values:
            raise _error(graph, f"output '{o}' is not a value of the group.")
        if isinstance(values[o], GraphInput):
            raise _error(graph, f"output '{o}' is a group input; a group writes only values it computes.")
        if o == node.name and multi:
            raise _error(graph, f"output '{o}' is the multi-result '{node.op}' itself; name its getitem nodes.")
    src = anchor.src
    pro_nodes = _closure(graph, [src.name], set())
    stop = set(result_names) | {node.name}
    epi_nodes = _closure(graph, list(graph.outputs), stop)
    if any(nd.name in stop for nd in pro_nodes):
        raise _error(graph, f"the input of '{node.op}' depends on its own result.", [node.op])
    P = tuple(src.shape)
    D = tuple(node.shape)
    pro_reads = _domain_reads(graph, pro_nodes, P, [src.name] if isinstance(src, GraphInput) else [],
                              "prologue")
    # Check the consumers of the results first: a norm-style consumer of the input is the likelier mistake.
    after = {nd.name for nd in epi_nodes if _uses(nd, stop, values)}
    epi_reads = _domain_reads(graph, sorted(epi_nodes, key=lambda nd: nd.name not in after), D, [], "epilogue")
    n_out = math.prod(D)
    for o in graph.outputs:
        if math.prod(values[o].shape) != n_out:
            raise _error(graph, f"output '{o}' has shape {list(values[o].shape)}; the reduce family writes "
                                f"values of the reduction's output size ({list(D)}). Values of the input's "
                                f"shape belong in another group (e.g. a norm or pointwise family).")

    nz = [d for d in range(len(P)) if P[d] > 1]
    kept = [d for d in nz if d not in anchor.dims]
    red = [d for d in nz if d in anchor.dims]
    kept_sizes, red_sizes = [P[d] for d in kept], [P[d] for d in red]
    if math.prod(kept_sizes) != n_out or [s for s in D if s > 1] != kept_sizes:
        raise _error(graph, f"'{node.op}' of {list(P)} over dims {list(anchor.dims)} has output shape {list(D)}, "
                            f"which is not the kept dims; cannot lower it.", [node.op])
    n_red = math.prod(red_sizes)
    family = "rows" if not nz or nz[-1] in anchor.dims else "cols"
    inner = P[nz[-1]] if nz else 1

    taken: set[str] = set()
    pro_ins = []
    for v in graph.inputs:
        if v.name not in pro_reads:
            continue
        st = pro_reads[v.name]
        pro_ins.append(_In(v, _cname("in_", v.name, taken), kept_sizes, [st[d] for d in kept],
                           red_sizes, [st[d] for d in red], st[nz[-1]] if nz else 0))
    D_nz = [d for d in range(len(D)) if D[d] > 1]
    epi_ins = []
    for v in graph.inputs:
        if v.name not in epi_reads:
            continue
        st = epi_reads[v.name]
        epi_ins.append(_EpiIn(v, _cname("ep_", v.name, taken),
                              _offset_expr("q", [D[d] for d in D_nz], [st[d] for d in D_nz])))
    out_cnames = [_cname("out_", o, taken) for o in graph.outputs]
    used = set(pro_reads) | set(epi_reads) | {nd.name for nd in pro_nodes + epi_nodes}
    for v in list(graph.inputs) + graph.nodes:
        if v.name in used and v.dtype not in STORAGE_CTYPE:
            raise _error(graph, f"'{v.name}' has dtype {v.dtype}, which the reduce family does not support.")

    widest = max((ITEMSIZE[i.value.dtype] for i in pro_ins if not i.hoisted and i.last == 1), default=1)
    vec0 = _default_vec(family, inner, widest, n_out, n_red)[0]
    split = _wants_split(family, n_out, n_red, vec0)
    big = math.prod(P) + n_out * SPLIT_VALUES[-1] + (1 << 22)
    idx_t = "int" if big < (1 << 31) else "long long"
    plan = _Plan(graph, kernel, anchor, pro_nodes, epi_nodes, result_names, pro_ins, epi_ins,
                 list(graph.outputs), out_cnames, n_out, n_red, family, inner, split, idx_t)
    if split:
        reserved = {v.name for v in graph.inputs} | set(graph.outputs) | set(graph.constants)

        def buffer_name(name: str) -> str:
            """A scratch buffer's name, clear of the group's inputs, outputs and constants."""
            while name in reserved:
                name = "_" + name
            reserved.add(name)
            return name

        for fname, ctype in _acc_fields(anchor):
            name = buffer_name("partials" if not plan.partials else f"partials_{fname}")
            plan.partials.append((name, _cname("part_", fname, taken), fname, ctype))
        name = buffer_name("arrivals")
        plan.arrivals = (name, _cname("arr_", name, taken))
    return plan


# ---- knobs ---------------------------------------------------------------------------------------

# A reduction is split when its outputs alone give fewer blocks than this (two per SM of an H200)
# and there is enough work for the second launch and the partials to pay off.
SPLIT_BELOW_BLOCKS = 264
SPLIT_MIN_ELEMENTS = 1 << 20
SPLIT_MIN_ROW = 8192


def _wants_split(family: str, n_out: int, n_red: int, vec0: int) -> bool:
    if n_out * n_red < SPLIT_MIN_ELEMENTS:
        return False
    if family == "rows":
        return n_out < SPLIT_BELOW_BLOCKS and n_red >= SPLIT_MIN_ROW
    return _cdiv(n_out, 32 * vec0) < SPLIT_BELOW_BLOCKS and n_red >= 64


def _pow2_floor(x: float) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(x, 1)))))


def _default_vec(family: str, inner: int, widest: int, n_out: int, n_red: int) -> list[int]:
    """Candidates for the default VEC, best first: the widest 16-byte-or-less vector that divides
    the innermost size and still gives a warp a vector each."""
    good = []
    for v in (8, 4, 2):
        if v * widest > MAX_ACCESS_BYTES or inner % v:
            continue
        if (n_red if family == "rows" else n_out) < 32 * v:
            continue
        good.append(v)
    return good + [1]


def _rows_threads(n_out: int, rows: int, block: int, row_mode: int) -> int:
    """Threads in the grid of the (unsplit) rows kernel."""
    return _cdiv(n_out, rows * (block // 32 if row_mode == 1 else 1)) * block


def _default_rows(n_out: int, block: int, row_mode: int) -> int:
    """The default ROWS. A block per row: 1 (measured on an H200, 4096-8192 rows of 16384: ROWS 2
    and 4 gain nothing over 1, which already reaches 94-98 % of the copy floor, and cost up to 7 %
    on bf16). A warp per row: 2 while the grid still fills the GPU (65536 rows of 1024: 2-3 %
    faster at every BLOCK, the warp's start-up and shuffle tree shared by two rows)."""
    if row_mode == 1 and _rows_threads(n_out, 2, block, row_mode) >= ROWS_MIN_THREADS:
        return 2
    return 1


def _ordered(default: int, values: tuple[int, ...]) -> tuple[int, ...]:
    return (default,) + tuple(v for v in values if v != default)


def _knobs(plan: _Plan, widest: int, vec0: int) -> list[Knob]:
    vecs = tuple(v for v in (1, 2, 4, 8) if v * widest <= MAX_ACCESS_BYTES)
    if plan.family == "rows":
        warp = plan.n_red <= 1024 and not plan.split
        lanes = 32 if warp else 256
        iters = plan.n_red / (lanes * vec0)
        unroll0 = 4 if iters >= 8 else 2 if iters >= 4 else 1
        block0 = 32 * min(8, _pow2_floor(plan.n_out)) if warp else 256   # no idle warps by default
        knobs = [Knob("BLOCK", _ordered(block0, (256, 32, 64, 128, 512, 1024)), "threads per block"),
                 Knob("VEC", _ordered(vec0, vecs), "elements per vector load along the row"),
                 Knob("UNROLL", _ordered(unroll0, (1, 2, 4)), "vector loads in flight per thread per step")]
        if not plan.split:
            knobs.insert(1, Knob("ROW_MODE", (1, 0) if warp else (0, 1),
                                 "0: one block per output row; 1: one warp per row, BLOCK/32 rows per block"))
            knobs.insert(2, Knob("ROWS", _ordered(_default_rows(plan.n_out, block0, int(warp)), ROWS_VALUES),
                                 "outputs each block (ROW_MODE 0) or warp (ROW_MODE 1) reduces one after another"))
    else:
        yt = min(8, _pow2_floor(plan.n_red))
        colw0 = 256 // yt
        iters = plan.n_red / yt
        unroll0 = 4 if iters >= 8 else 2 if iters >= 4 else 1
        knobs = [Knob("BLOCK", _ordered(256, (64, 128, 256, 512, 1024)), "threads per block"),
                 Knob("COLW", _ordered(colw0, (32, 64, 128, 256)),
                      "threads along the outputs; BLOCK/COLW threads share one output's reduction"),
                 Knob("VEC", _ordered(vec0, vecs), "consecutive outputs per thread (one vector load)"),
                 Knob("UNROLL", _ordered(unroll0, (1, 2, 4)), "reduction steps in flight per thread")]
    if plan.split:
        knobs.append(Knob("SPLIT", _split_values(plan, vec0), "parts the reduction is split into "
                                                              "(the last part to finish merges them)"))
        knobs.append(Knob("OCC", (0, 1, 2), "registers: 0 the compiler's choice; 1 at most what "
                                            f"{SM_THREADS} / BLOCK resident blocks leave (the one wave SPLIT's "
                                            "default is sized for); 2 up to what one block leaves"))
    return knobs


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _split_values(plan: _Plan, vec0: int) -> tuple[int, ...]:
    """SPLIT choices, the default first: enough blocks to fill the GPU, each part long enough."""
    if plan.family == "rows":
        blocks = plan.n_out
        per_part_min = 256 * vec0 * 2           # each thread of a 256-thread block reads 2 vectors
    else:
        blocks = _cdiv(plan.n_out, 32 * vec0)
        per_part_min = 32                        # 8 rows of threads x 4 steps
    cap = max(2, _pow2_floor(plan.n_red / per_part_min))
    default = max(2, min(_pow2_floor(TARGET_BLOCKS / blocks), cap, SPLIT_VALUES[-1]))
    others = [s for s in SPLIT_VALUES if s != default and default / 8 <= s <= default * 8 and s <= plan.n_red]
    return (default,) + tuple(others)


def _constraints(plan: _Plan, widest: int, acc_bytes: int) -> list:
    """Hard limits (access width, block shape, shared memory) and soft masks of schedules that
    leave threads idle or knobs without effect; the default is exempt from the soft ones."""
    default = {k.name: k.values[0] for k in plan.knobs}
    n_out, n_red, inner, rows_family = plan.n_out, plan.n_red, plan.inner, plan.family == "rows"
    min_threads = ROWS_MIN_THREADS     # read now: the constraint keeps the threshold it was lowered with

    def chunk(s: Any) -> int:
        """Reduction elements per part (per block in the rows kernel)."""
        part = _cdiv(n_red, s.get("SPLIT", 1))
        return _cdiv(part, s["VEC"]) * s["VEC"] if rows_family else part

    def vec_access(s: Any) -> str | None:
        if s["VEC"] * widest > MAX_ACCESS_BYTES:
            return f"VEC={s['VEC']} needs {s['VEC'] * widest}-byte loads; the widest load is {MAX_ACCESS_BYTES} bytes"
        if inner % s["VEC"]:
            return (f"VEC={s['VEC']} does not divide the innermost size {inner}: a vector would cross a row "
                    f"of the index space")
        return None

    def block_shape(s: Any) -> str | None:
        if not rows_family and s["COLW"] > s["BLOCK"]:
            return f"COLW={s['COLW']} is more than BLOCK={s['BLOCK']} threads"
        if not rows_family and s["BLOCK"] > s["COLW"]:
            nbytes = s["BLOCK"] * s["VEC"] * acc_bytes
            if nbytes > STATIC_SHARED_BYTES:
                return (f"BLOCK={s['BLOCK']} x VEC={s['VEC']} accumulators of {acc_bytes} bytes need {nbytes} "
                        f"bytes of shared memory (static limit {STATIC_SHARED_BYTES})")
        return None

    def idle(s: Any) -> str | None:
        if dict(s) == default:
            return None
        if rows_family and s.get("ROW_MODE", 0) == 0:
            if s["BLOCK"] > 32 and s["BLOCK"] * s["VEC"] > chunk(s):
                return (f"BLOCK={s['BLOCK']} threads x VEC={s['VEC']} for {chunk(s)} elements per block "
                        f"leaves threads idle")
        elif rows_family:
            if s["BLOCK"] // 32 > n_out:
                return f"BLOCK={s['BLOCK']} gives {s['BLOCK'] // 32} warps for only {n_out} rows"
        else:
            rows = s["BLOCK"] // s["COLW"]
            if rows > 1 and rows > chunk(s):
                return f"{rows} rows of threads for {chunk(s)} reduction steps per block leaves threads idle"
            if s["COLW"] > 32 and s["COLW"] * s["VEC"] > n_out:
                return f"COLW={s['COLW']} x VEC={s['VEC']} outputs per block is more than the {n_out} outputs"
        return None

    def few_threads(s: Any) -> str | None:
        if dict(s) == default or s.get("ROWS", 1) == 1:
            return None
        threads = _rows_threads(n_out, s["ROWS"], s["BLOCK"], s["ROW_MODE"])
        if threads < min_threads:
            return (f"ROWS={s['ROWS']} leaves {threads} threads for {n_out} outputs, fewer than the GPU "
                    f"holds ({min_threads}): SMs would idle")
        return None

    def useless(s: Any) -> str | None:
        if dict(s) == default:
            return None
        if s["UNROLL"] > 1:
            if rows_family:
                lanes = 32 if s.get("ROW_MODE", 0) == 1 else s["BLOCK"]
                steps = chunk(s) / (lanes * s["VEC"])
            else:
                steps = chunk(s) / (s["BLOCK"] // s["COLW"])
            if steps < s["UNROLL"]:
                return f"UNROLL={s['UNROLL']} is more than the {steps:.1f} steps each thread takes"
        if s.get("SPLIT", 1) * s["VEC"] > n_red:
            if "SPLIT" not in s:
                return f"VEC={s['VEC']} for a reduction of {n_red} elements"
            return f"SPLIT={s['SPLIT']} parts of VEC={s['VEC']} for a reduction of {n_red} elements"
        return None

    return [vec_access, block_shape, idle, few_threads, useless]


# ---- C emission ---------------------------------------------------------------------------------

def _acc_fields(a: _Anchor) -> list[tuple[str, str]]:
    k = a.kind
    if k in ("sum", "mean", "prod"):
        return [("s", a.at)]
    if k == "norm":
        return [("m", a.xt)] if math.isinf(a.ord) else [("s", "double" if a.xt in ("float", "double") else a.at)]
    if k in ("max", "min", "any", "all"):
        return [("m", "int" if k in ("any", "all") else a.xt)]
    if k in ("maxdim", "mindim", "argmax", "argmin"):
        return [("v", a.xt), ("i", a.it)]
    fields = [("s", "double"), ("ss", "double")]
    return fields + [("s0", "double")] if k in ("var_mean", "std_mean") else fields


def _ident(ctype: str, extreme: str) -> str:
    """The identity of max (extreme='max') or min over ctype."""
    if ctype in ("float", "double"):
        return literal(-math.inf if extreme == "max" else math.inf, ctype)
    lo, hi = INT_LIMITS[ctype]
    return lo if extreme == "max" else hi


def _part_fields(a: _Anchor) -> list[str]:
    """The fields of the fp32 partial (docs/codegen.md: numerics) that feeds the accumulator of a
    sum-like anchor over float elements; [] where each element goes into the accumulator itself
    (max, argmax, prod, integer and double sums)."""
    if a.xt != "float":
        return []
    if a.kind in ("sum", "mean"):
        return ["s"] if a.at == "double" else []
    if a.kind == "norm":
        return [] if math.isinf(a.ord) else ["s"]
    if a.kind in ("var", "std"):
        return ["s", "ss"]
    if a.kind in ("var_mean", "std_mean"):
        return ["s", "ss", "s0"]
    return []


def _part_code(a: _Anchor) -> list[str]:
    """Part, part_init, part_add and acc_take for an anchor with a partial."""
    fields = _part_fields(a)
    fabs = "fabsf(x)"
    if a.kind in ("sum", "mean"):
        add = "p.s += x;"
    elif a.kind == "norm":
        add = {2: "p.s += x * x;", 1: f"p.s += {fabs};", 0: "p.s += (x != 0.0f) ? 1.0f : 0.0f;"}.get(
            a.ord, f"p.s += {math_fn('pow', 'float')}({fabs}, {literal(a.ord, 'float')});")
    else:
        # sh is a float element (the row's first), so (float)sh is exact.
        add = "const float d = x - (float)sh; p.s += d; p.ss += d * d;" + (" p.s0 += x;" if "s0" in fields else "")
    return [f"// fp32 sums of up to {PART_ELEMENTS} elements, each group's total added to the double accumulator at once.",
            "struct Part { " + " ".join(f"float {f};" for f in fields) + " };",
            "CA_HD Part part_init() { Part p; " + " ".join(f"p.{f} = 0.0f;" for f in fields) + " return p; }",
            f"CA_HD void part_add(Part& p, float x, idx_t j, double sh) {{ {add} }}",
            "CA_HD void acc_take(Acc& a, const Part& p) { " + " ".join(f"a.{f} += (double)p.{f};" for f in fields) + " }"]


def part_group_steps(per_step: str) -> str:
    """C expression: how many loop steps of per_step elements (a C expression) fill one partial group."""
    if per_step == "1":
        return str(PART_ELEMENTS)
    return f"(({PART_ELEMENTS} / ({per_step})) > 0 ? ({PART_ELEMENTS} / ({per_step})) : 1)"


def _acc_code(a: _Anchor) -> str:
    fields = _acc_fields(a)
    xt, k = a.xt, a.kind
    init = {}
    merge = []
    for name, ct in fields:
        init[name] = literal(0, ct)
        merge.append(f"a.{name} += b.{name};")
    fabs = f"{math_fn('fabs', xt)}(x)" if xt in ("float", "double") else "(x < 0 ? -x : x)"
    if k in ("sum", "mean"):
        add = f"a.s += ({a.at})x;"
    elif k == "prod":
        init["s"] = literal(1, a.at)
        add, merge = f"a.s *= ({a.at})x;", ["a.s *= b.s;"]
    elif k == "norm" and math.isinf(a.ord):
        ext = "max" if a.ord > 0 else "min"
        init["m"] = _ident(xt, ext)
        add, merge = f"a.m = nan_{ext}(a.m, {fabs});", [f"a.m = nan_{ext}(a.m, b.m);"]
    elif k == "norm":
        p = a.ord
        if p == 2:
            add = "a.s += (double)x * (double)x;"
        elif p == 1:
            add = f"a.s += (double){fabs};"
        elif p == 0:
            add = f"a.s += (x != {literal(0, xt)}) ? 1.0 : 0.0;"
        else:
            add = f"a.s += (double){math_fn('pow', xt)}({fabs}, {literal(p, xt)});"
    elif k in ("max", "min"):
        init["m"] = _ident(xt, k)
        add, merge = f"a.m = nan_{k}(a.m, x);", [f"a.m = nan_{k}(a.m, b.m);"]
    elif k in ("any", "all"):
        init["m"] = "0" if k == "any" else "1"
        op = "|" if k == "any" else "&"
        add, merge = f"a.m {op}= (x != {literal(0, xt)}) ? 1 : 0;", [f"a.m {op}= b.m;"]
    elif k in ("maxdim", "mindim", "argmax", "argmin"):
        init["v"], init["i"] = _ident(xt, a.extreme), INT_LIMITS[a.it][1]
        # Each thread adds its elements in increasing index order, so a tie never takes the new one:
        # take x when it is NaN or strictly beyond a.v, unless a.v is already NaN (the first NaN
        # wins). An element equal to the identity is never taken; the index stays the sentinel and
        # _result_exprs maps it to 0 (every element was the identity: the first one).
        beyond = "<=" if a.extreme == "max" else ">="
        add = f"if (a.v == a.v && !(x {beyond} a.v)) {{ a.v = x; a.i = ({a.it})j; }}"
        merge = ["if (better(b.v, b.i, a.v, a.i)) { a.v = b.v; a.i = b.i; }"]
    else:
        add = "const double d = (double)x - sh; a.s += d; a.ss += d * d;"
        if k in ("var_mean", "std_mean"):
            add += " a.s0 += (double)x;"
    lines = ["// The accumulator: one per thread, merged in a fixed tree (deterministic).",
             "struct Acc { " + " ".join(f"{ct} {name};" for name, ct in fields) + " };",
             "CA_HD Acc acc_init() { Acc a; " + " ".join(f"a.{n} = {init[n]};" for n, _ in fields) + " return a; }"]
    if k in ("maxdim", "mindim", "argmax", "argmin"):
        cmp = ">" if a.extreme == "max" else "<"
        lines += ["// Does (vb, ib) beat (va, ia)? NaN is the extreme (as in PyTorch); ties go to the first index.",
                  f"CA_HD bool better({xt} vb, {a.it} ib, {xt} va, {a.it} ia) {{",
                  "    const bool nb = vb != vb, na = va != va;",
                  "    if (nb || na) return nb && (!na || ib < ia);",
                  f"    return vb {cmp} va || (vb == va && ib < ia);",
                  "}"]
    lines += [f"CA_HD void acc_add(Acc& a, {xt} x, idx_t j, double sh) {{ {add} }}",
              "CA_HD void acc_merge(Acc& a, const Acc& b) { " + " ".join(merge) + " }",
              "__device__ __forceinline__ Acc acc_shfl(const Acc& a, int o) {",
              "    Acc b;"]
    lines += [f"    b.{n} = __shfl_xor_sync(0xffffffffu, a.{n}, o);" for n, _ in fields]
    lines += ["    return b;", "}"]
    if _part_fields(a):
        lines += _part_code(a)
    return "\n".join(lines)


def _result_exprs(a: _Anchor) -> list[str]:
    """C expressions (of the merged `a`) for each of the anchor's results, before storing."""
    n = "(double)n_red"
    k = a.kind
    if k == "sum" or k == "prod":
        return ["a.s"]
    if k == "mean":
        return [f"a.s / {n}"]
    if k == "norm":
        p = a.ord
        if math.isinf(p):
            return ["a.m"]
        if p == 2:
            return ["sqrt(a.s)"]
        if p in (0, 1):
            return ["a.s"]
        return [f"pow(a.s, {literal(1.0 / p, 'double')})"]
    if k in ("max", "min"):
        return ["a.m"]
    if k in ("any", "all"):
        return ["(a.m != 0)"]
    index = f"(a.i == {INT_LIMITS[a.it][1]} ? ({a.it})0 : a.i)"   # the sentinel: all elements the identity
    if k in ("argmax", "argmin"):
        return [index]
    if k in ("maxdim", "mindim"):
        return ["a.v", index]
    var = "var_of(a)"
    first = f"sqrt({var})" if k in ("std", "std_mean") else var
    return [first, f"a.s0 / {n}"] if k in ("var_mean", "std_mean") else [first]


def _var_helper(a: _Anchor) -> str:
    if a.kind not in ("var", "std", "var_mean", "std_mean"):
        return ""
    return f"""// Shifted sums: m2 = ss - s^2/n, clamped at 0 against rounding (a NaN stays NaN).
CA_HD double var_of(const Acc& a) {{
    double m2 = a.ss - a.s * a.s / (double)n_red;
    m2 = m2 < 0.0 ? 0.0 : m2;
    const double dof = (double)n_red - {literal(a.correction, 'double')};
    return m2 / (dof > 0.0 ? dof : 0.0);
}}
"""


def _emit_chain(graph: Graph, nodes: list[Node], var: dict[str, tuple[str, str]], prefix: str,
                indent: str, fast: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """C statements computing nodes (in order) into variables; `var` gains each node's variable.
    Nodes named in `fast` may use pointwise_ops.FAST_OPS forms (the caller shows their error is
    invisible in the result)."""
    values = _values(graph)
    lines = []
    for i, node in enumerate(nodes):
        ct = COMPUTE_CTYPE[node.dtype]
        cvar = f"{prefix}{i}"
        try:
            if node.base in VIEW_OPS:
                src, have = var[node.operands[0].name]
                expr = src if have == ct else f"(({ct}){src})"
            else:
                expr = _node_expr(node, ct, var, values, fast=node.name in fast)
        except LoweringError as exc:
            raise _error(graph, f"the reduce family cannot lower '{node.op}' (node '{node.name}'): {exc} is "
                                f"not supported.", [node.op]) from exc
        lines += assign_node(node, ct, cvar, expr, indent)
        var[node.name] = (cvar, ct)
    return lines


def _emit_prologue(plan: _Plan) -> str:
    """pro(raw inputs) -> the reduced element, converted to the accumulator's element type."""
    a = plan.anchor
    params = [f"{i.ctype} r_{i.cname}" for i in plan.pro_ins]
    lines = ["// The prologue for one element of the reduction's input: raw stored inputs in.",
             f"CA_HD {a.xt} pro({', '.join(params)}) {{"]
    var: dict[str, tuple[str, str]] = {}
    for i in plan.pro_ins:
        ct = COMPUTE_CTYPE[i.value.dtype]
        lines.append(f"    const {ct} {i.cname} = {load_expr(i.value.dtype, 'r_' + i.cname)};")
        var[i.value.name] = (i.cname, ct)
    lines += _emit_chain(plan.graph, plan.pro_nodes, var, "p", "    ")
    value, ct = var[a.src.name]
    rdt_ct = COMPUTE_CTYPE[a.rdt]
    if rdt_ct != ct:
        value = round_to_storage(a.rdt, f"(({rdt_ct}){value})")   # the dtype= conversion
    lines += [f"    return ({a.xt})({value});", "}"]
    return "\n".join(lines)


def _emit_finish(plan: _Plan) -> str:
    """finish(q, merged accumulator): the results, the epilogue, the stores of output q."""
    a = plan.anchor
    graph = plan.graph
    values = _values(graph)
    params = ["const idx_t q", "const Acc& a"] + _finish_params(plan)
    lines = ["// The results of output q, the epilogue on them, the stores.",
             f"__device__ __forceinline__ void finish({', '.join(params)}) {{"]
    var: dict[str, tuple[str, str]] = {}
    exprs = _result_exprs(a)
    for i, ((role, dtype), expr) in enumerate(zip(a.results, exprs)):
        ct = COMPUTE_CTYPE[dtype]
        rvar = f"r{i}"
        lines.append(f"    {ct} {rvar} = ({ct})({expr});  // {a.node.op} {role}")
        rounded = round_to_storage(dtype, rvar)
        if rounded != rvar:
            lines.append(f"    {rvar} = {rounded};")
        for name, idx in plan.result_names.items():
            if idx == i:
                var[name] = (rvar, ct)
    for e in plan.epi_ins:
        ct = COMPUTE_CTYPE[e.value.dtype]
        lines.append(f"    const {ct} v_{e.cname} = {load_expr(e.value.dtype, f'{e.cname}[{e.offset}]')};")
        var[e.value.name] = (f"v_{e.cname}", ct)
    lines += _emit_chain(graph, plan.epi_nodes, var, "e", "    ")
    for o, c in zip(plan.outputs, plan.out_cnames):
        if o not in var:
            raise _error(graph, f"output '{o}' is not computed by the reduction or its epilogue.")
        lines.append(f"    {c}[q] = {store_expr(values[o].dtype, var[o][0])};")
    lines.append("}")
    return "\n".join(lines)


def _emit_store(plan: _Plan, q: str, acc: str, part: str, indent: str, fence: bool = True) -> str:
    """Finish output q (no split) or store its partial accumulator, made visible to the whole GPU
    (`fence`; or by the caller) before the block counts its arrival (last_to_arrive)."""
    if plan.split:
        return "\n".join([f"{indent}{c}[({q}) * SPLIT + {part}] = {acc}.{f};" for _, c, f, _ in plan.partials]
                         + ([f"{indent}__threadfence();"] if fence else []))
    return indent + _finish_call(plan, q, acc)


def _main_params(plan: _Plan) -> list[str]:
    """The kernel's parameters: prologue inputs, epilogue inputs and outputs, then (split) the
    partials and the arrival counters."""
    params = [f"const {i.ctype}* __restrict__ {i.cname}" for i in plan.pro_ins] + _finish_params(plan)
    if plan.split:
        params += [f"{ct}* __restrict__ {c}" for _, c, _, ct in plan.partials]
        params.append(f"int* __restrict__ {plan.arrivals[1]}")
    return params


def _gather_call(plan: _Plan, stride: str, width: str, q: str, r: str, valid: str) -> str:
    args = [q, r, valid] + [c for _, c, _, _ in plan.partials]
    return f"gather_parts<{stride}, {width}>({', '.join(args)})"


def _finish_call(plan: _Plan, q: str, acc: str) -> str:
    return f"finish({', '.join([q, acc] + [e.cname for e in plan.epi_ins] + plan.out_cnames)});"


def _finish_params(plan: _Plan) -> list[str]:
    values = _values(plan.graph)
    params = [f"const {STORAGE_CTYPE[e.value.dtype]}* __restrict__ {e.cname}" for e in plan.epi_ins]
    return params + [f"{STORAGE_CTYPE[values[o].dtype]}* __restrict__ {c}"
                     for o, c in zip(plan.outputs, plan.out_cnames)]


def _vec_ok(plan: _Plan) -> str:
    """Run-time check that every vector-loaded input is aligned to a whole vector."""
    checks = [f"aligned_to<VEC * sizeof({i.ctype})>({i.cname})" for i in plan.vec_inputs]
    return " && ".join(checks) or "true"


def _kernel_head(plan: _Plan) -> str:
    """The kernel's launch bounds. A split kernel's grid (SPLIT's default) fills the GPU in one wave
    of SM_THREADS / BLOCK blocks per SM only while a thread needs at most 32 registers at 256
    threads; OCC=1 tells the compiler so. OCC=2 (a minimum of one block) lets it take more registers
    than its own choice, for more loads in flight where the grid is small. Neither is a default
    (docs/codegen.md, the reduce family's OCC)."""
    if not plan.split:
        return 'extern "C" __global__ void __launch_bounds__(BLOCK)'
    return "\n".join(['extern "C" __global__ void', "#if OCC == 1", f"__launch_bounds__(BLOCK, {SM_THREADS} / BLOCK)",
                      "#elif OCC == 2", "__launch_bounds__(BLOCK, 1)", "#else", "__launch_bounds__(BLOCK)", "#endif"])


def _emit_rows(plan: _Plan) -> str:
    """One block (ROW_MODE 0) or warp (ROW_MODE 1) per output, ROWS outputs one after another;
    threads stride over j."""
    a = plan.anchor
    ins = plan.pro_ins
    row_mode = "ROW_MODE" if not plan.split else "0"
    split = "SPLIT" if plan.split else "1"
    rows = "ROWS" if not plan.split else "1"
    L = [_kernel_head(plan),
         f"{plan.kernel}({', '.join(_main_params(plan))})",
         "{",
         f"    using namespace {plan.kernel}_ns;",
         f"    constexpr int rows = {rows};   // outputs each block (ROW_MODE 0) or warp (ROW_MODE 1) reduces",
         f"    constexpr int lanes = {row_mode} == 1 ? 32 : BLOCK;   // threads that share one output",
         "    constexpr int warps = BLOCK / 32;",
         "    // One slot per row and warp: the warps' partials of all rows wait here for a single barrier.",
         "    __shared__ Acc smem[rows][warps];",
         f"    const int lane = {row_mode} == 1 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;",
         "    const int warp = threadIdx.x >> 5;",
         f"    const idx_t unit = {row_mode} == 1 ? (idx_t)blockIdx.x * warps + (idx_t)warp : (idx_t)blockIdx.x / {split};",
         f"    const idx_t part = {row_mode} == 1 ? 0 : (idx_t)blockIdx.x % {split};",
         f"    constexpr idx_t chunk = ((n_red + {split} - 1) / {split} + VEC - 1) / VEC * VEC;",
         "    const idx_t j0 = part * chunk;",
         "    const idx_t j1 = j0 + chunk < n_red ? j0 + chunk : n_red;",
         "    for (int r = 0; r < rows; ++r) {",
         "        const idx_t q = unit * rows + r;",
         "        // The same q for all threads that share it: whole warps (ROW_MODE 1) or the whole block",
         "        // (ROW_MODE 0) leave together, and the only block barrier is after the loop.",
         "        if (q >= n_out) break;"]
    for i in ins:
        L.append(f"        const idx_t kb_{i.cname} = {i.kept_off('q')};")
    for i in ins:
        if i.hoisted:
            L.append(f"        const {i.ctype} h_{i.cname} = {i.cname}[kb_{i.cname}];  // constant along the reduction")
    if a.kind in ("var", "std", "var_mean", "std_mean"):
        args = [f"h_{i.cname}" if i.hoisted else f"{i.cname}[kb_{i.cname}]" for i in ins]
        L.append(f"        const double sh = (double)pro({', '.join(args)});  // the output's first element")
    else:
        L.append("        const double sh = 0.0;")
    L += ["        Acc acc = acc_init();",
          f"        if ({_vec_ok(plan)}) {{"]
    L += _rows_loops(plan, "VEC")
    L += ["        } else {", "            // Scalar fallback (a misaligned pointer): one element per step."]
    L += _rows_loops(plan, "1", batched=False)
    L += ["        }",
          "        acc = warp_reduce(acc);",
          "        if (lanes > 32) {",
          "            if ((lane & 31) == 0) smem[r][warp] = acc;",
          "        } else if (lane == 0) {",
          _emit_store(plan, "q", "acc", "part", "            "),
          "        }",
          "    }",
          "    if (lanes > 32) {",
          "        // Every thread of the block gets here (the loop's exits are block-uniform).",
          "        __syncthreads();",
          "        const int wl = threadIdx.x & 31;",
          "        for (int r = warp; r < rows; r += warps) {   // warp r merges row r's warp partials",
          "            const idx_t q = unit * rows + r;",
          "            if (q >= n_out) break;",
          "            Acc acc = wl < warps ? smem[r][wl] : acc_init();",
          "            acc = warp_reduce(acc);",
          "            if (wl == 0) {",
          _emit_store(plan, "q", "acc", "part", "                "),
          "            }",
          "        }",
          "    }"]
    if plan.split:
        L += ["    // The last of this output's SPLIT blocks to finish merges their partials: every thread",
              "    // takes some (their loads in flight together), then the warps' trees and warp 0.",
              f"    if (!last_to_arrive({plan.arrivals[1]} + unit)) return;",
              f"    Acc m = {_gather_call(plan, 'BLOCK', '32', 'unit', '(int)threadIdx.x', 'true')};",
              "    if (BLOCK > 32) {",
              "        if ((threadIdx.x & 31) == 0) smem[0][warp] = m;",
              "        __syncthreads();",
              "        if (warp != 0) return;",
              "        m = (threadIdx.x & 31) < warps ? smem[0][threadIdx.x & 31] : acc_init();",
              "        m = warp_reduce(m);",
              "    }",
              f"    if (threadIdx.x == 0) {_finish_call(plan, 'unit', 'm')}"]
    L.append("}")
    return "\n".join(L)


def _rows_loops(plan: _Plan, w: str, batched: bool = True) -> list[str]:
    """Reduce j over [j0, j1): each thread takes groups of w consecutive j, UNROLL groups per step
    (their loads issued together), then the remaining groups one per step."""
    i8 = " " * 12
    carried = _carried_part(plan, f"UNROLL * {w}", "part = part_init();", "acc_take(acc, part);", i8 + "    ")
    batch = [*carried[0],
             f"{i8}    for (; j + (idx_t)(UNROLL - 1) * step < j1; j += (idx_t)UNROLL * step) {{",
             *_rows_body(plan, w, "UNROLL", carried[1]),
             f"{i8}    }}",
             *carried[2]] if batched else []
    return [f"{i8}{{",
            f"{i8}    constexpr idx_t step = (idx_t)lanes * {w};",
            f"{i8}    idx_t j = j0 + (idx_t)lane * {w};",
            *batch,
            f"{i8}    for (; j < j1; j += step) {{",
            *_rows_body(plan, w, "1"),
            f"{i8}    }}",
            f"{i8}}}"]


def _carried_part(plan: _Plan, per_batch: str, reset: str, take: str, ind: str
                  ) -> tuple[list[str], list[str], list[str]]:
    """The batched loop's partial group when one batch (per_batch elements, a C expression) holds
    fewer than PART_ELEMENTS: the partial is carried over group_batches batches, so that the
    conversion to double and the double add come once per PART_ELEMENTS elements. Lines before the
    loop, at the end of each batch, and after the loop; three empty lists without a partial."""
    if not _part_fields(plan.anchor):
        return [], [], []
    return ([f"{ind}// Partial groups of up to {PART_ELEMENTS} elements, carried over batches that hold fewer.",
             f"{ind}constexpr int group_batches = {part_group_steps(per_batch)};",
             f"{ind}int batches = 0;",
             f"{ind}{_part_decl(plan)}"],
            [f"{ind}    if (group_batches > 1 && ++batches == group_batches) {{ {take} {reset} batches = 0; }}"],
            [f"{ind}if (group_batches > 1) {{ {take} }}"])


def _part_decl(plan: _Plan) -> str:
    return "Part part = part_init();" if plan.family == "rows" else "Part part[VEC];"


def _rows_body(plan: _Plan, w: str, u: str, carried: list[str] | None = None) -> list[str]:
    """One step: u groups of w elements loaded, then added. `carried` (the batched loop with a
    partial): the partial is declared outside, and taken here only while group_batches is 1."""
    ind = " " * 20
    L = []
    for i in plan.pro_ins:
        if i.hoisted:
            continue
        if i.last == 1:
            L.append(f"{ind}vec_t<{i.ctype}, {w}> L_{i.cname}[{u}];")
        else:
            L.append(f"{ind}{i.ctype} G_{i.cname}[{u}];")
    L += [f"{ind}#pragma unroll", f"{ind}for (int u = 0; u < {u}; ++u) {{",
          f"{ind}    const idx_t ju = j + (idx_t)u * step;"]
    for i in plan.pro_ins:
        if i.hoisted:
            continue
        off = f"kb_{i.cname} + {i.red_off('ju')}"
        if i.last == 1:
            L.append(f"{ind}    L_{i.cname}[u] = *reinterpret_cast<const vec_t<{i.ctype}, {w}>*>({i.cname} + {off});")
        else:
            L.append(f"{ind}    G_{i.cname}[u] = {i.cname}[{off}];")
    args = [f"h_{i.cname}" if i.hoisted else f"L_{i.cname}[u].v[k]" if i.last == 1 else f"G_{i.cname}[u]"
            for i in plan.pro_ins]
    parts = bool(_part_fields(plan.anchor))
    L += [f"{ind}}}"]
    if parts and not carried:
        L.append(f"{ind}Part part = part_init();")
    L += [f"{ind}#pragma unroll", f"{ind}for (int u = 0; u < {u}; ++u) {{",
          f"{ind}    #pragma unroll", f"{ind}    for (int k = 0; k < {w}; ++k)",
          f"{ind}        {'part_add(part' if parts else 'acc_add(acc'}, pro({', '.join(args)}), "
          f"j + (idx_t)u * step + k, sh);"]
    if parts:
        when = f"(u + 1) % {part_group_steps(w)} == 0 || u + 1 == {u}"
        L.append(f"{ind}    if ({'group_batches == 1 && (' + when + ')' if carried else when}) "
                 "{ acc_take(acc, part); part = part_init(); }")
    L.append(f"{ind}}}")
    return L + (carried or [])


def _emit_cols(plan: _Plan) -> str:
    """A thread owns VEC consecutive outputs; BLOCK/COLW rows of threads split j, merged in smem."""
    a = plan.anchor
    ins = plan.pro_ins
    split = "SPLIT" if plan.split else "1"
    L = [_kernel_head(plan),
         f"{plan.kernel}({', '.join(_main_params(plan))})",
         "{",
         f"    using namespace {plan.kernel}_ns;",
         "    constexpr int rows = BLOCK / COLW;   // threads that share one output's reduction",
         "    __shared__ Acc sm[rows > 1 ? VEC * BLOCK : 1];",
         "    const int tx = threadIdx.x, ty = threadIdx.y;",
         "    const idx_t q0 = ((idx_t)blockIdx.x * COLW + tx) * VEC;   // VEC divides n_out",
         f"    const idx_t part = {'(idx_t)blockIdx.y' if plan.split else '0'};",
         "    const bool active = q0 < n_out;",
         f"    constexpr idx_t chunk = (n_red + {split} - 1) / {split};",
         "    const idx_t j0 = part * chunk;",
         "    const idx_t j1 = j0 + chunk < n_red ? j0 + chunk : n_red;",
         "    Acc acc[VEC];",
         "    #pragma unroll",
         "    for (int k = 0; k < VEC; ++k) acc[k] = acc_init();",
         "    // No early return: every thread reaches the barrier below.",
         "    if (active) {"]
    for i in ins:
        L.append(f"        const idx_t kb_{i.cname} = {i.kept_off('q0')};")
    for i in ins:
        if i.hoisted:
            L += [f"        {i.ctype} H_{i.cname}[VEC];  // constant along the reduction",
                  "        #pragma unroll",
                  f"        for (int k = 0; k < VEC; ++k) H_{i.cname}[k] = {i.cname}[kb_{i.cname} + {'k' if i.last else '0'}];"]
    L += ["        double sh[VEC];", "        #pragma unroll", "        for (int k = 0; k < VEC; ++k)"]
    if a.kind in ("var", "std", "var_mean", "std_mean"):
        args = [f"H_{i.cname}[k]" if i.hoisted else f"{i.cname}[kb_{i.cname} + {'k' if i.last else '0'}]" for i in ins]
        L.append(f"            sh[k] = (double)pro({', '.join(args)});  // output k's first element")
    else:
        L.append("            sh[k] = 0.0;")
    L.append(f"        if ({_vec_ok(plan)}) {{")
    L += _cols_loops(plan, True)
    L += ["        } else {", "            // Scalar fallback (a misaligned pointer): one step at a time."]
    L += _cols_loops(plan, False, batched=False)
    L += ["        }",
          "    }",
          "    if (rows > 1) {",
          "        #pragma unroll",
          "        for (int k = 0; k < VEC; ++k) sm[(k * rows + ty) * COLW + tx] = acc[k];",
          "        __syncthreads();",
          "        if (ty == 0) {",
          "            #pragma unroll",
          "            for (int k = 0; k < VEC; ++k)",
          "                for (int y = 1; y < rows; ++y) acc_merge(acc[k], sm[(k * rows + y) * COLW + tx]);",
          "        }",
          "    }",
          "    if (ty == 0 && active) {",
          "        #pragma unroll",
          "        for (int k = 0; k < VEC; ++k) {",
          _emit_store(plan, "q0 + k", "acc[k]", "part", "            ", fence=False),
          "        }",
          *(["        __threadfence();   // the partials before the arrival count"] if plan.split else []),
          "    }"]
    if plan.split:
        L += ["    // The last of this column tile's SPLIT blocks to finish merges the tile's partials: g",
              "    // neighbouring threads per output (all loads of a thread in flight together, reads of",
              "    // neighbouring parts coalesced), then an xor tree over the g.",
              f"    if (!last_to_arrive({plan.arrivals[1]} + blockIdx.x)) return;",
              "    constexpr int outs = COLW * VEC;                      // outputs of a tile",
              "    constexpr int g = BLOCK >= outs ? BLOCK / outs : 1;   // threads per output (divides 32)",
              "    const int t = ty * COLW + tx;",
              "    // The same trip count for every thread (BLOCK / g divides outs): the trees' shuffles meet.",
              "    for (int o = t / g; o < outs; o += BLOCK / g) {",
              "        const idx_t q = (idx_t)blockIdx.x * outs + o;",
              f"        const Acc m = {_gather_call(plan, 'g', 'g', 'q', 't % g', 'q < n_out')};",
              f"        if (t % g == 0 && q < n_out) {_finish_call(plan, 'q', 'm')}",
              "    }"]
    L.append("}")
    return "\n".join(L)


def _cols_loops(plan: _Plan, vector: bool, batched: bool = True) -> list[str]:
    """This thread's row of threads takes j = j0 + ty, + rows, ...: UNROLL steps at a time, then
    the rest one by one. Each step reads VEC consecutive outputs (one vector load when aligned)."""
    ind = " " * 12
    every = "for (int k = 0; k < VEC; ++k)"
    carried = _carried_part(plan, "UNROLL", f"{every} part[k] = part_init();",
                            f"{every} acc_take(acc[k], part[k]);", ind + "    ")
    if carried[0]:
        carried[0].append(f"{ind}    {every} part[k] = part_init();")
    batch = [*carried[0],
             f"{ind}    for (; j + (idx_t)(UNROLL - 1) * rows < j1; j += (idx_t)UNROLL * rows) {{",
             *_cols_body(plan, vector, "UNROLL", carried[1]),
             f"{ind}    }}",
             *carried[2]] if batched else []
    return [f"{ind}{{",
            f"{ind}    idx_t j = j0 + ty;",
            *batch,
            f"{ind}    for (; j < j1; j += rows) {{",
            *_cols_body(plan, vector, "1"),
            f"{ind}    }}",
            f"{ind}}}"]


def _cols_body(plan: _Plan, vector: bool, u: str, carried: list[str] | None = None) -> list[str]:
    """One step of u rows of VEC outputs; `carried` as in _rows_body."""
    ind = " " * 20
    L = []
    for i in plan.pro_ins:
        if i.hoisted:
            continue
        if i.last == 1:
            L.append(f"{ind}vec_t<{i.ctype}, VEC> L_{i.cname}[{u}];")
        else:
            L.append(f"{ind}{i.ctype} G_{i.cname}[{u}];")
    L += [f"{ind}#pragma unroll", f"{ind}for (int u = 0; u < {u}; ++u) {{",
          f"{ind}    const idx_t ju = j + (idx_t)u * rows;"]
    for i in plan.pro_ins:
        if i.hoisted:
            continue
        off = f"kb_{i.cname} + {i.red_off('ju')}"
        if i.last == 1 and vector:
            L.append(f"{ind}    L_{i.cname}[u] = *reinterpret_cast<const vec_t<{i.ctype}, VEC>*>({i.cname} + {off});")
        elif i.last == 1:
            L += [f"{ind}    #pragma unroll",
                  f"{ind}    for (int k = 0; k < VEC; ++k) L_{i.cname}[u].v[k] = {i.cname}[{off} + k];"]
        else:
            L.append(f"{ind}    G_{i.cname}[u] = {i.cname}[{off}];")
    args = [f"H_{i.cname}[k]" if i.hoisted else f"L_{i.cname}[u].v[k]" if i.last == 1 else f"G_{i.cname}[u]"
            for i in plan.pro_ins]
    parts = bool(_part_fields(plan.anchor))
    L += [f"{ind}}}"]
    if parts and not carried:
        L += [f"{ind}Part part[VEC];", f"{ind}#pragma unroll", f"{ind}for (int k = 0; k < VEC; ++k) part[k] = part_init();"]
    L += [f"{ind}#pragma unroll", f"{ind}for (int u = 0; u < {u}; ++u) {{",
          f"{ind}    #pragma unroll", f"{ind}    for (int k = 0; k < VEC; ++k)",
          f"{ind}        {'part_add(part[k]' if parts else 'acc_add(acc[k]'}, pro({', '.join(args)}), "
          f"j + (idx_t)u * rows, sh[k]);"]
    if parts:
        when = f"(u + 1) % {part_group_steps('1')} == 0 || u + 1 == {u}"
        L += [f"{ind}    if ({'group_batches == 1 && (' + when + ')' if carried else when}) {{",
              f"{ind}        #pragma unroll",
              f"{ind}        for (int k = 0; k < VEC; ++k) {{ acc_take(acc[k], part[k]); part[k] = part_init(); }}",
              f"{ind}    }}"]
    L.append(f"{ind}}}")
    return L + (carried or [])


def _emit_split_helpers(plan: _Plan) -> str:
    """last_to_arrive (one block of a part counts itself) and gather_parts (a group of threads
    merges one output's SPLIT partials in a fixed order)."""
    params = [f"const {ct}* {c}" for _, c, _, ct in plan.partials]
    # Past L1 (ld.global.cg): the partials were written by other SMs during this launch.
    loads = " ".join(f"b.{f} = __ldcg({c} + q * SPLIT + s);" for _, c, f, _ in plan.partials)
    return "\n".join([
        "// Whether this block is the last of its SPLIT parts to finish. Every thread of the block calls",
        "// it; the writers fenced their partial stores before it. The last block sets the counter back to",
        "// zero: the buffer is zeroed and must be left so for the next run (docs/program-format.md).",
        "__device__ __forceinline__ bool last_to_arrive(int* counter) {",
        "    __shared__ int last;",
        "    __syncthreads();",
        "    if (threadIdx.x == 0 && threadIdx.y == 0) {",
        "        __threadfence();",
        "        last = atomicAdd(counter, 1) == SPLIT - 1;",
        "        if (last) *counter = 0;",
        "        __threadfence();",
        "    }",
        "    __syncthreads();",
        "    return last;",
        "}",
        "",
        "// Thread r of a group takes output q's parts r, r + stride, ... in order (loads past L1, after",
        "// the last_to_arrive fences), then an xor tree over `width` neighbouring lanes (a power of 2",
        "// up to 32; every lane of the warp calls it). A fixed order: the same bits whichever block is last.",
        "template <int stride, int width>",
        f"__device__ __forceinline__ Acc gather_parts(const idx_t q, const int r, const bool valid, {', '.join(params)}) {{",
        "    Acc a = acc_init();",
        "    constexpr int per_thread = (SPLIT + stride - 1) / stride;",
        "    if (per_thread <= 16) {",
        "        // All of this thread's loads first, then the merges: one L2 latency, not per_thread.",
        "        Acc bs[per_thread <= 16 ? per_thread : 1];",
        "        #pragma unroll",
        "        for (int i = 0; i < per_thread; ++i) {",
        "            const idx_t s = r + (idx_t)i * stride;",
        "            Acc b = acc_init();",
        f"            if (valid && s < SPLIT) {{ {loads} }}",
        "            bs[i] = b;",
        "        }",
        "        #pragma unroll",
        "        for (int i = 0; i < per_thread; ++i) acc_merge(a, bs[i]);",
        "    } else if (valid) {",
        "        #pragma unroll 4",
        "        for (idx_t s = r; s < SPLIT; s += stride) {",
        f"            Acc b; {loads}",
        "            acc_merge(a, b);",
        "        }",
        "    }",
        "    #pragma unroll",
        "    for (int o = width / 2; o > 0; o >>= 1) acc_merge(a, acc_shfl(a, o));",
        "    return a;",
        "}"])


def _emit_source(plan: _Plan) -> str:
    ns = f"{plan.kernel}_ns"
    helpers = [
        f"namespace {ns} {{",
        f"typedef {plan.idx_t} idx_t;",
        f"constexpr idx_t n_out = {plan.n_out};   // outputs (kept dims)",
        f"constexpr idx_t n_red = {plan.n_red};   // elements reduced into each output",
        _acc_code(plan.anchor),
        _var_helper(plan.anchor),
        _emit_prologue(plan),
        _emit_finish(plan),
        """// Merge across a warp (xor butterfly, a fixed order): lane 0 holds the result.
__device__ __forceinline__ Acc warp_reduce(Acc a) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc_merge(a, acc_shfl(a, o));
    return a;
}""",
        _emit_split_helpers(plan) if plan.split else "",
        f"}}  // namespace {ns}",
        "",
    ]
    body = _emit_rows(plan) if plan.family == "rows" else _emit_cols(plan)
    parts = [PRELUDE, "\n".join(helpers), body, ""]
    return "\n".join(parts)


# ---- the family entry point ----------------------------------------------------------------------

def lower_reduce(graph: Graph, kernel: str) -> Lowering:
    """One kernel (two with a split reduction) for a prologue -> reduction -> epilogue group."""
    plan = _plan(graph, kernel)
    values = _values(graph)
    fields = _acc_fields(plan.anchor)
    acc_bytes = sum(8 if ct in ("double", "long long") else 4 for _, ct in fields)
    if any(ct in ("double", "long long") for _, ct in fields):
        acc_bytes = _cdiv(acc_bytes, 8) * 8                 # sizeof(Acc) with 8-byte alignment
    widest = max((ITEMSIZE[i.value.dtype] for i in plan.vec_inputs), default=1)
    for vec0 in _default_vec(plan.family, plan.inner, widest, plan.n_out, plan.n_red):
        plan.knobs = _knobs(plan, widest, vec0)
        spec = ScheduleSpec(list(plan.knobs), _constraints(plan, widest, acc_bytes))
        if spec.legal(spec.default()):
            break
    else:
        raise _error(graph, f"the reduce family found no legal default schedule "
                            f"({spec.why_illegal(spec.default())}).")
    source = _emit_source(plan)
    outs = [{"name": o, "shape": [int(s) for s in values[o].shape], "dtype": values[o].dtype}
            for o in plan.outputs]
    parts = [{"name": name, "shape": [plan.n_out, "SPLIT"], "dtype": PARTIAL_DTYPE[ct]}
             for name, _, _, ct in plan.partials]
    pro_args = [i.value.name for i in plan.pro_ins]
    epi_args = [e.value.name for e in plan.epi_ins] + list(plan.outputs)
    n = plan.n_out
    if plan.family == "rows":
        grid = [f"{n} * SPLIT"] if plan.split else [f"cdiv({n}, ROWS) if ROW_MODE == 0 else cdiv({n}, BLOCK // 32 * ROWS)"]
        block = ["BLOCK"]
    else:
        grid = [f"cdiv({n}, COLW * VEC)"] + (["SPLIT"] if plan.split else [])
        block = ["COLW", "BLOCK // COLW"]
    args = pro_args + epi_args
    if plan.split:
        # One arrival counter per output (rows) or per column tile (cols): the grid's x.
        counters = n if plan.family == "rows" else grid[0]
        parts.append({"name": plan.arrivals[0], "shape": [counters], "dtype": "int32", "zeroed": True})
        args += [p["name"] for p in parts]
    launches = [{"kernel": kernel, "grid": grid, "block": block, "shared_bytes": 0, "args": args}]
    program = {
        "format": "cuda-agent/program@1",
        "name": kernel,
        "source": source,
        "tunables": {k.name: list(k.values) for k in plan.knobs},
        "schedule": {k.name: k.values[0] for k in plan.knobs},
        "buffers": outs + parts,
        "launches": launches,
        "outputs": list(plan.outputs),
    }
    a = plan.anchor
    P = list(a.src.shape)
    notes = [f"reduce: {a.node.op} of '{a.src.name}' {a.src.dtype}{P} over dims {list(a.dims)} -> "
             f"{list(a.node.shape)}: {plan.n_out} outputs of {plan.n_red} elements, {plan.family} kernel"
             + (", split over the reduction (the last part to finish merges)" if plan.split else ""),
             f"prologue: {len(plan.pro_nodes)} ops; epilogue: {len(plan.epi_nodes)} ops"]
    for i in plan.pro_ins:
        how = "once per output" if i.hoisted else "vector loads" if i.last == 1 else "one load per vector group"
        notes.append(f"input '{i.value.name}' {i.value.dtype}{list(i.value.shape)}: {how}")
    unused = [nd.name for nd in graph.nodes if nd not in plan.pro_nodes and nd not in plan.epi_nodes
              and nd is not a.node and nd.name not in plan.result_names]
    if unused:
        notes.append(f"nodes not needed by the outputs (not computed): {', '.join(unused)}")
    return Lowering(program, spec, notes)
