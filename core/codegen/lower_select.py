"""The selection family: sort, argsort, topk, kthvalue, median and nanmedian along one dim.

Ops: `sort.default` / `sort.stable` (torch.sort, argsort, msort), `topk.default` (sorted results),
`kthvalue.default`, `median.dim` / `median.default`, `nanmedian.dim` / `nanmedian.default` (the
`.default` forms over the whole tensor, one row). A row is the elements along the op's dim; rows
of up to MAX_ROW elements are taken.

The kernel: each block sorts ROWS rows in shared memory with a bitonic network over rows padded to
P, a power of two. An element is a (key, position) pair. The key is an unsigned integer that orders
as PyTorch compares: floats by value with -0.0 equal to 0.0 and every NaN equal and above +inf (fp16
/ bf16 through float32, exactly); signed integers with the sign bit flipped. A descending order
inverts the key. Pairs order by key, then position, so equal values keep their order: the stable
sort, which is what torch.sort returns for rows longer than 32 and what its topk gathers before
sorting. Pads (position P) sort last. Then each output position reads its pair: values are read
back from the input at the pair's position (so -0.0 and NaN payloads come out as they went in),
indices are the position.

Which position each output reads: sort, every one; topk, the first k (largest: descending); kthvalue,
k - 1; median, (L - 1) / 2, or L - 1 when the row holds a NaN (the last pair is then a NaN, as
torch.median returns); nanmedian, (L - n - 1) / 2 over the n NaNs at the end. Where values tie at the
chosen position, kthvalue and median on CUDA return any of the tied indices (PyTorch warns they are
nondeterministic); here, the one the stable order puts there.

Loads and stores are coalesced: along the row when the dim is the last (B == 1), across the
block's rows otherwise (consecutive rows are consecutive in memory then).

Knobs: BLOCK threads; ROWS rows per block (dynamic shared memory: ROWS * P pairs, at most 200 KB).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from core.codegen.cuda_emit import COMPUTE_CTYPE, PRELUDE, STORAGE_CTYPE, load_expr
from core.codegen.errors import CodegenError
from core.codegen.graph import Graph, Node, Ref
from core.codegen.lower_pointwise import Lowering
from core.codegen.schedule import Knob, ScheduleSpec

SELECT_OPS = {"sort.default", "sort.stable", "topk.default", "kthvalue.default", "median.dim", "median.default",
              "nanmedian.dim", "nanmedian.default"}
MAX_ROW = 16384                      # elements of one row (its pairs fit shared memory with ROWS = 1)
# Dynamic shared memory of one block: above 48 KB the runner opts in (227 KB on sm_90, 163 KB on
# sm_80); a GPU with less rejects such a schedule when its plan resolves.
SHARED_LIMIT = 200 * 1024
FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int64", "int32", "int16", "int8", "uint8")
KNOBS = [
    Knob("BLOCK", (256, 128, 512, 1024, 64, 32), "threads per block"),
    Knob("ROWS", (1, 2, 4, 8, 16, 32, 64), "rows sorted by one block"),
]
# topk with a small k: each thread first keeps the best KP (k rounded up to a power of two) of the
# elements it walks, in registers; the block then sorts only BLOCK * KP candidates.
LOCAL_KNOB = Knob("LOCAL", (0, 1), "topk: 1 = per-thread candidates, then a sort of BLOCK * KP; 0 = sort the row")
LOCAL_MAX_K = 16


@dataclass(frozen=True)
class _Geometry:
    """The rows of a selection: A blocks of L x B, row r = (a, b) at a * L * B + b, stride B."""

    length: int          # L: elements per row
    inner: int           # B: the stride between a row's elements
    rows: int            # A * B
    padded: int          # P: L rounded up to a power of two
    key_bytes: int       # 4, or 8 for 64-bit inputs

    def shared_bytes(self, rows_per_block: int) -> int:
        return rows_per_block * self.padded * (self.key_bytes + 4)

    def fits(self, rows_per_block: int) -> bool:
        return self.shared_bytes(rows_per_block) <= SHARED_LIMIT


def _geometry(node: Node, src: Any) -> _Geometry | None:
    shape = list(src.shape)
    if node.op.endswith("median.default"):
        length, inner, rows = math.prod(shape), 1, 1
    else:
        rank = len(shape)
        if rank == 0:
            length, inner, rows = 1, 1, 1
        else:
            d = node.attrs.get("dim", -1) % rank
            length, inner = shape[d], math.prod(shape[d + 1:])
            rows = math.prod(shape[:d]) * inner
    if not 1 <= length <= MAX_ROW or rows < 1:
        return None
    key_bytes = 8 if src.dtype in ("float64", "int64") else 4
    return _Geometry(length, inner, rows, 1 << (length - 1).bit_length(), key_bytes)


def is_select(node: Node, graph: Graph) -> bool:
    """True when this node is a selection the family lowers (the group's anchor)."""
    if node.op not in SELECT_OPS or not node.operands or not isinstance(node.operands[0], Ref):
        return False
    src = graph.value(node.operands[0].name)
    if src.dtype not in FLOATS + INTS:
        return False
    if node.op == "topk.default" and not node.attrs.get("sorted", True):
        return False              # PyTorch leaves the order unspecified (CUDA's differs from the CPU's)
    if node.base == "nanmedian" and src.dtype not in FLOATS:
        return False
    return _geometry(node, src) is not None


def describe_rows(geo: _Geometry) -> str:
    return f"{geo.rows} rows of {geo.length}" + (f" (stride {geo.inner})" if geo.inner > 1 else "")


def lower_select(graph: Graph, kernel: str) -> Lowering:
    """One kernel for a graph of one selection over a graph input and the getitems of its results."""
    anchors = [n for n in graph.nodes if n.op in SELECT_OPS]
    if len(anchors) != 1 or not is_select(anchors[0], graph):
        raise CodegenError(f"Task '{graph.task}': the selection family lowers one sort / topk / kthvalue / "
                           f"median of a graph input; this graph has {', '.join(graph.ops())}.",
                           task=graph.task, ops=graph.ops())
    node = anchors[0]
    src = graph.value(node.operands[0].name)
    geo = _geometry(node, src)
    assert geo is not None
    values = {v.name: v for v in graph.inputs}
    values.update({n.name: n for n in graph.nodes})
    roles: dict[str, str] = {}
    for n in graph.nodes:
        if n.op == "getitem" and n.operands and isinstance(n.operands[0], Ref) and n.operands[0].name == node.name:
            roles[n.name] = ("values", "indices")[n.attrs.get("index", 0)]
    roles[node.name] = "values"          # median.default: the node is its one result
    if len(set(graph.outputs)) != len(graph.outputs) or any(o not in roles for o in graph.outputs) or \
            any(n.op not in SELECT_OPS and n.op != "getitem" for n in graph.nodes):
        raise CodegenError(f"Task '{graph.task}': the selection family writes the values and / or indices of "
                           f"its op, without elementwise ops around it; this group has {', '.join(graph.ops())} "
                           f"and outputs {graph.outputs}.", task=graph.task, ops=graph.ops())
    outputs = list(graph.outputs)
    count = {"sort": geo.length, "topk": node.attrs.get("k", 1)}.get(node.base, 1)
    local_kp = 1 << (count - 1).bit_length() if node.base == "topk" and count <= LOCAL_MAX_K else 0
    source = PRELUDE + _emit(kernel, node, src.dtype, geo, count, [roles[o] for o in outputs], local_kp)
    pair_bytes = geo.key_bytes + 4

    def shared_fits(s: Any) -> str | None:
        if s.get("LOCAL"):
            return None if s["BLOCK"] * local_kp * pair_bytes <= SHARED_LIMIT else \
                f"BLOCK={s['BLOCK']} threads' {local_kp} candidates need more than {SHARED_LIMIT} bytes"
        if not geo.fits(s["ROWS"]):
            return (f"ROWS={s['ROWS']} rows of {geo.padded} pairs need "
                    f"{geo.shared_bytes(s['ROWS'])} bytes of shared memory (at most {SHARED_LIMIT})")
        return None

    def local_alone(s: Any) -> str | None:
        if s.get("LOCAL") and s["ROWS"] != 1:
            return "LOCAL=1 takes one row per block (ROWS=1)"
        if s.get("LOCAL") and s["BLOCK"] * local_kp >= geo.padded:
            return f"LOCAL=1 with BLOCK={s['BLOCK']} keeps as many candidates as the row has ({geo.length})"
        return None

    def rows_used(s: Any) -> str | None:
        if s["ROWS"] > 1 and s["ROWS"] // 2 >= geo.rows:
            return f"ROWS={s['ROWS']} rows per block for {geo.rows} rows"
        return None

    def threads_used(s: Any) -> str | None:
        if not s.get("LOCAL") and s["BLOCK"] > 32 and s["BLOCK"] // 2 >= max(s["ROWS"] * geo.padded // 2, 1):
            return f"BLOCK={s['BLOCK']} threads for {s['ROWS'] * geo.padded // 2} compare-exchanges per step"
        return None

    # The default: enough rows per block for 512 pairs (small rows would leave threads idle), and
    # for a strided dim at least 8 rows, whose elements are consecutive in memory (one 32-byte sector
    # of fp32 per load instead of one element); threads for half the pairs, within the knobs' values.
    rows = 1
    while rows < 64 and (rows * geo.padded < 512 or rows < min(geo.inner, 8)) and rows < geo.rows \
            and geo.fits(rows * 2):
        rows *= 2
    block = 32
    while block < 256 and block < rows * geo.padded // 2:
        block *= 2
    knobs, defaults = list(KNOBS), {"BLOCK": block, "ROWS": rows}
    if local_kp:
        knobs.append(LOCAL_KNOB)
        # Per-thread candidates by default where each of 256 threads walks at least 4 of them.
        defaults.update(LOCAL=int(geo.length >= 4 * 256 * local_kp))
        if defaults["LOCAL"]:
            defaults.update(BLOCK=256, ROWS=1)
    spec = ScheduleSpec(knobs, [shared_fits, local_alone, rows_used, threads_used], defaults)
    shared = f"ROWS * {geo.shared_bytes(1)}"
    if local_kp:
        shared = f"BLOCK * {local_kp * pair_bytes} if LOCAL == 1 else {shared}"
    program = {
        "format": "cuda-agent/program@1", "name": kernel, "source": source,
        "tunables": spec.tunables(), "schedule": spec.default(),
        "buffers": [{"name": o, "shape": [int(d) for d in values[o].shape], "dtype": values[o].dtype}
                    for o in outputs],
        "launches": [{"kernel": kernel, "grid": [f"cdiv({geo.rows}, ROWS)"], "block": ["BLOCK"],
                      "shared_bytes": shared, "args": [src.name] + outputs}],
        "outputs": outputs,
    }
    notes = [f"selection: {node.op} of '{src.name}' {src.dtype}{list(src.shape)}: {describe_rows(geo)}, "
             f"bitonic sort of {geo.padded} per row in shared memory; outputs "
             f"{', '.join(f'{o} ({roles[o]})' for o in outputs)}"]
    return Lowering(program, spec, notes)


def _key_code(dtype: str) -> tuple[str, str]:
    """The key type, and the body of `key_of(v)` (v in the compute type) that orders as PyTorch does."""
    if dtype == "float64":
        return "unsigned long long", """
    if (v != v) return 0xffffffffffffffffULL;                 // every NaN: above +inf
    if (v == 0.0) v = 0.0;                                     // -0.0 equals 0.0
#ifdef __CUDA_ARCH__
    const unsigned long long u = (unsigned long long)__double_as_longlong(v);
#else
    unsigned long long u; memcpy(&u, &v, 8);
#endif
    return (u >> 63) ? ~u : (u | 0x8000000000000000ULL);"""
    if dtype in FLOATS:
        return "unsigned", """
    if (v != v) return 0xffffffffu;                            // every NaN: above +inf
    if (v == 0.0f) v = 0.0f;                                   // -0.0 equals 0.0
    const unsigned u = ca_f2u(v);
    return (u >> 31) ? ~u : (u | 0x80000000u);"""
    if dtype == "int64":
        return "unsigned long long", "\n    return (unsigned long long)v ^ 0x8000000000000000ULL;"
    if dtype == "uint8":
        return "unsigned", "\n    return (unsigned)v;"
    return "unsigned", "\n    return (unsigned)(int)v ^ 0x80000000u;"


def _emit(kernel: str, node: Node, dtype: str, geo: _Geometry, count: int, roles: list[str], local_kp: int) -> str:
    st, ct = STORAGE_CTYPE[dtype], COMPUTE_CTYPE[dtype]
    key_t, key_body = _key_code(dtype)
    ns = f"{kernel}_sel"
    descending = bool(node.attrs.get("descending") if node.base == "sort" else
                      node.attrs.get("largest", True) if node.base == "topk" else False)
    L, B, R, P = geo.length, geo.inner, geo.rows, geo.padded
    nan_key = "0xffffffffffffffffULL" if key_t == "unsigned long long" else "0xffffffffu"
    addr = (lambda r, j: f"({r}) * {L}LL + ({j})") if B == 1 else \
        (lambda r, j: f"(({r}) / {B}LL) * {L * B}LL + (long long)({j}) * {B}LL + ({r}) % {B}LL")
    out_addr = (lambda r, p: f"({r}) * {count}LL + ({p})") if B == 1 else \
        (lambda r, p: f"(({r}) / {B}LL) * {count * B}LL + (long long)({p}) * {B}LL + ({r}) % {B}LL")
    # Element e of the block: along the row when B == 1, across the block's rows otherwise.
    split = (lambda e, n: (f"{e} / {n}", f"{e} % {n}")) if B == 1 else (lambda e, n: (f"{e} % ROWS", f"{e} / ROWS"))
    g_in, j_in = split("e", P)
    g_out, p_out = split("e", count)
    invert = "\n            key = ~key;                              // descending" if descending else ""
    element = "x[" + addr("r", "j") + "]"
    key_load = f"{ns}::key_of({load_expr(dtype, element)})"
    whole = f"""    for (int e = threadIdx.x; e < ROWS * {P}; e += BLOCK) {{
        const int g = {g_in}, j = {j_in};
        const long long r = row0 + g;
        {ns}::key_t key = ({ns}::key_t){nan_key};      // a pad: after every element
        int at = {P};
        if (j < {L} && r < {R}) {{
            key = {key_load};{invert}
            at = j;
        }}
        keys[g * {P} + j] = key;
        pos[g * {P} + j] = at;
    }}"""
    if local_kp:
        # Each thread's best KP of the elements it walks, kept sorted in registers (the unrolled
        # insertion indexes the arrays with constants only), then written as its KP pairs.
        seg = f"#if LOCAL\n#define SEG (BLOCK * {local_kp})\n#else\n#define SEG {P}\n#endif"
        load = f"""#if LOCAL
    {{
        const long long r = row0;
        {ns}::key_t bk[{local_kp}];
        int bp[{local_kp}];
        #pragma unroll
        for (int q = 0; q < {local_kp}; ++q) {{ bk[q] = ({ns}::key_t){nan_key}; bp[q] = {P}; }}
        for (int j = threadIdx.x; j < {L}; j += BLOCK) {{
            {ns}::key_t key = {key_load};{invert}
            #pragma unroll
            for (int q = {local_kp - 1}; q >= 0; --q) {{
                const int prev = q > 0 ? q - 1 : 0;
                const bool here = key < bk[q] || (key == bk[q] && j < bp[q]);
                const bool before = q > 0 && (key < bk[prev] || (key == bk[prev] && j < bp[prev]));
                if (here) {{ bk[q] = before ? bk[prev] : key; bp[q] = before ? bp[prev] : j; }}
            }}
        }}
        #pragma unroll
        for (int q = 0; q < {local_kp}; ++q) {{
            keys[threadIdx.x * {local_kp} + q] = bk[q];
            pos[threadIdx.x * {local_kp} + q] = bp[q];
        }}
    }}
#else
{whole}
#endif"""
    else:
        seg, load = f"#define SEG {P}", whole
    if node.base in ("sort", "topk"):
        position = "p"
    elif node.base == "kthvalue":
        position = str(node.attrs.get("k", 1) - 1)
    elif node.base == "median" and dtype in FLOATS:     # a NaN in the row sorts last: the median is NaN
        position = f"keys[g * {P} + {L - 1}] == {nan_key} ? {L - 1} : {(L - 1) // 2}"
    elif node.base == "median":
        position = str((L - 1) // 2)
    else:                                               # nanmedian: the middle of the pairs before the NaNs
        position = f"({L} - {ns}::nans(keys + g * {P}) - 1) / 2"
    params = [f"const {st}* __restrict__ x"]
    stores = []
    for k, role in enumerate(roles):
        if role == "values":
            params.append(f"{st}* __restrict__ y{k}")
            stores.append(f"y{k}[{out_addr('r', 'p')}] = x[{addr('r', 'at')}];")
        else:
            params.append(f"long long* __restrict__ y{k}")
            stores.append(f"y{k}[{out_addr('r', 'p')}] = (long long)at;")
    store_lines = "\n        ".join(stores)
    return f"""
// ==== selection: {node.op}, {describe_rows(geo)} ====
#ifndef CA_DYNAMIC_SMEM
#define CA_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif
namespace {ns} {{
typedef {key_t} key_t;
// A key that orders as PyTorch compares the values.
CA_HD key_t key_of({ct} v) {{{key_body}
}}
// The NaNs of a sorted row (its last pairs, before the pads): a binary search for the first.
CA_HD int nans(const key_t* row) {{
    int lo = 0, hi = {L};
    while (lo < hi) {{
        const int mid = (lo + hi) / 2;
        if (row[mid] == ({key_t}){nan_key}) hi = mid; else lo = mid + 1;
    }}
    return {L} - lo;
}}
}}  // namespace {ns}

{seg}                    // pairs of one row in shared memory
extern "C" __global__ void __launch_bounds__(BLOCK)
{kernel}({", ".join(params)})
{{
    CA_DYNAMIC_SMEM(ca_smem);                          // ROWS * SEG keys, then ROWS * SEG positions
    {ns}::key_t* const keys = reinterpret_cast<{ns}::key_t*>(ca_smem);
    int* const pos = reinterpret_cast<int*>(ca_smem + ROWS * SEG * sizeof({ns}::key_t));
    const long long row0 = (long long)blockIdx.x * ROWS;
{load}
    __syncthreads();
    // Bitonic sort of each row's SEG pairs by (key, position): runs of k, merged by steps of j.
    for (int k = 2; k <= SEG; k <<= 1) {{
        for (int j = k >> 1; j > 0; j >>= 1) {{
            for (int t = threadIdx.x; t < ROWS * SEG / 2; t += BLOCK) {{
                const int i = 2 * j * (t / j) + t % j, l = i + j;
                const bool up = k == SEG || (i & k) == 0;      // the last merge: every row ascending
                const {ns}::key_t a = keys[i], b = keys[l];
                const int pa = pos[i], pb = pos[l];
                if ((a > b || (a == b && pa > pb)) == up) {{
                    keys[i] = b; keys[l] = a;
                    pos[i] = pb; pos[l] = pa;
                }}
            }}
            __syncthreads();
        }}
    }}
    for (int e = threadIdx.x; e < ROWS * {count}; e += BLOCK) {{
        const int g = {g_out}, p = {p_out};
        const long long r = row0 + g;
        if (r >= {R}) continue;
        const int at = pos[g * SEG + ({position})];
        {store_lines}
    }}
}}
#undef SEG
"""
