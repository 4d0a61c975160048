"""The pooling family: one max or average pooling (1-D, 2-D, 3-D), or one depthwise convolution, plus a
pointwise epilogue.

A group is one pooling node (max_pool2d/3d_with_indices, avg_pool2d/3d) with the view nodes
around it (1-D pools arrive as unsqueeze -> pool2d -> squeeze), the getitems that pick the max
values and/or indices, and elementwise ops on the pooled result (relu, a scale, a bias that
broadcasts to the output). Every view of a contiguous tensor keeps its flat element order, so
the kernel reads the group input as the pool's operand and writes each output at the flat index
of its pooled element.

Layout: channels-first, contiguous; every leading dim before the 2 (or 3) pooled dims is one
independent (N, C) plane. A 2-D pool is computed as a 3-D pool with a window of depth 1.

Semantics follow PyTorch's kernels exactly: output sizes (ceil_mode: the last window must start
inside the input or the left padding), max windows skip padding, NaN wins (the last NaN of the
window gives the index), ties keep the first maximum, an all -inf window reports its first valid
position; avg windows divide by divisor_override, or the window clipped to the padded input
(count_include_pad) or to the input. Math in fp32 (fp64 for fp64 inputs), stored in the dtype.

A depthwise convolution (groups = input channels = output channels, not transposed; the conv
family's CONV node) is the same window walk with a weighted sum: every plane (image, channel)
multiplies its windows by that channel's KD x KH x KW weights (kind "conv"; zero padding, any
stride, padding and dilation). As an implicit product it would be one column per group: each output
a separate short dot product staged through shared memory.

Schedule: a block computes a tile of ROWS output rows x TW output columns of one plane (and one
output depth), TW = BLOCK / ROWS * OUT_W. Knobs:
  BLOCK  threads per block.
  ROWS   output rows per tile: several short output rows fill one block.
  OUT_W  neighbouring outputs per thread along W: the thread loads the input columns its windows
         cover once into registers (SPAN = (OUT_W-1)*SW + (KW-1)*DW + 1 loads per input row
         instead of OUT_W*KW), which pays when windows overlap (stride < kernel).
  VEC    input columns per vector load (16 bytes at most). Loads start VEC_R columns before the
         window so that they are aligned; needs VEC | W and VEC | the column step between threads
         (OUT_W * stride; with SMEM the tile's). A run-time pointer check falls back to scalars.
  SMEM   1: the block first stages every input element its tile reads in shared memory with
         coalesced loads (each element loaded from global memory once per block), then
         computes from there; 0: windows read global memory directly (through L1).
Without SMEM, a thread whose window rows fit MAX_PREFETCH registers issues the loads of all of them
before it combines any (several rows of loads in flight instead of one), and every thread computes
its OUT_W results before it stores them (the stores to neighbouring outputs then issue together).
Geometry (kernel, stride, padding, dilation, divisor) is compile-time; sizes are kernel args.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from core.codegen.cuda_emit import COMPUTE_CTYPE, ITEMSIZE, PRELUDE, STORAGE_CTYPE, literal, load_expr, \
    round_to_storage, store_expr
from core.codegen.errors import CodegenError
from core.codegen.graph import Graph, GraphInput, Node, Ref
from core.codegen.lower_matmul import CONV, spatial3
from core.codegen.lower_pointwise import Lowering, emit_epilogue_chain, epilogue_read_problem
from core.codegen.pointwise_ops import is_pointwise
from core.codegen.schedule import Knob, ScheduleSpec

# op -> (kind, pooled dims)
POOL_OPS = {
    "max_pool2d_with_indices.default": ("max", 2), "max_pool3d_with_indices.default": ("max", 3),
    "avg_pool2d.default": ("avg", 2), "avg_pool3d.default": ("avg", 3),
}
# Views whose result has the operand's elements in the same flat order (on contiguous data):
# absorbed into the group on either side of the pool.
VIEW_OPS = {"unsqueeze.default", "squeeze.default", "squeeze.dim", "squeeze.dims", "view.default",
            "reshape.default", "_unsafe_view.default", "alias.default"}
FLOATS = ("float32", "float16", "bfloat16", "float64")

BLOCKS = (256, 128, 512, 64, 1024)
ROWS_VALUES = (1, 2, 4, 8, 16, 32)
OUT_W_VALUES = (1, 2, 4, 8)
DEFAULT_PREFERENCE = ((2, 4), (2, 2), (2, 1))   # (OUT_W, VEC) the default takes, first legal (schedule_spec)
VEC_VALUES = (1, 2, 4, 8)
SMEM_VALUES = (0, 1)
MAX_SPAN = 64                      # register array of one thread's input columns (OUT_W > 1)
MAX_PREFETCH = 48                  # registers for every window row's columns, loaded before combining
MAX_ACCESS_BYTES = 16
MAX_STATIC_SHARED = 48 * 1024      # static __shared__ limit per block
MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65535
SMS = 132                          # H200


@dataclass(frozen=True)
class PoolGeometry:
    """One pooling op as a 3-D pool over planes: sizes and window per (depth, height, width)."""

    kind: str                            # "max", "avg" or "conv" (depthwise)
    dims: int                            # pooled dims of the op (2 or 3; a convolution's 1 to 3)
    dtype: str                           # input (and value output) dtype
    planes: int                          # product of the dims before the pooled ones
    in_size: tuple[int, int, int]        # ID, IH, IW (ID = 1 for 2-D pools)
    out_size: tuple[int, int, int]       # OD, OH, OW
    kernel: tuple[int, int, int]
    stride: tuple[int, int, int]
    padding: tuple[int, int, int]
    dilation: tuple[int, int, int]       # 1s for avg
    ceil_mode: bool
    count_include_pad: bool              # avg only
    divisor: int                         # avg divisor_override, 0 = none
    channels: int = 1                    # conv: the planes' channels (plane % channels picks the weights)

    @property
    def out_numel(self) -> int:
        return self.planes * math.prod(self.out_size)

    @property
    def plane_numel(self) -> int:
        return math.prod(self.in_size)


def output_size(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    """PyTorch's pooling_output_shape: floor (or ceil) windows, the last one starting in the input."""
    eff = dilation * (kernel - 1) + 1
    out = (size + 2 * pad - eff + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _triple(task: str, op: str, what: str, value: Any, dims: int, default: Any = None) -> tuple[int, int, int]:
    """A kernel_size/stride/padding/dilation attribute as (depth, height, width)."""
    if value is None or value == []:
        value = default
    if isinstance(value, int):
        value = [value]
    if not isinstance(value, (list, tuple)) or len(value) not in (1, dims) or \
            not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise CodegenError(f"Task '{task}': '{op}' has {what}={value!r}; the pooling family needs "
                           f"1 or {dims} integers.", task=task, ops=[op])
    values = list(value) * dims if len(value) == 1 else list(value)
    if dims == 2:
        values = [1 if what != "padding" else 0] + values
    return values[0], values[1], values[2]


def pool_geometry(task: str, node: Node, in_shape: tuple[int, ...], dtype: str) -> PoolGeometry:
    """The pool's sizes and window from its attributes and the static shape of its operand."""
    kind, dims = POOL_OPS[node.op]
    if len(in_shape) not in (dims + 1, dims + 2):
        raise CodegenError(f"Task '{task}': '{node.op}' (node '{node.name}') pools a tensor of shape "
                           f"{list(in_shape)}; it takes {dims + 1}-D or {dims + 2}-D channels-first "
                           f"input.", task=task, ops=[node.op])
    a = node.attrs
    kernel = _triple(task, node.op, "kernel_size", a.get("kernel_size"), dims)
    stride = _triple(task, node.op, "stride", a.get("stride"), dims, default=a.get("kernel_size"))
    padding = _triple(task, node.op, "padding", a.get("padding", 0), dims, default=0)
    dilation = _triple(task, node.op, "dilation", a.get("dilation", 1), dims, default=1) if kind == "max" \
        else (1, 1, 1)
    ceil_mode = bool(a.get("ceil_mode", False))
    divisor = a.get("divisor_override") or 0
    if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 or \
            any(p > k // 2 for p, k in zip(padding, kernel)) or divisor < 0:
        raise CodegenError(f"Task '{task}': '{node.op}' (node '{node.name}') has kernel {list(kernel)}, "
                           f"stride {list(stride)}, padding {list(padding)}, dilation {list(dilation)}, "
                           f"divisor {divisor}: PyTorch rejects these (padding at most half the kernel, "
                           f"positive sizes).", task=task, ops=[node.op])
    spatial = tuple(in_shape[-dims:])
    in_size = (1,) * (3 - dims) + spatial
    out = tuple(output_size(*args, ceil_mode) for args in zip(in_size, kernel, stride, padding, dilation))
    if min(out) < 1 or out[3 - dims:] != tuple(node.shape[-dims:]):
        raise CodegenError(f"Task '{task}': '{node.op}' (node '{node.name}') on {list(in_shape)} gives "
                           f"output {list(node.shape)}, but PyTorch's size rule gives "
                           f"{list(out[3 - dims:])}; cannot lower it.", task=task, ops=[node.op])
    return PoolGeometry(kind, dims, dtype, math.prod(in_shape[:-dims]), in_size, out, kernel, stride,
                        padding, dilation, ceil_mode, bool(a.get("count_include_pad", True)), int(divisor))


def depthwise_geometry(task: str, node: Node, graph: Graph) -> PoolGeometry:
    """A depthwise convolution as a pool of kind "conv": raises CodegenError for any other node."""
    ok = node.op == CONV and len(node.operands) == 2 and all(isinstance(o, Ref) for o in node.operands)
    x, w = (graph.value(o.name) for o in node.operands) if ok else (None, None)
    dims = len(x.shape) - 2 if ok else 0
    groups = int(node.attrs.get("groups", 1))
    if not ok or node.attrs.get("transposed") or not 1 <= dims <= 3 or x.dtype != w.dtype or \
            x.dtype not in FLOATS or node.dtype != x.dtype or len(w.shape) != len(x.shape) or \
            groups != x.shape[1] or tuple(w.shape[:2]) != (groups, 1) or tuple(node.shape[:2]) != (x.shape[0], groups):
        raise CodegenError(f"Task '{task}': '{node.op}' (node '{node.name}') is not a depthwise convolution "
                           f"(groups = input channels = output channels, not transposed).", task=task, ops=[node.op])
    a = node.attrs
    kernel = spatial3(list(w.shape[2:]), dims, 1)
    stride, padding = spatial3(a.get("stride", 1), dims, 1), spatial3(a.get("padding", 0), dims, 0)
    dilation = spatial3(a.get("dilation", 1), dims, 1)
    in_size = spatial3(list(x.shape[2:]), dims, 1)
    out = tuple(output_size(*args, False) for args in zip(in_size, kernel, stride, padding, dilation))
    if out != spatial3(list(node.shape[2:]), dims, 1) or min(stride) < 1 or min(padding) < 0 or min(dilation) < 1:
        raise CodegenError(f"Task '{task}': a depthwise convolution of {list(x.shape)} by {list(w.shape)} -> "
                           f"{list(node.shape)} that the pooling family does not understand.", task=task, ops=[node.op])
    return PoolGeometry("conv", dims, x.dtype, x.shape[0] * groups, in_size, out, kernel, stride, padding, dilation,
                        False, True, 0, groups)


def is_depthwise_conv(node: Node, graph: Graph) -> bool:
    try:
        depthwise_geometry(graph.task, node, graph)
    except CodegenError:
        return False
    return True


def is_pool(node: Node, graph: Graph) -> bool:
    """True when this node is a max/avg pooling of a float tensor, or a depthwise convolution, that the
    family lowers."""
    if node.op == CONV:
        return is_depthwise_conv(node, graph)
    if node.op not in POOL_OPS or not node.operands or not isinstance(node.operands[0], Ref):
        return False
    src = graph.value(node.operands[0].name)
    if src.dtype not in FLOATS:
        return False
    try:
        pool_geometry(graph.task, node, tuple(src.shape), src.dtype)
    except CodegenError:
        return False
    return True


def pool_chain(anchor: Node, graph: Graph) -> list[str]:
    """Names of the nodes that must join the pool's group: the views feeding it (1-D unsqueeze),
    its getitems and the views of its results (1-D squeeze), in graph order. Pointwise
    epilogue ops on the result may join too; that is the partitioner's choice."""
    users: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for o in n.operands:
            if isinstance(o, Ref):
                users.setdefault(o.name, []).append(n)
    names = {anchor.name}
    cur = anchor.operands[0]
    while isinstance(cur, Ref):
        value = graph.value(cur.name)
        if not isinstance(value, Node) or value.op not in VIEW_OPS:
            break
        names.add(value.name)
        cur = value.operands[0] if value.operands else None
    frontier = [anchor.name]
    while frontier:
        name = frontier.pop()
        for user in users.get(name, []):
            if user.op == "getitem" or (user.op in VIEW_OPS and math.prod(user.shape) == math.prod(anchor.shape)):
                names.add(user.name)
                frontier.append(user.name)
    return [n.name for n in graph.nodes if n.name in names]


# ---- group analysis -------------------------------------------------------------------------------

@dataclass
class _Group:
    anchor: Node
    x: GraphInput                        # the group input the pool reads
    weight: GraphInput | None            # a depthwise convolution's weights [C, 1, k...]
    geo: PoolGeometry
    role: dict[str, str]                 # node name -> "value" | "index" | "epilogue"
    alias: dict[str, str]                # node name -> the node whose C value it shares
    epilogue: list[Node]                 # pointwise nodes, in order
    extra: list[GraphInput]              # group inputs the epilogue reads (one pointer each)
    reads: dict[str, tuple[str, tuple[int, ...]]]  # readable name -> (group input, shape it is read as)


def _fail(graph: Graph, what: str, ops: list[str]) -> CodegenError:
    return CodegenError(f"Task '{graph.task}': the pooling family lowers one max/avg pooling or depthwise "
                        f"convolution with the view nodes around it and a pointwise epilogue on its result; {what}.",
                        task=graph.task, ops=ops)


def _analyse(graph: Graph) -> _Group:
    anchors = [n for n in graph.nodes if n.op in POOL_OPS or is_depthwise_conv(n, graph)]
    if len(anchors) != 1:
        raise _fail(graph, f"this group has {len(anchors)} pooling nodes ({', '.join(graph.ops())})", graph.ops())
    anchor = anchors[0]
    kind = "conv" if anchor.op == CONV else POOL_OPS[anchor.op][0]
    inputs = {v.name: v for v in graph.inputs}
    weight = None
    if kind == "conv":
        w = anchor.operands[1]
        if not isinstance(w, Ref) or w.name not in inputs:
            raise _fail(graph, "the depthwise convolution's weight is not a group input", [anchor.op])
        weight = inputs[w.name]
    nodes = {n.name: n for n in graph.nodes}
    # Views from a group input to the pool's operand: the pool reads that input's memory.
    pre: set[str] = set()
    cur = anchor.operands[0] if anchor.operands else None
    while isinstance(cur, Ref) and cur.name in nodes:
        view = nodes[cur.name]
        if view.op not in VIEW_OPS or not view.operands or not isinstance(view.operands[0], Ref) or \
                math.prod(view.shape) != math.prod(graph.value(view.operands[0].name).shape):
            raise _fail(graph, f"the pool's operand comes from '{view.op}' (node '{view.name}'), which is "
                               f"not a view of a group input", [view.op])
        pre.add(view.name)
        cur = view.operands[0]
    if not isinstance(cur, Ref) or cur.name not in inputs:
        raise _fail(graph, f"the operand of '{anchor.op}' is not a group input", [anchor.op])
    x = inputs[cur.name]
    operand = graph.value(anchor.operands[0].name)
    if x.dtype not in FLOATS:
        raise CodegenError(f"Task '{graph.task}': '{anchor.op}' pools '{x.name}' of dtype {x.dtype}; the "
                           f"pooling family supports {', '.join(FLOATS)}.", task=graph.task, ops=[anchor.op])
    geo = depthwise_geometry(graph.task, anchor, graph) if kind == "conv" else \
        pool_geometry(graph.task, anchor, tuple(operand.shape), x.dtype)

    role: dict[str, str] = {}
    alias: dict[str, str] = {}
    epilogue: list[Node] = []
    extra: dict[str, GraphInput] = {}
    reads = {v.name: (v.name, tuple(v.shape)) for v in graph.inputs}
    if kind in ("avg", "conv"):
        role[anchor.name], alias[anchor.name] = "value", anchor.name
    for n in graph.nodes:
        if n is anchor or n.name in pre:
            continue
        refs = [o.name for o in n.operands if isinstance(o, Ref)]
        if n.op in VIEW_OPS and len(refs) == 1 and refs[0] in reads and refs[0] not in role:
            reads[n.name] = (reads[refs[0]][0], tuple(n.shape))   # e.g. a bias viewed as [1, C, 1, 1]
            continue
        if math.prod(n.shape) != geo.out_numel:
            raise _fail(graph, f"'{n.op}' (node '{n.name}') has shape {list(n.shape)}, not the "
                               f"{geo.out_numel} elements of the pooled result", [n.op])
        if n.op == "getitem" and refs == [anchor.name] and n.attrs.get("index") in (0, 1) and kind == "max":
            role[n.name] = "value" if n.attrs["index"] == 0 else "index"
            alias[n.name] = n.name
        elif n.op in VIEW_OPS and len(refs) == 1 and refs[0] in role:
            role[n.name], alias[n.name] = role[refs[0]], alias[refs[0]]
        elif is_pointwise(n) and all(r in role or r in reads for r in refs) and n.dtype in STORAGE_CTYPE:
            for r in refs:
                if r in role:
                    continue
                source, shape = reads[r]
                _check_broadcast(graph, inputs[source], shape, n)
                extra.setdefault(source, inputs[source])
            role[n.name], alias[n.name] = "epilogue", n.name
            epilogue.append(n)
        else:
            raise _fail(graph, f"it cannot fuse '{n.op}' (node '{n.name}')", [n.op])
    for o in graph.outputs:
        if o not in role:
            what = "a group input or a view of one" if o in reads else "not an element of the pooled result"
            raise _fail(graph, f"the group output '{o}' is {what}", [anchor.op])
    return _Group(anchor, x, weight, geo, role, alias, epilogue, list(extra.values()), reads)


def _check_broadcast(graph: Graph, g: GraphInput, shape: tuple[int, ...], n: Node) -> None:
    problem = epilogue_read_problem(g, shape, n)
    if problem:
        raise _fail(graph, problem, [n.op])


# ---- schedule -----------------------------------------------------------------------------------

def tile_cols(s: Mapping[str, int]) -> int:
    """Output columns of one block tile (TW)."""
    return s["BLOCK"] // s["ROWS"] * s["OUT_W"]


def span(geo: PoolGeometry, out_w: int) -> int:
    """Input columns that one thread's OUT_W neighbouring windows cover (SPAN)."""
    return (out_w - 1) * geo.stride[2] + (geo.kernel[2] - 1) * geo.dilation[2] + 1


def vec_fits(geo: PoolGeometry, s: Mapping[str, int]) -> bool:
    """VEC-wide loads stay aligned: every thread's (SMEM: every tile's) first column is -PW mod VEC."""
    step = (tile_cols(s) if s["SMEM"] else s["OUT_W"]) * geo.stride[2]
    return s["VEC"] > 1 and step % s["VEC"] == 0


def vec_shift(geo: PoolGeometry, s: Mapping[str, int]) -> int:
    """VEC_R: columns loaded before a window start so that vector loads are aligned."""
    return (s["VEC"] - geo.padding[2] % s["VEC"]) % s["VEC"] if vec_fits(geo, s) else 0


def loaded_span(geo: PoolGeometry, s: Mapping[str, int]) -> int:
    """VSPAN: register columns one thread loads per input row (without SMEM)."""
    n = span(geo, s["OUT_W"])
    if not vec_fits(geo, s):
        return n
    return -(-(vec_shift(geo, s) + n) // s["VEC"]) * s["VEC"]


def smem_bytes(geo: PoolGeometry, s: Mapping[str, int]) -> int:
    rows = (s["ROWS"] - 1) * geo.stride[1] + (geo.kernel[1] - 1) * geo.dilation[1] + 1
    cols = (tile_cols(s) - 1) * geo.stride[2] + (geo.kernel[2] - 1) * geo.dilation[2] + 1
    if vec_fits(geo, s):
        cols = -(-(vec_shift(geo, s) + cols) // s["VEC"]) * s["VEC"]
    return geo.kernel[0] * rows * cols * (8 if geo.dtype == "float64" else 4)


def grid3(geo: PoolGeometry) -> bool:
    """A (tiles_w, tiles_h, planes*OD) grid fits the y/z limits for every ROWS: no index division."""
    return geo.planes * geo.out_size[0] <= MAX_GRID_YZ and geo.out_size[1] <= MAX_GRID_YZ


def blocks(geo: PoolGeometry, s: Mapping[str, int]) -> int:
    od, oh, ow = geo.out_size
    return -(-ow // tile_cols(s)) * -(-oh // s["ROWS"]) * geo.planes * od


def utilization(geo: PoolGeometry, s: Mapping[str, int]) -> float:
    """Fraction of the launched threads' outputs that exist (tiles past the edges idle)."""
    _, oh, ow = geo.out_size
    tw = tile_cols(s)
    return (oh / (-(-oh // s["ROWS"]) * s["ROWS"])) * (ow / (-(-ow // tw) * tw))


def _default_rows(geo: PoolGeometry, out_w: int = 1) -> int:
    """The output rows of a BLOCKS[0] tile with out_w outputs per thread that idle the fewest threads."""
    base = {"BLOCK": BLOCKS[0], "OUT_W": out_w}
    best = max((utilization(geo, {**base, "ROWS": r}), -r) for r in ROWS_VALUES if r <= BLOCKS[0])
    return -best[1]


def schedule_spec(geo: PoolGeometry) -> ScheduleSpec:
    rows0 = _default_rows(geo)
    knobs = [
        Knob("BLOCK", BLOCKS, "threads per block"),
        Knob("ROWS", (rows0,) + tuple(r for r in ROWS_VALUES if r != rows0), "output rows per block tile"),
        Knob("OUT_W", OUT_W_VALUES, "neighbouring outputs per thread along W (input columns reused in registers)"),
        Knob("VEC", VEC_VALUES, "input columns per vector load (16 bytes at most)"),
        Knob("SMEM", SMEM_VALUES, "1: stage the tile's input in shared memory with coalesced loads"),
    ]
    default = {k.name: k.values[0] for k in knobs}
    util_floor = min(0.6, utilization(geo, default))
    finest = max(blocks(geo, {"BLOCK": b, "ROWS": r, "OUT_W": 1}) for b in BLOCKS for r in ROWS_VALUES if r <= b)
    min_blocks = min(SMS, finest)
    iw = geo.in_size[2]
    itemsize = ITEMSIZE[geo.dtype]

    def rows_fit(s: Mapping[str, int]) -> str | None:
        if s["ROWS"] > s["BLOCK"]:
            return f"ROWS={s['ROWS']} output rows need more threads than BLOCK={s['BLOCK']}"
        return None

    def vector(s: Mapping[str, int]) -> str | None:
        if s["VEC"] == 1:
            return None
        if s["VEC"] * itemsize > MAX_ACCESS_BYTES:
            return f"VEC={s['VEC']} needs {s['VEC'] * itemsize}-byte loads of {geo.dtype} (16 at most)"
        if iw % s["VEC"]:
            return f"VEC={s['VEC']} does not divide the input width {iw}: the kernel would only load scalars"
        if not vec_fits(geo, s):
            what = "a tile's" if s["SMEM"] else "a thread's"
            return (f"VEC={s['VEC']} does not divide the stride between {what} first input columns "
                    f"(OUT_W={s['OUT_W']}, stride {geo.stride[2]}): loads would be misaligned")
        return None

    def registers(s: Mapping[str, int]) -> str | None:
        n = span(geo, s["OUT_W"]) if s["SMEM"] else loaded_span(geo, s)
        if (s["OUT_W"] > 1 or s["VEC"] > 1) and n > MAX_SPAN:
            return (f"OUT_W={s['OUT_W']}, VEC={s['VEC']} keep {n} input columns per thread in registers "
                    f"(at most {MAX_SPAN})")
        return None

    def shared(s: Mapping[str, int]) -> str | None:
        if s["SMEM"] and s["ROWS"] <= s["BLOCK"] and smem_bytes(geo, s) > MAX_STATIC_SHARED:
            return (f"SMEM=1 with a {s['ROWS']}x{tile_cols(s)} output tile stages {smem_bytes(geo, s)} bytes; "
                    f"static shared memory is {MAX_STATIC_SHARED} bytes per block")
        return None

    def idle(s: Mapping[str, int]) -> str | None:
        if s["ROWS"] <= s["BLOCK"] and utilization(geo, s) < util_floor:
            return (f"a {s['ROWS']}x{tile_cols(s)} output tile over {geo.out_size[1]}x{geo.out_size[2]} "
                    f"outputs leaves {1 - utilization(geo, s):.0%} of the threads idle")
        return None

    def grid(s: Mapping[str, int]) -> str | None:
        if s["ROWS"] > s["BLOCK"]:
            return None
        n = blocks(geo, s)
        if not grid3(geo) and n > MAX_GRID_X:
            return f"{n} blocks exceed the grid limit"
        if n < min_blocks and dict(s) != default:
            return f"{n} blocks cannot fill {SMS} SMs"
        return None

    spec = ScheduleSpec(knobs, [rows_fit, vector, registers, shared, idle, grid])
    if not spec.legal(default):
        raise CodegenError(f"the pooling family's default schedule {default} is illegal for {geo}: "
                           f"{spec.why_illegal(default)}")
    # The program starts from two outputs per thread (the tile's rows fitted to them) and the widest
    # legal vector: on the H200 sweep of
    # the six example pools (100 schedules each, 2026-11-30) OUT_W=1 was the slowest choice on every
    # one (median 1.3-1.5x OUT_W=2) and OUT_W=8 slower still; VEC=4 was fastest within OUT_W=2. Scalar
    # single outputs stay the first values: always legal, the fallback.
    for ow, vec in DEFAULT_PREFERENCE:
        preferred = {**default, "ROWS": _default_rows(geo, ow), "OUT_W": ow, "VEC": vec}
        if spec.legal(preferred):
            spec.defaults = {k: v for k, v in preferred.items() if v != default[k]}
            break
    return spec


# ---- lowering ------------------------------------------------------------------------------------

def lower_pool(graph: Graph, kernel: str) -> Lowering:
    """One kernel computing a pool (values and/or indices) and its pointwise epilogue."""
    g = _analyse(graph)
    geo = g.geo
    if len(set(graph.outputs)) != len(graph.outputs):
        raise _fail(graph, f"the group outputs {graph.outputs} name one value twice (one buffer each)",
                    [g.anchor.op])
    values = {v.name: v for v in graph.inputs}
    values.update({n.name: n for n in graph.nodes})
    safe = lambda name: re.sub(r"\W", "_", name)
    x_c = "in_" + safe(g.x.name)
    w_c = "w_" + safe(g.weight.name) if g.weight is not None else None
    extra_c = [f"in{i}_{safe(v.name)}" for i, v in enumerate(g.extra)]
    out_c = [f"out{i}_{safe(o)}" for i, o in enumerate(graph.outputs)]
    need_index = any(g.role[o] == "index" for o in graph.outputs) or any(
        isinstance(op, Ref) and g.role.get(op.name) == "index" for n in g.epilogue for op in n.operands)

    source = PRELUDE + _emit(graph, g, kernel, extra_c, out_c, x_c, w_c, need_index, values)
    od, oh, ow = geo.out_size
    tiles_w = f"cdiv({ow}, BLOCK // ROWS * OUT_W)"
    tiles_h = f"cdiv({oh}, ROWS)"
    depth_planes = geo.planes * od
    grid = [tiles_w, tiles_h, str(depth_planes)] if grid3(geo) else [f"{tiles_w} * {tiles_h} * {depth_planes}"]
    sizes = [*geo.in_size, *geo.out_size]
    weights = [g.weight.name] if g.weight is not None else []
    args = [g.x.name] + weights + [v.name for v in g.extra] + list(graph.outputs) + [f"int32({v})" for v in sizes]
    spec = schedule_spec(geo)
    program = {
        "format": "cuda-agent/program@1", "name": kernel, "source": source,
        "tunables": spec.tunables(), "schedule": spec.default(),
        "buffers": [{"name": o, "shape": [int(d) for d in values[o].shape], "dtype": values[o].dtype}
                    for o in graph.outputs],
        "launches": [{"kernel": kernel, "grid": grid, "block": ["BLOCK"], "shared_bytes": 0, "args": args}],
        "outputs": list(graph.outputs),
    }
    notes = [_describe(g.anchor, geo), f"outputs: {', '.join(f'{o} ({g.role[o]})' for o in graph.outputs)}"]
    if g.epilogue:
        notes.append(f"epilogue: {', '.join(n.op for n in g.epilogue)}")
    return Lowering(program, spec, notes)


def _describe(anchor: Node, geo: PoolGeometry) -> str:
    own = slice(3 - geo.dims, 3)       # the op's own dims (a 2-D pool has no depth)
    what = "depthwise convolution" if geo.kind == "conv" else anchor.op
    text = (f"pool: {what} {'x'.join(map(str, geo.kernel[own]))} window, stride {list(geo.stride[own])}, "
            f"padding {list(geo.padding[own])}")
    if geo.kind in ("max", "conv"):
        text += f", dilation {list(geo.dilation[own])}"
    if geo.ceil_mode:
        text += ", ceil_mode"
    if geo.kind == "avg":
        text += (f", divisor {geo.divisor}" if geo.divisor else
                 ", count_include_pad" if geo.count_include_pad else ", padding not counted")
    return (text + f" over {geo.planes} planes of {'x'.join(map(str, geo.in_size[own]))} {geo.dtype} -> "
            f"{'x'.join(map(str, geo.out_size[own]))}")


def _emit(graph: Graph, g: _Group, kernel: str, extra_c: list[str], out_c: list[str], x_c: str, w_c: str | None,
          need_index: bool, values: dict[str, Any]) -> str:
    geo = g.geo
    ns = f"{kernel}_pool"
    in_t = STORAGE_CTYPE[geo.dtype]
    acc_t = COMPUTE_CTYPE[geo.dtype]
    idx_t = "int" if geo.plane_numel < 2**31 else "long long"
    is_max = geo.kind == "max"
    sentinel = literal(float("-inf"), acc_t) if is_max else literal(0, acc_t)
    (kd, kh, kw), (sd, sh, sw), (pd, ph, pw), (dd, dh, dw) = geo.kernel, geo.stride, geo.padding, geo.dilation
    extra_params = "".join(f", const {STORAGE_CTYPE[v.dtype]}* __restrict__ {c}" for v, c in zip(g.extra, extra_c))
    out_params = "".join(f", {STORAGE_CTYPE[values[o].dtype]}* __restrict__ {c}"
                         for o, c in zip(graph.outputs, out_c))
    extra_args = "".join(f", {c}" for c in extra_c)
    out_args = "".join(f", {c}" for c in out_c)
    epilogue = _emit_epilogue(graph, g, extra_c, out_c, values)
    flag = lambda b: "true" if b else "false"
    load_x = lambda raw: load_expr(geo.dtype, raw)
    # A depthwise convolution's weights: one more pointer (pools have none, and W is null in compute).
    w_param = ", const in_t* __restrict__ W" if w_c else ""
    w_kernel_param = f", const {in_t}* __restrict__ {w_c}" if w_c else ""
    w_none = "" if w_c else "    const in_t* const W = nullptr;           // pools have no weights\n"
    return f"""
namespace {ns} {{
typedef {in_t} in_t;      // a stored input element
typedef {acc_t} acc_t;        // compute type
typedef {idx_t} idx_t;          // flat index inside one plane
// Window (depth, height, width); a 2-D pool has a depth-1 window.
constexpr int KD = {kd}, KH = {kh}, KW = {kw};
constexpr int SD = {sd}, SH = {sh}, SW = {sw};
constexpr int PD = {pd}, PH = {ph}, PW = {pw};
constexpr int DD = {dd}, DH = {dh}, DW = {dw};
constexpr bool IS_MAX = {flag(is_max)};
constexpr bool IS_CONV = {flag(geo.kind == "conv")};   // a depthwise convolution: windows times weights
constexpr int CHANNELS = {geo.channels};          // IS_CONV: plane % CHANNELS is the channel
constexpr bool NEED_INDEX = {flag(need_index)};
constexpr bool COUNT_PAD = {flag(geo.count_include_pad)};
constexpr int DIVISOR = {geo.divisor};           // avg divisor_override; 0: none
constexpr bool POOL3D = {flag(geo.dims == 3)};
constexpr bool GRID3 = {flag(grid3(geo))};  // grid (tiles_w, tiles_h, planes*OD), else flat
// Block tile: ROWS output rows x TW output columns; each thread has OUT_W neighbouring outputs.
constexpr int TPR = BLOCK / ROWS;
constexpr int TW = TPR * OUT_W;
constexpr int SPAN = (OUT_W - 1) * SW + (KW - 1) * DW + 1;       // input columns of one thread's windows
// VEC-wide loads start VEC_R columns before a window start so that they are aligned: the start
// is -PW modulo VEC when the thread's (or, with SMEM, the tile's) first column is a multiple of it.
constexpr bool VEC_FITS = VEC > 1 && ((SMEM ? TW : OUT_W) * SW) % VEC == 0;
constexpr int VEC_R = VEC_FITS ? (VEC - PW % VEC) % VEC : 0;
constexpr int VSPAN = VEC_FITS ? (VEC_R + SPAN + VEC - 1) / VEC * VEC : SPAN;   // columns loaded, from c0 - VEC_R
constexpr int TILE_ROWS = (ROWS - 1) * SH + (KH - 1) * DH + 1;   // input rows of the tile (per depth tap)
constexpr int TILE_COLS = VEC_FITS ? (VEC_R + (TW - 1) * SW + (KW - 1) * DW + 1 + VEC - 1) / VEC * VEC
                                   : (TW - 1) * SW + (KW - 1) * DW + 1;
constexpr int TILE_ELEMS = KD * TILE_ROWS * TILE_COLS;
constexpr bool PREFETCH = !SMEM && KD * KH * VSPAN <= {MAX_PREFETCH};   // see compute()

struct Tile {{ long long plane; int od, oh0, ow0; }};

// The output tile of block (bx, by, bz).
CA_HD Tile tile_of(unsigned bx, unsigned by, unsigned bz, int OD, int OH, int OW) {{
    unsigned tw, th, pd;
    if (GRID3) {{
        tw = bx; th = by; pd = bz;
    }} else {{
        const unsigned tiles_w = ((unsigned)OW + TW - 1) / TW, tiles_h = ((unsigned)OH + ROWS - 1) / ROWS;
        tw = bx % tiles_w;
        const unsigned rest = bx / tiles_w;
        th = rest % tiles_h;
        pd = rest / tiles_h;
    }}
    Tile t;
    t.plane = POOL3D ? (long long)(pd / (unsigned)OD) : (long long)pd;
    t.od = POOL3D ? (int)(pd % (unsigned)OD) : 0;
    t.oh0 = (int)th * ROWS;
    t.ow0 = (int)tw * TW;
    return t;
}}

// Vector loads need whole aligned groups: rows of a multiple of VEC columns, an aligned tensor.
CA_HD bool vec_ok(const in_t* x, int IW) {{
    return VEC_FITS && IW % VEC == 0 && aligned_to<VEC * sizeof(in_t)>(x);
}}

// SMEM: every input element the tile's windows read, as acc_t, from column w0 - VEC_R on;
// outside the input the sentinel ({'-inf: never the max' if is_max else '0: adds nothing'}). Coalesced along W.
CA_HD void fill(acc_t* tile, const in_t* __restrict__ x, const Tile& t, int tid, int ID, int IH, int IW) {{
    const in_t* xp = x + t.plane * ((long long)ID * IH * IW);
    const int d0 = t.od * SD - PD, h0 = t.oh0 * SH - PH, w0 = t.ow0 * SW - PW - VEC_R;
    if (vec_ok(x, IW)) {{
        // w0 is a multiple of VEC, and so is IW: each group is wholly inside or outside the row.
        constexpr int GROUPS = TILE_COLS / VEC;
        #pragma unroll 4
        for (int i = tid; i < KD * TILE_ROWS * GROUPS; i += BLOCK) {{
            const int q = i % GROUPS, r = (i / GROUPS) % TILE_ROWS, k = i / (GROUPS * TILE_ROWS);
            const int id = d0 + k * DD, ih = h0 + r, iw = w0 + q * VEC;
            vec_t<acc_t, VEC> out;
            if (id >= 0 && id < ID && ih >= 0 && ih < IH && iw >= 0 && iw < IW) {{
                const in_t* src = xp + ((idx_t)id * IH + ih) * IW + iw;
                const vec_t<in_t, VEC> in = *reinterpret_cast<const vec_t<in_t, VEC>*>(src);
                #pragma unroll
                for (int u = 0; u < VEC; ++u) out.v[u] = {load_x("in.v[u]")};
            }} else {{
                #pragma unroll
                for (int u = 0; u < VEC; ++u) out.v[u] = {sentinel};
            }}
            *reinterpret_cast<vec_t<acc_t, VEC>*>(tile + (k * TILE_ROWS + r) * TILE_COLS + q * VEC) = out;
        }}
    }} else {{
        #pragma unroll 4
        for (int i = tid; i < TILE_ELEMS; i += BLOCK) {{
            const int c = i % TILE_COLS, r = (i / TILE_COLS) % TILE_ROWS, k = i / (TILE_COLS * TILE_ROWS);
            const int id = d0 + k * DD, ih = h0 + r, iw = w0 + c;
            acc_t v = {sentinel};
            if (id >= 0 && id < ID && ih >= 0 && ih < IH && iw >= 0 && iw < IW)
                v = {load_x("xp[((idx_t)id * IH + ih) * IW + iw]")};
            tile[i] = v;
        }}
    }}
}}

{epilogue}
// v[s] = input column c0 - VEC_R + s of input row `row` (from the SMEM tile at tile_row + s);
// the sentinel outside the input.
CA_HD void load_row(acc_t (&v)[VSPAN], const acc_t* tile, const in_t* __restrict__ xp, bool vec, idx_t row, int c0,
                    int IW, int tile_row) {{
    if (SMEM) {{
        const acc_t* src = tile + tile_row;
        #pragma unroll
        for (int s = VEC_R; s < VEC_R + SPAN; ++s) v[s] = src[s];
    }} else if (vec) {{
        #pragma unroll
        for (int q = 0; q < VSPAN / VEC; ++q) {{
            const int iw = c0 - VEC_R + q * VEC;
            if (iw >= 0 && iw < IW) {{
                const vec_t<in_t, VEC> in = *reinterpret_cast<const vec_t<in_t, VEC>*>(xp + row + iw);
                #pragma unroll
                for (int u = 0; u < VEC; ++u) v[q * VEC + u] = {load_x("in.v[u]")};
            }} else {{
                #pragma unroll
                for (int u = 0; u < VEC; ++u) v[q * VEC + u] = {sentinel};
            }}
        }}
    }} else {{
        #pragma unroll
        for (int s = 0; s < VSPAN; ++s) {{
            const int iw = c0 - VEC_R + s;
            v[s] = (iw >= 0 && iw < IW) ? {load_x("xp[row + iw]")} : {sentinel};
        }}
    }}
}}

// The OUT_W outputs of thread `tid` in tile `t`, epilogue applied and stored.
CA_HD void compute(const acc_t* tile, const in_t* __restrict__ x{w_param}{extra_params}{out_params}, const Tile& t,
                   int tid, int ID, int IH, int IW, int OD, int OH, int OW) {{
{w_none}
    const int tr = tid / TPR, tc = tid % TPR;
    const int oh = t.oh0 + tr, ow0 = t.ow0 + tc * OUT_W;
    if (oh >= OH || ow0 >= OW) return;
    const in_t* xp = x + t.plane * ((long long)ID * IH * IW);
    const bool vec = !SMEM && vec_ok(x, IW);
    // Window starts (negative inside the left padding).
    const int d0 = t.od * SD - PD, h0 = oh * SH - PH, c0 = ow0 * SW - PW;
    acc_t acc[OUT_W];
    idx_t arg[OUT_W];
    // PyTorch's index when no element beats -inf: the first in-input tap of each dim.
    const int fd = d0 < 0 ? d0 + (-d0 + DD - 1) / DD * DD : d0;
    const int fh = h0 < 0 ? h0 + (-h0 + DH - 1) / DH * DH : h0;
    #pragma unroll
    for (int j = 0; j < OUT_W; ++j) {{
        acc[j] = {sentinel};
        const int w = c0 + j * SW;
        const int fw = w < 0 ? w + (-w + DW - 1) / DW * DW : w;
        arg[j] = ((idx_t)fd * IH + fh) * IW + fw;
    }}
    // PREFETCH: the loads of every window row are issued before any row is combined (KD * KH rows
    // in flight per thread instead of one) when they fit in MAX_PREFETCH registers.
    acc_t rows[PREFETCH ? KD * KH : 1][VSPAN];
    if (PREFETCH) {{
        #pragma unroll
        for (int kd = 0; kd < KD; ++kd) {{
            #pragma unroll
            for (int kh = 0; kh < KH; ++kh) {{
                const int id = d0 + kd * DD, ih = h0 + kh * DH;
                if (id >= 0 && id < ID && ih >= 0 && ih < IH)
                    load_row(rows[kd * KH + kh], tile, xp, vec, ((idx_t)id * IH + ih) * IW, c0, IW, 0);
            }}
        }}
    }}
    #pragma unroll
    for (int kd = 0; kd < KD; ++kd) {{
        const int id = d0 + kd * DD;
        if (id < 0 || id >= ID) continue;
        #pragma unroll
        for (int kh = 0; kh < KH; ++kh) {{
            const int ih = h0 + kh * DH;
            if (ih < 0 || ih >= IH) continue;
            const idx_t row = ((idx_t)id * IH + ih) * IW;
            // v[s] = input column c0 - VEC_R + s of this row; the sentinel outside the input.
            acc_t own[VSPAN];
            if (!PREFETCH)
                load_row(own, tile, xp, vec, row, c0, IW, (kd * TILE_ROWS + tr * SH + kh * DH) * TILE_COLS + tc * OUT_W * SW);
            const acc_t* v = PREFETCH ? rows[PREFETCH ? kd * KH + kh : 0] : own;   // in bounds of rows[1] when off
            // IS_CONV: this window row's weights of the plane's channel (the same for the whole block).
            acc_t wk[KW];
            if (IS_CONV) {{
                const long long w0 = (t.plane % CHANNELS * KD + kd) * (long long)(KH * KW) + kh * KW;
                #pragma unroll
                for (int k = 0; k < KW; ++k) wk[k] = {load_x("W[w0 + k]")};
            }}
            #pragma unroll
            for (int j = 0; j < OUT_W; ++j) {{
                #pragma unroll
                for (int k = 0; k < KW; ++k) {{
                    const acc_t val = v[VEC_R + j * SW + k * DW];
                    if (IS_MAX) {{
                        // Strictly greater keeps the first maximum; a NaN always wins (the last NaN).
                        if (val > acc[j] || val != val) {{
                            acc[j] = val;
                            if (NEED_INDEX) arg[j] = row + c0 + j * SW + k * DW;
                        }}
                    }} else if (IS_CONV) {{
                        acc[j] += val * wk[k];
                    }} else {{
                        acc[j] += val;
                    }}
                }}
            }}
        }}
    }}
    const long long e0 = (((long long)t.plane * OD + t.od) * OH + oh) * (long long)OW;
    // Every result first, then the stores: the OUT_W stores to neighbouring outputs issue back to
    // back, not between an average's divisions (docs/codegen.md, the pool family).
    acc_t result[OUT_W];
    #pragma unroll
    for (int j = 0; j < OUT_W; ++j) {{
        result[j] = acc[j];
        if (!IS_MAX && !IS_CONV) {{
            // PyTorch's divisor: the window clipped to the padded input, or to the input.
            int ds = d0, hs = h0, ws = c0 + j * SW;
            int de = ds + KD < ID + PD ? ds + KD : ID + PD;
            int he = hs + KH < IH + PH ? hs + KH : IH + PH;
            int we = ws + KW < IW + PW ? ws + KW : IW + PW;
            const int pool_size = (de - ds) * (he - hs) * (we - ws);
            ds = ds < 0 ? 0 : ds; hs = hs < 0 ? 0 : hs; ws = ws < 0 ? 0 : ws;
            de = de > ID ? ID : de; he = he > IH ? IH : he; we = we > IW ? IW : we;
            if (ds >= de || hs >= he || ws >= we) {{
                result[j] = (acc_t)0;
            }} else {{
                const int divide = DIVISOR ? DIVISOR : COUNT_PAD ? pool_size : (de - ds) * (he - hs) * (we - ws);
                result[j] = acc[j] / (acc_t)divide;
            }}
        }}
    }}
    #pragma unroll
    for (int j = 0; j < OUT_W; ++j) {{
        const int ow = ow0 + j;
        if (ow >= OW) break;
        epilogue({round_to_storage(geo.dtype, "result[j]")}, (long long)arg[j], e0 + ow{extra_args}{out_args});
    }}
}}
}}  // namespace {ns}

extern "C" __global__ void __launch_bounds__(BLOCK)
{kernel}(const {in_t}* __restrict__ {x_c}{w_kernel_param}{extra_params}{out_params},
        int ID, int IH, int IW, int OD, int OH, int OW)
{{
    const {ns}::Tile t = {ns}::tile_of(blockIdx.x, blockIdx.y, blockIdx.z, OD, OH, OW);
#if SMEM
    __shared__ __align__(32) {ns}::acc_t tile[{ns}::TILE_ELEMS];
    {ns}::fill(tile, {x_c}, t, threadIdx.x, ID, IH, IW);
    __syncthreads();   // every thread reaches it: no thread returns before
#else
    const {ns}::acc_t* tile = nullptr;
#endif
    {ns}::compute(tile, {x_c}{", " + w_c if w_c else ""}{extra_args}{out_args}, t, threadIdx.x, ID, IH, IW, OD, OH, OW);
}}
"""


def _emit_epilogue(graph: Graph, g: _Group, extra_c: list[str], out_c: list[str], values: dict[str, Any]) -> str:
    """epilogue(pv, pi, e, inputs..., outputs...): the pointwise chain for output element e."""
    acc_t = COMPUTE_CTYPE[g.geo.dtype]
    params = [f"{acc_t} pv", "long long pi", "long long e"]
    params += [f"const {STORAGE_CTYPE[v.dtype]}* __restrict__ {c}" for v, c in zip(g.extra, extra_c)]
    params += [f"{STORAGE_CTYPE[values[o].dtype]}* __restrict__ {c}" for o, c in zip(graph.outputs, out_c)]
    lines = ["// The pooled value pv (rounded to the input dtype, as eager stores it) and its index pi",
             "// through the pointwise epilogue, stored at flat output index e.",
             f"CA_HD void epilogue({', '.join(params)}) {{"]
    var: dict[str, tuple[str, str]] = {}
    for name, role in g.role.items():
        if role == "value":
            var[name] = ("pv", acc_t)
        elif role == "index":
            var[name] = ("pi", "long long")
    lines += emit_epilogue_chain(graph, g.epilogue, var, g.alias, g.reads,
                                 {v.name: c for v, c in zip(g.extra, extra_c)}, "pooling")
    for o, c in zip(graph.outputs, out_c):
        cvar = var[g.alias[o]][0]
        lines.append(f"    {c}[e] = {store_expr(values[o].dtype, cvar)};")
    lines += ["    (void)pv; (void)pi;", "}"]
    return "\n".join(lines) + "\n"
