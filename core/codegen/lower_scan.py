"""The scan family: one cumsum / cumprod / logcumsumexp / cummax / cummin along any dim, with a
pointwise prologue and epilogue, in one kernel (plus a chunk-total pass when a few long scans are split).

A group is exactly one scan node, elementwise nodes before it (the scan's input, e.g. `x * mask`,
casts) and after it (e.g. an exclusive scan written `cumsum(x) - x`, a scale), and `flip.default`
nodes over the scanned dim anywhere. Flips are folded into the indexing, never materialised:
every value carries an orientation along the scanned dim, `flip -> cumsum -> flip` becomes one
reverse scan, and an output whose orientation differs from the scan's is stored mirrored.

The tensor is viewed as [outer, L, inner] with L the scanned length.
- rows layout (inner == 1): LANES threads scan one row (4..32, rows share a warp: shuffles only)
  or the whole block does (LANES=0: warp scans, then a shared-memory scan of the warp totals).
  A tile is LANES (or BLOCK) x ITEMS x VEC elements; each warp owns a contiguous segment of it,
  item k of lane l is the VEC elements at (k * 32 + l) * VEC: every warp access is one
  contiguous, coalesced run, a VEC vector per lane. The carry crosses tiles in a register.
- columns layout (inner > 1): each thread walks the scanned dim for VEC adjacent columns, ITEMS
  steps of loads in flight; lanes read neighbouring columns, so every step is coalesced.
- SPLIT (offered only when there are few scans of long lines): the scanned dim is cut into SPLIT
  chunks. A first kernel (`<kernel>_2`) writes the total of every chunk but the last to a scratch
  buffer; the scan kernel starts each chunk from the totals of the chunks before it. The input is
  read 2 - 1/SPLIT times, which pays only when one pass cannot fill the GPU.

cummax / cummin carry a (value, index) pair through the same scans (shuffles move both fields);
their combine follows PyTorch's kernels: the later element wins ties and NaN (so the index is
that of the last maximum, or of the last NaN once one was seen). An empty pair (index -1) is the
identity on both sides. Their results are the group's getitems 0 (values, in the input's dtype)
and 1 (int64 indices: positions along the scanned dim of the scan's operand, so a flipped
operand's are positions in the flipped order). No SPLIT for them: the chunk totals would be pairs.

Numerics: cumsum / cumprod of floating inputs accumulate in double (every element: the loop waits
on memory, not on the adds), int / bool inputs in int64 (PyTorch's result dtype), logcumsumexp
in fp32 (fp64 for fp64) with PyTorch's NaN / inf rules. The scan result is rounded to its dtype
(fp16 / bf16 included) before the epilogue reads it, as eager stores it.

Every kernel handles any length and alignment at run time: a uniform check picks vector
accesses (VEC divides the vectorised extent, pointers aligned) or a scalar path; constraints mask
the schedules that would only take the scalar path or waste most of each tile.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from core.codegen.cuda_emit import (COMPUTE_CTYPE, FLOAT_DTYPES, ITEMSIZE, PRELUDE, STORAGE_CTYPE, literal,
                                    load_expr, math_fn, round_to_storage, store_expr)
from core.codegen.errors import CodegenError
from core.codegen.graph import Graph, GraphInput, Node, Ref
from core.codegen.lower_pointwise import Lowering, _cname, _node_expr, assign_node
from core.codegen.pointwise_ops import LoweringError, is_pointwise
from core.codegen.schedule import Knob, ScheduleSpec

SCAN_OPS = {"cumsum.default": "sum", "cumprod.default": "prod", "logcumsumexp.default": "lse",
            "cummax.default": "max", "cummin.default": "min"}
PAIR_KINDS = ("max", "min")     # scans that carry (value, index)
FLIP = "flip.default"
INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "bool")
SMS = 132                       # H200 streaming multiprocessors: the grid-filling target
MAX_ACCESS_BYTES = 16
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def is_scan(node: Node, graph: Graph) -> bool:
    """True when this node is a scan the family lowers (the group's anchor)."""
    kind = SCAN_OPS.get(node.op)
    if kind is None or not node.operands or not isinstance(node.operands[0], Ref) or not node.shape:
        return False
    src = graph.value(node.operands[0].name)
    if src.dtype not in STORAGE_CTYPE or node.dtype not in STORAGE_CTYPE:
        return False
    if kind in PAIR_KINDS:       # bool too: a running any (cummax) or all (cummin)
        return "results" in node.attrs and node.dtype == src.dtype
    if node.dtype == "bool":
        return False
    if kind == "lse":
        return node.dtype in FLOAT_DTYPES
    return True


# ---- analysis ------------------------------------------------------------------------------------

@dataclass
class _In:
    """How the kernel reads one group input."""

    value: GraphInput
    cname: str
    aligned: tuple[int, ...]       # shape left-padded with 1s to the scan's rank
    full: bool                     # same shape as the scan
    vec: bool                      # contiguous along the vectorised direction: vector loads allowed
    inner: str = "full"            # columns layout: full | const | general (how it varies with the column)
    for_pre: bool = False
    for_post: bool = False

    @property
    def ctype(self) -> str:
        return STORAGE_CTYPE[self.value.dtype]


@dataclass
class _Out:
    node: Node
    buffer: str
    cname: str
    mirror: bool                   # stored at L-1-p for logical position p

    @property
    def ctype(self) -> str:
        return STORAGE_CTYPE[self.node.dtype]


@dataclass
class _Group:
    graph: Graph
    scan: Node
    kind: str                      # sum | prod | lse | max | min
    shape: tuple[int, ...]
    dim: int
    rev: bool                      # the scan runs from the end of the dim (flip -> scan -> flip)
    pre: list[Node]                # nodes computing the scan's operand, in order
    post: list[Node]               # non-scan nodes the outputs need, in order
    ins: list[_In]
    outs: list[_Out]
    acc_ctype: str
    acc_dtype: str
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def pair(self) -> bool:
        """The accumulator is a (value, index) pair (cummax / cummin)."""
        return self.kind in PAIR_KINDS

    @property
    def outer(self) -> int:
        return math.prod(self.shape[:self.dim])

    @property
    def length(self) -> int:
        return self.shape[self.dim]

    @property
    def inner(self) -> int:
        return math.prod(self.shape[self.dim + 1:])

    @property
    def rows_layout(self) -> bool:
        return self.inner == 1


def _fail(graph: Graph, message: str, ops: list[str] | None = None) -> CodegenError:
    return CodegenError(f"Task '{graph.task}': {message}", task=graph.task, ops=ops or graph.ops())


def _norm_dims(dims: Any, rank: int) -> list[int]:
    if isinstance(dims, int):
        dims = [dims]
    return [d % rank for d in dims] if rank else []


def _ancestors(graph: Graph, roots: list[str], stop: set[str]) -> set[str]:
    """Node names the roots depend on (roots included), not walking through `stop` nodes."""
    nodes = {n.name: n for n in graph.nodes}
    seen: set[str] = set()
    todo = [r for r in roots if r in nodes]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in stop:
            continue
        todo += [o.name for o in nodes[name].operands if isinstance(o, Ref) and o.name in nodes]
    return seen


def _analyse(graph: Graph) -> _Group:
    scans = [n for n in graph.nodes if is_scan(n, graph)]
    picks = {n.name for n in graph.nodes if n.op == "getitem" and n.operands and n.operands[0] in
             [Ref(s.name) for s in scans]}      # a cummax / cummin's values and indices
    others = [n for n in graph.nodes if n not in scans and n.name not in picks and n.op != FLIP
              and not is_pointwise(n)]
    if len(scans) != 1 or others:
        bad = sorted({n.op for n in others})
        also = f" and {', '.join(bad)}, which it cannot fuse" if bad else ""
        raise _fail(graph, f"the scan family lowers one cumsum/cumprod/logcumsumexp/cummax/cummin with "
                           f"elementwise ops and flips around it; this group has {len(scans)} scans{also}.",
                    bad or [n.op for n in scans])
    scan = scans[0]
    shape = tuple(scan.shape)
    rank = len(shape)
    dim = _norm_dims(scan.attrs.get("dim"), rank)[0]
    length = shape[dim]
    values: dict[str, Any] = {v.name: v for v in graph.inputs}
    values.update({n.name: n for n in graph.nodes})

    for v in list(graph.inputs) + graph.nodes:
        if v.dtype not in STORAGE_CTYPE:
            raise _fail(graph, f"'{v.name}' has dtype {v.dtype}, which the scan family does not support.")
        aligned = (1,) * (rank - len(v.shape)) + tuple(v.shape)
        if len(v.shape) > rank or any(a not in (1, s) for a, s in zip(aligned, shape)):
            raise _fail(graph, f"'{v.name}' of shape {list(v.shape)} does not broadcast to the scanned "
                               f"shape {list(shape)}; the scan family computes every value per element "
                               f"of {_node_desc(scan)}.")
    if len(set(graph.outputs)) != len(graph.outputs):
        raise _fail(graph, f"the group lists an output twice ({', '.join(graph.outputs)}).")
    for o in graph.outputs:
        v = values[o]
        if isinstance(v, GraphInput):
            raise _fail(graph, f"the group returns its input '{o}' unchanged; an output must be computed.")
        if tuple(v.shape) != shape:
            raise _fail(graph, f"output '{o}' has shape {list(v.shape)}, not the scanned shape "
                               f"{list(shape)}; one scan kernel writes outputs of the scan's shape.")

    # Orientation along the scanned dim: 0 as stored, 1 flipped, None when the value does not vary
    # along it (size 1 there, or L == 1).
    def varies(v: Any) -> bool:
        aligned = (1,) * (rank - len(v.shape)) + tuple(v.shape)
        return length > 1 and aligned[dim] == length

    orient: dict[str, int | None] = {v.name: (0 if varies(v) else None) for v in graph.inputs}
    for n in graph.nodes:
        refs = [o.name for o in n.operands if isinstance(o, Ref)]
        seen = {orient[r] for r in refs} - {None}
        if len(seen) > 1:
            raise _fail(graph, f"'{n.name}' ({n.op}) combines a value with its flip along the scanned "
                               f"dim {dim}; the scan family reads every input once per element, in "
                               f"one direction.", [n.op])
        o = seen.pop() if seen else None
        if n.op == FLIP:
            n_rank = len(n.shape)
            offset = rank - n_rank
            for fd in _norm_dims(n.attrs.get("dims"), n_rank):
                size = n.shape[fd]
                if fd + offset == dim and size > 1:
                    o = None if o is None else 1 - o
                elif size > 1:
                    raise _fail(graph, f"'{n.name}' flips dim {fd} of {list(n.shape)}, not the scanned "
                                       f"dim {dim}; only flips along the scanned dim fold into the scan.",
                                [n.op])
        orient[n.name] = o if varies(n) else None
    rev = orient[scan.operands[0].name] == 1

    # The scan's operand chain (pre) and what the outputs need besides the scan (post).
    pre_names = _ancestors(graph, [scan.operands[0].name], set())
    post_names = _ancestors(graph, list(graph.outputs), {scan.name}) - {scan.name}
    pre = [n for n in graph.nodes if n.name in pre_names]
    post = [n for n in graph.nodes if n.name in post_names]
    if scan.name in pre_names:
        raise _fail(graph, "the scan feeds its own operand.")

    def inputs_of(nodes: list[Node], roots: list[str]) -> set[str]:
        names = {o.name for n in nodes for o in n.operands if isinstance(o, Ref)} | set(roots)
        return {v.name for v in graph.inputs if v.name in names}

    pre_inputs = inputs_of(pre, [scan.operands[0].name])
    post_inputs = inputs_of(post, list(graph.outputs))
    taken: set[str] = set()
    inner_dims = range(dim + 1, rank)
    ins: list[_In] = []
    for v in graph.inputs:
        if v.name not in pre_inputs | post_inputs:
            continue
        aligned = (1,) * (rank - len(v.shape)) + tuple(v.shape)
        full = aligned == shape
        if math.prod(shape[dim + 1:]) == 1:     # rows layout: vector loads along the row
            vec, inner = aligned[dim] == length, "full"
        elif all(aligned[k] == shape[k] for k in inner_dims):
            vec, inner = True, "full"
        elif all(aligned[k] == 1 for k in inner_dims):
            vec, inner = False, "const"
        else:
            vec, inner = False, "general"
        ins.append(_In(v, _cname("in_", v.name, taken), aligned, full, vec, inner,
                       v.name in pre_inputs, v.name in post_inputs))
    outs = [_Out(values[o], o, _cname("o_", o, taken), rev != (orient[o] == 1)) for o in graph.outputs]

    kind = SCAN_OPS[scan.op]
    if kind in PAIR_KINDS:
        if any(o == scan.name for o in graph.outputs):
            raise _fail(graph, f"the group returns {scan.op}'s result pair itself; it returns its values "
                               f"and indices (getitem 0 and 1).")
        acc_dtype = scan.dtype        # a max or min is exact: compared in the compute type
    elif kind == "lse":
        acc_dtype = "float64" if scan.dtype == "float64" else "float32"
    elif scan.dtype in INT_DTYPES:
        acc_dtype = "int64"
    else:
        acc_dtype = "float64"
    # The compute type: the storage type of the wide accumulators, float for an fp16 / bf16 max or min.
    return _Group(graph, scan, kind, shape, dim, rev, pre, post, ins, outs,
                  COMPUTE_CTYPE[acc_dtype], acc_dtype, values)


def _node_desc(node: Node) -> str:
    return f"'{node.name}' ({node.op}, {node.dtype}{list(node.shape)})"


# ---- the schedule space --------------------------------------------------------------------------

def _first(values: tuple[int, ...], default: int) -> tuple[int, ...]:
    return (default,) + tuple(v for v in values if v != default)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _widest(g: _Group) -> tuple[str, int]:
    dtypes = [i.value.dtype for i in g.ins if i.vec] + [o.node.dtype for o in g.outs]
    dt = max(dtypes, key=lambda d: ITEMSIZE[d])
    return dt, ITEMSIZE[dt]


def _offer_split(g: _Group) -> bool:
    """A second pass pays only when one block per row (one thread per column) cannot fill the GPU
    and the scan is big enough for the extra launch not to matter (then `lower_scan` keeps it only
    if the default splits)."""
    if g.pair:
        return False
    big = g.outer * g.length * g.inner >= 1 << 17
    if g.rows_layout:
        return big and g.outer < 2 * SMS and g.length >= 4096
    return big and g.outer * g.inner < SMS * 512 and g.length >= 256


def _space(g: _Group, split: bool) -> ScheduleSpec:
    wide_dt, wide = _widest(g)
    L = g.length
    extent = L if g.rows_layout else g.inner          # what VEC runs along
    vec = next(v for v in (8, 4, 2, 1) if v * wide <= MAX_ACCESS_BYTES and extent % v == 0)
    rows = g.outer

    def vec_bytes(s: Any) -> str | None:
        if s["VEC"] * wide > MAX_ACCESS_BYTES:
            return (f"VEC={s['VEC']} needs {s['VEC'] * wide}-byte accesses of {wide_dt}; the widest load "
                    f"or store is {MAX_ACCESS_BYTES} bytes")
        return None

    def vec_divides(s: Any) -> str | None:
        if s["VEC"] > 1 and extent % s["VEC"]:
            what = "the scanned length" if g.rows_layout else "the number of columns after the scanned dim"
            return (f"VEC={s['VEC']} does not divide {what} ({extent}): the kernel would only take its "
                    f"scalar path")
        return None

    constraints = [vec_bytes, vec_divides]
    if g.rows_layout:
        lanes = 32 if L >= 32 * vec else max(4, _pow2_at_least(-(-L // vec)))
        if rows >= 4096 or L < 2048:
            items = next(i for i in (4, 2, 1) if lanes * vec * i <= max(L, lanes * vec))
            block = next(b for b in (256, 128, 64) if rows * lanes > b // 2 or b == 64)
        else:                                            # few long rows: a block per row
            lanes = 0
            # Split into chunks, tiles small enough for 4 blocks per SM.
            cap = max(64 * vec, rows * L // (4 * SMS)) if split else L
            block = next(b for b in (1024, 512, 256, 128, 64) if b * vec * 4 <= cap or b == 64)
            items = next(i for i in (4, 2, 1) if block * vec * i <= cap or i == 1)
        knobs = [
            Knob("BLOCK", _first((64, 128, 256, 512, 1024), block), "threads per block"),
            Knob("LANES", _first((32, 16, 8, 4, 0), lanes),
                 "threads per row: 4..32 (rows share a warp, shuffles only) or 0 (the whole block per row)"),
            Knob("VEC", _first((1, 2, 4, 8), vec), "adjacent elements per thread per access (one vector load)"),
            Knob("ITEMS", _first((1, 2, 4, 8), items), "vectors per thread per tile (loads in flight)"),
        ]

        def group_of(s: Any) -> int:
            return s["BLOCK"] if s["LANES"] == 0 else s["LANES"]

        # Registers: a thread holds ITEMS*VEC raw values of each vector input, and a block-wide
        # row also every partial (a double) until the block scan; past these limits ptxas spills.
        n_vec = sum(1 for i in g.ins if i.vec)

        def registers(s: Any) -> str | None:
            limit = (16 if s["LANES"] == 0 or n_vec > 1 else 32) // (2 if g.pair else 1)   # pairs: two words
            if s["ITEMS"] * s["VEC"] > limit:
                why = "a block-wide row holds every partial until the block scan" if s["LANES"] == 0 else \
                    f"{n_vec} inputs are held per element"
                return (f"ITEMS*VEC = {s['ITEMS'] * s['VEC']} elements per thread per tile is more than "
                        f"{limit} ({why})")
            return None

        def tile_fit(s: Any) -> str | None:
            grp = group_of(s)
            if s["ITEMS"] > 1 and grp * s["VEC"] * (s["ITEMS"] // 2) >= L:
                return (f"ITEMS={s['ITEMS']}: half as many items already cover the row of {L} "
                        f"({grp} threads x VEC={s['VEC']})")
            if grp > (4 if s["LANES"] else 64) and (grp // 2) * s["VEC"] * s["ITEMS"] >= L:
                return (f"{grp} threads on a row of {L}: half of them with VEC={s['VEC']} x "
                        f"ITEMS={s['ITEMS']} already cover it")
            return None

        def idle_rows(s: Any) -> str | None:
            if s["LANES"] and s["BLOCK"] > 64 and rows * s["LANES"] <= s["BLOCK"] // 2:
                return (f"BLOCK={s['BLOCK']} holds {s['BLOCK'] // s['LANES']} rows of {s['LANES']} threads, "
                        f"but there are only {rows} rows")
            return None

        constraints += [registers, tile_fit, idle_rows]
        tile_of = lambda s: group_of(s) * s["ITEMS"] * s["VEC"]          # noqa: E731
        lines, per_line = rows, (lambda s: 1)                            # noqa: E731
    else:
        threads = lambda s: g.outer * -(-g.inner // s["VEC"])           # noqa: E731
        t_def = g.outer * -(-g.inner // vec)
        block = next(b for b in (256, 128, 64) if t_def > b // 2 or b == 64)
        items = next(i for i in (4, 2, 1) if i <= L or i == 1)
        knobs = [
            Knob("BLOCK", _first((64, 128, 256, 512, 1024), block), "threads per block"),
            Knob("VEC", _first((1, 2, 4, 8), vec), "adjacent columns per thread (one vector load per step)"),
            Knob("ITEMS", _first((1, 2, 4, 8), items), "steps along the scanned dim with loads in flight"),
        ]

        def registers(s: Any) -> str | None:
            limit = 16 if g.pair else 32     # a pair carry holds two words per column
            if s["ITEMS"] * s["VEC"] > limit:
                return f"ITEMS*VEC = {s['ITEMS'] * s['VEC']} elements in flight per thread is more than {limit}"
            return None

        def items_fit(s: Any) -> str | None:
            if s["ITEMS"] > 1 and s["ITEMS"] > L:
                return f"ITEMS={s['ITEMS']} steps in flight for a scanned length of {L}"
            return None

        def idle_threads(s: Any) -> str | None:
            if s["BLOCK"] > 64 and threads(s) <= s["BLOCK"] // 2:
                return f"BLOCK={s['BLOCK']} threads for only {threads(s)} column groups"
            return None

        constraints += [registers, items_fit, idle_threads]
        tile_of = lambda s: s["ITEMS"]                                   # noqa: E731
        lines, per_line = g.outer * g.inner, (lambda s: s["VEC"])        # noqa: E731

    if split:
        def chunks(s: Any) -> str | None:
            if s["SPLIT"] == 1:
                return None
            chunk = -(-L // s["SPLIT"])
            # Columns: each thread first reads the carries of the chunks before its own, up to
            # SPLIT of them; chunks of >= 4 * SPLIT keep those reads under 1/8 of the traffic.
            least = tile_of(s) if g.rows_layout else max(tile_of(s), 4 * s["SPLIT"])
            if chunk < least:
                return (f"SPLIT={s['SPLIT']} cuts the scanned length {L} into chunks of {chunk}, shorter "
                        f"than {least} (a tile, or 4 x SPLIT carries to read)")
            return None

        constraints.append(chunks)
        base = {k.name: k.values[0] for k in knobs}
        want = 4 * SMS if g.rows_layout else SMS * 1024     # blocks (rows) / threads (columns) in flight
        width = rows if g.rows_layout else lines // per_line(base)
        best = 1
        for sp in SPLITS[1:]:
            if width * best >= want or chunks({**base, "SPLIT": sp}):
                break
            best = sp
        knobs.append(Knob("SPLIT", _first(SPLITS, best),
                          "chunks per scan line, each scanned by its own blocks (a first pass sums the chunks)"))
    return ScheduleSpec(knobs, constraints)


# ---- C emission ----------------------------------------------------------------------------------

def _comb_body(g: _Group) -> str:
    if g.pair:
        # b is the later element: it wins ties and NaN (PyTorch's cummax / cummin).
        later = ">=" if g.kind == "max" else "<="
        return (f"if (b.i < 0) return a;\n    if (a.i < 0) return b;\n"
                f"    return (b.v != b.v || (a.v == a.v && b.v {later} a.v)) ? b : a;")
    if g.kind == "sum":
        return "return a + b;"
    if g.kind == "prod":
        return "return a * b;"
    ct = g.acc_ctype
    # PyTorch's _log_add_exp_helper: NaN wins; equal infinities (lo == hi, not finite) stay as they are.
    return (f"const bool na = a != a, nb = b != b;\n"
            f"    const {ct} lo = nb ? b : (na ? a : (b < a ? b : a));\n"
            f"    const {ct} hi = nb ? b : (na ? a : (a < b ? b : a));\n"
            f"    if (lo != hi || lo - lo == lo - lo) return {math_fn('log1p', ct)}({math_fn('exp', ct)}(lo - hi)) + hi;\n"
            f"    return a;")


def _identity(g: _Group, acc: str) -> str:
    if g.pair:
        return f"{acc}{{({g.acc_ctype})0, -1LL}}"
    value = {"sum": 0, "prod": 1, "lse": float("-inf")}[g.kind]
    return literal(value, g.acc_ctype)


def _emit_chain(g: _Group, nodes: list[Node], var: dict[str, tuple[str, str]], lines: list[str]) -> None:
    index = {n.name: i for i, n in enumerate(g.graph.nodes)}
    for node in nodes:
        if node.name in var:               # a cummax / cummin's values or indices, read from the pair
            continue
        if node.op == FLIP:                # the orientation lives in the indexing
            var[node.name] = var[node.operands[0].name]
            continue
        ct = COMPUTE_CTYPE[node.dtype]
        cvar = f"v{index[node.name]}"
        try:
            expr = _node_expr(node, ct, var, g.values)
        except LoweringError as exc:
            raise _fail(g.graph, f"the scan family cannot lower '{node.op}' here: {exc} is not "
                                 f"supported.", [node.op]) from exc
        lines += assign_node(node, ct, cvar, expr, "    ")
        var[node.name] = (cvar, ct)


def _emit_element_fns(g: _Group, p: str) -> str:
    acc = f"{p}_acc"
    out = [f"struct {acc} {{ {g.acc_ctype} v; long long i; }};   // value, index of the running max / min"
           if g.pair else f"typedef {g.acc_ctype} {acc};",
           f"CA_HD {acc} {p}_comb({acc} a, {acc} b) {{\n    {_comb_body(g)}\n}}",
           _emit_carry_helpers(g, p),
           f"CA_HD long long {p}_min(long long a, long long b) {{ return a < b ? a : b; }}",
           f"CA_HD long long {p}_cdiv(long long a, long long b) {{ return (a + b - 1) / b; }}"]

    def load_lines(ins: list[_In], var: dict[str, tuple[str, str]]) -> list[str]:
        lines = []
        for i in ins:
            ct = COMPUTE_CTYPE[i.value.dtype]
            lines.append(f"    const {ct} {i.cname} = {load_expr(i.value.dtype, 'r_' + i.cname)};")
            var[i.value.name] = (i.cname, ct)
        return lines

    # The scan's operand for one element, converted to the accumulator (as torch converts the
    # input to cumsum's dtype= first).
    pre_ins = [i for i in g.ins if i.for_pre]
    var: dict[str, tuple[str, str]] = {}
    lines = [f"CA_HD {acc} {p}_pre({', '.join(f'{i.ctype} r_{i.cname}' for i in pre_ins)}) {{"]
    lines += load_lines(pre_ins, var)
    _emit_chain(g, g.pre, var, lines)
    src, src_ct = var[g.scan.operands[0].name]
    ct = COMPUTE_CTYPE[g.scan.dtype]
    operand_dtype = g.values[g.scan.operands[0].name].dtype
    value = src if src_ct == ct else f"(({ct}){src})"
    if operand_dtype != g.scan.dtype:
        value = round_to_storage(g.scan.dtype, value)
    lines.append(f"    return {acc}{{{value}, 0LL}};" if g.pair else f"    return ({acc})({value});")
    lines.append("}")
    out.append("\n".join(lines))

    # The outputs of one element from its scanned value (rounded to the scan's dtype) and inputs.
    post_ins = [i for i in g.ins if i.for_post]
    var = {}
    params = [f"{acc} acc"] + [f"{i.ctype} r_{i.cname}" for i in post_ins]
    params += [f"{o.ctype}& r_{o.cname}" for o in g.outs]
    lines = [f"CA_HD void {p}_post({', '.join(params)}) {{"]
    lines += load_lines(post_ins, var)
    if g.pair:
        lines.append(f"    const {ct} s = acc.v;  // {g.scan.op}: values")
        lines.append("    const long long si = acc.i;  // indices")
        for n in g.graph.nodes:
            if n.op == "getitem" and n.operands[0] == Ref(g.scan.name):
                var[n.name] = ("s", ct) if n.attrs.get("index") == 0 else ("si", "long long")
    else:
        lines.append(f"    const {ct} s = {round_to_storage(g.scan.dtype, f'(({ct})acc)')};  // {g.scan.op}")
        var[g.scan.name] = ("s", ct)
    _emit_chain(g, g.post, var, lines)
    for o in g.outs:
        cvar, _ = var[o.buffer]
        lines.append(f"    r_{o.cname} = {store_expr(o.node.dtype, cvar)};")
    lines.append("}")
    out.append("\n".join(lines))
    return "\n".join(out) + "\n"


def _emit_carry_helpers(g: _Group, p: str) -> str:
    """`{p}_at(x, i)` gives an element its index along the scan (a no-op for one-word scans), and
    `{p}_shfl_up` / `{p}_shfl` are the warp shuffles of the accumulator (a pair: field by field)."""
    acc = f"{p}_acc"
    if not g.pair:
        return "\n".join([
            f"CA_HD {acc} {p}_at({acc} x, long long) {{ return x; }}",
            f"__device__ __forceinline__ {acc} {p}_shfl_up({acc} x, int d, int w) "
            "{ return __shfl_up_sync(0xffffffffu, x, d, w); }",
            f"__device__ __forceinline__ {acc} {p}_shfl({acc} x, int src, int w) "
            "{ return __shfl_sync(0xffffffffu, x, src, w); }"])
    return "\n".join([
        f"CA_HD {acc} {p}_at({acc} x, long long i) {{ x.i = i; return x; }}",
        f"__device__ __forceinline__ {acc} {p}_shfl_up({acc} x, int d, int w) {{",
        "    x.v = __shfl_up_sync(0xffffffffu, x.v, d, w);",
        "    x.i = __shfl_up_sync(0xffffffffu, x.i, d, w);",
        "    return x;",
        "}",
        f"__device__ __forceinline__ {acc} {p}_shfl({acc} x, int src, int w) {{",
        "    x.v = __shfl_sync(0xffffffffu, x.v, src, w);",
        "    x.i = __shfl_sync(0xffffffffu, x.i, src, w);",
        "    return x;",
        "}"])


def _stride(i: _In, k: int, rank: int) -> str:
    """C expression of input i's element stride along full-shape dim k (from the dims d0..)."""
    later = [f"d{m}" for m in range(k + 1, rank) if i.aligned[m] != 1]
    return " * ".join(later) if later else "1"


def _decompose(targets: list[tuple[str, _In]], index: str, dims: range, rank: int, indent: str) -> list[str]:
    """Add to each target variable its input's offset of the multi-index `index` spans over `dims`."""
    lines = [f"{indent}{{", f"{indent}    long long rem = {index};"]
    for k in reversed(dims):
        adds = "".join(f" {var} += i * ({_stride(inp, k, rank)});" for var, inp in targets if inp.aligned[k] != 1)
        lines.append(f"{indent}    {{ const long long i = rem % d{k}; rem /= d{k};{adds} }}")
    lines.append(f"{indent}}}")
    return lines


def _kernel_params(g: _Group, p: str, split: bool) -> tuple[list[str], list[str]]:
    params = [f"const {i.ctype}* __restrict__ {i.cname}" for i in g.ins]
    params += [f"{o.ctype}* __restrict__ {o.cname}" for o in g.outs]
    if split:
        params.append(f"{p}_acc* __restrict__ part")
    if g.rows_layout:
        params += ["long long rows", "long long L"]
    else:
        params += ["long long outer", "long long L", "long long inner"]
    if _needs_dims(g):
        params += [f"long long d{k}" for k in range(g.rank)]
    names = [q.split()[-1] for q in params]
    return params, names


def _needs_dims(g: _Group) -> bool:
    return any(not i.full for i in g.ins)


def _vec_check(g: _Group, extent: str) -> str:
    checks = ["VEC > 1", f"{extent} % VEC == 0"]
    checks += [f"aligned_to<VEC * sizeof({i.ctype})>({i.cname})" for i in g.ins if i.vec]
    checks += [f"aligned_to<VEC * sizeof({o.ctype})>({o.cname})" for o in g.outs]
    return " && ".join(checks)


def _emit_rows(g: _Group, p: str, split: bool) -> str:
    acc = f"{p}_acc"
    ident = _identity(g, acc)
    params, _ = _kernel_params(g, p, split)
    rev = g.rev

    def pos(m: bool, q: str, width: str) -> str:
        return f"(L - {width} - {q})" if m else q

    lines = [
        "template <bool VL, bool PARTIAL>",
        f"__device__ __forceinline__ void {p}_rows({', '.join(params)})",
        "{",
        "    constexpr int SEGW = LANES == 0 ? 32 : LANES;          // threads of one shuffle scan",
        "    constexpr int GROUP = LANES == 0 ? BLOCK : LANES;      // threads on one row",
        "    constexpr long long TILE = (long long)GROUP * ITEMS * VEC;",
        "    constexpr long long SEG = (long long)SEGW * ITEMS * VEC;  // a warp's contiguous part of a tile",
        f"    __shared__ {acc} s_tot[2][32];                          // warp totals (LANES 0), double-buffered",
        "    const int tid = threadIdx.x;",
        "    const int lane = tid % SEGW;",
        "    const int warp = tid / 32;",
        "    const long long r = ((long long)blockIdx.x * BLOCK + tid) / GROUP;",
        "    // Threads past the last row still join every shuffle and barrier; they load and store nothing.",
        "    const bool live = r < rows;",
        f"    const long long clen = {p}_split == 1 ? L : {p}_cdiv({p}_cdiv(L, {p}_split), TILE) * TILE;",
        f"    const long long p0 = {p}_min(L, (long long)blockIdx.y * clen);",
        f"    const long long p1 = {p}_min(L, p0 + clen);",
        f"    {acc} carry = {ident};",
    ]
    if split:
        lines.append(f"    if (!PARTIAL && live) for (int c = 0; c < (int)blockIdx.y; ++c) "
                     f"carry = {p}_comb(carry, part[r * {p}_split + c]);")
    lines.append("    const long long rowb = r * L;")
    general = [i for i in g.ins if not i.full]
    for i in g.ins:
        if i.full:
            lines.append(f"    const long long b_{i.cname} = rowb;")
        else:
            lines.append(f"    long long b_{i.cname} = 0;")
    if general:
        lines += _decompose([(f"b_{i.cname}", i) for i in general], "r", range(g.rank - 1), g.rank, "    ")
    for i in g.ins:
        if not i.vec:    # constant along the row: one load per row
            lines.append(f"    const {i.ctype} c_{i.cname} = live ? {i.cname}[b_{i.cname}] : ({i.ctype})0;")

    def guard_post(i: _In, body: list[str], indent: str) -> list[str]:
        if i.for_pre:
            return body
        return [f"{indent}if (!PARTIAL) {{"] + ["    " + b for b in body] + [f"{indent}}}"]

    lines += [
        "    for (long long t0 = p0; t0 < p1; t0 += TILE) {     // uniform: the same bounds for the whole block",
        "        const long long sb = t0 + (LANES == 0 ? (long long)warp * SEG : 0LL);",
    ]
    vec_ins = [i for i in g.ins if i.vec]
    for i in vec_ins:
        lines.append(f"        {i.ctype} v_{i.cname}[ITEMS][VEC];")
    lines += ["        #pragma unroll", "        for (int k = 0; k < ITEMS; ++k) {",
              "            const long long q = sb + ((long long)k * SEGW + lane) * VEC;"]
    for i in vec_ins:
        ind = "            "
        body = [
            f"{ind}if (VL) {{",
            f"{ind}    if (live && q < p1) {{",
            f"{ind}        const vec_t<{i.ctype}, VEC> t = *reinterpret_cast<const vec_t<{i.ctype}, VEC>*>("
            f"{i.cname} + b_{i.cname} + {pos(rev, 'q', 'VEC')});",
            f"{ind}        #pragma unroll",
            f"{ind}        for (int j = 0; j < VEC; ++j) v_{i.cname}[k][j] = t.v[{'VEC - 1 - j' if rev else 'j'}];",
            f"{ind}    }} else {{",
            f"{ind}        #pragma unroll",
            f"{ind}        for (int j = 0; j < VEC; ++j) v_{i.cname}[k][j] = ({i.ctype})0;",
            f"{ind}    }}",
            f"{ind}}} else {{",
            f"{ind}    #pragma unroll",
            f"{ind}    for (int j = 0; j < VEC; ++j) {{",
            f"{ind}        const long long e = q + j;",
            f"{ind}        v_{i.cname}[k][j] = (live && e < p1) ? {i.cname}[b_{i.cname} + {pos(rev, 'e', '1')}] : ({i.ctype})0;",
            f"{ind}    }}",
            f"{ind}}}",
        ]
        lines += guard_post(i, body, ind)
    lines.append("        }")

    def arg(i: _In) -> str:
        return f"v_{i.cname}[k][j]" if i.vec else f"c_{i.cname}"

    pre_args = ", ".join(arg(i) for i in g.ins if i.for_pre)
    post_ins = [arg(i) for i in g.ins if i.for_post]

    def store_item(off: str, indent: str) -> list[str]:
        """Outputs of item k (every j) with carry-in `off`: vector stores or the scalar path."""
        ind = indent
        res = [f"{ind}{{", f"{ind}    const long long q = sb + ((long long)k * SEGW + lane) * VEC;",
               f"{ind}    if (VL) {{", f"{ind}        if (live && q < p1) {{"]
        res += [f"{ind}            vec_t<{o.ctype}, VEC> w_{o.cname};" for o in g.outs]
        call = ", ".join([f"{p}_comb({off}, a[k][j])"] + post_ins +
                         [f"w_{o.cname}.v[{'VEC - 1 - j' if o.mirror else 'j'}]" for o in g.outs])
        res += [f"{ind}            #pragma unroll",
                f"{ind}            for (int j = 0; j < VEC; ++j) {p}_post({call});"]
        res += [f"{ind}            *reinterpret_cast<vec_t<{o.ctype}, VEC>*>({o.cname} + rowb + "
                f"{pos(o.mirror, 'q', 'VEC')}) = w_{o.cname};" for o in g.outs]
        res += [f"{ind}        }}", f"{ind}    }} else {{", f"{ind}        #pragma unroll",
                f"{ind}        for (int j = 0; j < VEC; ++j) {{",
                f"{ind}            const long long e = q + j;",
                f"{ind}            if (live && e < p1) {{"]
        res += [f"{ind}                {o.ctype} w_{o.cname};" for o in g.outs]
        call = ", ".join([f"{p}_comb({off}, a[k][j])"] + post_ins + [f"w_{o.cname}" for o in g.outs])
        res.append(f"{ind}                {p}_post({call});")
        res += [f"{ind}                {o.cname}[rowb + {pos(o.mirror, 'e', '1')}] = w_{o.cname};" for o in g.outs]
        res += [f"{ind}            }}", f"{ind}        }}", f"{ind}    }}", f"{ind}}}"]
        return res

    lines += [
        "        // Scan each item: serial over its VEC elements, then shuffles across the SEGW lanes.",
        f"        {acc} a[ITEMS][VEC];",
        f"        {acc} seg = {ident};                      // the segment's total before item k",
        "        #pragma unroll",
        "        for (int k = 0; k < ITEMS; ++k) {",
        "            const long long q = sb + ((long long)k * SEGW + lane) * VEC;",
        f"            {acc} run = {ident};",
        "            const bool whole = live && q < p1;        // VL: a vector is all in or all out",
        "            #pragma unroll",
        "            for (int j = 0; j < VEC; ++j) {",
        "                const bool in = VL ? whole : (live && q + j < p1);",
        f"                run = {p}_comb(run, in ? {p}_at({p}_pre({pre_args}), q + j) : {ident});",
        "                a[k][j] = run;",
        "            }",
        f"            {acc} inc = run;",
        "            #pragma unroll",
        "            for (int d = 1; d < SEGW; d <<= 1) {",
        f"                const {acc} y = {p}_shfl_up(inc, d, SEGW);",
        f"                if (lane >= d) inc = {p}_comb(y, inc);",
        "            }",
        f"            const {acc} up = {p}_shfl_up(inc, 1, SEGW);",
        f"            const {acc} before = lane == 0 ? seg : {p}_comb(seg, up);",
        f"            seg = {p}_comb(seg, {p}_shfl(inc, SEGW - 1, SEGW));",
        "            #pragma unroll",
        f"            for (int j = 0; j < VEC; ++j) a[k][j] = {p}_comb(before, a[k][j]);",
        "            if (LANES != 0 && !PARTIAL) {      // the row's carry-in is known: store item k now",
    ]
    lines += store_item("carry", "                ")
    lines += [
        "            }",
        "        }",
        "        if (LANES == 0) {",
        "            // Block-wide row: scan the warp totals, then every warp adds the totals before it.",
        "            const int par = (int)(((t0 - p0) / TILE) & 1);",
        "            if (lane == 0) s_tot[par][warp] = seg;",
        "            __syncthreads();   // all threads: LANES == 0 and the tile loop are uniform per block",
        f"            {acc} w = lane < BLOCK / 32 ? s_tot[par][lane] : {ident};",
        "            #pragma unroll",
        "            for (int d = 1; d < 32; d <<= 1) {",
        f"                const {acc} y = {p}_shfl_up(w, d, 32);",
        f"                if (lane >= d) w = {p}_comb(y, w);",
        "            }",
        f"            const {acc} wex = {p}_shfl(w, warp == 0 ? 0 : warp - 1, 32);",
        f"            const {acc} off = warp == 0 ? carry : {p}_comb(carry, wex);",
        f"            carry = {p}_comb(carry, {p}_shfl(w, BLOCK / 32 - 1, 32));",
        "            // The next tile writes the other s_tot half, and passes its barrier only after every",
        "            // warp has read this one: one barrier per tile is enough.",
        "            if (!PARTIAL) {",
        "                #pragma unroll",
        "                for (int k = 0; k < ITEMS; ++k)",
    ]
    lines += store_item("off", "                ")
    lines += [
        "            }",
        "        } else {",
        f"            carry = {p}_comb(carry, seg);",
        "        }",
        "    }",
    ]
    if split:
        lines.append(f"    if (PARTIAL && live && lane == 0 && (LANES != 0 || warp == 0)) "
                     f"part[r * {p}_split + blockIdx.y] = carry;")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _emit_cols(g: _Group, p: str, split: bool) -> str:
    acc = f"{p}_acc"
    ident = _identity(g, acc)
    params, _ = _kernel_params(g, p, split)
    rev = g.rev
    lines = [
        "template <bool VL, bool PARTIAL>",
        f"__device__ __forceinline__ void {p}_cols({', '.join(params)})",
        "{",
        f"    const long long ncv = {p}_cdiv(inner, VEC);          // column groups per outer index",
        "    const long long g = (long long)blockIdx.x * BLOCK + threadIdx.x;",
        "    if (g >= outer * ncv) return;                      // no barrier or shuffle in this kernel",
        "    const long long o = g / ncv;",
        "    const long long c0 = (g - o * ncv) * VEC;",
        f"    const long long clen = {p}_split == 1 ? L : {p}_cdiv({p}_cdiv(L, {p}_split), ITEMS) * ITEMS;",
        f"    const long long p0 = {p}_min(L, (long long)blockIdx.y * clen);",
        f"    const long long p1 = {p}_min(L, p0 + clen);",
        "    const long long line0 = o * inner + c0;            // scan line of column c0 (chunk-major carries:",
        "                                                       // neighbouring lanes read neighbouring lines)",
        f"    {acc} carry[VEC];",
        "    #pragma unroll",
        "    for (int j = 0; j < VEC; ++j) {",
        f"        carry[j] = {ident};",
    ]
    if split:
        lines.append(f"        if (!PARTIAL && c0 + j < inner) for (int c = 0; c < (int)blockIdx.y; ++c) "
                     f"carry[j] = {p}_comb(carry[j], part[c * outer * inner + line0 + j]);")
    lines += ["    }", "    const long long ob = o * L * inner + c0;         // outputs: element (o, l, c0)"]
    steps: dict[str, str] = {}
    general = [i for i in g.ins if not i.full]
    for i in g.ins:
        if i.full:
            lines.append(f"    const long long b_{i.cname} = ob;")
            steps[i.cname] = "inner"
        else:
            lines.append(f"    long long b_{i.cname} = {'c0' if i.inner == 'full' else '0'};")
            steps[i.cname] = _stride(i, g.dim, g.rank) if i.aligned[g.dim] != 1 else "0"
    if general:
        lines += _decompose([(f"b_{i.cname}", i) for i in general], "o", range(g.dim), g.rank, "    ")
    for i in g.ins:
        if i.inner == "general":
            lines += [f"    long long oc_{i.cname}[VEC];", "    #pragma unroll",
                      "    for (int j = 0; j < VEC; ++j) {", f"        oc_{i.cname}[j] = 0;"]
            lines += _decompose([(f"oc_{i.cname}[j]", i)], "(c0 + j < inner ? c0 + j : 0LL)",
                                range(g.dim + 1, g.rank), g.rank, "        ")
            lines.append("    }")

    def guard_post(i: _In, body: list[str], indent: str) -> list[str]:
        if i.for_pre:
            return body
        return [f"{indent}if (!PARTIAL) {{"] + ["    " + b for b in body] + [f"{indent}}}"]

    lines += ["    for (long long t = p0; t < p1; t += ITEMS) {"]
    lines += [f"        {i.ctype} v_{i.cname}[ITEMS][VEC];" for i in g.ins]
    lines += ["        #pragma unroll", "        for (int it = 0; it < ITEMS; ++it) {",
              "            const long long e = t + it;",
              f"            const long long l = {'L - 1 - e' if rev else 'e'};   // the inputs' position"]
    ind = "            "
    for i in g.ins:
        at = f"{i.cname}[b_{i.cname} + l * ({steps[i.cname]})"
        if i.vec:
            body = [
                f"{ind}if (VL) {{",
                f"{ind}    if (e < p1) {{",
                f"{ind}        const vec_t<{i.ctype}, VEC> x = *reinterpret_cast<const vec_t<{i.ctype}, VEC>*>("
                f"{i.cname} + b_{i.cname} + l * ({steps[i.cname]}));",
                f"{ind}        #pragma unroll",
                f"{ind}        for (int j = 0; j < VEC; ++j) v_{i.cname}[it][j] = x.v[j];",
                f"{ind}    }} else {{",
                f"{ind}        #pragma unroll",
                f"{ind}        for (int j = 0; j < VEC; ++j) v_{i.cname}[it][j] = ({i.ctype})0;",
                f"{ind}    }}",
                f"{ind}}} else {{",
                f"{ind}    #pragma unroll",
                f"{ind}    for (int j = 0; j < VEC; ++j)",
                f"{ind}        v_{i.cname}[it][j] = (e < p1 && c0 + j < inner) ? {at} + j] : ({i.ctype})0;",
                f"{ind}}}",
            ]
        elif i.inner == "const":
            body = [f"{ind}{{",
                    f"{ind}    const {i.ctype} x = e < p1 ? {at}] : ({i.ctype})0;",
                    f"{ind}    #pragma unroll",
                    f"{ind}    for (int j = 0; j < VEC; ++j) v_{i.cname}[it][j] = x;",
                    f"{ind}}}"]
        else:
            body = [f"{ind}#pragma unroll",
                    f"{ind}for (int j = 0; j < VEC; ++j)",
                    f"{ind}    v_{i.cname}[it][j] = (e < p1 && c0 + j < inner) ? {at} + oc_{i.cname}[j]] : ({i.ctype})0;"]
        lines += guard_post(i, body, ind)
    lines.append("        }")
    pre_args = ", ".join(f"v_{i.cname}[it][j]" for i in g.ins if i.for_pre)
    post_args = [f"v_{i.cname}[it][j]" for i in g.ins if i.for_post]
    call = ", ".join(["carry[j]"] + post_args + [f"w_{o.cname}.v[j]" for o in g.outs])
    lines += [
        "        #pragma unroll",
        "        for (int it = 0; it < ITEMS; ++it) {",
        "            const long long e = t + it;",
        "            if (e >= p1) continue;",
    ]
    lines += [f"            vec_t<{o.ctype}, VEC> w_{o.cname};" for o in g.outs]
    lines += [
        "            #pragma unroll",
        "            for (int j = 0; j < VEC; ++j) {",
        "                if (!VL && c0 + j >= inner) continue;",
        f"                carry[j] = {p}_comb(carry[j], {p}_at({p}_pre({pre_args}), e));",
        f"                if (!PARTIAL) {p}_post({call});",
        "            }",
        "            if (!PARTIAL) {",
    ]
    for o in g.outs:
        at = f"{o.cname} + ob + ({'L - 1 - e' if o.mirror else 'e'}) * inner"
        lines += [
            f"                if (VL) *reinterpret_cast<vec_t<{o.ctype}, VEC>*>({at}) = w_{o.cname};",
            "                else {",
            "                    #pragma unroll",
            f"                    for (int j = 0; j < VEC; ++j) if (c0 + j < inner) ({at})[j] = w_{o.cname}.v[j];",
            "                }",
        ]
    lines += ["            }", "        }", "    }"]
    if split:
        lines += ["    if (PARTIAL) {", "        #pragma unroll",
                  "        for (int j = 0; j < VEC; ++j) if (c0 + j < inner) "
                  "part[blockIdx.y * outer * inner + line0 + j] = carry[j];", "    }"]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _emit_globals(g: _Group, p: str, split: bool) -> str:
    params, names = _kernel_params(g, p, split)
    body = f"{p}_rows" if g.rows_layout else f"{p}_cols"
    check = _vec_check(g, "L" if g.rows_layout else "inner")
    args = ", ".join(names)
    out = [
        'extern "C" __global__ void __launch_bounds__(BLOCK)',
        f"{p}({', '.join(params)})",
        "{",
        "    // Uniform per launch: vectors need whole, aligned groups of VEC elements.",
        f"    const bool vl = {check};",
        f"    if (vl) {body}<true, false>({args});",
        f"    else {body}<false, false>({args});",
        "}",
    ]
    if split:
        out += [
            "",
            "// SPLIT > 1: the total of each chunk but the last, for the scan kernel's carry-in.",
            'extern "C" __global__ void __launch_bounds__(BLOCK)',
            f"{p}_2({', '.join(params)})",
            "{",
            f"    if ({p}_split == 1) return;",
            f"    const bool vl = {check};",
            f"    if (vl) {body}<true, true>({args});",
            f"    else {body}<false, true>({args});",
            "}",
        ]
    return "\n".join(out) + "\n"


def emit_source(g: _Group, kernel: str, split: bool) -> str:
    head = [f"// Scan family: {g.scan.op} over dim {g.dim} of {list(g.shape)}"
            f"{' (reverse)' if g.rev else ''}, {'rows' if g.rows_layout else 'columns'} layout.",
            f"constexpr int {kernel}_split = {'SPLIT' if split else '1'};"]
    body = _emit_rows(g, kernel, split) if g.rows_layout else _emit_cols(g, kernel, split)
    return PRELUDE + "\n".join(head) + "\n" + _emit_element_fns(g, kernel) + body + _emit_globals(g, kernel, split)


# ---- the program ---------------------------------------------------------------------------------

def _dim_exprs(g: _Group) -> list[str]:
    exprs = []
    for k, size in enumerate(g.shape):
        expr = str(size)
        for i in sorted(g.ins, key=lambda i: not i.full):
            offset = g.rank - len(i.value.shape)
            if k >= offset and i.aligned[k] == size:
                expr = f"{i.value.name}.shape[{k - offset}]"
                break
        exprs.append(expr)
    return exprs


def _product(exprs: list[str]) -> str:
    return " * ".join(f"({e})" if " " in e else e for e in exprs) if exprs else "1"


def lower_scan(graph: Graph, kernel: str) -> Lowering:
    """A KernelProgram dict for one scan group (see the module docstring)."""
    g = _analyse(graph)
    split = _offer_split(g)
    spec = _space(g, split)
    if split and spec.default()["SPLIT"] == 1:      # no default split: no second kernel to launch
        split = False
        spec = _space(g, split)
    source = emit_source(g, kernel, split)
    dims = _dim_exprs(g)
    outer, length, inner = _product(dims[:g.dim]), dims[g.dim], _product(dims[g.dim + 1:])
    taken = {v.name for v in graph.inputs} | set(graph.outputs) | set(graph.constants) | {k.name for k in spec.knobs}
    part = "scan_partials"
    while part in taken:
        part = "_" + part
    args = [i.value.name for i in g.ins] + [o.buffer for o in g.outs] + ([part] if split else [])
    if g.rows_layout:
        args += [f"int64({outer})", f"int64({length})"]
        main_grid = [f"{outer} if LANES == 0 else cdiv({outer}, max(BLOCK // max(LANES, 1), 1))"]
        lines = outer
    else:
        args += [f"int64({outer})", f"int64({length})", f"int64({inner})"]
        main_grid = [f"cdiv({_product([outer, f'cdiv({inner}, VEC)'])}, BLOCK)"]
        lines = _product([outer, inner])
    if _needs_dims(g):
        args += [f"int64({d})" for d in dims]
    buffers = [{"name": o.buffer, "shape": list(dims), "dtype": o.node.dtype} for o in g.outs]
    launches = []
    if split:
        buffers.append({"name": part, "shape": [f"{_product([lines])} * SPLIT"], "dtype": g.acc_dtype})
        launches.append({"kernel": f"{kernel}_2", "grid": [f"({main_grid[0]}) if SPLIT > 1 else 1",
                                                          "max(SPLIT - 1, 1)"],
                         "block": ["BLOCK"], "shared_bytes": 0, "args": args})
    launches.append({"kernel": kernel, "grid": main_grid + (["SPLIT"] if split else []),
                     "block": ["BLOCK"], "shared_bytes": 0, "args": args})
    program = {
        "format": "cuda-agent/program@1",
        "name": kernel,
        "source": source,
        "tunables": spec.tunables(),
        "schedule": spec.default(),
        "buffers": buffers,
        "launches": launches,
        "outputs": [o.buffer for o in g.outs],
    }
    layout = "rows" if g.rows_layout else "columns"
    notes = [f"scan: {g.scan.op} over dim {g.dim} of {g.scan.dtype}{list(g.shape)}"
             f"{' in reverse (flips folded)' if g.rev else ''}: {layout} layout, {g.outer} x {g.length}"
             f" x {g.inner}, {'carrying (value, index) in' if g.pair else 'accumulating in'} {g.acc_dtype}"]
    if g.pre:
        notes.append("prologue: " + ", ".join(n.op for n in g.pre))
    if g.post:
        notes.append("epilogue: " + ", ".join(n.op for n in g.post))
    if split:
        notes.append("SPLIT > 1 adds a chunk-total pass (kernel _2) for few long scan lines")
    return Lowering(program, spec, notes)
