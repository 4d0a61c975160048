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

Kernel (SIMT, no tensor cores): a block computes a BM x BN tile of C; it walks K in slices of BK,
staging the slice of A and of B in shared memory (as the compute type, loaded coalesced along
each operand's contiguous dim, zero outside the matrices), and each of its (BM/TM) x (BN/TN)
threads accumulates TM x TN products in registers. A thread's rows are ty, ty + BM/TM, ... and its
columns tx, tx + BN/TN, ...: a warp reads neighbouring shared-memory words (no bank conflicts) and
stores neighbouring outputs. Knobs:
  BM, BN  the block's tile of C;
  BK      the K slice staged per step (more work per __syncthreads, more shared memory);
  TM, TN  each thread's micro-tile (registers: TM*TN accumulators).
"""
from __future__ import annotations

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

# Not an ATen op: canonicalize's form of mm / bmm / addmm / baddbmm (attrs trans_a, trans_b).
MATMUL = "cuda_agent_matmul.default"
SOURCE_OPS = {"mm.default", "bmm.default", "addmm.default", "baddbmm.default"}
FLOATS = ("float32", "float16", "bfloat16", "float64")
VIEW_OPS = {"unsqueeze.default", "squeeze.default", "squeeze.dim", "squeeze.dims", "view.default",
            "reshape.default", "_unsafe_view.default", "alias.default"}

TILE_VALUES = (128, 64, 32, 16)
BK_VALUES = (8, 16, 32)
THREAD_TILE_VALUES = (8, 4, 2, 1)
MAX_THREADS = 1024
MIN_THREADS = 32
MAX_ACCUMULATORS = 64              # TM * TN registers per thread
MAX_STATIC_SHARED = 48 * 1024
MAX_GRID_YZ = 65535
SMS = 132                          # H200
# The default is the first of these (BM, BN, BK, TM, TN) that is legal and gives every SM a block,
# else the legal one with the most blocks: big tiles reuse each loaded element most, small ones
# keep a small product busy.
DEFAULT_PREFERENCE = ((128, 128, 8, 8, 8), (128, 64, 8, 8, 4), (64, 64, 16, 4, 4), (64, 32, 16, 4, 2),
                      (32, 32, 16, 2, 2), (32, 16, 16, 2, 1), (16, 16, 16, 1, 1), (16, 16, 8, 1, 1))


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
    anchors = [n for n in graph.nodes if n.op == MATMUL]
    if len(anchors) != 1:
        raise _fail(graph, f"this group has {len(anchors)} products ({', '.join(graph.ops())})", graph.ops())
    anchor = anchors[0]
    inputs = {v.name: v for v in graph.inputs}
    if not is_matmul(anchor, graph) or any(o.name not in inputs for o in anchor.operands):
        raise _fail(graph, f"the operands of '{anchor.name}' are not two group inputs of one float dtype",
                    [anchor.op])
    product = product_of(anchor, graph)
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
    return (s["BM"] // s["TM"]) * (s["BN"] // s["TN"])


def smem_bytes(p: Product, s: Mapping[str, int]) -> int:
    """The staged slices of A and B, each row padded by one word (see the kernel)."""
    return s["BK"] * (s["BM"] + 1 + s["BN"] + 1) * ITEMSIZE["float64" if p.dtype == "float64" else "float32"]


def blocks(p: Product, s: Mapping[str, int]) -> int:
    return math.ceil(p.m / s["BM"]) * math.ceil(p.n / s["BN"]) * p.batch


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def schedule_spec(p: Product) -> ScheduleSpec:
    knobs = [
        Knob("BM", TILE_VALUES, "rows of the product per block tile"),
        Knob("BN", TILE_VALUES, "columns of the product per block tile"),
        Knob("BK", BK_VALUES, "the K slice staged in shared memory per step"),
        Knob("TM", THREAD_TILE_VALUES, "rows per thread (registers)"),
        Knob("TN", THREAD_TILE_VALUES, "columns per thread (registers)"),
    ]

    def shape(s: Mapping[str, int]) -> str | None:
        if s["TM"] > s["BM"] or s["TN"] > s["BN"]:
            return f"a {s['TM']}x{s['TN']} thread tile does not fit a {s['BM']}x{s['BN']} block tile"
        n = threads(s)
        if not MIN_THREADS <= n <= MAX_THREADS:
            return f"a {s['BM']}x{s['BN']} tile of {s['TM']}x{s['TN']} per thread needs {n} threads " \
                   f"({MIN_THREADS}-{MAX_THREADS})"
        if s["TM"] * s["TN"] > MAX_ACCUMULATORS:
            return f"{s['TM'] * s['TN']} accumulators per thread (at most {MAX_ACCUMULATORS})"
        return None

    def shared(s: Mapping[str, int]) -> str | None:
        if smem_bytes(p, s) > MAX_STATIC_SHARED:
            return f"BK={s['BK']} slices of a {s['BM']}x{s['BN']} tile stage {smem_bytes(p, s)} bytes; static " \
                   f"shared memory is {MAX_STATIC_SHARED} bytes per block"
        return None

    def waste(s: Mapping[str, int]) -> str | None:
        # A tile past twice the matrix (16 at least) computes mostly padding.
        if s["BM"] > max(16, _pow2_at_least(p.m)) or s["BN"] > max(16, _pow2_at_least(p.n)):
            return f"a {s['BM']}x{s['BN']} tile is larger than the {p.m}x{p.n} product needs"
        if s["BK"] > max(8, _pow2_at_least(p.k)):
            return f"BK={s['BK']} is longer than K={p.k} needs"
        return None

    def grid(s: Mapping[str, int]) -> str | None:
        if math.ceil(p.m / s["BM"]) > MAX_GRID_YZ:
            return f"{math.ceil(p.m / s['BM'])} row tiles exceed the grid's y limit"
        return None

    spec = ScheduleSpec(knobs, [shape, shared, waste, grid])
    legal = [dict(zip(("BM", "BN", "BK", "TM", "TN"), c)) for c in DEFAULT_PREFERENCE]
    legal = [s for s in legal if spec.legal(s)]
    if not legal:
        raise CodegenError(f"the matmul family has no legal default schedule for {p}")
    busy = [s for s in legal if blocks(p, s) >= SMS]
    chosen = busy[0] if busy else max(legal, key=lambda s: blocks(p, s))
    first = {k.name: k.values[0] for k in knobs}
    spec.defaults = {k: v for k, v in chosen.items() if v != first[k]}
    return spec


# ---- lowering -------------------------------------------------------------------------------------

def lower_matmul(graph: Graph, kernel: str) -> Lowering:
    """One kernel computing a (batched) matrix product and its pointwise epilogue."""
    g = _analyse(graph)
    p = g.product
    if p.batch > MAX_GRID_YZ:
        raise _fail(graph, f"a batch of {p.batch} products exceeds the grid's z limit ({MAX_GRID_YZ})", [MATMUL])
    if len(set(graph.outputs)) != len(graph.outputs):
        raise _fail(graph, f"the group outputs {graph.outputs} name one value twice (one buffer each)", [MATMUL])
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
                      "block": ["(BM // TM) * (BN // TN)"], "shared_bytes": 0, "args": args}],
        "outputs": list(graph.outputs),
    }
    shape = f"{p.batch} x " if p.batch > 1 else ""
    notes = [f"matmul: {shape}[{p.m} x {p.k}]{'ᵀ' if p.trans_a else ''} @ [{p.k} x {p.n}]{'ᵀ' if p.trans_b else ''} "
             f"{p.dtype}, accumulated in {'fp64' if p.dtype == 'float64' else 'fp32'}"]
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
    load = lambda raw: load_expr(p.dtype, raw)
    return f"""
namespace {ns} {{
typedef {in_t} in_t;      // a stored operand element
typedef {acc_t} acc_t;        // accumulation type
constexpr bool TRANS_A = {flag(p.trans_a)};      // A stored [K, M] (else [M, K])
constexpr bool TRANS_B = {flag(p.trans_b)};      // B stored [N, K] (else [K, N])
constexpr bool A_BATCHED = {flag(p.a_batched)}, B_BATCHED = {flag(p.b_batched)};   // else one matrix for all
constexpr int TX = BN / TN, TY = BM / TM, THREADS = TX * TY;

{epilogue}
}}  // namespace {ns}

extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN))
{kernel}(const {ns}::in_t* __restrict__ A, const {ns}::in_t* __restrict__ B{extra_params}{out_params}, int M, int N, int K) {{
    using namespace {ns};
    // Rows padded by one word: the transposed stores of a slice hit distinct banks.
    __shared__ acc_t As[BK][BM + 1];
    __shared__ acc_t Bs[BK][BN + 1];
    const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
    const long long batch = blockIdx.z;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const in_t* a = A + (A_BATCHED ? batch * (long long)M * K : 0LL);
    const in_t* b = B + (B_BATCHED ? batch * (long long)K * N : 0LL);
    acc_t acc[TM][TN];
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = (acc_t)0;
    for (int k0 = 0; k0 < K; k0 += BK) {{
        // Consecutive threads load consecutive elements of each operand's contiguous dim.
        for (int i = tid; i < BM * BK; i += THREADS) {{
            const int m = TRANS_A ? i % BM : i / BK, k = TRANS_A ? i / BM : i % BK;
            const int gm = m0 + m, gk = k0 + k;
            acc_t v = (acc_t)0;
            if (gm < M && gk < K) v = {load("(TRANS_A ? a[(long long)gk * M + gm] : a[(long long)gm * K + gk])")};
            As[k][m] = v;
        }}
        for (int i = tid; i < BK * BN; i += THREADS) {{
            const int n = TRANS_B ? i / BK : i % BN, k = TRANS_B ? i % BK : i / BN;
            const int gn = n0 + n, gk = k0 + k;
            acc_t v = (acc_t)0;
            if (gn < N && gk < K) v = {load("(TRANS_B ? b[(long long)gn * K + gk] : b[(long long)gk * N + gn])")};
            Bs[k][n] = v;
        }}
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < BK; ++kk) {{
            acc_t ra[TM], rb[TN];
            #pragma unroll
            for (int i = 0; i < TM; ++i) ra[i] = As[kk][ty + i * TY];
            #pragma unroll
            for (int j = 0; j < TN; ++j) rb[j] = Bs[kk][tx + j * TX];
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += ra[i] * rb[j];
        }}
        __syncthreads();
    }}
    #pragma unroll
    for (int i = 0; i < TM; ++i) {{
        const int gm = m0 + ty + i * TY;
        #pragma unroll
        for (int j = 0; j < TN; ++j) {{
            const int gn = n0 + tx + j * TX;
            if (gm < M && gn < N)
                epilogue(acc[i][j], (batch * M + gm) * (long long)N + gn{call_args});
        }}
    }}
}}
"""


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
