"""The selection family: sort, argsort, topk, kthvalue, median and nanmedian along one dim.

Ops: `sort.default` / `sort.stable` (torch.sort, argsort, msort), `topk.default` (sorted results),
`kthvalue.default`, `median.dim` / `median.default`, `nanmedian.dim` / `nanmedian.default` (the
`.default` forms over the whole tensor, one row). A row is the elements along the op's dim; rows
of up to LONG_MAX_ROW elements are taken (longer than MAX_ROW: sorted in chunks, then merged).

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

Rows longer than MAX_ROW (up to LONG_MAX_ROW): sort and topk take chunks of CHUNK sorted as above
(topk of at most LOCAL_MAX_K: each chunk's first k from per-thread candidates), then merge passes
through global memory (`_lower_long`, `_emit_long`; knobs BLOCK and CHUNK). kthvalue, median and
nanmedian need one pair: a radix select over the key's bytes finds its key and its place among equal
keys, then the position (`_lower_radix`, `_emit_radix`; knobs BLOCK and SEG). Both give the pair the
stable order puts at the rank, as the short path does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from core.codegen.cuda_emit import COMPUTE_CTYPE, PRELUDE, STORAGE_CTYPE, load_expr
from core.codegen.errors import CodegenError
from core.codegen.graph import Graph, Node, Ref
from core.codegen.lower_pointwise import Lowering
from core.codegen.schedule import Knob, ScheduleSpec

SELECT_OPS = {"sort.default", "sort.stable", "topk.default", "kthvalue.default", "median.dim", "median.default",
              "nanmedian.dim", "nanmedian.default"}
MAX_ROW = 16384                      # elements of one row (its pairs fit shared memory with ROWS = 1)
# Longer rows (up to LONG_MAX_ROW): sorted in chunks in shared memory, then merged in global memory
# (kthvalue / median / nanmedian: a radix select).
LONG_MAX_ROW = 1 << 24
MERGE_TILE_MAX = 4096                 # pairs one block of a merge pass takes (divides every 2 * run width)
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

    @property
    def long(self) -> bool:
        """Rows too long for one block's shared memory: chunks sorted, then merged in global memory."""
        return self.length > MAX_ROW

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
    if not 1 <= length <= LONG_MAX_ROW or rows < 1:
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
    if geo.long and node.base in ("kthvalue", "median", "nanmedian"):
        return _lower_radix(graph, kernel, node, src, geo, outputs, [roles[o] for o in outputs])
    if geo.long:
        return _lower_long(graph, kernel, node, src, geo, outputs, [roles[o] for o in outputs], count)
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
        # Per-thread candidates by default where each of 256 threads walks at least 4 of them, or each
        # of 128 at least 2; 128 first where 1024 rows or more fill the GPU anyway (on an H100, 4096
        # rows of 4096 with k = 16 took 525 us against 1125 us sorted whole; 1024 rows of 16384 with
        # k = 8 131 us at 128 threads, 181 at 256; 16384 rows of 1000 with k = 1 111 us, sorted 902).
        for threads, walks in ((128, 2), (256, 4)) if geo.rows >= 1024 else ((256, 4), (128, 2)):
            if geo.length >= walks * threads * local_kp:
                defaults.update(LOCAL=1, BLOCK=threads, ROWS=1)
                break
        else:
            defaults.update(LOCAL=0)
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


LONG_KNOBS = [
    Knob("BLOCK", (256, 512, 128, 1024, 64), "threads per block (all three kernels)"),
    Knob("CHUNK", (8192, 16384, 4096, 2048), "elements of a row one block sorts in shared memory"),
]
# topk of long rows, k <= LOCAL_MAX_K: a chunk is walked by per-thread candidates, not held in shared memory.
LONG_LOCAL_CHUNK = Knob("CHUNK", (16384, 32768, 65536, 8192, 4096), "elements of a row one block takes the first k of")


def _scratch_namer(graph: Graph, reserved: set[str]) -> Callable[[str], str]:
    """Names for scratch buffers that take no name of the graph's values or constants, nor `reserved`
    (the knobs, which the source #defines): a clash gets underscores in front."""
    taken = {v.name for v in graph.inputs} | {n.name for n in graph.nodes} | set(graph.constants) | reserved

    def scratch(name: str) -> str:
        while name in taken:
            name = "_" + name
        taken.add(name)
        return name
    return scratch


def _lower_long(graph: Graph, kernel: str, node: Node, src: Any, geo: _Geometry, outputs: list[str],
                roles: list[str], count: int) -> Lowering:
    """Rows longer than MAX_ROW: three kernels (see `_emit_long`)."""
    values = {v.name: v for v in graph.inputs}
    values.update({n.name: n for n in graph.nodes})
    pair_bytes = geo.key_bytes + 4
    scratch = _scratch_namer(graph, {"BLOCK", "CHUNK"})
    keys, pos = scratch(f"{kernel}_keys"), scratch(f"{kernel}_pos")
    # topk of a few: each chunk's first k from per-thread candidates (the chunk is not sorted whole).
    local_kp = 1 << (count - 1).bit_length() if node.base == "topk" and count <= LOCAL_MAX_K else 0
    chunk_knob = LONG_LOCAL_CHUNK if local_kp else LONG_KNOBS[1]

    def shared_fits(s: Any) -> str | None:
        pairs = s["BLOCK"] * local_kp if local_kp else s["CHUNK"]
        need = pairs * pair_bytes
        return None if need <= SHARED_LIMIT else f"{pairs} pairs (BLOCK={s['BLOCK']}, CHUNK={s['CHUNK']}) need " \
                                                  f"{need} bytes of shared memory (at most {SHARED_LIMIT})"

    def fewer_candidates(s: Any) -> str | None:
        if local_kp and s["BLOCK"] * local_kp * 2 > s["CHUNK"]:
            return f"BLOCK={s['BLOCK']} threads' {local_kp} candidates are more than half of CHUNK={s['CHUNK']}"
        return None

    defaults = {"BLOCK": 128, "CHUNK": 16384} if local_kp else {"BLOCK": 256, "CHUNK": 8192}
    spec = ScheduleSpec([LONG_KNOBS[0], chunk_knob], [shared_fits, fewer_candidates], defaults)
    L, R = geo.length, geo.rows
    smallest = min(chunk_knob.values)
    passes = (-(-L // smallest) - 1).bit_length()           # merges of runs of the smallest CHUNK
    chunk_shared = f"BLOCK * {local_kp * pair_bytes}" if local_kp else f"CHUNK * {pair_bytes}"
    launches = [{"kernel": f"{kernel}_chunks", "grid": [f"{R} * cdiv({L}, CHUNK)"], "block": ["BLOCK"],
                 "shared_bytes": chunk_shared, "args": [src.name, keys, pos]}]
    # A pass a larger CHUNK does not need is launched as one block that returns at once.
    tile = f"min(BLOCK * 4, {MERGE_TILE_MAX})"
    launches += [{"kernel": f"{kernel}_merge", "grid": [f"{R} * cdiv({L}, {tile}) if CHUNK * {1 << p} < {L} else 1"],
                  "block": ["BLOCK"], "shared_bytes": f"{tile} * {pair_bytes}", "args": [keys, pos, f"int32({p})"]}
                 for p in range(passes)]
    launches.append({"kernel": kernel, "grid": [f"cdiv({R * count}, BLOCK)"], "block": ["BLOCK"], "shared_bytes": 0,
                     "args": [src.name, keys, pos] + outputs})
    key_dtype = "int64" if geo.key_bytes == 8 else "int32"
    program = {
        "format": "cuda-agent/program@1", "name": kernel,
        "source": PRELUDE + _emit_long(kernel, node, src.dtype, geo, count, roles, local_kp),
        "tunables": spec.tunables(), "schedule": spec.default(),
        "buffers": [{"name": o, "shape": [int(d) for d in values[o].shape], "dtype": values[o].dtype} for o in outputs]
        + [{"name": keys, "shape": [2, R, L], "dtype": key_dtype}, {"name": pos, "shape": [2, R, L], "dtype": "int32"}],
        "launches": launches,
        "outputs": outputs,
    }
    chunked = f"each CHUNK's first {count} from {local_kp} candidates per thread" if local_kp else \
        "chunks of CHUNK sorted in shared memory"
    notes = [f"selection: {node.op} of '{src.name}' {src.dtype}{list(src.shape)}: {describe_rows(geo)}, "
             f"longer than {MAX_ROW}: {chunked}, then up to {passes} merge passes "
             f"in global memory; outputs {', '.join(f'{o} ({r})' for o, r in zip(outputs, roles))}"]
    return Lowering(program, spec, notes)


RADIX_KNOBS = [
    Knob("BLOCK", (256, 512, 128, 1024), "threads per block"),
    Knob("SEG", (16384, 8192, 32768, 65536, 4096), "elements of a row one block counts"),
]
RADIX_BITS = 8                        # bits of the key each counting pass settles: 256 bins


def _lower_radix(graph: Graph, kernel: str, node: Node, src: Any, geo: _Geometry, outputs: list[str],
                 roles: list[str]) -> Lowering:
    """kthvalue / median / nanmedian of rows longer than MAX_ROW: a radix select (see `_emit_radix`)."""
    values = {v.name: v for v in graph.inputs}
    values.update({n.name: n for n in graph.nodes})
    scratch = _scratch_namer(graph, {"BLOCK", "SEG"})
    prefix, rank, work, counts = (scratch(f"{kernel}_{n}") for n in ("prefix", "rank", "work", "counts"))
    L, R = geo.length, geo.rows
    key_bits = 8 * geo.key_bytes
    passes = key_bits // RADIX_BITS
    segs_max = -(-L // min(RADIX_KNOBS[1].values))
    spec = ScheduleSpec(list(RADIX_KNOBS), [], {"BLOCK": 256, "SEG": 16384})
    grid = [f"{R} * cdiv({L}, SEG)"]
    launches = [{"kernel": f"{kernel}_count", "grid": grid, "block": ["BLOCK"], "shared_bytes": 0,
                 "args": [src.name, prefix, rank, work, f"int32({p})"]} for p in range(passes)]
    launches.append({"kernel": f"{kernel}_find", "grid": grid, "block": ["BLOCK"], "shared_bytes": 0,
                     "args": [src.name, prefix, rank, work, counts] + outputs})
    program = {
        "format": "cuda-agent/program@1", "name": kernel,
        "source": PRELUDE + _emit_radix(kernel, node, src.dtype, geo, roles, segs_max),
        "tunables": spec.tunables(), "schedule": spec.default(),
        "buffers": [{"name": o, "shape": [int(d) for d in values[o].shape], "dtype": values[o].dtype} for o in outputs]
        + [{"name": prefix, "shape": [R], "dtype": "int64" if geo.key_bytes == 8 else "int32"},
           {"name": rank, "shape": [R], "dtype": "int32"},
           {"name": work, "shape": [R, RADIX_WORK], "dtype": "int32", "zeroed": True},
           {"name": counts, "shape": [R, segs_max], "dtype": "int32"}],
        "launches": launches,
        "outputs": outputs,
    }
    notes = [f"selection: {node.op} of '{src.name}' {src.dtype}{list(src.shape)}: {describe_rows(geo)}, "
             f"longer than {MAX_ROW}: a radix select, {passes} counting passes of {RADIX_BITS} bits, then one "
             f"that finds the position; outputs {', '.join(f'{o} ({r})' for o, r in zip(outputs, roles))}"]
    return Lowering(program, spec, notes)


RADIX_WORK = (1 << RADIX_BITS) + 2    # per row: the bins, the blocks that have finished, the NaNs


def _rank(node: Node, dtype: str, length: int) -> str:
    """The rank (in the stable order) of the pair kthvalue / median / nanmedian returns; `nans` is the
    row's NaN count (the same picks as `_position` makes in a sorted row)."""
    L = length
    if node.base == "kthvalue":
        return str(node.attrs.get("k", 1) - 1)
    if node.base == "median" and dtype in FLOATS:       # a NaN in the row: the last pair, a NaN
        return f"nans ? {L - 1}u : {(L - 1) // 2}u"
    if node.base == "median":
        return f"{(L - 1) // 2}u"
    return f"(unsigned)(({L} - (int)nans - 1) / 2)"     # nanmedian: the middle of the pairs before the NaNs


def _locate(n: str, count, target: str, found: str, rest: str) -> str:
    """Block-wide: the first i < n at which the running sum of count(i) passes `target` (which is below
    the total); sets `found` to i and `rest` to target minus the sum before i. Each thread sums a
    contiguous share of i, thread 0 finds the share, its thread the i. Uses shared `part`, `owner`,
    `owner_before`; every thread of the block calls it."""
    return f"""    {{
        const int per = ({n} + BLOCK - 1) / BLOCK, i0 = threadIdx.x * per;
        const int i1 = i0 + per < {n} ? i0 + per : {n};
        unsigned c = 0;
        for (int i = i0; i < i1; ++i) c += {count("i")};
        part[threadIdx.x] = c;
        __syncthreads();
        if (threadIdx.x == 0) {{
            unsigned before = 0;
            int q = 0;
            for (; q < BLOCK - 1 && before + part[q] <= {target}; ++q) before += part[q];
            owner = q;
            owner_before = before;
        }}
        __syncthreads();
        if (threadIdx.x == owner) {{
            unsigned before = owner_before;
            int i = i0;
            for (; i < i1 - 1 && before + ({count("i")}) <= {target}; ++i) before += {count("i")};
            {found} = i;
            {rest} = {target} - before;
        }}
        __syncthreads();
    }}"""


def _emit_radix(kernel: str, node: Node, dtype: str, geo: _Geometry, roles: list[str], segs_max: int) -> str:
    """A radix select of the pair of rank t in each row's stable (key, position) order, in two kernels.
    `_count` pass p (of KEY_BITS / 8): every block counts, in 256 bins of shared memory, the 8 bits
    below the prefix the earlier passes settled of the keys of its SEG elements that have that prefix,
    and adds its bins to the row's in `work`; the row's last block to finish (a counter) finds the bin
    holding rank t, appends it to the row's prefix, takes the pairs of smaller bins off t, and sets
    the bins and the counter back to zero (`work` is a zeroed buffer: left as it was found). Pass 0
    also counts the NaNs, which median and nanmedian's t depends on. After the last pass the prefix is
    the key K of the pair, and t its place among the pairs of key K. `_find`: every block counts the
    keys equal to K among its elements; the row's last block finds the segment, then the element of
    that segment holding the t-th K (in position order: the stable order), and writes the outputs."""
    st = STORAGE_CTYPE[dtype]
    key_t, _ = _key_code(dtype)
    ns = f"{kernel}_sel"
    L, B = geo.length, geo.inner
    nan_key = _nan_key(key_t)
    key_bits = 8 * geo.key_bytes
    addr = (lambda r, j: f"({r}) * {L}LL + ({j})") if B == 1 else \
        (lambda r, j: f"(({r}) / {B}LL) * {L * B}LL + (long long)({j}) * {B}LL + ({r}) % {B}LL")
    key_load = f"{ns}::key_of({load_expr(dtype, 'x[' + addr('r', 'j') + ']')})"
    params, stores = _outputs(roles, st, addr("r", "at"), "r")
    store_lines = "\n        ".join(stores)
    nans = f"\n        if (pass == 0 && key == ({ns}::key_t){nan_key}) ++my_nans;" if dtype in FLOATS else ""
    head = f"""    const int segs = ({L} + SEG - 1) / SEG;
    const long long r = blockIdx.x / segs;
    const int seg = blockIdx.x % segs;
    const int s0 = seg * SEG, s1 = s0 + SEG < {L} ? s0 + SEG : {L};
    unsigned* const w = work + r * {RADIX_WORK};          // 256 bins, the finished blocks, the NaNs"""
    last = """    __threadfence();                                   // this block's counts before its arrival
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&w[256], 1u) == (unsigned)segs - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();"""
    return _namespace(ns, node, dtype, geo) + f"""
extern "C" __global__ void __launch_bounds__(BLOCK)
{kernel}_count(const {st}* __restrict__ x, {ns}::key_t* __restrict__ prefix, unsigned* __restrict__ rank,
    unsigned* __restrict__ work, int pass)
{{
    __shared__ unsigned bins[256];
    __shared__ unsigned block_nans;
    __shared__ bool last;
{head}
    const int shift = {key_bits} - {RADIX_BITS} * (pass + 1);
    // The bits the earlier passes settled, and their values for this row.
    const {ns}::key_t high = pass ? ~({ns}::key_t)0 << (shift + {RADIX_BITS}) : ({ns}::key_t)0;
    const {ns}::key_t want = pass ? prefix[r] : ({ns}::key_t)0;
    for (int b = threadIdx.x; b < 256; b += BLOCK) bins[b] = 0u;
    if (threadIdx.x == 0) block_nans = 0u;
    __syncthreads();
    unsigned my_nans = 0u;
    for (int j = s0 + threadIdx.x; j < s1; j += BLOCK) {{
        const {ns}::key_t key = {key_load};
        if ((key & high) == want) atomicAdd(&bins[(unsigned)(key >> shift) & 255u], 1u);{nans}
    }}
    if (my_nans) atomicAdd(&block_nans, my_nans);
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += BLOCK)
        if (bins[b]) atomicAdd(&w[b], bins[b]);
    if (threadIdx.x == 0 && block_nans) atomicAdd(&w[257], block_nans);
{last}
    // The row's last block: the bins of every block (read and set back to zero at once).
    for (int b = threadIdx.x; b < 256; b += BLOCK) bins[b] = atomicExch(&w[b], 0u);
    __syncthreads();
    if (threadIdx.x == 0) {{
        unsigned t;
        if (pass == 0) {{
            const unsigned nans = atomicExch(&w[257], 0u);
            (void)nans;
            t = {_rank(node, dtype, L)};
        }} else {{
            t = rank[r];
        }}
        unsigned before = 0u;
        int b = 0;
        for (; b < 255 && before + bins[b] <= t; ++b) before += bins[b];
        prefix[r] = want | (({ns}::key_t)b << shift);
        rank[r] = t - before;
        w[256] = 0u;                                   // the counter, for the next pass
    }}
}}

extern "C" __global__ void __launch_bounds__(BLOCK)
{kernel}_find({", ".join([f"const {st}* __restrict__ x", f"const {ns}::key_t* __restrict__ prefix",
                          "const unsigned* __restrict__ rank", "unsigned* __restrict__ work",
                          "unsigned* __restrict__ counts"] + params)})
{{
    __shared__ unsigned part[BLOCK];
    __shared__ int owner;
    __shared__ unsigned owner_before;
    __shared__ unsigned equal;
    __shared__ bool last;
    __shared__ int at_seg, at_rel;
    __shared__ unsigned rest_seg, rest;
{head}
    const {ns}::key_t k = prefix[r];
    if (threadIdx.x == 0) equal = 0u;
    __syncthreads();
    unsigned mine = 0u;
    for (int j = s0 + threadIdx.x; j < s1; j += BLOCK) {{
        const {ns}::key_t key = {key_load};
        mine += key == k;
    }}
    if (mine) atomicAdd(&equal, mine);
    __syncthreads();
    if (threadIdx.x == 0) counts[r * {segs_max}LL + seg] = equal;
{last}
    // The row's last block: the segment holding the t-th pair of key K, then its element.
    const unsigned t = rank[r];
    const unsigned* const row_counts = counts + r * {segs_max}LL;
{_locate("segs", lambda i: f"__ldcg(row_counts + {i})", "t", "at_seg", "rest_seg")}
    const int a0 = at_seg * SEG, a1 = a0 + SEG < {L} ? a0 + SEG : {L};
{_locate("a1 - a0", lambda i: f"({ns}::key_of({load_expr(dtype, 'x[' + addr('r', f'a0 + {i}') + ']')}) == k)", "rest_seg", "at_rel", "rest")}
    if (threadIdx.x == 0) {{
        const long long at = a0 + at_rel;
        {store_lines}
        w[256] = 0u;                                   // the counter: left zero
    }}
}}
"""


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


def _descending(node: Node) -> bool:
    return bool(node.attrs.get("descending") if node.base == "sort" else
                node.attrs.get("largest", True) if node.base == "topk" else False)


def _nan_key(key_t: str) -> str:
    return "0xffffffffffffffffULL" if key_t == "unsigned long long" else "0xffffffffu"


def _position(node: Node, dtype: str, ns: str, length: int, nan_key: str) -> str:
    """Which pair of the sorted row output `p` reads; `rk` is the row's sorted keys."""
    L = length
    if node.base in ("sort", "topk"):
        return "p"
    if node.base == "kthvalue":
        return str(node.attrs.get("k", 1) - 1)
    if node.base == "median" and dtype in FLOATS:       # a NaN in the row sorts last: the median is NaN
        return f"rk[{L - 1}] == {nan_key} ? {L - 1} : {(L - 1) // 2}"
    if node.base == "median":
        return str((L - 1) // 2)
    return f"({L} - {ns}::nans(rk) - 1) / 2"          # nanmedian: the middle of the pairs before the NaNs


def _namespace(ns: str, node: Node, dtype: str, geo: _Geometry) -> str:
    key_t, key_body = _key_code(dtype)
    nan_key, L = _nan_key(key_t), geo.length
    return f"""
// ==== selection: {node.op}, {describe_rows(geo)} ====
#ifndef CA_DYNAMIC_SMEM
#define CA_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif
namespace {ns} {{
typedef {key_t} key_t;
// A key that orders as PyTorch compares the values.
CA_HD key_t key_of({COMPUTE_CTYPE[dtype]} v) {{{key_body}
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
"""


def _outputs(roles: list[str], st: str, value_at: str, index_at: str) -> tuple[list[str], list[str]]:
    """Kernel parameters and store statements of the outputs (values read back from x at the pair's position)."""
    params, stores = [], []
    for k, role in enumerate(roles):
        if role == "values":
            params.append(f"{st}* __restrict__ y{k}")
            stores.append(f"y{k}[{index_at}] = x[{value_at}];")
        else:
            params.append(f"long long* __restrict__ y{k}")
            stores.append(f"y{k}[{index_at}] = (long long)at;")
    return params, stores


def _bitonic(ns: str, rows: str, seg: str, indent: str = "    ") -> str:
    """Bitonic sort of `rows` runs of `seg` pairs in shared memory (keys, pos) by (key, position)."""
    body = f"""for (int k = 2; k <= {seg}; k <<= 1) {{
    for (int j = k >> 1; j > 0; j >>= 1) {{
        for (int t = threadIdx.x; t < {rows} * {seg} / 2; t += BLOCK) {{
            const int i = 2 * j * (t / j) + t % j, l = i + j;
            const bool up = k == {seg} || (i & k) == 0;      // the last merge: every row ascending
            const {ns}::key_t a = keys[i], b = keys[l];
            const int pa = pos[i], pb = pos[l];
            if ((a > b || (a == b && pa > pb)) == up) {{
                keys[i] = b; keys[l] = a;
                pos[i] = pb; pos[l] = pa;
            }}
        }}
        __syncthreads();
    }}
}}"""
    return "\n".join(indent + line for line in body.splitlines())


def _local_candidates(ns: str, kp: int, nan_key: str, pad_at: int, first: str, end: str, load: str) -> str:
    """Each thread's best KP of the elements j = first, first + BLOCK, ... < end, kept sorted in registers
    (the unrolled insertion indexes the arrays with constants only), then written to shared memory as
    its KP pairs; `load` sets `key` from element j of row r."""
    return f"""        {ns}::key_t bk[{kp}];
        int bp[{kp}];
        #pragma unroll
        for (int q = 0; q < {kp}; ++q) {{ bk[q] = ({ns}::key_t){nan_key}; bp[q] = {pad_at}; }}
        for (int j = {first}; j < {end}; j += BLOCK) {{
            {ns}::key_t key = {load}
            if (!(key < bk[{kp - 1}] || (key == bk[{kp - 1}] && j < bp[{kp - 1}]))) continue;   // most elements
            #pragma unroll
            for (int q = {kp - 1}; q >= 0; --q) {{
                const int prev = q > 0 ? q - 1 : 0;
                const bool here = key < bk[q] || (key == bk[q] && j < bp[q]);
                const bool before = q > 0 && (key < bk[prev] || (key == bk[prev] && j < bp[prev]));
                if (here) {{ bk[q] = before ? bk[prev] : key; bp[q] = before ? bp[prev] : j; }}
            }}
        }}
        #pragma unroll
        for (int q = 0; q < {kp}; ++q) {{
            keys[threadIdx.x * {kp} + q] = bk[q];
            pos[threadIdx.x * {kp} + q] = bp[q];
        }}"""


def _emit(kernel: str, node: Node, dtype: str, geo: _Geometry, count: int, roles: list[str], local_kp: int) -> str:
    st = STORAGE_CTYPE[dtype]
    key_t, _ = _key_code(dtype)
    ns = f"{kernel}_sel"
    L, B, R, P = geo.length, geo.inner, geo.rows, geo.padded
    nan_key = _nan_key(key_t)
    addr = (lambda r, j: f"({r}) * {L}LL + ({j})") if B == 1 else \
        (lambda r, j: f"(({r}) / {B}LL) * {L * B}LL + (long long)({j}) * {B}LL + ({r}) % {B}LL")
    out_addr = (lambda r, p: f"({r}) * {count}LL + ({p})") if B == 1 else \
        (lambda r, p: f"(({r}) / {B}LL) * {count * B}LL + (long long)({p}) * {B}LL + ({r}) % {B}LL")
    # Element e of the block: along the row when B == 1, across the block's rows otherwise.
    split = (lambda e, n: (f"{e} / {n}", f"{e} % {n}")) if B == 1 else (lambda e, n: (f"{e} % ROWS", f"{e} / ROWS"))
    g_in, j_in = split("e", P)
    g_out, p_out = split("e", count)
    invert = "\n            key = ~key;                              // descending" if _descending(node) else ""
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
        # LOCAL: each thread's best KP candidates first, then a sort of BLOCK * KP of them.
        seg = f"#if LOCAL\n#define SEG (BLOCK * {local_kp})\n#else\n#define SEG {P}\n#endif"
        load = f"""#if LOCAL
    {{
        const long long r = row0;
{_local_candidates(ns, local_kp, nan_key, P, "threadIdx.x", str(L), key_load + ";" + invert)}
    }}
#else
{whole}
#endif"""
    else:
        seg, load = f"#define SEG {P}", whole
    position = _position(node, dtype, ns, L, nan_key)
    params, stores = _outputs(roles, st, addr("r", "at"), out_addr("r", "p"))
    store_lines = "\n        ".join(stores)
    return _namespace(ns, node, dtype, geo) + f"""
{seg}                    // pairs of one row in shared memory
extern "C" __global__ void __launch_bounds__(BLOCK)
{kernel}({", ".join([f"const {st}* __restrict__ x"] + params)})
{{
    CA_DYNAMIC_SMEM(ca_smem);                          // ROWS * SEG keys, then ROWS * SEG positions
    {ns}::key_t* const keys = reinterpret_cast<{ns}::key_t*>(ca_smem);
    int* const pos = reinterpret_cast<int*>(ca_smem + ROWS * SEG * sizeof({ns}::key_t));
    const long long row0 = (long long)blockIdx.x * ROWS;
{load}
    __syncthreads();
    // Bitonic sort of each row's SEG pairs by (key, position): runs of k, merged by steps of j.
{_bitonic(ns, "ROWS", "SEG")}
    for (int e = threadIdx.x; e < ROWS * {count}; e += BLOCK) {{
        const int g = {g_out}, p = {p_out};
        const long long r = row0 + g;
        if (r >= {R}) continue;
        const {ns}::key_t* const rk = keys + g * SEG;
        const int at = pos[g * SEG + ({position})];
        {store_lines}
    }}
}}
#undef SEG
"""


def _emit_long(kernel: str, node: Node, dtype: str, geo: _Geometry, count: int, roles: list[str],
               local_kp: int = 0) -> str:
    """Rows longer than MAX_ROW, as three kernels over scratch pairs `keys`, `pos` of [2, R, L] (two halves):
    `_chunks` sorts each CHUNK of a row in shared memory into half 0; `_merge` pass p merges runs of
    CHUNK << p pairwise from half p % 2 into the other, a tile of MT merged places per block: two
    merge-path searches find which pairs of runs A and B fill the tile, the block loads them into
    shared memory (coalesced), and each pair's place is its place in its own part plus the number of
    the other part's pairs before it (a binary search in shared memory; pairs are distinct, as
    positions are, so there are no ties). The last kernel picks the outputs as the short path does,
    from the half the last pass wrote. With `local_kp` (topk of a few) `_chunks` writes only each
    chunk's first k, from per-thread candidates sorted in shared memory."""
    st = STORAGE_CTYPE[dtype]
    key_t, _ = _key_code(dtype)
    ns = f"{kernel}_sel"
    L, B, R = geo.length, geo.inner, geo.rows
    nan_key = _nan_key(key_t)
    addr = (lambda r, j: f"({r}) * {L}LL + ({j})") if B == 1 else \
        (lambda r, j: f"(({r}) / {B}LL) * {L * B}LL + (long long)({j}) * {B}LL + ({r}) % {B}LL")
    invert = "\n            key = ~key;                              // descending" if _descending(node) else ""
    key_load = f"{ns}::key_of({load_expr(dtype, 'x[' + addr('r', 'j') + ']')})"
    position = _position(node, dtype, ns, L, nan_key)
    # Output o in memory order: row r = (a, b), position p along the row.
    where = "const long long r = o / " + str(count) + "LL, p = o % " + str(count) + "LL;" if B == 1 else \
        f"const long long p = (o / {B}LL) % {count}LL, r = (o / {count * B}LL) * {B}LL + o % {B}LL;"
    params, stores = _outputs(roles, st, addr("r", "at"), "o")
    store_lines = "\n    ".join(stores)
    # topk merges the first k of each run only: a pair further back in its run cannot reach the first
    # k of the merged one (the places after the first k are never written, nor read).
    keep_runs = ""
    if node.base == "topk":
        keep_runs = (f"\n    if (na > {count}LL) na = {count}LL;                  // topk: the first k of each run"
                     f"\n    if (nb > {count}LL) nb = {count}LL;")
    if local_kp:
        chunks = f"""extern "C" __global__ void __launch_bounds__(BLOCK)
{kernel}_chunks(const {st}* __restrict__ x, {ns}::key_t* __restrict__ out_keys, int* __restrict__ out_pos)
{{
    CA_DYNAMIC_SMEM(ca_smem);                          // BLOCK * {local_kp} candidate keys, then their positions
    {ns}::key_t* const keys = reinterpret_cast<{ns}::key_t*>(ca_smem);
    int* const pos = reinterpret_cast<int*>(ca_smem + BLOCK * {local_kp} * sizeof({ns}::key_t));
    const int chunks = ({L} + CHUNK - 1) / CHUNK;
    const long long r = blockIdx.x / chunks;
    const int c0 = (blockIdx.x % chunks) * CHUNK;
    const int c1 = c0 + CHUNK < {L} ? c0 + CHUNK : {L};
    {{
{_local_candidates(ns, local_kp, nan_key, L, "c0 + threadIdx.x", "c1", key_load + ";" + invert)}
    }}
    __syncthreads();
{_bitonic(ns, "1", f"(BLOCK * {local_kp})")}
    for (int t = threadIdx.x; t < {count} && c0 + t < {L}; t += BLOCK) {{   // the chunk's first k
        out_keys[r * {L}LL + c0 + t] = keys[t];
        out_pos[r * {L}LL + c0 + t] = pos[t];
    }}
}}"""
    else:
        chunks = f"""extern "C" __global__ void __launch_bounds__(BLOCK)
{kernel}_chunks(const {st}* __restrict__ x, {ns}::key_t* __restrict__ out_keys, int* __restrict__ out_pos)
{{
    CA_DYNAMIC_SMEM(ca_smem);                          // CHUNK keys, then CHUNK positions
    {ns}::key_t* const keys = reinterpret_cast<{ns}::key_t*>(ca_smem);
    int* const pos = reinterpret_cast<int*>(ca_smem + CHUNK * sizeof({ns}::key_t));
    const int chunks = ({L} + CHUNK - 1) / CHUNK;
    const long long r = blockIdx.x / chunks;
    const int c0 = (blockIdx.x % chunks) * CHUNK;
    for (int t = threadIdx.x; t < CHUNK; t += BLOCK) {{
        const int j = c0 + t;
        {ns}::key_t key = ({ns}::key_t){nan_key};      // a pad: after every element
        int at = {L};
        if (j < {L}) {{
            key = {key_load};{invert}
            at = j;
        }}
        keys[t] = key;
        pos[t] = at;
    }}
    __syncthreads();
{_bitonic(ns, "1", "CHUNK")}
    for (int t = threadIdx.x; t < CHUNK && c0 + t < {L}; t += BLOCK) {{
        out_keys[r * {L}LL + c0 + t] = keys[t];
        out_pos[r * {L}LL + c0 + t] = pos[t];
    }}
}}"""
    return _namespace(ns, node, dtype, geo) + f"""
#define MT (BLOCK * 4 < {MERGE_TILE_MAX} ? BLOCK * 4 : {MERGE_TILE_MAX})   // pairs one block of a merge pass takes
{chunks}

extern "C" __global__ void __launch_bounds__(BLOCK)
{kernel}_merge({ns}::key_t* __restrict__ keys, int* __restrict__ pos, int pass)
{{
    const long long width = (long long)CHUNK << pass;
    if (width >= {L}) return;                          // runs this CHUNK does not need to merge
    CA_DYNAMIC_SMEM(ca_smem);                          // the tile's pairs: MT keys, then MT positions
    {ns}::key_t* const tk = reinterpret_cast<{ns}::key_t*>(ca_smem);
    int* const tp = reinterpret_cast<int*>(ca_smem + MT * sizeof({ns}::key_t));
    __shared__ long long cut[2];
    const int tiles = ({L} + MT - 1) / MT;
    const long long r = blockIdx.x / tiles;
    const long long o = (long long)(blockIdx.x % tiles) * MT;   // the tile's first place in the row
    const long long base = o / (2 * width) * (2 * width);        // run A at base, run B at base + width
    const {ns}::key_t* const fk = keys + (pass & 1) * {R * L}LL + r * {L}LL + base;
    const int* const fp = pos + (pass & 1) * {R * L}LL + r * {L}LL + base;
    {ns}::key_t* const dk = keys + ((pass + 1) & 1) * {R * L}LL + r * {L}LL;
    int* const dp = pos + ((pass + 1) & 1) * {R * L}LL + r * {L}LL;
    long long na = {L}LL - base < width ? {L}LL - base : width;
    long long nb = {L}LL - base - width < width ? {L}LL - base - width : width;
    if (nb < 0) nb = 0;{keep_runs}
    const long long d0 = o - base;                     // this tile: merged places [d0, d1)
    const long long d1 = d0 + MT < na + nb ? d0 + MT : na + nb;
    if (d0 >= d1) return;
    // Merge path: how many of the first d merged pairs come from A (pairs are distinct: no ties).
    if (threadIdx.x < 2) {{
        const long long d = threadIdx.x ? d1 : d0;
        long long lo = d - nb > 0 ? d - nb : 0, hi = d < na ? d : na;
        while (lo < hi) {{
            const long long a = (lo + hi) / 2;
            const {ns}::key_t ka = fk[a], kb = fk[width + d - a - 1];
            if (ka < kb || (ka == kb && fp[a] < fp[width + d - a - 1])) lo = a + 1; else hi = a;
        }}
        cut[threadIdx.x] = lo;
    }}
    __syncthreads();
    const long long a0 = cut[0], b0 = d0 - a0;
    const int la = (int)(cut[1] - a0), n = (int)(d1 - d0);
    for (int t = threadIdx.x; t < n; t += BLOCK) {{    // A's part, then B's, coalesced
        const long long g = t < la ? a0 + t : width + b0 + (t - la);
        tk[t] = fk[g];
        tp[t] = fp[g];
    }}
    __syncthreads();
    // Each pair's place: its place in its own part plus the pairs of the other part before it.
    for (int t = threadIdx.x; t < n; t += BLOCK) {{
        const {ns}::key_t key = tk[t];
        const int at = tp[t];
        const bool in_a = t < la;
        int lo = in_a ? la : 0, hi = in_a ? n : la;
        const int start = lo;
        while (lo < hi) {{
            const int mid = (lo + hi) / 2;
            if (tk[mid] < key || (tk[mid] == key && tp[mid] < at)) lo = mid + 1; else hi = mid;
        }}
        const long long to = base + d0 + (in_a ? t : t - la) + (lo - start);
        dk[to] = key;
        dp[to] = at;
    }}
}}
#undef MT

extern "C" __global__ void __launch_bounds__(BLOCK)
{kernel}({", ".join([f"const {st}* __restrict__ x", f"const {ns}::key_t* __restrict__ keys", "const int* __restrict__ pos"] + params)})
{{
    int passes = 0;                                    // the half the last merge pass wrote
    for (long long w = CHUNK; w < {L}; w <<= 1) ++passes;
    const long long o = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (o >= {R * count}LL) return;
    {where}
    const long long row = (passes & 1) * {R * L}LL + r * {L}LL;
    const {ns}::key_t* const rk = keys + row;
    const int at = pos[row + ({position})];
    {store_lines}
}}
"""
