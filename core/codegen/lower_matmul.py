"""The matmul family: one (batched) matrix product plus a pointwise epilogue, one kernel.

canonicalize (partition.py) turns `mm`, `bmm`, `addmm` and `baddbmm` into one MATMUL node whose
operands are the stored tensors: a transpose of the last two dims that feeds it (nn.Linear's
`weight.t()`, `x.T`) folds into its `trans_a` / `trans_b` flags, so the kernel reads the weight
where it lies instead of a transposed copy; addmm's bias (times beta) and its alpha become
ordinary elementwise ops after it, which the epilogue takes with the rest (activations, scales,
residuals, a bias broadcast over the rows).

Semantics: C[b, m, n] = sum_k A[b, m, k] * B[b, k, n], accumulated in fp32 for fp16/bf16/fp32
(as cuBLAS does: no TF32) and in fp64 for fp64; the product is rounded to the output dtype before
the epilogue, as eager stores it. A is stored [batch, M, K] ([batch, K, M] when trans_a), B
[batch, K, N] ([batch, N, K] when trans_b), contiguous; an operand without the batch dim (or with a
batch of 1) is one matrix for every batch (`torch.matmul` of a batch with one matrix).

Kernel (SIMT, MMA=0): a block computes a BM x BN tile of C; it walks K in slices of BK,
staging the slice of A and of B in shared memory (as the compute type, loaded coalesced along
each operand's contiguous dim in 16-byte chunks where that dim is a multiple of the chunk and the
matrix is aligned, else element by element, zero outside the matrices), and each of its
(BM/TM) x (BN/TN) threads accumulates TM x TN products in registers. Knobs:
  BM, BN    the block's tile of C;
  BK        the K slice staged per step (more work per __syncthreads, more shared memory);
  TM, TN    each thread's micro-tile (registers: TM*TN accumulators);
  SVEC      1: a thread's rows are ty, ty + BM/TM, ... and its columns tx, tx + BN/TN, ... (one
            shared-memory read each); 4: they come in groups of up to 4 consecutive ones, each
            group one vector read (LDS.128 for fp32: a third of the shared-memory wavefronts of 1
            at 8 x 8). The SIMT default is 4 where the micro-tile is larger than 1 x 1;
  PREFETCH  1: two shared buffers; each thread loads its part of the next slice into registers
            before it multiplies the current one and stores it after (the loads' latency hides
            behind the arithmetic; one barrier per step). 0: load, barrier, multiply, barrier.
            The default is 1 for SIMT tiles at least 16 wide, 0 for narrower ones and under MMA
            (as measured on an H200).
  GROUP_M   the order in which blocks take their tiles: GROUP_M row tiles at a time, column by
            column, so that the blocks resident together share operand panels in L2; 1: row by row.
  MMA       (fp16/bf16 products only) 1: tensor cores. Each warp computes a (16*TM) x (8*TN) tile of
            C with PTX mma.sync m16n8k16 (fp32 accumulation, as cuBLAS; no instruction of lower
            precision). Slices are staged as stored elements, k fastest, rows padded by 8 elements
            (a warp's fragment reads hit 32 distinct banks), in 16-byte chunks where the operand's
            contiguous dim is a multiple of 8 and the pointers are 16-byte aligned. BK >= 16.
  STAGES    (MMA=1 only) 0: the above, slices through registers (PREFETCH as for SIMT). 2-4: a ring of
            STAGES slices in dynamic shared memory, each laid out as its operand lies (the contiguous
            dim padded by 8), filled by cp.async 16-byte copies STAGES - 1 steps ahead of the multiply
            (one barrier a step); ldmatrix.trans reads the slices whose rows, not k, are contiguous.
            Gathered operands (a convolution's A, a transposed one's B) and unaligned ones are loaded
            element by element into the ring instead.
fp32 products have no MMA knob: the tensor cores' fp32 input is TF32, which the task's precision
rules out (DESIGN section 4).
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from core.codegen.cuda_emit import COMPUTE_CTYPE, ITEMSIZE, PRELUDE, STORAGE_CTYPE, load_expr, round_to_storage, \
    store_expr
from core.codegen.errors import CodegenError
from core.codegen.graph import Graph, GraphInput, Node, Ref
from core.codegen.lower_pointwise import Lowering, emit_epilogue_chain, epilogue_read_problem
from core.codegen.pointwise_ops import is_pointwise
from core.codegen.schedule import Knob, ScheduleSpec

# Not ATen ops: canonicalize's form of mm / bmm / addmm / baddbmm (attrs trans_a, trans_b), and of
# a convolution without its bias (attrs stride, padding, dilation, groups; lowered as a product too).
MATMUL = "cuda_agent_matmul.default"
CONV = "cuda_agent_conv.default"
SOURCE_OPS = {"mm.default", "bmm.default", "addmm.default", "baddbmm.default"}
FLOATS = ("float32", "float16", "bfloat16", "float64")
VIEW_OPS = {"unsqueeze.default", "squeeze.default", "squeeze.dim", "squeeze.dims", "view.default",
            "reshape.default", "_unsafe_view.default", "alias.default"}

TILE_VALUES = (128, 64, 32, 16, 8, 4, 2, 1)     # narrow tiles: skinny products, depthwise convolutions
BK_VALUES = (8, 16, 32, 64)
THREAD_TILE_VALUES = (8, 4, 2, 1)
MAX_THREADS = 1024
MIN_THREADS = 32
MAX_ACCUMULATORS = 64              # TM * TN registers per thread
MAX_MMA_ACCUMULATORS = 128         # 4 * TM * TN under MMA=1: a 64 x 64 warp tile (4 warps for 128 x 128)
MAX_PREFETCH = 32                  # registers holding the next slice per thread (PREFETCH=1)
MAX_STATIC_SHARED = 48 * 1024
MAX_DYNAMIC_SHARED = 227 * 1024    # a block's shared memory on an H100 / H200 (opted in above 48 KiB)
STAGE_VALUES = (0, 2, 3, 4)        # MMA=1's cp.async ring (0: staged through registers)
GROUP_M_VALUES = (1, 8, 16)        # row tiles walked together (block_origin)
SVEC_VALUES = (1, 4)               # SIMT: a thread's rows / columns read from shared memory this many at a time
DEFAULT_SVEC = 4
OCC_VALUES = (0, 1)                # registers: 0 the compiler's choice; 1 at most what two blocks an SM leave
DEFAULT_STAGES = 3                 # the ring's depth in MMA defaults (fastest or within 2 % of it at BK=32)
MAX_GRID_YZ = 65535
SMS = 132                          # H200
# The default is the first of these (BM, BN, BK, TM, TN) that is legal and gives every SM a block,
# else the legal one with the most blocks: big tiles reuse each loaded element most, small ones
# keep a small product busy.
DEFAULT_PREFERENCE = ((128, 128, 8, 8, 8), (128, 64, 8, 8, 4), (64, 64, 16, 4, 4), (64, 32, 16, 4, 2),
                      (32, 32, 16, 2, 2), (32, 16, 16, 2, 1), (16, 16, 16, 1, 1), (16, 16, 8, 1, 1))
# The same for MMA=1, where TM x TN are a warp's m16 x n8 fragments (a 64 x 32 warp tile first).
MMA_PREFERENCE = ((128, 128, 32, 4, 4), (128, 64, 32, 4, 2), (64, 64, 32, 2, 2), (64, 32, 32, 2, 2),
                  (32, 32, 32, 1, 2), (32, 16, 16, 1, 1), (16, 16, 16, 1, 1),
                  (128, 8, 32, 2, 1), (64, 8, 32, 1, 1), (16, 8, 16, 1, 1))       # 8 columns or fewer
MMA_DTYPES = ("float16", "bfloat16")
# Whether fp16 / bf16 defaults use the tensor cores: on since an H200 ran the MMA=1 kernel's GPU tests
# and measured it 4.3-4.7x faster than the SIMT default on fp16 / bf16 products (2026-12-06).
MMA_BY_DEFAULT = True
# Transposed convolutions phase by phase (ConvGeometry.split_phases); False only to measure the
# unsplit form against it (bench/tconv_phases.py).
SPLIT_PHASES = True
MMA_PAD = 8                        # elements padding each staged row (MMA=1)
BLOCK_SIMT = "(BM // TM) * (BN // TN)"
BLOCK_MMA = f"32 * (BM // (16 * TM)) * (BN // (8 * TN)) if MMA else {BLOCK_SIMT}"


@dataclass(frozen=True)
class Product:
    """One matrix product as the kernel sees it."""

    batch: int
    m: int
    n: int
    k: int
    trans_a: bool
    trans_b: bool
    dtype: str                     # the operands' and the product's dtype
    a_batched: bool = True         # False: one matrix A for every batch (stride 0)
    b_batched: bool = True
    conv: "ConvGeometry | None" = None     # A is the im2col view of a convolution's input


@dataclass(frozen=True)
class ConvGeometry:
    """A convolution as a product (implicit GEMM), 1-D and 2-D as 3-D with size-1 dims: for group g
    (the batch), rows m = (image, output position), columns = the group's output channels,
    K = (input channel of the group, kernel tap); A[m, k] is the input element under that tap (zero
    in the padding), B[k, co] the weight, read where it lies ([Cout, Cin/groups, taps] is B
    transposed)."""

    images: int
    cin: int
    cout: int
    groups: int
    in_size: tuple[int, int, int]
    out_size: tuple[int, int, int]
    kernel: tuple[int, int, int]
    stride: tuple[int, int, int]
    padding: tuple[int, int, int]
    dilation: tuple[int, int, int]
    transposed: bool = False       # a transposed convolution: output position o takes input i where
    #                                o = i * stride - padding + tap * dilation; the weight is [Cin, Cout/groups, taps]

    # A transposed convolution is computed phase by phase (sub-pixel): the outputs o = o' * stride + r
    # of one phase r (per dim) take only the taps t with t * dilation = r + padding (mod stride), every
    # stride / gcd(dilation, stride)-th tap from the first such one. So each phase is a convolution of
    # its own with a fraction of the taps, and no product multiplies the zeros between the input
    # elements. A plain convolution is one phase of every tap; so is a transposed one whose
    # groups x phases would pass the grid's z limit (split_phases False): its products take every tap
    # and multiply zeros where (o + padding - t * dilation) does not divide by the stride.
    split_phases: bool = True

    @property
    def phase_stride(self) -> tuple[int, int, int]:
        """Per dim: the step between the outputs of one product (the stride where phases are split)."""
        return self.stride if self.transposed and self.split_phases else (1, 1, 1)

    @property
    def phases(self) -> int:
        """The products per group: one per output phase of a split transposed convolution, else 1."""
        return math.prod(self.phase_stride)

    @property
    def tap_step(self) -> tuple[int, int, int]:
        """Per dim: the step between the taps of one phase."""
        return tuple(s // math.gcd(d, s) for s, d in zip(self.phase_stride, self.dilation))   # type: ignore[return-value]

    @property
    def phase_taps(self) -> tuple[int, int, int]:
        """Per dim: the most taps one phase takes (a phase past the kernel's end takes fewer)."""
        return tuple(-(-k // step) for k, step in zip(self.kernel, self.tap_step))   # type: ignore[return-value]

    @property
    def phase_out(self) -> tuple[int, int, int]:
        """Per dim: the most output positions one phase has."""
        return tuple(-(-o // s) for o, s in zip(self.out_size, self.phase_stride))   # type: ignore[return-value]


def is_matmul(node: Node, graph: Graph) -> bool:
    """A MATMUL node of float operands of one dtype (canonicalize makes them)."""
    if node.op != MATMUL or len(node.operands) != 2 or not all(isinstance(o, Ref) for o in node.operands):
        return False
    return all(graph.value(o.name).dtype == node.dtype for o in node.operands) and node.dtype in FLOATS


def product_of(node: Node, graph: Graph) -> Product:
    a, b = (tuple(graph.value(o.name).shape) for o in node.operands)
    ta, tb = bool(node.attrs.get("trans_a")), bool(node.attrs.get("trans_b"))
    out = tuple(node.shape)
    if len(out) not in (2, 3) or not 2 <= len(a) <= len(out) or not 2 <= len(b) <= len(out):
        raise CodegenError(f"Task '{graph.task}': a matrix product of shapes {list(a)} x {list(b)} -> "
                           f"{list(out)}: the matmul family takes 2-D or batched 3-D operands.",
                           task=graph.task, ops=[node.op])
    m, k = (a[-1], a[-2]) if ta else (a[-2], a[-1])
    k2, n = (b[-1], b[-2]) if tb else (b[-2], b[-1])
    batch = out[0] if len(out) == 3 else 1
    # A 3-D operand is one matrix per batch, or (batch dim 1) one matrix for all; a 2-D one, one for all.
    a_batched, b_batched = (len(x) == 3 and x[0] == batch and batch > 1 for x in (a, b))
    if k != k2 or out[-2:] != (m, n) or any(len(x) == 3 and x[0] not in (1, batch) for x in (a, b)):
        raise CodegenError(f"Task '{graph.task}': the operands {list(a)} and {list(b)} (transposed: {ta}, {tb}) "
                           f"do not multiply to {list(out)}.", task=graph.task, ops=[node.op])
    return Product(batch, m, n, k, ta, tb, node.dtype, a_batched, b_batched)


def spatial3(values: Any, dims: int, fill: int) -> tuple[int, int, int]:
    """A convolution's per-dim attribute (one value for all dims, or one per dim) as (depth, height, width)."""
    values = [int(v) for v in (values if isinstance(values, (list, tuple)) else [values] * dims)]
    if len(values) == 1 and dims > 1:
        values = values * dims
    return tuple([fill] * (3 - dims) + values)          # type: ignore[return-value]


def is_conv(node: Node, graph: Graph) -> bool:
    """A CONV node of float input and weight of one dtype, 1 to 3 spatial dims (canonicalize makes them)."""
    if node.op != CONV or len(node.operands) != 2 or not all(isinstance(o, Ref) for o in node.operands):
        return False
    x, w = (graph.value(o.name) for o in node.operands)
    return x.dtype == w.dtype == node.dtype and node.dtype in FLOATS and 3 <= len(x.shape) <= 5 and \
        len(w.shape) == len(x.shape)


def conv_product(node: Node, graph: Graph) -> Product:
    x, w = (tuple(graph.value(o.name).shape) for o in node.operands)
    out = tuple(node.shape)
    dims = len(x) - 2
    groups = int(node.attrs.get("groups", 1))
    transposed = bool(node.attrs.get("transposed"))
    cout = w[1] * groups if transposed else w[0]
    geo = ConvGeometry(x[0], x[1], cout, groups, spatial3(x[2:], dims, 1), spatial3(out[2:], dims, 1),
                       spatial3(w[2:], dims, 1), spatial3(node.attrs.get("stride", 1), dims, 1),
                       spatial3(node.attrs.get("padding", 0), dims, 0), spatial3(node.attrs.get("dilation", 1), dims, 1),
                       transposed)
    if transposed:
        extra = spatial3(node.attrs.get("output_padding") or 0, dims, 0)
        expected = tuple((i - 1) * s - 2 * p + d * (k - 1) + e + 1 for i, p, d, k, s, e in
                         zip(geo.in_size, geo.padding, geo.dilation, geo.kernel, geo.stride, extra))
        weight_ok = w[0] == geo.cin
    else:
        expected = tuple((i + 2 * p - d * (k - 1) - 1) // s + 1
                         for i, p, d, k, s in zip(geo.in_size, geo.padding, geo.dilation, geo.kernel, geo.stride))
        weight_ok = w[1] == geo.cin // groups
    if geo.cin % groups or geo.cout % groups or not weight_ok or expected != geo.out_size or \
            out[:2] != (geo.images, geo.cout):
        raise CodegenError(f"Task '{graph.task}': a convolution of {list(x)} by {list(w)} (groups {groups}) -> "
                           f"{list(out)} that the conv family does not understand.", task=graph.task, ops=[node.op])
    if not SPLIT_PHASES or groups * geo.phases > MAX_GRID_YZ:
        geo = dataclasses.replace(geo, split_phases=False)
    # One product per group (and per output phase of a transposed convolution, geo.phases).
    return Product(groups * geo.phases, geo.images * math.prod(geo.phase_out), geo.cout // groups,
                   geo.cin // groups * math.prod(geo.phase_taps), True, True, node.dtype, conv=geo)


# ---- group analysis -------------------------------------------------------------------------------

@dataclass
class _Group:
    anchor: Node
    a: GraphInput
    b: GraphInput
    product: Product
    alias: dict[str, str]                # result or epilogue node -> the node whose C value it shares
    epilogue: list[Node]
    extra: list[GraphInput]              # group inputs the epilogue reads
    reads: dict[str, tuple[str, tuple[int, ...]]]


def _fail(graph: Graph, what: str, ops: list[str]) -> CodegenError:
    return CodegenError(f"Task '{graph.task}': the matmul family lowers one matrix product of two "
                        f"group inputs with a pointwise epilogue on its result; {what}.", task=graph.task, ops=ops)


def _analyse(graph: Graph) -> _Group:
    anchors = [n for n in graph.nodes if n.op in (MATMUL, CONV)]
    if len(anchors) != 1:
        raise _fail(graph, f"this group has {len(anchors)} products ({', '.join(graph.ops())})", graph.ops())
    anchor = anchors[0]
    inputs = {v.name: v for v in graph.inputs}
    takes = is_conv if anchor.op == CONV else is_matmul
    if not takes(anchor, graph) or any(o.name not in inputs for o in anchor.operands):
        raise _fail(graph, f"the operands of '{anchor.name}' are not two group inputs of one float dtype",
                    [anchor.op])
    product = conv_product(anchor, graph) if anchor.op == CONV else product_of(anchor, graph)
    alias = {anchor.name: anchor.name}
    reads = {v.name: (v.name, tuple(v.shape)) for v in graph.inputs}
    epilogue: list[Node] = []
    extra: dict[str, GraphInput] = {}
    numel = math.prod(anchor.shape)
    for n in graph.nodes:
        if n is anchor:
            continue
        refs = [o.name for o in n.operands if isinstance(o, Ref)]
        if n.op in VIEW_OPS and len(refs) == 1 and refs[0] in reads and refs[0] not in alias:
            reads[n.name] = (reads[refs[0]][0], tuple(n.shape))       # e.g. a bias viewed as [1, N]
            continue
        if n.op in VIEW_OPS and len(refs) == 1 and refs[0] in alias and math.prod(n.shape) == numel:
            alias[n.name] = alias[refs[0]]
        elif is_pointwise(n) and all(r in alias or r in reads for r in refs) and n.dtype in STORAGE_CTYPE \
                and _broadcasts(tuple(n.shape), tuple(anchor.shape)):
            # Computed at every element of the product: a node of a smaller (broadcast) shape gives
            # each element the value it broadcasts to there (e.g. a scaled bias).
            full = Node(n.name, n.op, list(n.operands), dict(n.attrs), tuple(anchor.shape), n.dtype)
            for r in refs:
                if r not in alias:
                    source, shape = reads[r]
                    _check_broadcast(graph, inputs[source], shape, full)
                    extra.setdefault(source, inputs[source])
            alias[n.name] = n.name
            epilogue.append(full)
        else:
            raise _fail(graph, f"it cannot fuse '{n.op}' (node '{n.name}')", [n.op])
    for o in graph.outputs:
        if o not in alias:
            raise _fail(graph, f"the group output '{o}' is not an element of the product", [anchor.op])
    a, b = (inputs[o.name] for o in anchor.operands)
    return _Group(anchor, a, b, product, alias, epilogue, list(extra.values()), reads)


def _broadcasts(shape: tuple[int, ...], out: tuple[int, ...]) -> bool:
    aligned = (1,) * (len(out) - len(shape)) + shape
    return len(shape) <= len(out) and all(a in (1, s) for a, s in zip(aligned, out))


def _check_broadcast(graph: Graph, g: GraphInput, shape: tuple[int, ...], n: Node) -> None:
    problem = epilogue_read_problem(g, shape, n)
    if problem:
        raise _fail(graph, problem, [n.op])


# ---- schedule -------------------------------------------------------------------------------------

def threads(s: Mapping[str, int]) -> int:
    if s.get("MMA"):
        return 32 * (s["BM"] // (16 * s["TM"])) * (s["BN"] // (8 * s["TN"]))
    return (s["BM"] // s["TM"]) * (s["BN"] // s["TN"])


def smem_bytes(p: Product, s: Mapping[str, int]) -> int:
    """The staged slices of A and B, rows padded (see the kernel): SIMT stages the compute type, MMA the
    stored 16-bit elements; STAGES > 0 a ring of slices laid out as the operands lie (the contiguous
    dim padded: Ring in the kernel)."""
    if s.get("STAGES"):
        a = s["BM"] * s["BK"] + MMA_PAD * (s["BK"] if p.trans_a else s["BM"])
        b = s["BN"] * s["BK"] + MMA_PAD * (s["BN"] if p.trans_b else s["BK"])
        return s["STAGES"] * (a + b) * ITEMSIZE[p.dtype]
    if s.get("MMA"):
        return (1 + s.get("PREFETCH", 0)) * (s["BM"] + s["BN"]) * (s["BK"] + MMA_PAD) * ITEMSIZE[p.dtype]
    pad = s.get("SVEC", 1)          # each staged row's padding, in elements
    return (1 + s.get("PREFETCH", 0)) * s["BK"] * (s["BM"] + s["BN"] + 2 * pad) * \
        ITEMSIZE["float64" if p.dtype == "float64" else "float32"]


def ring_bytes_expr(p: Product) -> str:
    """smem_bytes under STAGES > 0 as a launch-plan expression (the ring is dynamic shared memory)."""
    a = f"BK * (BM + {MMA_PAD})" if p.trans_a else f"BM * (BK + {MMA_PAD})"
    b = f"BN * (BK + {MMA_PAD})" if p.trans_b else f"BK * (BN + {MMA_PAD})"
    return f"STAGES * ({a} + {b}) * {ITEMSIZE[p.dtype]} if STAGES else 0"


def chunk_lengths(p: Product) -> tuple[int, int]:
    """Elements per global load of A and of B: 16 bytes (8 elements for MMA=1's 16-bit dtypes, 4 fp32,
    2 fp64) where the operand's contiguous dim is a multiple of that, else 1; a convolution's gathered
    input (and a transposed one's weight) element by element. The SIMT kernel also loads element by
    element where the slice's side along that dim is not a multiple (GA, GB)."""
    v = 16 // ITEMSIZE[p.dtype]
    va = 1 if p.conv is not None or (p.m if p.trans_a else p.k) % v else v
    vb = 1 if (p.conv is not None and p.conv.transposed) or (p.k if p.trans_b else p.n) % v else v
    return va, vb


def prefetch_registers(p: Product, s: Mapping[str, int]) -> int:
    """32-bit registers a thread holds the next slice in (PREFETCH=1)."""
    n = threads(s)
    if s.get("MMA"):
        va, vb = chunk_lengths(p)
        return math.ceil(s["BM"] * s["BK"] / va / n) * max(1, va // 2) + \
            math.ceil(s["BN"] * s["BK"] / vb / n) * max(1, vb // 2)
    ca, cb = chunk_lengths(p)
    ga = ca if (s["BM"] if p.trans_a else s["BK"]) % ca == 0 else 1      # as GA, GB in the kernel
    gb = cb if (s["BK"] if p.trans_b else s["BN"]) % cb == 0 else 1
    return math.ceil(s["BM"] * s["BK"] / ga / n) * ga + math.ceil(s["BK"] * s["BN"] / gb / n) * gb


def blocks(p: Product, s: Mapping[str, int]) -> int:
    return math.ceil(p.m / s["BM"]) * math.ceil(p.n / s["BN"]) * p.batch


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _narrow_preference(p: Product) -> tuple[tuple[int, int, int, int, int], ...]:
    """Under 16 columns (a depthwise convolution has one per group) or rows: a tile as narrow as the
    product, 128 long, with up to 256 threads, before the square tiles that would idle most threads."""
    out = []
    if p.n < 16:
        bn = _pow2_at_least(p.n)
        out.append((128, bn, 8, max(1, 128 * bn // 256), 1))
    if p.m < 16:
        bm = _pow2_at_least(p.m)
        out.append((bm, 128, 8, 1, max(1, 128 * bm // 256)))
    return tuple(out)


def schedule_spec(p: Product, tensor_cores_first: bool | None = None) -> ScheduleSpec:
    """The product's knobs and constraints; its default prefers tensor cores (where they apply) when
    `tensor_cores_first`, MMA_BY_DEFAULT when None."""
    knobs = [
        Knob("BM", TILE_VALUES, "rows of the product per block tile"),
        Knob("BN", TILE_VALUES, "columns of the product per block tile"),
        Knob("BK", BK_VALUES, "the K slice staged in shared memory per step"),
        Knob("TM", THREAD_TILE_VALUES, "rows per thread (registers); MMA=1: m16 fragments per warp"),
        Knob("TN", THREAD_TILE_VALUES, "columns per thread (registers); MMA=1: n8 fragments per warp"),
        Knob("PREFETCH", (0, 1), "1: two shared buffers, the next K slice loaded into registers while this "
                                 "one is multiplied"),
        Knob("GROUP_M", GROUP_M_VALUES, "the order of the block tiles: GROUP_M row tiles at a time, column by "
                                        "column (operand panels reused in L2); 1: row by row"),
        Knob("SVEC", SVEC_VALUES, "SIMT: a thread's rows and columns in groups of up to SVEC consecutive ones, each "
                                  "group one vector read of shared memory; 1: rows strided across the threads"),
        Knob("OCC", OCC_VALUES, "registers: 0 the compiler's choice; 1 at most what two blocks an SM leave "
                                "(65536 / (2 x threads): 128 at 256 threads), spilling if it must"),
    ]
    if p.dtype in MMA_DTYPES:
        knobs.append(Knob("MMA", (0, 1), "1: tensor cores (mma.sync m16n8k16, fp32 accumulation)"))
        knobs.append(Knob("STAGES", STAGE_VALUES, "MMA=1: 0 stages slices through registers (PREFETCH); 2-4: a "
                                                  "ring of that many shared slices filled by cp.async, the next "
                                                  "STAGES - 1 in flight"))

    def prefetch(s: Mapping[str, int]) -> str | None:
        if s["PREFETCH"] and MIN_THREADS <= threads(s) <= MAX_THREADS:
            each = prefetch_registers(p, s)
            if each > MAX_PREFETCH:
                return f"PREFETCH=1 holds the next slice in {each} registers per thread (at most {MAX_PREFETCH})"
        return None

    def fragments(s: Mapping[str, int]) -> str | None:
        if s.get("SVEC", 1) > 1:
            if s.get("MMA"):
                return "SVEC reads the SIMT kernel's fragments; tensor cores (MMA=1) read theirs with ldmatrix"
            if s["TM"] == 1 and s["TN"] == 1:
                return "SVEC > 1 needs a thread tile of several rows or columns (TM = TN = 1 reads one of each)"
        return None

    def stages(s: Mapping[str, int]) -> str | None:
        if s.get("STAGES"):
            if not s.get("MMA"):
                return "STAGES feeds the tensor cores (MMA=1); the SIMT kernel stages through registers"
            if s["PREFETCH"]:
                return "STAGES > 0 replaces PREFETCH (the ring already loads ahead)"
            if s.get("OCC"):
                return "OCC=1 with STAGES > 0: the cp.async ring already holds its blocks to two an SM"
        return None

    def shape(s: Mapping[str, int]) -> str | None:
        if s.get("MMA"):
            if s["BM"] % (16 * s["TM"]) or s["BN"] % (8 * s["TN"]):
                return f"a warp's {16 * s['TM']}x{8 * s['TN']} tile (MMA) does not divide a {s['BM']}x{s['BN']} block tile"
            if s["BK"] % 16:
                return f"BK={s['BK']}: MMA steps through K 16 at a time"
            accumulators = 4 * s["TM"] * s["TN"]
        else:
            if s["TM"] > s["BM"] or s["TN"] > s["BN"]:
                return f"a {s['TM']}x{s['TN']} thread tile does not fit a {s['BM']}x{s['BN']} block tile"
            accumulators = s["TM"] * s["TN"]
        n = threads(s)
        if not MIN_THREADS <= n <= MAX_THREADS:
            return f"a {s['BM']}x{s['BN']} tile of {s['TM']}x{s['TN']} per {'warp' if s.get('MMA') else 'thread'} " \
                   f"needs {n} threads ({MIN_THREADS}-{MAX_THREADS})"
        most = MAX_MMA_ACCUMULATORS if s.get("MMA") else MAX_ACCUMULATORS
        if accumulators > most:
            return f"{accumulators} accumulators per thread (at most {most})"
        return None

    def shared(s: Mapping[str, int]) -> str | None:
        if s.get("STAGES"):
            if smem_bytes(p, s) > MAX_DYNAMIC_SHARED:
                return f"STAGES={s['STAGES']} slices of BK={s['BK']} for a {s['BM']}x{s['BN']} tile take " \
                       f"{smem_bytes(p, s)} bytes; a block may have {MAX_DYNAMIC_SHARED}"
            return None
        if smem_bytes(p, s) > MAX_STATIC_SHARED:
            return f"BK={s['BK']} slices of a {s['BM']}x{s['BN']} tile stage {smem_bytes(p, s)} bytes; static " \
                   f"shared memory is {MAX_STATIC_SHARED} bytes per block"
        return None

    def waste(s: Mapping[str, int]) -> str | None:
        # A tile past twice the matrix (16 at least) computes mostly padding.
        if s["BM"] > max(16, _pow2_at_least(p.m)) or s["BN"] > max(16, _pow2_at_least(p.n)):
            return f"a {s['BM']}x{s['BN']} tile is larger than the {p.m}x{p.n} product needs"
        if s["BK"] > max(16 if s.get("MMA") else 8, _pow2_at_least(p.k)):
            return f"BK={s['BK']} is longer than K={p.k} needs"
        return None

    def grid(s: Mapping[str, int]) -> str | None:
        if math.ceil(p.m / s["BM"]) > MAX_GRID_YZ:
            return f"{math.ceil(p.m / s['BM'])} row tiles exceed the grid's y limit"
        if s.get("GROUP_M", 1) > 1 and (p.m <= s["BM"] or p.n <= s["BN"]):
            return f"GROUP_M={s['GROUP_M']} orders row and column tiles; a {p.m}x{p.n} product has one " \
                   f"{'row' if p.m <= s['BM'] else 'column'} of {s['BM']}x{s['BN']} tiles"
        return None

    spec = ScheduleSpec(knobs, [stages, fragments, shape, shared, waste, grid, prefetch])
    # The default: tensor cores where they apply (when first), the SIMT kernel, else tensor cores; within
    # each, the first preferred tile that is legal and gives every SM a block, else the legal one with
    # the most blocks.
    names = ("BM", "BN", "BK", "TM", "TN")
    kinds = [(_narrow_preference(p) + DEFAULT_PREFERENCE, 0)]
    if p.dtype in MMA_DTYPES:
        first = MMA_BY_DEFAULT if tensor_cores_first is None else tensor_cores_first
        kinds.insert(0 if first else 1, (MMA_PREFERENCE, 1))
    chosen = None
    for preference, mma in kinds:
        legal = [{k.name: {**dict(zip(names, c)), "PREFETCH": 0, "MMA": mma, "STAGES": 0, "GROUP_M": 1, "SVEC": 1,
                                                    "OCC": 0}[k.name]
                  for k in knobs}
                 for c in preference]
        legal = [c for c in legal if spec.legal(c)]
        if legal:
            busy = [c for c in legal if blocks(p, c) >= SMS]
            chosen = busy[0] if busy else max(legal, key=lambda c: blocks(p, c))
            break
    if chosen is None:
        legal = spec.enumerate()
        if not legal:
            raise CodegenError(f"the matmul family has no legal default schedule for {p}")
        chosen = max(legal, key=lambda c: blocks(p, c))
    # PREFETCH=1 where it was faster on an H200 (2026-12-06): SIMT tiles at least 16 wide (1.01-1.48x on
    # the four fp32 products and convolutions measured); not the narrow ones (a depthwise convolution's
    # BN=1 lost 1.3x) nor tensor cores (1.8x slower: the registers it holds).
    if not chosen.get("MMA") and min(chosen["BM"], chosen["BN"]) >= 16 and spec.legal({**chosen, "PREFETCH": 1}):
        chosen = {**chosen, "PREFETCH": 1}
    # SIMT fragments read 4 at a time from shared memory where the thread tile allows.
    if not chosen.get("MMA") and spec.legal({**chosen, "SVEC": DEFAULT_SVEC}):
        chosen = {**chosen, "SVEC": DEFAULT_SVEC}
    # An 8 x 8 thread tile of 256 threads held to 128 registers, two blocks an SM: convolutions' index
    # math took the compiler's choice to 139-141 and one block an SM; held, they ran 1.29-1.31x faster
    # (conv_2d, conv_1d; matrix products, already at 128, the same; H100, 2026-12-06). Smaller tiles
    # are left alone: the bound only lets them take more (conv_3d's 4 x 2 went from 80 to 107, 1.16x slower).
    if not chosen.get("MMA") and chosen["TM"] * chosen["TN"] >= MAX_ACCUMULATORS and threads(chosen) == 256 \
            and spec.legal({**chosen, "OCC": 1}):
        chosen = {**chosen, "OCC": 1}
    # Tensor cores take the cp.async ring where both operands come in 16-byte chunks (2.7-3.1x faster than
    # staging through registers on three products, H100, 2026-12-06); gathered operands keep registers.
    if chosen.get("MMA") and chunk_lengths(p) == (8, 8) and spec.legal({**chosen, "STAGES": DEFAULT_STAGES}):
        chosen = {**chosen, "STAGES": DEFAULT_STAGES}
        # Slices of 64 where K allows: half the barriers (faster in 7 of 8 runs of three products).
        if spec.legal({**chosen, "BK": 64}):
            chosen = {**chosen, "BK": 64}
    first_values = {k.name: k.values[0] for k in knobs}
    spec.defaults = {k: v for k, v in chosen.items() if v != first_values[k]}
    return spec


# ---- lowering -------------------------------------------------------------------------------------

def lower_conv(graph: Graph, kernel: str) -> Lowering:
    """One kernel computing a convolution (as an implicit matrix product) and its pointwise epilogue."""
    return lower_matmul(graph, kernel)


def lower_matmul(graph: Graph, kernel: str) -> Lowering:
    """One kernel computing a (batched) matrix product, or a convolution, and its pointwise epilogue."""
    g = _analyse(graph)
    p = g.product
    if p.batch > MAX_GRID_YZ:
        raise _fail(graph, f"a batch of {p.batch} products exceeds the grid's z limit ({MAX_GRID_YZ})", [g.anchor.op])
    if max(p.m, p.n, p.k) >= 2**31:
        raise _fail(graph, f"a [{p.m} x {p.k}] @ [{p.k} x {p.n}] product has a dimension past 32-bit indices",
                    [g.anchor.op])
    if len(set(graph.outputs)) != len(graph.outputs):
        raise _fail(graph, f"the group outputs {graph.outputs} name one value twice (one buffer each)", [g.anchor.op])
    values: dict[str, Any] = {v.name: v for v in graph.inputs}
    values.update({n.name: n for n in graph.nodes})
    safe = lambda name: re.sub(r"\W", "_", name)
    extra_c = [f"in{i}_{safe(v.name)}" for i, v in enumerate(g.extra)]
    out_c = [f"out{i}_{safe(o)}" for i, o in enumerate(graph.outputs)]
    source = PRELUDE + _emit(graph, g, kernel, extra_c, out_c, values)
    args = [g.a.name, g.b.name] + [v.name for v in g.extra] + list(graph.outputs) + \
        [f"int32({p.m})", f"int32({p.n})", f"int32({p.k})"]
    spec = schedule_spec(p)
    program = {
        "format": "cuda-agent/program@1", "name": kernel, "source": source,
        "tunables": spec.tunables(), "schedule": spec.default(),
        "buffers": [{"name": o, "shape": [int(d) for d in values[o].shape], "dtype": values[o].dtype}
                    for o in graph.outputs],
        "launches": [{"kernel": kernel, "grid": ["cdiv(%d, BN)" % p.n, "cdiv(%d, BM)" % p.m, str(p.batch)],
                      "block": [BLOCK_MMA if p.dtype in MMA_DTYPES else BLOCK_SIMT],
                      "shared_bytes": ring_bytes_expr(p) if p.dtype in MMA_DTYPES else 0,
                      "args": args}],
        "outputs": list(graph.outputs),
    }
    shape = f"{p.batch} x " if p.batch > 1 else ""
    acc = f"accumulated in {'fp64' if p.dtype == 'float64' else 'fp32'}"
    if p.conv is not None:
        c = p.conv
        notes = [f"{'transposed ' if c.transposed else ''}conv: {c.images} images, {c.cin} -> {c.cout} channels (groups {c.groups}), "
                 f"{'x'.join(map(str, c.in_size))} -> {'x'.join(map(str, c.out_size))}, kernel "
                 f"{'x'.join(map(str, c.kernel))}, stride {list(c.stride)}, padding {list(c.padding)}, dilation "
                 f"{list(c.dilation)} {p.dtype}, as {shape}[{p.m} x {p.k}] @ [{p.k} x {p.n}], {acc}"
                 + (f" ({c.groups} groups x {c.phases} output phases, each with its own taps)" if c.phases > 1 else "")
                 + (" (output phases not split: every tap, zeros multiplied)" if c.transposed and not c.split_phases
                    else "")]
    else:
        notes = [f"matmul: {shape}[{p.m} x {p.k}]{'ᵀ' if p.trans_a else ''} @ [{p.k} x {p.n}]{'ᵀ' if p.trans_b else ''} "
                 f"{p.dtype}, {acc}"]
    if g.epilogue:
        notes.append(f"epilogue: {', '.join(n.op for n in g.epilogue)}")
    return Lowering(program, spec, notes)


def _emit(graph: Graph, g: _Group, kernel: str, extra_c: list[str], out_c: list[str], values: dict[str, Any]) -> str:
    p = g.product
    ns = f"{kernel}_mm"
    in_t = STORAGE_CTYPE[p.dtype]
    acc_t = COMPUTE_CTYPE[p.dtype]
    flag = lambda b: "true" if b else "false"
    extra_params = "".join(f", const {STORAGE_CTYPE[v.dtype]}* __restrict__ {c}" for v, c in zip(g.extra, extra_c))
    out_params = "".join(f", {STORAGE_CTYPE[values[o].dtype]}* __restrict__ {c}" for o, c in zip(graph.outputs, out_c))
    call_args = "".join(f", {c}" for c in extra_c + out_c)
    epilogue = _emit_epilogue(graph, g, extra_c, out_c, values)
    simt = _emit_simt_body(p, call_args)
    chunks = chunk_lengths(p)
    if p.dtype in MMA_DTYPES:
        threads_c = "#if MMA\n" + _emit_mma_helpers(p) + "#else\n" + SIMT_THREADS + "#endif"
        body = (f"#if MMA\n#if STAGES\n{_emit_mma_ring_body(call_args)}#else\n{_emit_mma_body(call_args)}#endif\n"
                f"#else\n{simt}#endif\n")
    else:
        threads_c, body = SIMT_THREADS, simt
    return f"""
#ifndef CA_DYNAMIC_SMEM
#define CA_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif
namespace {ns} {{
typedef {in_t} in_t;      // a stored operand element
typedef {acc_t} acc_t;        // accumulation type
constexpr bool TRANS_A = {flag(p.trans_a)};      // A stored [K, M] (else [M, K])
constexpr bool TRANS_B = {flag(p.trans_b)};      // B stored [N, K] (else [K, N])
constexpr bool A_BATCHED = {flag(p.a_batched)}, B_BATCHED = {flag(p.b_batched)};   // else one matrix for all
constexpr int CHUNK_A = {chunks[0]}, CHUNK_B = {chunks[1]};   // SIMT: elements per global load
{_conv_constants(p)}

// The block's tile of C (its first row and column). GROUP_M > 1 walks the tiles GROUP_M row tiles at a
// time, column by column (the blocks resident together read GROUP_M panels of A and a few of B, which
// stay in L2, instead of one panel of A and all of B); 1: row by row, as the grid lies.
CA_HD void block_origin(int& m0, int& n0) {{
    if (GROUP_M <= 1) {{
        m0 = blockIdx.y * BM;
        n0 = blockIdx.x * BN;
        return;
    }}
    const int tiles_n = gridDim.x, tiles_m = gridDim.y, id = blockIdx.y * tiles_n + blockIdx.x;
    const int in_group = id % (GROUP_M * tiles_n), first = id / (GROUP_M * tiles_n) * GROUP_M;
    const int rows = tiles_m - first < GROUP_M ? tiles_m - first : GROUP_M;
    m0 = (first + in_group % rows) * BM;
    n0 = in_group / rows * BN;
}}

// A transposed convolution's products: batch = group * PHASES + phase; row gm = (image, position
// o' in the phase's grid QOD x QOH x QOW), the output o = o' * PS + r; column gk = (input channel, j),
// the phase's j-th tap t = t0(r) + j * TS per dim (TS = PS / gcd(D, PS); t0 solves t * D = r + P
// mod PS). PS, the phase stride, is the stride where phases are split, else 1 (one phase, every tap).
// -1: no such tap (past the kernel, or a phase no tap reaches).
CA_HD int phase_tap(int r, int j, int PS, int P, int G, int TS, int DINV, int KX) {{
    if ((r + P) % G) return -1;
    const int t = (r + P) % PS / G * DINV % TS + j * TS;
    return t < KX ? t : -1;
}}
// The output position (od, oh, ow) of row gm (its image in img), and the taps (td, th, tw) of column gk,
// of a transposed convolution's product `batch`; false when the row is past the output or the
// column has no tap.
CA_HD bool tconv_row(long long batch, int gm, int& img, int& od, int& oh, int& ow) {{
    const int ph = (int)(batch % PHASES), pos = gm % OUT_POS;
    img = gm / OUT_POS;
    od = pos / (QOH * QOW) * PSD + ph / (PSH * PSW);
    oh = pos / QOW % QOH * PSH + ph / PSW % PSH;
    ow = pos % QOW * PSW + ph % PSW;
    return od < OD && oh < OH && ow < OW;
}}
CA_HD bool tconv_col(long long batch, int gk, int& td, int& th, int& tw) {{
    const int ph = (int)(batch % PHASES), j = gk % TAPS;
    td = phase_tap(ph / (PSH * PSW), j / (QKH * QKW), PSD, PD, GD, TSD, DINVD, KD);
    th = phase_tap(ph / PSW % PSH, j / QKW % QKH, PSH, PH, GH, TSH, DINVH, KH);
    tw = phase_tap(ph % PSW, j % QKW, PSW, PW, GW, TSW, DINVW, KW);
    return td >= 0 && th >= 0 && tw >= 0;
}}

// Where A[batch][gm][gk] of a convolution lies in its input: the element under tap gk of output
// position gm (im2col, never stored), or -1 in the padding. Transposed: output o takes input
// i = (o + P - t * D) / S where that divides (always, for a split phase's taps).
CA_HD long long conv_a_index(long long batch, int gm, int gk) {{
    const int c = gk / TAPS;
    int img, id, ih, iw;
    long long group = batch;
    if (TCONV) {{
        int od, oh, ow, td, th, tw;
        if (!tconv_row(batch, gm, img, od, oh, ow) || !tconv_col(batch, gk, td, th, tw)) return -1;
        group = batch / PHASES;
        const int nd = od + PD - td * DD, nh = oh + PH - th * DH, nw = ow + PW - tw * DW;
        if (nd % SD || nh % SH || nw % SW) return -1;
        id = nd / SD; ih = nh / SH; iw = nw / SW;          // a negative one fails the bounds check below
    }} else {{
        const int pos = gm % OUT_POS, tap = gk % TAPS;
        img = gm / OUT_POS;
        id = pos / (OH * OW) * SD - PD + tap / (KH * KW) * DD;
        ih = pos / OW % OH * SH - PH + tap / KW % KH * DH;
        iw = pos % OW * SW - PW + tap % KW * DW;
    }}
    if (id < 0 || id >= ID || ih < 0 || ih >= IH || iw < 0 || iw >= IW) return -1;
    return (((long long)img * CIN + group * CIN_G + c) * ID + id) * (IH * IW) + (long long)ih * IW + iw;
}}

// Where B[batch][gk][gn] of a transposed convolution lies in its weight [CIN, COUT_G, KD * KH * KW],
// or -1 where the phase has no tap gk.
CA_HD long long tconv_b_index(long long batch, int gn, int gk) {{
    int td, th, tw;
    if (!tconv_col(batch, gk, td, th, tw)) return -1;
    return ((batch / PHASES * CIN_G + gk / TAPS) * (long long)COUT_G + gn) * (KD * KH * KW) + (td * KH + th) * KW + tw;
}}

// The flat output index of C[batch][gm][gn], or -1 for a row past a phase's outputs: a convolution's
// output is [images, channels, positions]; a product's [batch, M, N].
CA_HD long long out_index(long long batch, int gm, int gn, int M, int N) {{
    if (TCONV) {{
        int img, od, oh, ow;
        if (!tconv_row(batch, gm, img, od, oh, ow)) return -1;
        return ((long long)img * COUT + batch / PHASES * N + gn) * (OD * OH * OW) + ((long long)od * OH + oh) * OW + ow;
    }}
    return CONV ? ((long long)(gm / OUT_POS) * COUT + batch * N + gn) * OUT_POS + gm % OUT_POS
                : (batch * M + gm) * (long long)N + gn;
}}

{threads_c}
{epilogue}
}}  // namespace {ns}

// Under the cp.async ring a 256-thread block is held to 128 registers, two blocks an SM: the ring's
// default compiles to 124-126 anyway, but BK=64 with GROUP_M=8 took 166 and ran one block an SM,
// 1.2x slower. Elsewhere only where OCC=1 asks (the SIMT default for 8 x 8 thread tiles): naming a
// minimum (even 1) made the register-staged MMA kernel take 138 registers instead of 126 and run
// 1.8x slower (H100, 2026-12-06).
extern "C" __global__ void
#if MMA && STAGES
__launch_bounds__({ns}::THREADS, {ns}::THREADS <= 256 ? 2 : 1)
#elif OCC
__launch_bounds__({ns}::THREADS, 2)
#else
__launch_bounds__({ns}::THREADS)
#endif
{kernel}(const {ns}::in_t* __restrict__ A, const {ns}::in_t* __restrict__ B{extra_params}{out_params}, int M, int N, int K) {{
    using namespace {ns};
{body}}}
"""


SIMT_THREADS = "constexpr int TX = BN / TN, TY = BM / TM, THREADS = TX * TY;\n"


def _emit_simt_body(p: Product, call_args: str) -> str:
    load = lambda raw: load_expr(p.dtype, raw)
    return f"""    // A thread's TM rows (TN columns) lie in groups of VA (VB) consecutive ones, TY * VA apart, so
    // each group is one vector read of shared memory: SVEC=4 reads 4 at a time (a 16-byte LDS.128 for
    // fp32, a third of SVEC=1's shared-memory wavefronts at 8 x 8), SVEC=1 one (rows TY apart).
    // Rows padded by SVEC words: 4 keeps them aligned for the vector reads, and a warp's transposing
    // stores at BK=8 then hit 32 distinct banks (4k + m). (SVEC=1's one word puts them in 11 banks,
    // k + m: the 50 M conflicts Nsight Compute counted on mm_square.) PREFETCH: two buffers, the next
    // slice loaded into registers while this one is multiplied (one barrier a step).
    constexpr int VA = SVEC < TM ? SVEC : TM, VB = SVEC < TN ? SVEC : TN;
    __shared__ __align__(32) acc_t As[1 + PREFETCH][BK][BM + SVEC];
    __shared__ __align__(32) acc_t Bs[1 + PREFETCH][BK][BN + SVEC];
    const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
    // The block-tile row of the thread's i-th row, and column of its j-th column.
    auto row_of = [&](int i) {{ return i / VA * (TY * VA) + ty * VA + i % VA; }};
    auto col_of = [&](int j) {{ return j / VB * (TX * VB) + tx * VB + j % VB; }};
    const long long batch = blockIdx.z;
    int m0, n0;
    block_origin(m0, n0);
    const in_t* a = A + (A_BATCHED ? batch * (long long)M * K : 0LL);
    const in_t* b = B + (B_BATCHED ? batch * (long long)K * N : 0LL);
    // Slices come from global memory in chunks of GA (GB) elements along each operand's contiguous
    // dim: one 16-byte load where that dim is a multiple of the chunk (CHUNK_A, CHUNK_B) and the
    // matrix is 16-byte aligned, else element by element (gathered convolution operands: always).
    constexpr int GA = CHUNK_A > 1 && (TRANS_A ? BM : BK) % CHUNK_A == 0 ? CHUNK_A : 1;
    constexpr int GB = CHUNK_B > 1 && (TRANS_B ? BK : BN) % CHUNK_B == 0 ? CHUNK_B : 1;
    constexpr int A_CHUNKS = BM * BK / GA, B_CHUNKS = BK * BN / GB;
    const bool vec_a = GA > 1 && aligned_to<16>(a), vec_b = GB > 1 && aligned_to<16>(b);
    // Where chunk c of a slice starts in the tile. Consecutive chunks run along each operand's
    // contiguous dim, so consecutive threads load neighbouring memory.
    auto a_where = [&](int c, int& m, int& k) {{
        if (TRANS_A) {{ m = c % (BM / GA) * GA; k = c / (BM / GA); }}
        else {{ m = c / (BK / GA); k = c % (BK / GA) * GA; }}
    }};
    auto b_where = [&](int c, int& n, int& k) {{
        if (TRANS_B) {{ n = c / (BK / GB); k = c % (BK / GB) * GB; }}
        else {{ n = c % (BN / GB) * GB; k = c / (BN / GB); }}
    }};
    // Element (m, k) of A's slice at k0 and (k, n) of B's (zero outside the matrices).
    auto a_at = [&](int k0, int m, int k) -> acc_t {{
        const int gm = m0 + m, gk = k0 + k;
        acc_t v = (acc_t)0;
        if (gm < M && gk < K) {{
            if (CONV) {{
                const long long at = conv_a_index(batch, gm, gk);
                if (at >= 0) v = {load("A[at]")};
            }} else {{
                v = {load("(TRANS_A ? a[(long long)gk * M + gm] : a[(long long)gm * K + gk])")};
            }}
        }}
        return v;
    }};
    auto b_at = [&](int k0, int n, int k) -> acc_t {{
        const int gn = n0 + n, gk = k0 + k;
        if (gn >= N || gk >= K) return (acc_t)0;
        if (TCONV) {{
            const long long at = tconv_b_index(batch, gn, gk);
            return at >= 0 ? {load("B[at]")} : (acc_t)0;
        }}
        return {load("(TRANS_B ? b[(long long)gn * K + gk] : b[(long long)gk * N + gn])")};
    }};
    // Chunk c of the slice at k0 into v; a whole chunk lies inside the matrix or outside it, since
    // the contiguous dim is a multiple of the chunk.
    auto fetch_a = [&](int k0, int c, acc_t (&v)[GA]) {{
        int m, k;
        a_where(c, m, k);
        if (GA > 1 && vec_a && m0 + m < M && k0 + k < K) {{
            const long long at = TRANS_A ? (long long)(k0 + k) * M + m0 + m : (long long)(m0 + m) * K + k0 + k;
            const vec_t<in_t, GA> r = *reinterpret_cast<const vec_t<in_t, GA>*>(a + at);
            #pragma unroll
            for (int j = 0; j < GA; ++j) v[j] = {load("r.v[j]")};
        }} else {{
            #pragma unroll
            for (int j = 0; j < GA; ++j) v[j] = a_at(k0, TRANS_A ? m + j : m, TRANS_A ? k : k + j);
        }}
    }};
    auto fetch_b = [&](int k0, int c, acc_t (&v)[GB]) {{
        int n, k;
        b_where(c, n, k);
        if (GB > 1 && vec_b && n0 + n < N && k0 + k < K) {{
            const long long at = TRANS_B ? (long long)(n0 + n) * K + k0 + k : (long long)(k0 + k) * N + n0 + n;
            const vec_t<in_t, GB> r = *reinterpret_cast<const vec_t<in_t, GB>*>(b + at);
            #pragma unroll
            for (int j = 0; j < GB; ++j) v[j] = {load("r.v[j]")};
        }} else {{
            #pragma unroll
            for (int j = 0; j < GB; ++j) v[j] = b_at(k0, TRANS_B ? n : n + j, TRANS_B ? k + j : k);
        }}
    }};
    auto put_a = [&](int buf, int c, const acc_t (&v)[GA]) {{
        int m, k;
        a_where(c, m, k);
        #pragma unroll
        for (int j = 0; j < GA; ++j) As[buf][TRANS_A ? k : k + j][TRANS_A ? m + j : m] = v[j];
    }};
    auto put_b = [&](int buf, int c, const acc_t (&v)[GB]) {{
        int n, k;
        b_where(c, n, k);
        #pragma unroll
        for (int j = 0; j < GB; ++j) Bs[buf][TRANS_B ? k + j : k][TRANS_B ? n : n + j] = v[j];
    }};
    acc_t acc[TM][TN];
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = (acc_t)0;
    auto multiply = [&](int buf) {{
        #pragma unroll
        for (int kk = 0; kk < BK; ++kk) {{
            acc_t ra[TM], rb[TN];
            #pragma unroll
            for (int g = 0; g < TM / VA; ++g) {{
                const vec_t<acc_t, VA> v = *reinterpret_cast<const vec_t<acc_t, VA>*>(&As[buf][kk][row_of(g * VA)]);
                #pragma unroll
                for (int e = 0; e < VA; ++e) ra[g * VA + e] = v.v[e];
            }}
            #pragma unroll
            for (int g = 0; g < TN / VB; ++g) {{
                const vec_t<acc_t, VB> v = *reinterpret_cast<const vec_t<acc_t, VB>*>(&Bs[buf][kk][col_of(g * VB)]);
                #pragma unroll
                for (int e = 0; e < VB; ++e) rb[g * VB + e] = v.v[e];
            }}
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += ra[i] * rb[j];
        }}
    }};
    if (!PREFETCH) {{
        for (int k0 = 0; k0 < K; k0 += BK) {{
            for (int c = tid; c < A_CHUNKS; c += THREADS) {{ acc_t v[GA]; fetch_a(k0, c, v); put_a(0, c, v); }}
            for (int c = tid; c < B_CHUNKS; c += THREADS) {{ acc_t v[GB]; fetch_b(k0, c, v); put_b(0, c, v); }}
            __syncthreads();
            multiply(0);
            __syncthreads();
        }}
    }} else {{
        constexpr int A_EACH = (A_CHUNKS + THREADS - 1) / THREADS, B_EACH = (B_CHUNKS + THREADS - 1) / THREADS;
        for (int c = tid; c < A_CHUNKS; c += THREADS) {{ acc_t v[GA]; fetch_a(0, c, v); put_a(0, c, v); }}
        for (int c = tid; c < B_CHUNKS; c += THREADS) {{ acc_t v[GB]; fetch_b(0, c, v); put_b(0, c, v); }}
        __syncthreads();
        int cur = 0;
        for (int k0 = 0; k0 < K; k0 += BK) {{
            const bool more = k0 + BK < K;
            acc_t ra[A_EACH][GA], rb[B_EACH][GB];
            if (more) {{
                #pragma unroll
                for (int r = 0; r < A_EACH; ++r) if (tid + r * THREADS < A_CHUNKS) fetch_a(k0 + BK, tid + r * THREADS, ra[r]);
                #pragma unroll
                for (int r = 0; r < B_EACH; ++r) if (tid + r * THREADS < B_CHUNKS) fetch_b(k0 + BK, tid + r * THREADS, rb[r]);
            }}
            multiply(cur);
            if (more) {{
                // The other buffer was last read before the previous step's barrier.
                #pragma unroll
                for (int r = 0; r < A_EACH; ++r) if (tid + r * THREADS < A_CHUNKS) put_a(cur ^ 1, tid + r * THREADS, ra[r]);
                #pragma unroll
                for (int r = 0; r < B_EACH; ++r) if (tid + r * THREADS < B_CHUNKS) put_b(cur ^ 1, tid + r * THREADS, rb[r]);
            }}
            __syncthreads();
            cur ^= 1;
        }}
    }}
    #pragma unroll
    for (int i = 0; i < TM; ++i) {{
        const int gm = m0 + row_of(i);
        #pragma unroll
        for (int j = 0; j < TN; ++j) {{
            const int gn = n0 + col_of(j);
            const long long e = gm < M && gn < N ? out_index(batch, gm, gn, M, N) : -1;
            if (e >= 0) epilogue(acc[i][j], e{call_args});
        }}
    }}
"""


def _emit_mma_helpers(p: Product) -> str:
    """MMA=1's constants, its staging of one operand's slice, and the mma.sync wrapper."""
    va, vb = chunk_lengths(p)
    kind = "bf16" if p.dtype == "bfloat16" else "f16"
    return f"""constexpr int WARPS_M = BM / (16 * TM), WARPS_N = BN / (8 * TN), THREADS = 32 * WARPS_M * WARPS_N;
constexpr int SK = BK + {MMA_PAD};            // a staged row: BK elements and padding
constexpr int VA = {va}, VB = {vb};            // elements per staged chunk of A, of B

// One operand's R x BK slice at rows r0.., k0.. of a matrix stored [rows, K] (KC: k contiguous) or
// [K, rows], in chunks of V elements along the contiguous dim (V = 8: one 16-byte load where `vec`),
// zero outside the matrix; GATHER 1: a convolution's A (conv_a_index), 2: a transposed convolution's B
// (tconv_b_index), element by element. A thread
// fetches chunks tid, tid + THREADS, ... into registers, then puts them in the shared tile S[R][SK]
// (k fastest).
// Element j of a chunk whose first element is at row gr, k gk (flat index `at` where stored [rows, K]
// (KC) or [K, rows]): zero outside the matrix; GATHER 1: a convolution's A (conv_a_index), 2: a
// transposed convolution's B (tconv_b_index), zero where no input element lies under the tap.
// `live` false: a chunk past the slice's (zero too).
template <bool KC, int GATHER>
CA_HD in_t chunk_element(const in_t* __restrict__ x, long long batch, int rows, int K, int gr, int gk, long long at, int j,
                         bool live = true) {{
    if (!(live && (KC ? gr < rows && gk + j < K : gr + j < rows && gk < K))) return (in_t)0;
    if (GATHER) {{
        const long long src = GATHER == 1 ? conv_a_index(batch, gr, gk) : tconv_b_index(batch, gr, gk);
        return src >= 0 ? x[src] : (in_t)0;
    }}
    return x[at + j];
}}
template <int R, bool KC, int V, int GATHER> struct Slice {{
    static constexpr int CHUNKS = R * BK / V, EACH = (CHUNKS + THREADS - 1) / THREADS;
    vec_t<in_t, V> r[EACH];
    // KC: V consecutive k of one row, a row's chunks side by side (coalesced along k). Else V
    // consecutive rows of one k, k fastest across threads (conflict-free transposing stores).
    CA_HD static void where(int c, int& row, int& k) {{
        if (KC) {{ row = c / (BK / V); k = c % (BK / V) * V; }}
        else {{ k = c % BK; row = c / BK * V; }}
    }}
    CA_HD void fetch(const in_t* __restrict__ x, long long batch, int rows, int K, int r0, int k0, int tid, bool vec) {{
        #pragma unroll
        for (int e = 0; e < EACH; ++e) {{
            const int c = tid + e * THREADS;
            int row, k;
            where(c, row, k);
            const int gr = r0 + row, gk = k0 + k;
            const long long at = KC ? (long long)gr * K + gk : (long long)gk * rows + gr;
            if (V > 1 && vec && c < CHUNKS && gr < rows && gk < K) {{
                r[e] = *reinterpret_cast<const vec_t<in_t, V>*>(x + at);    // the contiguous dim % 8 == 0
            }} else {{
                #pragma unroll
                for (int j = 0; j < V; ++j)
                    r[e].v[j] = chunk_element<KC, GATHER>(x, batch, rows, K, gr, gk, at, j, c < CHUNKS);
            }}
        }}
    }}
    CA_HD void put(in_t (*S)[SK], int tid) const {{
        #pragma unroll
        for (int e = 0; e < EACH; ++e) {{
            const int c = tid + e * THREADS;
            if (c >= CHUNKS) break;
            int row, k;
            where(c, row, k);
            if (KC) {{
                *reinterpret_cast<vec_t<in_t, V>*>(&S[row][k]) = r[e];      // 16-byte aligned: SK % 8 == 0
            }} else {{
                #pragma unroll
                for (int j = 0; j < V; ++j) S[row + j][k] = r[e].v[j];
            }}
        }}
    }}
}};

// d += a * b for one m16n8k16 tile, fp32 accumulation; a lane's fragments are laid out as the
// PTX ISA gives them for mma.m16n8k16 (groupID = lane / 4, threadID_in_group = lane % 4).
CA_HD void mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, "
        "{{%8, %9}}, {{%0, %1, %2, %3}};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(__CUDA_ARCH__)
#error "MMA=1 (mma.sync m16n8k16) needs sm_80 or newer"
#elif defined(CA_WARP_MMA)
    CA_WARP_MMA(d, a, b, {"true" if kind == "bf16" else "false"});     // the CPU tests' emulation (bf16?)
#endif
}}
// STAGES > 0: 16-byte cp.async copies (global -> shared, past the registers); zeros where `inside` is
// false (src-size 0 reads nothing). A group per slice; wait_group N: all but the last N groups landed.
CA_HD void cp_async16(in_t* dst, const in_t* src, bool inside) {{
#if defined(__CUDA_ARCH__)
    const unsigned at = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(at), "l"(src), "r"(inside ? 16 : 0));
#else
    for (int j = 0; j < 8; ++j) dst[j] = inside ? src[j] : (in_t)0;
#endif
}}
CA_HD void cp_async_commit() {{
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.commit_group;" ::);
#endif
}}
template <int N> CA_HD void cp_async_wait() {{
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_group %0;" :: "n"(N));
#endif
}}
// STAGES > 0: one operand's R x BK slice in a stage of the ring, laid out as it lies in memory: KC
// (k contiguous) as S[R][BK + PAD], else S[BK][R + PAD] (rows contiguous; ldmatrix.trans reads it).
// 16-byte chunks along the contiguous dim by cp.async where `vec`, else element by element (GATHER as
// in Slice) with plain stores, which the barrier before the slice is multiplied makes visible.
template <int R, bool KC, int V, int GATHER> struct Ring {{
    static constexpr int LEN = KC ? BK : R, PITCH = LEN + {MMA_PAD}, ELEMS = (KC ? R : BK) * PITCH;
    static constexpr int CHUNKS = R * BK / V, EACH = (CHUNKS + THREADS - 1) / THREADS;
    CA_HD static void load(in_t* S, const in_t* __restrict__ x, long long batch, int rows, int K, int r0, int k0, int tid, bool vec) {{
        #pragma unroll
        for (int e = 0; e < EACH; ++e) {{
            const int c = tid + e * THREADS;
            if (c >= CHUNKS) break;
            const int line = c / (LEN / V), off = c % (LEN / V) * V;
            const int gr = r0 + (KC ? line : off), gk = k0 + (KC ? off : line);
            const long long at = KC ? (long long)gr * K + gk : (long long)gk * rows + gr;
            in_t* dst = S + line * PITCH + off;
            if (V > 1 && vec) {{
                const bool inside = gr < rows && gk < K;       // the whole chunk: its dim % 8 == 0
                cp_async16(dst, inside ? x + at : x, inside);
            }} else {{
                #pragma unroll
                for (int j = 0; j < V; ++j) dst[j] = chunk_element<KC, GATHER>(x, batch, rows, K, gr, gk, at, j);
            }}
        }}
    }}
}};
// ldmatrix.x4: lane l gives the address of row l % 8 of 8x8 matrix l / 8 (16 bytes, in shared memory)
// and receives, for each matrix i, the pair of row l / 4 at columns 2 * (l % 4): one instruction
// for an A fragment, or for two n8 B fragments.
CA_HD void ldmatrix_x4(unsigned (&r)[4], const in_t* row) {{
#if defined(__CUDA_ARCH__)
    const unsigned at = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0, %1, %2, %3}}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(at));
#elif defined(CA_WARP_LDMATRIX)
    CA_WARP_LDMATRIX(r, row);       // the CPU tests' emulation
#endif
}}
// ldmatrix.x4.trans: the same addresses; lane l receives, for each matrix i, the elements of column
// l / 4 at rows 2 * (l % 4) and 2 * (l % 4) + 1 (the transpose's pair): fragments from slices stored
// with the rows (not k) contiguous.
CA_HD void ldmatrix_x4_trans(unsigned (&r)[4], const in_t* row) {{
#if defined(__CUDA_ARCH__)
    const unsigned at = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{%0, %1, %2, %3}}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(at));
#elif defined(CA_WARP_LDMATRIX_TRANS)
    CA_WARP_LDMATRIX_TRANS(r, row);       // the CPU tests' emulation
#endif
}}
"""


# Both tensor-core bodies: the thread's warp and lane, the block's tile and its operands; then the
# accumulators, zeroed.
MMA_PROLOGUE = """    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N, g = lane / 4, t = lane % 4;
    const long long batch = blockIdx.z;
    int m0, n0;
    block_origin(m0, n0);
    const in_t* a = CONV ? A : A + (A_BATCHED ? batch * (long long)M * K : 0LL);
    const in_t* b = TCONV ? B : B + (B_BATCHED ? batch * (long long)K * N : 0LL);
    const bool vec_a = aligned_to<16>(a), vec_b = aligned_to<16>(b);     // else element by element
"""
MMA_ZERO_ACC = """    float acc[TM][TN][4];
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j)
            #pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
"""


def _emit_mma_body(call_args: str) -> str:
    return f"""    // Tensor cores: warp (wm, wn) computes rows wm*16*TM.. and columns wn*8*TN.. of the block's tile.
    alignas(16) __shared__ in_t As[1 + PREFETCH][BM][SK];
    alignas(16) __shared__ in_t Bs[1 + PREFETCH][BN][SK];
{MMA_PROLOGUE}    Slice<BM, !TRANS_A, VA, CONV ? 1 : 0> sa;
    Slice<BN, TRANS_B, VB, TCONV ? 2 : 0> sb;
    auto fetch = [&](int k0) {{
        sa.fetch(a, batch, M, K, m0, k0, tid, vec_a);
        sb.fetch(b, batch, N, K, n0, k0, tid, vec_b);
    }};
    auto put = [&](int buf) {{
        sa.put(As[buf], tid);
        sb.put(Bs[buf], tid);
    }};
{MMA_ZERO_ACC}    auto multiply = [&](int buf) {{
        #pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {{
            // A fragment i: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
            // (rows 8-15, k 8-15); lane l points at row l % 16, k (l / 16) * 8.
            unsigned fa[TM][4], fb[(TN + 1) / 2 * 2][2];
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                ldmatrix_x4(fa[i], &As[buf][wm * 16 * TM + i * 16 + lane % 16][kk + lane / 16 * 8]);
            // B fragments j and j + 1 (columns n, k fastest): matrices (n 0-7, k 0-7), (n 0-7, k 8-15),
            // (n 8-15, k 0-7), (n 8-15, k 8-15); with TN = 1 the last two read fragment 0's rows again.
            #pragma unroll
            for (int j = 0; j < TN; j += 2) {{
                const int mi = lane / 8, n = wn * 8 * TN + (j + (TN > 1 ? mi / 2 : 0)) * 8 + lane % 8;
                unsigned r[4];
                ldmatrix_x4(r, &Bs[buf][n][kk + mi % 2 * 8]);
                fb[j][0] = r[0]; fb[j][1] = r[1]; fb[j + 1][0] = r[2]; fb[j + 1][1] = r[3];
            }}
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < TN; ++j) mma_16816(acc[i][j], fa[i], fb[j]);
        }}
    }};
    if (!PREFETCH) {{
        for (int k0 = 0; k0 < K; k0 += BK) {{
            fetch(k0);
            put(0);
            __syncthreads();
            multiply(0);
            __syncthreads();
        }}
    }} else {{
        fetch(0);
        put(0);
        __syncthreads();
        int cur = 0;
        for (int k0 = 0; k0 < K; k0 += BK) {{
            const bool more = k0 + BK < K;
            if (more) fetch(k0 + BK);
            multiply(cur);
            if (more) put(cur ^ 1);           // the other buffer was last read before the previous barrier
            __syncthreads();
            cur ^= 1;
        }}
    }}
{_mma_store(call_args)}"""


def _mma_store(call_args: str) -> str:
    return f"""    // Lane (g, t) holds C rows g and g + 8, columns 2t and 2t + 1 of each m16 x n8 fragment.
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j)
            #pragma unroll
            for (int q = 0; q < 4; ++q) {{
                const int gm = m0 + wm * 16 * TM + i * 16 + g + (q >= 2 ? 8 : 0);
                const int gn = n0 + wn * 8 * TN + j * 8 + 2 * t + (q & 1);
                const long long e = gm < M && gn < N ? out_index(batch, gm, gn, M, N) : -1;
                if (e >= 0) epilogue(acc[i][j][q], e{call_args});
            }}
"""


def _emit_mma_ring_body(call_args: str) -> str:
    return f"""    // Tensor cores fed by a ring of STAGES shared slices: cp.async fills the slice STAGES - 1 steps
    // ahead while the warps multiply this one (one barrier a step). Warp (wm, wn) computes rows
    // wm*16*TM.. and columns wn*8*TN.. of the block's tile.
    CA_DYNAMIC_SMEM(ca_ring);
    in_t* const ring = reinterpret_cast<in_t*>(ca_ring);
    typedef Ring<BM, !TRANS_A, VA, CONV ? 1 : 0> RA;
    typedef Ring<BN, TRANS_B, VB, TCONV ? 2 : 0> RB;
    constexpr int STAGE = RA::ELEMS + RB::ELEMS;       // elements of one stage (16-byte multiples)
{MMA_PROLOGUE}    auto load = [&](int slot, int k0) {{
        RA::load(ring + slot * STAGE, a, batch, M, K, m0, k0, tid, vec_a);
        RB::load(ring + slot * STAGE + RA::ELEMS, b, batch, N, K, n0, k0, tid, vec_b);
    }};
{MMA_ZERO_ACC}    auto multiply = [&](int slot) {{
        const in_t* As = ring + slot * STAGE;
        const in_t* Bs = As + RA::ELEMS;
        #pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {{
            // A fragment i: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15,
            // k 8-15); lane l points at matrix l / 8's line l % 8 (a row of A, or a k where A is [K, M]).
            unsigned fa[TM][4], fb[(TN + 1) / 2 * 2][2];
            #pragma unroll
            for (int i = 0; i < TM; ++i) {{
                const int m = wm * 16 * TM + i * 16;
                if (!TRANS_A) ldmatrix_x4(fa[i], As + (m + lane % 16) * RA::PITCH + kk + lane / 16 * 8);
                else ldmatrix_x4_trans(fa[i], As + (kk + lane / 16 * 8 + lane % 8) * RA::PITCH + m + lane / 8 % 2 * 8);
            }}
            // B fragments j and j + 1: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15,
            // k 8-15); with TN = 1 the last two read fragment 0's again.
            #pragma unroll
            for (int j = 0; j < TN; j += 2) {{
                const int mi = lane / 8, n = wn * 8 * TN + (j + (TN > 1 ? mi / 2 : 0)) * 8;
                unsigned r[4];
                if (TRANS_B) ldmatrix_x4(r, Bs + (n + lane % 8) * RB::PITCH + kk + mi % 2 * 8);
                else ldmatrix_x4_trans(r, Bs + (kk + mi % 2 * 8 + lane % 8) * RB::PITCH + n);
                fb[j][0] = r[0]; fb[j][1] = r[1]; fb[j + 1][0] = r[2]; fb[j + 1][1] = r[3];
            }}
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < TN; ++j) mma_16816(acc[i][j], fa[i], fb[j]);
        }}
    }};
    // Slice s goes to slot s % STAGES in commit group s (a group is committed every step, empty ones
    // too, so that waiting for all but the newest STAGES - 2 means slice kt has landed).
    const int slices = (K + BK - 1) / BK;
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {{
        if (s < slices) load(s, s * BK);
        cp_async_commit();
    }}
    for (int kt = 0; kt < slices; ++kt) {{
        cp_async_wait<STAGES - 2>();
        __syncthreads();              // slice kt is everyone's; every warp is done with slot (kt - 1) % STAGES
        const int next = kt + STAGES - 1;
        if (next < slices) load(next % STAGES, next * BK);
        cp_async_commit();
        multiply(kt % STAGES);
    }}
{_mma_store(call_args)}"""


def _conv_constants(p: Product) -> str:
    c = p.conv
    if c is None:
        c = ConvGeometry(1, 1, 1, 1, (1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1))
        head = "constexpr bool CONV = false, TCONV = false;   // a plain product: none of the below is used\n"
    else:
        head = (f"constexpr bool CONV = true;   // A is the im2col view of the input [images, CIN, ID, IH, IW]\n"
                f"constexpr bool TCONV = {'true' if c.transposed else 'false'};   // transposed: B is the weight "
                f"[CIN, COUT / groups, KD, KH, KW], one product per group and phase\n")
    (id_, ih, iw), (od, oh, ow), (kd, kh, kw) = c.in_size, c.out_size, c.kernel
    (sd, sh, sw), (pd, ph, pw), (dd, dh, dw) = c.stride, c.padding, c.dilation
    (qod, qoh, qow), (qkd, qkh, qkw), steps, (psd, psh, psw) = c.phase_out, c.phase_taps, c.tap_step, c.phase_stride
    gcds = [math.gcd(d, s) for d, s in zip(c.dilation, c.phase_stride)]
    # The inverse of D / G modulo TS (phase_tap's first tap); 0 where TS is 1 (every tap is the first).
    inverses = [pow(d // g, -1, ts) if ts > 1 else 0 for d, g, ts in zip(c.dilation, gcds, steps)]
    return (head +
            f"constexpr int ID = {id_}, IH = {ih}, IW = {iw}, OD = {od}, OH = {oh}, OW = {ow}, KD = {kd}, KH = {kh}, KW = {kw};\n"
            f"constexpr int SD = {sd}, SH = {sh}, SW = {sw}, PD = {pd}, PH = {ph}, PW = {pw}, DD = {dd}, DH = {dh}, DW = {dw};\n"
            f"constexpr int CIN = {c.cin}, CIN_G = {c.cin // c.groups}, COUT = {c.cout}, COUT_G = {c.cout // c.groups};\n"
            f"// Per product: output positions (a phase's grid QOD x QOH x QOW) and taps (QKD x QKH x QKW).\n"
            f"constexpr int PHASES = {c.phases}, PSD = {psd}, PSH = {psh}, PSW = {psw};   // phases, and their strides\n"
            f"constexpr int QOH = {qoh}, QOW = {qow}, OUT_POS = {qod * qoh * qow};\n"
            f"constexpr int QKH = {qkh}, QKW = {qkw}, TAPS = {qkd * qkh * qkw};\n"
            f"constexpr int GD = {gcds[0]}, GH = {gcds[1]}, GW = {gcds[2]}, TSD = {steps[0]}, TSH = {steps[1]}, "
            f"TSW = {steps[2]}, DINVD = {inverses[0]}, DINVH = {inverses[1]}, DINVW = {inverses[2]};")


def _emit_epilogue(graph: Graph, g: _Group, extra_c: list[str], out_c: list[str], values: dict[str, Any]) -> str:
    """epilogue(acc, e, inputs..., outputs...): the product rounded as eager stores it, through the
    pointwise chain, stored at flat output index e."""
    p = g.product
    acc_t = COMPUTE_CTYPE[p.dtype]
    params = [f"{acc_t} acc", "long long e"]
    params += [f"const {STORAGE_CTYPE[v.dtype]}* __restrict__ {c}" for v, c in zip(g.extra, extra_c)]
    params += [f"{STORAGE_CTYPE[values[o].dtype]}* __restrict__ {c}" for o, c in zip(graph.outputs, out_c)]
    lines = [f"CA_HD void epilogue({', '.join(params)}) {{",
             f"    const {acc_t} pv = {round_to_storage(p.dtype, 'acc')};"]
    var: dict[str, tuple[str, str]] = {g.anchor.name: ("pv", acc_t)}
    lines += emit_epilogue_chain(graph, g.epilogue, var, g.alias, g.reads,
                                 {v.name: c for v, c in zip(g.extra, extra_c)}, "matmul")
    for o, c in zip(graph.outputs, out_c):
        lines.append(f"    {c}[e] = {store_expr(values[o].dtype, var[g.alias[o]][0])};")
    lines += ["    (void)pv;", "}"]
    return "\n".join(lines)
