"""The row-reduction family: one reduction or softmax over the last, contiguous dim of an input.

Ops: sum.dim_IntList, mean.dim, amax, amin (reduce the last dim, keepdim or not), _softmax and
_log_softmax over the last dim. A row is reduced either by a whole block (ROW_MODE=0: BLOCK
threads stride over the columns, warp shuffles then shared memory) or by one warp
(ROW_MODE=1: BLOCK/32 rows per block, shuffles only). Math in fp32 for fp16/bf16/fp32 inputs;
the result is stored in the op's dtype.
"""
from __future__ import annotations

from typing import Any

from core.codegen.cuda_emit import PRELUDE, STORAGE_CTYPE, load_expr, store_expr
from core.codegen.errors import CodegenError
from core.codegen.graph import Graph, Node, Ref
from core.codegen.lower_pointwise import Lowering
from core.codegen.schedule import Knob, ScheduleSpec

KNOBS = [
    Knob("BLOCK", (256, 32, 64, 128, 512, 1024), "threads per block (a multiple of 32)"),
    Knob("ROW_MODE", (0, 1), "0: one block per row; 1: one warp per row, BLOCK/32 rows per block"),
]
REDUCTIONS = {"sum": "sum", "mean": "sum", "amax": "max", "amin": "min"}
SOFTMAXES = {"_softmax", "_log_softmax"}
FLOATS = ("float32", "float16", "bfloat16")


def _last_dim(dims: Any, rank: int) -> bool:
    if isinstance(dims, int):
        dims = [dims]
    return isinstance(dims, list) and len(dims) == 1 and rank > 0 and dims[0] % rank == rank - 1


def is_rowreduce(node: Node, graph: Graph) -> bool:
    """True when this node alone is a row reduction / softmax over the last dim of a float input."""
    if not node.operands or not isinstance(node.operands[0], Ref):
        return False
    src = graph.value(node.operands[0].name)
    rank = len(src.shape)
    if src.dtype not in FLOATS or node.dtype not in FLOATS:
        return False
    if node.op in ("sum.dim_IntList", "mean.dim"):
        return node.attrs.get("dtype") is None and _last_dim(node.attrs.get("dim"), rank)
    if node.op in ("amax.default", "amin.default"):
        return _last_dim(node.attrs.get("dim"), rank)
    if node.base in SOFTMAXES and node.op.endswith(".default"):
        return _last_dim(node.attrs.get("dim"), rank)
    return False


def lower_rowreduce(graph: Graph, kernel: str) -> Lowering:
    """One kernel for a graph that is exactly one row reduction of a graph input."""
    if len(graph.nodes) != 1 or graph.outputs != [graph.nodes[0].name] or \
            not is_rowreduce(graph.nodes[0], graph):
        raise CodegenError(f"Task '{graph.task}': the row-reduction family lowers a graph of one "
                           f"reduction or softmax over the last dim of an input; this graph has "
                           f"{', '.join(graph.ops())}.", task=graph.task, ops=graph.ops())
    node = graph.nodes[0]
    src = graph.value(node.operands[0].name)
    rank = len(src.shape)
    x = src.name
    out = "out" if x != "out" else "out_"
    softmax = node.base in SOFTMAXES
    if softmax:
        out_shape = [f"{x}.shape[{d}]" for d in range(rank)]
    else:
        out_shape = [f"{x}.shape[{d}]" for d in range(rank - 1)]
        if node.attrs.get("keepdim"):
            out_shape.append("1")
    source = PRELUDE + _emit(kernel, node, src.dtype)
    rows = f"{x}.numel // {x}.shape[-1]"
    program = {
        "format": "cuda-agent/program@1", "name": kernel, "source": source,
        "tunables": {k.name: list(k.values) for k in KNOBS},
        "schedule": {k.name: k.values[0] for k in KNOBS},
        "buffers": [{"name": out, "shape": out_shape, "dtype": node.dtype}],
        "launches": [{"kernel": kernel,
                      "grid": [f"{rows} if ROW_MODE == 0 else cdiv({rows}, BLOCK // 32)"],
                      "block": ["BLOCK"], "shared_bytes": 0,
                      "args": [x, out, f"int64({rows})", f"int64({x}.shape[-1])"]}],
        "outputs": [out],
    }
    n_rows = 1
    for s in src.shape[:-1]:
        n_rows *= s
    cols = src.shape[-1] if src.shape else 1

    def idle_threads(s: Any) -> str | None:
        if s["ROW_MODE"] == 0 and s["BLOCK"] > max(cols, 32) and s["BLOCK"] != KNOBS[0].values[0]:
            return f"BLOCK={s['BLOCK']} threads for rows of {cols} columns leaves threads idle"
        return None

    def idle_warps(s: Any) -> str | None:
        if s["ROW_MODE"] == 1 and s["BLOCK"] // 32 > n_rows:
            return f"BLOCK={s['BLOCK']} gives {s['BLOCK'] // 32} warps for only {n_rows} rows"
        return None

    spec = ScheduleSpec(list(KNOBS), [idle_threads, idle_warps])
    notes = [f"row reduction: {node.op} over the last dim of '{x}' {src.dtype}{list(src.shape)}: "
             f"{n_rows} rows of {cols}"]
    return Lowering(program, spec, notes)


def _emit(kernel: str, node: Node, in_dtype: str) -> str:
    base = node.base
    combine = REDUCTIONS.get(base, "max")
    st_in, st_out = STORAGE_CTYPE[in_dtype], STORAGE_CTYPE[node.dtype]
    ld = load_expr(in_dtype, "row[c]")
    ident = {"sum": "0.0f", "max": "ca_i2f((int)0xff800000u)", "min": "ca_i2f(0x7f800000)"}
    comb = {"sum": "a + b", "max": "nan_max(a, b)", "min": "nan_min(a, b)"}
    head = f"""
CA_HD float rr_sum(float a, float b) {{ return {comb['sum']}; }}
CA_HD float rr_max(float a, float b) {{ return {comb['max']}; }}
CA_HD float rr_min(float a, float b) {{ return {comb['min']}; }}
// Reduce across the row's threads: a warp (ROW_MODE 1) or the whole block (ROW_MODE 0).
template <float (*F)(float, float)>
__device__ __forceinline__ float row_reduce(float v, float identity, float* smem) {{
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = F(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (ROW_MODE == 1) return v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    if (warp == 0) {{
        v = lane < BLOCK / 32 ? smem[lane] : identity;
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = F(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) smem[0] = v;
    }}
    __syncthreads();
    v = smem[0];
    __syncthreads();  // smem is reused by the next reduction
    return v;
}}

extern "C" __global__ void __launch_bounds__(BLOCK)
{kernel}(const {st_in}* __restrict__ x, {st_out}* __restrict__ y, long long rows, long long cols)
{{
    __shared__ float smem[32];
    const int lanes = ROW_MODE == 1 ? 32 : BLOCK;
    const int lane = ROW_MODE == 1 ? (threadIdx.x & 31) : threadIdx.x;
    const long long r = ROW_MODE == 1 ? (long long)blockIdx.x * (BLOCK / 32) + (threadIdx.x >> 5)
                                      : (long long)blockIdx.x;
    // Only ROW_MODE 1 can have r >= rows, and its warps never wait for each other: leaving is safe.
    if (r >= rows) return;
    const {st_in}* row = x + r * cols;
"""
    if base in REDUCTIONS:
        fn = f"rr_{combine}"
        result = "acc / (float)cols" if base == "mean" else "acc"
        if combine == "sum":
            # Each thread adds up to cols / 32 values in a row; a double accumulator keeps that
            # serial sum as accurate as a tree (free here: the loop waits on memory, not on adds).
            loop = f"""    double part = 0.0;
    for (long long c = lane; c < cols; c += lanes) part += (double)({ld});
    float acc = (float)part;"""
        else:
            loop = f"""    float acc = {ident[combine]};
    for (long long c = lane; c < cols; c += lanes) acc = {fn}(acc, {ld});"""
        body = f"""{loop}
    acc = row_reduce<{fn}>(acc, {ident[combine]}, smem);
    if (lane == 0) y[r] = {store_expr(node.dtype, result)};
}}
"""
    else:
        out_val = "v - m - logf(s)" if base == "_log_softmax" else "expf(v - m) * inv"
        body = f"""    float m = {ident['max']};
    for (long long c = lane; c < cols; c += lanes) m = rr_max(m, {ld});
    m = row_reduce<rr_max>(m, {ident['max']}, smem);
    float s = 0.0f;
    for (long long c = lane; c < cols; c += lanes) s += expf({ld} - m);
    s = row_reduce<rr_sum>(s, 0.0f, smem);
    const float inv = 1.0f / s;
    {st_out}* out = y + r * cols;
    for (long long c = lane; c < cols; c += lanes) {{
        const float v = {ld};
        out[c] = {store_expr(node.dtype, out_val)};
    }}
}}
"""
    return head + body
