"""The scatter family: index_put (x[i] = v, x[i] += v, Tensor.index_add_ / index_copy / index_fill,
F.fold, F.max_unpool), index_reduce, scatter_add, scatter_reduce (sum, prod, mean, amax, amin, with or
without self) and scatter.

partition.canonicalize rewrites each source op into one `ca_scatter.default` node (to_scatter):

    operands   [self, src, index tensors...]  (src left out for scatter.value, whose value is an attr)
    mode       "index": index_put and index_reduce; the index tensors (attr `dims`: the self dims they index, the
               others taken whole) broadcast to one shape B, and src broadcasts to self[indices]'s
               shape, which holds B at dim `lead` (PyTorch's advanced indexing: in place of the
               indexed dims where they are adjacent, else first). Negative indices count from the end.
               "dim": scatter / scatter_add / scatter_reduce along `dim`; one element per element of
               the index: out[.., index[c], ..] op= src[c] (c over the index's shape).
    reduce     "none" (a store), "sum", "prod", "mean", "amax", "amin"
    include_self  whether self's value takes part in the reduction (scatter_reduce's flag)

The kernels, each a grid-stride loop over its elements:
  `_init`    acc = self (or the reduction's identity without self), counts = 0;
  `_scatter` per element of the iteration shape: its destination, then an atomic update of acc
             (atomicAdd for sums; a compare-and-swap loop for prod, amax and amin) and of the count;
  `_finish`  out = acc in the output dtype; mean divides by the count (+1 with self; integers round
             down, as PyTorch does); without self, elements nothing was scattered to keep self's value.
acc is in the accumulation type (float for fp16 / bf16 / fp32, double, long long for integers), so
fp16 / bf16 round once, as ATen's index_put does. Where acc would hold the output as it is (fp32,
fp64 or int64, no mean, with self), the output is the accumulator and there is no `_finish`. A store
("none": scatter, index_put without accumulate) is two kernels: out = self, then out[dest] = src.
Where several elements write one place, PyTorch leaves which wins open; so does this. Indices out of
range are skipped (PyTorch raises). Sums by atomics add in an order that changes from run to run, as
ATen's scatter_add does on CUDA.

Knobs: BLOCK threads; ITEMS elements per thread of the scatter (the grid is cdiv(E, BLOCK * ITEMS)).
"""
from __future__ import annotations

import math
from typing import Any, Callable

from core.codegen.cuda_emit import COMPUTE_CTYPE, PRELUDE, STORAGE_CTYPE, literal, load_expr, store_expr
from core.codegen.errors import CodegenError
from core.codegen.graph import Graph, Node, Ref
from core.codegen.lower_pointwise import Lowering
from core.codegen.schedule import Knob, ScheduleSpec

SCATTER = "ca_scatter.default"
SOURCE_OPS = {"index_put.default", "scatter_add.default", "scatter_reduce.two", "scatter.src", "scatter.value",
              "index_reduce.default"}
REDUCES = ("none", "sum", "prod", "mean", "amax", "amin")
DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32")
INDEX_DTYPES = ("int64", "int32")
ACC_CTYPE = {"float32": "float", "float16": "float", "bfloat16": "float", "float64": "double",
             "int64": "long long", "int32": "long long"}
KNOBS = [
    Knob("BLOCK", (256, 128, 512, 1024), "threads per block"),
    Knob("ITEMS", (1, 2, 4, 8), "scattered elements per thread, BLOCK apart"),
]


def is_scatter(node: Node, graph: Graph) -> bool:
    return node.op == SCATTER


# ---- canonical form -------------------------------------------------------------------------------

def _broadcast(shapes: list[tuple[int, ...]]) -> list[int] | None:
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for k, n in enumerate(s):
            d = rank - len(s) + k
            if n != 1 and out[d] not in (1, n):
                return None
            out[d] = n if n != 1 else out[d]
    return out


def _fits(shape: tuple[int, ...], target: list[int]) -> bool:
    """`shape` broadcasts to `target` (right-aligned)."""
    return len(shape) <= len(target) and all(n in (1, m) for n, m in zip(shape, target[len(target) - len(shape):]))


def to_scatter(n: Node, value: Callable[[str], Any]) -> Node | None:
    """The ca_scatter node of an index_put / scatter / scatter_add / scatter_reduce node, or None
    where its operands are out of this family's reach (then the op stays, and is refused by name)."""
    a = n.attrs
    if n.op == "index_put.default":
        self_, src = n.operands[:2]
        indices = a.get("indices") or []
        if not isinstance(self_, Ref) or not isinstance(src, Ref) or not indices or \
                any(i is not None and not isinstance(i, Ref) for i in indices):
            return None
        dims = [d for d, i in enumerate(indices) if i is not None]
        idx = [i for i in indices if i is not None]
        shape = tuple(value(self_.name).shape)
        if not dims or len(indices) > len(shape) or any(value(i.name).dtype not in INDEX_DTYPES for i in idx):
            return None
        ishapes = [list(value(i.name).shape) for i in idx]
        bshape = _broadcast([tuple(s) for s in ishapes])
        if bshape is None:
            return None
        rest = [d for d in range(len(shape)) if d not in dims]
        lead = dims[0] if dims == list(range(dims[0], dims[-1] + 1)) else 0
        rshape = [shape[d] for d in rest[:lead]] + bshape + [shape[d] for d in rest[lead:]]
        if not _fits(tuple(value(src.name).shape), rshape):
            return None
        attrs = {"mode": "index", "reduce": "sum" if a.get("accumulate") else "none", "include_self": True,
                 "dims": dims, "ishapes": ishapes, "bshape": bshape, "lead": lead, "rshape": rshape}
        operands: list[Any] = [self_, src] + idx
    elif n.op == "index_reduce.default":
        # self.index_reduce(dim, index, source, reduce): an index_put along dim with one 1-D index.
        self_, index, src = (n.operands + [None, None, None])[:3]
        if not all(isinstance(o, Ref) for o in (self_, index, src)) or a.get("reduce") not in REDUCES:
            return None
        shape, ishape = tuple(value(self_.name).shape), tuple(value(index.name).shape)
        rank = len(shape)
        d = a.get("dim", 0) % rank if rank else 0
        rshape = list(shape[:d]) + list(ishape) + list(shape[d + 1:])
        if rank == 0 or len(ishape) != 1 or value(index.name).dtype not in INDEX_DTYPES or \
                list(value(src.name).shape) != rshape:
            return None
        attrs = {"mode": "index", "reduce": a["reduce"], "include_self": bool(a.get("include_self", True)),
                 "dims": [d], "ishapes": [list(ishape)], "bshape": list(ishape), "lead": d, "rshape": rshape}
        operands = [self_, src, index]
    elif n.op in ("scatter_add.default", "scatter_reduce.two", "scatter.src", "scatter.value"):
        self_, index = n.operands[0], n.operands[1]
        src = n.operands[2] if n.op != "scatter.value" and len(n.operands) > 2 else None
        if not isinstance(self_, Ref) or not isinstance(index, Ref) or \
                (n.op != "scatter.value" and not isinstance(src, Ref)):
            return None
        shape, ishape = tuple(value(self_.name).shape), tuple(value(index.name).shape)
        rank = len(shape)
        d = a.get("dim", 0) % rank if rank else 0
        if value(index.name).dtype not in INDEX_DTYPES or len(ishape) != rank or rank == 0 or \
                any(ishape[k] > shape[k] for k in range(rank) if k != d):
            return None
        if isinstance(src, Ref):
            sshape = tuple(value(src.name).shape)
            if len(sshape) != rank or any(i > s for i, s in zip(ishape, sshape)):
                return None
        reduce = {"scatter_add.default": "sum", "scatter.src": "none", "scatter.value": "none"}.get(n.op) or \
            a.get("reduce")
        if reduce not in REDUCES:
            return None
        attrs = {"mode": "dim", "reduce": reduce, "include_self": bool(a.get("include_self", True)), "dim": d,
                 "rshape": list(ishape)}
        operands = [self_] + ([src] if isinstance(src, Ref) else []) + [index]
        if not isinstance(src, Ref):
            attrs["value"] = a.get("value", 0)
    else:
        return None
    dtype = value(self_.name).dtype
    if dtype not in DTYPES or n.dtype != dtype or (isinstance(src, Ref) and value(src.name).dtype != dtype):
        return None
    return Node(n.name, SCATTER, operands, attrs, n.shape, n.dtype)


def interpret_scatter(node: Node, operands: list[Any]) -> Any:
    """The canonical node on real tensors with ATen's ops (the IR's reference semantics)."""
    import torch

    a = node.attrs
    self_ = operands[0]
    if a["mode"] == "index":
        src, idx = operands[1], operands[2:]
        indices: list[Any] = [None] * (max(a["dims"]) + 1)
        for d, i in zip(a["dims"], idx):
            indices[d] = i
        if a["reduce"] in ("none", "sum") and a["include_self"]:
            return torch.ops.aten.index_put.default(self_, indices, src, a["reduce"] == "sum")
        return torch.ops.aten.index_reduce.default(self_, a["dims"][0], idx[0], src, a["reduce"],
                                                   include_self=a["include_self"])
    has_src = "value" not in a
    index = operands[2] if has_src else operands[1]
    if not has_src:
        return torch.ops.aten.scatter.value(self_, a["dim"], index, a["value"])
    if a["reduce"] == "none":
        return torch.ops.aten.scatter.src(self_, a["dim"], index, operands[1])
    return torch.ops.aten.scatter_reduce.two(self_, a["dim"], index, operands[1], a["reduce"],
                                             include_self=a["include_self"])


# ---- lowering -------------------------------------------------------------------------------------

def lower_scatter(graph: Graph, kernel: str) -> Lowering:
    anchors = [n for n in graph.nodes if n.op == SCATTER]
    inputs = {v.name: v for v in graph.inputs}
    if len(anchors) != 1 or len(graph.nodes) != 1 or graph.outputs != [anchors[0].name] or \
            any(not isinstance(o, Ref) or o.name not in inputs for o in anchors[0].operands):
        raise CodegenError(f"Task '{graph.task}': the scatter family lowers one index_put / scatter of graph "
                           f"inputs; this group has {', '.join(graph.ops())}.", task=graph.task, ops=graph.ops())
    node = anchors[0]
    a = node.attrs
    operands = [inputs[o.name] for o in node.operands]
    self_ = operands[0]
    reduce, include_self = a["reduce"], a["include_self"]
    counts = reduce == "mean" or (reduce != "none" and not include_self)
    # The output itself accumulates where _finish would only copy it.
    finish = reduce != "none" and (counts or ACC_CTYPE[node.dtype] != STORAGE_CTYPE[node.dtype])
    out, n_out, n_iter = node.name, math.prod(node.shape), math.prod(a["rshape"])
    taken = set(inputs) | {out, "BLOCK", "ITEMS"}

    def scratch(name: str) -> str:
        while name in taken:
            name = "_" + name
        taken.add(name)
        return name

    acc = scratch(f"{kernel}_acc") if finish else out
    count = scratch(f"{kernel}_count") if counts else None
    names = [o.name for o in operands]
    spec = ScheduleSpec(list(KNOBS), [], {"BLOCK": 256, "ITEMS": 1})
    # Grid-stride loops: at most 65535 blocks; at least one (an empty index scatters nothing).
    grid_out = [f"max(min(cdiv({n_out}, BLOCK), 65535), 1)"]
    grid_iter = [f"max(min(cdiv({n_iter}, BLOCK * ITEMS), 65535), 1)"]
    buffers = [{"name": out, "shape": list(node.shape), "dtype": node.dtype}]
    if finish:
        acc_dtype = {"float": "float32", "double": "float64", "long long": "int64"}[ACC_CTYPE[node.dtype]]
        buffers.append({"name": acc, "shape": [n_out], "dtype": acc_dtype})
    if count:
        buffers.append({"name": count, "shape": [n_out], "dtype": "int32"})
    state = [acc] + ([count] if count else [])
    launches = [
        {"kernel": f"{kernel}_init", "grid": grid_out, "block": ["BLOCK"], "shared_bytes": 0,
         "args": [names[0]] + state},
        {"kernel": f"{kernel}_scatter", "grid": grid_iter, "block": ["BLOCK"], "shared_bytes": 0,
         "args": names[1:] + state},
    ]
    if finish:
        launches.append({"kernel": f"{kernel}_finish", "grid": grid_out, "block": ["BLOCK"], "shared_bytes": 0,
                         "args": [names[0]] + state + [out]})
    program = {
        "format": "cuda-agent/program@1", "name": kernel,
        "source": PRELUDE + _emit(kernel, node, operands, counts, finish),
        "tunables": spec.tunables(), "schedule": spec.default(),
        "buffers": buffers, "launches": launches, "outputs": [out],
    }
    what = "index_put" if a["mode"] == "index" else f"scatter along dim {a['dim']}"
    notes = [f"scatter: {what} ({reduce}{'' if include_self or reduce == 'none' else ', without self'}) of "
             f"{n_iter} elements into '{self_.name}' {self_.dtype}{list(self_.shape)}"
             + (f"; atomics on a {ACC_CTYPE[node.dtype]} accumulator" if reduce != "none" else "; stores")]
    return Lowering(program, spec, notes)


def _ravel(coords: list[str], shape: list[int]) -> str:
    """The flat offset of `coords` in a contiguous `shape` (dims of size 1 read index 0: broadcasting)."""
    terms, stride = [], 1
    for c, n in reversed(list(zip(coords, shape))):
        if n != 1:
            terms.append(f"({c}) * {stride}LL" if stride != 1 else f"({c})")
        stride *= n
    return " + ".join(reversed(terms)) or "0LL"


def _emit(kernel: str, node: Node, operands: list[Any], counts: bool, finish: bool) -> str:
    a = node.attrs
    dtype, reduce, include_self = node.dtype, a["reduce"], a["include_self"]
    st, at = STORAGE_CTYPE[dtype], ACC_CTYPE[dtype]
    shape, rshape = list(node.shape), list(a["rshape"])
    rank = len(rshape)
    n_out, n_iter = math.prod(shape), math.prod(rshape)
    ns = f"{kernel}_sc"
    c = [f"c{k}" for k in range(rank)]
    unravel, rem = [], "e"
    for k in reversed(range(rank)):
        unravel.append(f"const long long c{k} = {rem} % {rshape[k]}LL;" if k else f"const long long c{k} = {rem};")
        if k:
            unravel.append(f"const long long q{k} = {rem} / {rshape[k]}LL;")
            rem = f"q{k}"
    body = ["        " + line for line in unravel]
    params: list[str] = []
    has_src = "value" not in a
    if has_src:
        params.append(f"const {st}* __restrict__ src")
    if a["mode"] == "index":
        dims, lead, bshape = a["dims"], a["lead"], a["bshape"]
        nb = len(bshape)
        rest = [d for d in range(len(shape)) if d not in dims]
        self_coord: dict[int, str] = {}
        for j, d in enumerate(rest):
            self_coord[d] = c[j] if j < lead else c[j + nb]
        bc = c[lead:lead + nb]
        for k, (d, ishape) in enumerate(zip(dims, a["ishapes"])):
            params.append(f"const {STORAGE_CTYPE[operands[2 + k].dtype]}* __restrict__ i{k}")
            off = _ravel(bc[nb - len(ishape):], ishape)
            body.append(f"        long long d{d} = (long long)i{k}[{off}];")
            body.append(f"        if (d{d} < 0) d{d} += {shape[d]}LL;")
            body.append(f"        if (d{d} < 0 || d{d} >= {shape[d]}LL) continue;      // out of range: skipped")
            self_coord[d] = f"d{d}"
        sshape = list(operands[1].shape) if has_src else []
        src_off = _ravel(c[rank - len(sshape):], sshape) if has_src else ""
    else:
        d = a["dim"]
        index = operands[2] if has_src else operands[1]
        params.append(f"const {STORAGE_CTYPE[index.dtype]}* __restrict__ idx")
        body.append("        const long long v = (long long)idx[e];")
        body.append(f"        if (v < 0 || v >= {shape[d]}LL) continue;           // out of range: skipped")
        self_coord = {k: c[k] for k in range(rank)}
        self_coord[d] = "v"
        # src may be larger than the index along any dim: its own strides (c < the index's sizes).
        src_off = _ravel(c, list(operands[1].shape)) if has_src else ""
    dest = _ravel([self_coord[k] for k in range(len(shape))], shape) if shape else "0LL"
    body.append(f"        const long long to = {dest};")
    if has_src:
        value = load_expr(dtype, f"src[{src_off}]")
    else:
        value = repr(float(a["value"])) if dtype.startswith(("float", "bfloat")) else str(int(a["value"]))
    state = [f"{at}* __restrict__ acc"] + (["int* __restrict__ count"] if counts else [])
    if reduce == "none":
        body.append(f"        out[to] = {store_expr(dtype, f'({value})') if has_src else store_expr(dtype, value)};")
        init_body = "out[i] = self[i];"
        init_params = [f"const {st}* __restrict__ self", f"{st}* __restrict__ out"]
        scatter_params = params + [f"{st}* __restrict__ out"]
    else:
        body.append(f"        {ns}::update(acc + to, ({at})({value}));")
        if counts:
            body.append("        atomicAdd(count + to, 1);")
        integer = at == "long long"
        identity = {"sum": "0", "mean": "0", "prod": "1",
                    "amax": "(-0x7fffffffffffffffLL - 1)" if integer else literal(float("-inf"), at),
                    "amin": "0x7fffffffffffffffLL" if integer else literal(float("inf"), at)}[reduce]
        first = f"({at}){load_expr(dtype, 'self[i]')}" if include_self else f"({at}){identity}"
        init_body = f"acc[i] = {first};" + (" count[i] = 0;" if counts else "")
        init_params = [f"const {st}* __restrict__ self"] + state
        scatter_params = params + state
    combine = {"sum": "a + b", "mean": "a + b", "prod": "a * b", "amax": "nan_max(a, b)", "amin": "nan_min(a, b)",
               "none": "b"}[reduce]
    if at == "float":
        cas = "unsigned* const u = (unsigned*)p;\n    unsigned old = *u, seen;\n    do {\n        seen = old;\n" \
              "        const float a = ca_u2f(seen);\n        old = atomicCAS(u, seen, ca_f2u(COMBINE));\n" \
              "    } while (old != seen);"
    elif at == "double":
        cas = "unsigned long long* const u = (unsigned long long*)p;\n    unsigned long long old = *u, seen;\n" \
              "    do {\n        seen = old;\n        const double a = ca_ll2d((long long)seen);\n" \
              f"        old = atomicCAS(u, seen, {ns}::bits(COMBINE));\n    }} while (old != seen);"
    else:
        cas = "unsigned long long* const u = (unsigned long long*)p;\n    unsigned long long old = *u, seen;\n" \
              "    do {\n        seen = old;\n        const long long a = (long long)seen;\n" \
              "        old = atomicCAS(u, seen, (unsigned long long)(COMBINE));\n    } while (old != seen);"
    if reduce in ("sum", "mean"):
        update = "atomicAdd((unsigned long long*)p, (unsigned long long)b);" if at == "long long" else \
            "atomicAdd(p, b);"
    else:
        update = cas.replace("COMBINE", combine)
    if reduce == "mean":
        div = "ca_div_floor(acc[i], (long long)n)" if at == "long long" else f"acc[i] / ({at})n"
        result = f"const int n = count[i]{' + 1' if include_self else ''};\n" \
                 f"        const {at} r = n ? {div} : acc[i];"
    else:
        result = f"const {at} r = acc[i];"
    keep = "" if include_self or reduce == "none" else "\n        if (count[i] == 0) { out[i] = self[i]; continue; }"
    finish_kernel = f"""
extern "C" __global__ void __launch_bounds__(BLOCK)
{kernel}_finish({", ".join([f"const {st}* __restrict__ self"] + state + [f"{st}* __restrict__ out"])})
{{
    for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < {n_out}LL; i += (long long)gridDim.x * BLOCK) {{{keep}
        {result}
        out[i] = {store_expr(dtype, f"({COMPUTE_CTYPE[dtype]})r")};
    }}
}}
""" if finish else ""
    body_text = "\n".join(body)
    return f"""
// ==== scatter: {a['mode']} ({reduce}), {n_iter} elements into {dtype}{shape} ====
namespace {ns} {{
CA_HD unsigned long long bits(double v) {{
#ifdef __CUDA_ARCH__
    return (unsigned long long)__double_as_longlong(v);
#else
    unsigned long long u; memcpy(&u, &v, 8); return u;
#endif
}}
// acc[to] op= b, atomically.
__device__ __forceinline__ void update({at}* p, {at} b) {{
    {update}
}}
}}  // namespace {ns}

extern "C" __global__ void __launch_bounds__(BLOCK)
{kernel}_init({", ".join(init_params)})
{{
    for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < {n_out}LL; i += (long long)gridDim.x * BLOCK) {{
        {init_body}
    }}
}}

extern "C" __global__ void __launch_bounds__(BLOCK)
{kernel}_scatter({", ".join(scatter_params)})
{{
    for (long long base = (long long)blockIdx.x * BLOCK * ITEMS + threadIdx.x; base < {n_iter}LL;
         base += (long long)gridDim.x * BLOCK * ITEMS) {{
      for (int it = 0; it < ITEMS; ++it) {{
        const long long e = base + (long long)it * BLOCK;
        if (e >= {n_iter}LL) break;
{body_text}
      }}
    }}
}}
{finish_kernel}"""

