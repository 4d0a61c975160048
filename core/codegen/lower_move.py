"""The data-movement family: cat, slicing (slice, select, and split / chunk / unbind through them),
constant / replicate / reflect padding, permute / transpose copies, flips that no scan takes,
index_select (torch.roll, x[:, i]), advanced indexing (x[i, j], x[torch.arange(n), t]), torch.gather
(nn.Embedding arrives as index_select), sliding
windows (Tensor.unfold), diagonals (torch.diagonal, trace's), nearest upsampling, linear / bilinear /
trilinear / bicubic interpolation, adaptive average pools and arange: one gather kernel for a whole
chain of them.

partition.canonicalize rewrites each such op into a `ca_move.default` node (to_move). Its attrs
hold a *tree*, plain data, that maps the node's output back to its tensor operands. When an
operand is itself a move whose result nothing else reads, its tree is folded in, so a chain
becomes one node. Examples: the pad and the slice of KernelBench's exclusive cumsum, or a
transpose of a slice. Tree steps, each with the `shape` of its result:

    {"op": "in", "k": K}                                     operand K of the node
    {"op": "slice", "dim": D, "start": S, "step": T, ...}    out[.., i, ..] = child[.., S + i*T, ..]
    {"op": "select", "dim": D, "index": I, ...}              the child has dim D; out drops it
    {"op": "pad", "before": [...], "value": V, ...}          child shifted by `before` per dim, else V
    {"op": "cat", "dim": D, "parts": [{"offset": O, "child": ...}, ...]}
    {"op": "permute", "dims": [...], ...}                    out dim k is child dim dims[k]
    {"op": "flip", "dims": [...], ...}
    {"op": "index", "dim": D, "k": K, ...}                   child[.., idx_K[i], ..] (index_select)
    {"op": "index", "dim": D, "table": [...], ...}           the same with an index known when lowering
                                                             (torch.roll's arange + shift, mod n)
    {"op": "gather", "dim": D, "k": K, ...}                  child[.., idx_K[i, j, ..], ..] (torch.gather: the
                                                             index has the result's shape)
    {"op": "take", "dims": [D...], "ks": [K...], "ishapes": [...], "bshape": B, "lead": L, ...}
                                                             x[i, j] (index.Tensor): the index tensors K (shapes
                                                             `ishapes`) broadcast to B, which sits at out dim L
    {"op": "windows", "dim": D, "step": T, ...}              Tensor.unfold: out[.., i, .., w] = child[.., i*T + w, ..]
    {"op": "diagonal", "dims": [D1, D2], "offset": O, ...}   out[.., k] = child[.., k + max(-O, 0) at D1,
                                                             .., k + max(O, 0) at D2, ..] (torch.diagonal)
    {"op": "const", "value": V, ...}                         a constant operand (zeros_like, full)
    {"op": "iota", "start": S, "step": T, ...}               arange: S + i * T along its one dim
    {"op": "interp", "dims": [D...], "taps": [[{"index": [...], "weight": [...]}, ...] per dim], ...}
                                                             F.interpolate's linear modes and bicubic, and
                                                             adaptive average pools (windows as taps):
                                                             sum over taps of weight[i] * child[.., index[i], ..],
                                                             dims nested in order (the last innermost), in the
                                                             compute type and rounded once, as ATen's kernels do

The kernel: each thread takes ITEMS output elements BLOCK apart (coalesced stores), unravels the
flat index over the output shape (literal sizes: divisions become multiplies) and walks the tree
back to one element of an operand or a pad value (an interp step reads several and weighs them).
Elementwise ops on the result that the partitioner adds as an epilogue run on that value before the
stores (store()). Reads follow the tree: contiguous for slices, pads and cats, strided for
transposes. Values are copied as stored, so every dtype moves exactly (interp aside: it computes).

A copy that is only a transpose (a permute of one operand whose innermost dim moves) has a second
form, TILED=1 (its default when both dims of the plane are 16 or more): 32 x 32 tiles of the plane
of the two dims that hold the input's and the output's innermost, read along the input's rows and
written along the output's through shared memory, so both sides are coalesced.

Knobs: BLOCK threads per block; ITEMS output elements per thread (the gather); TILED (transposes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from core.codegen.cuda_emit import COMPUTE_CTYPE, PRELUDE, STORAGE_CTYPE, literal, load_expr, store_expr
from core.codegen.errors import CodegenError
from core.codegen.graph import Graph, Node, Ref
from core.codegen.lower_pointwise import Lowering, emit_epilogue_chain, output_names
from core.codegen.pointwise_ops import is_pointwise
from core.codegen.schedule import Knob, ScheduleSpec

MOVE = "ca_move.default"
# ATen ops that to_move rewrites (flip only where no scan takes it: see partition.canonicalize).
MOVE_OPS = {"cat.default", "slice.Tensor", "select.int", "constant_pad_nd.default", "permute.default",
            "transpose.int", "t.default", "flip.default", "index_select.default", "gather.default",
            "unfold.default", "diagonal.default", "index.Tensor"}
# Ops whose tensor operands after the first are indices, not data of the result's dtype.
INDEXED_OPS = ("index_select.default", "gather.default", "index.Tensor")
# Index arithmetic (tril / triu / eye decompose to aranges compared with each other): written once
# to a small buffer by a move kernel, then read, broadcast, by the elementwise ops.
ARANGES = {"arange.start_step", "arange.default", "arange.start"}
INDEX_DTYPES = ("int64", "int32")
KNOBS = [
    Knob("BLOCK", (256, 128, 512, 1024), "threads per block"),
    Knob("ITEMS", (4, 1, 2, 8), "output elements per thread, BLOCK apart"),
]
INT32_LIMIT = 2 ** 31 - 2 ** 24       # a flat index below this, plus a grid's overshoot, fits an int
TILE, TILE_ROWS = 32, 8               # a transpose tile, and the thread rows that copy it (256 threads)

Tree = dict[str, Any]


def is_move(node: Node, graph: Graph) -> bool:
    return node.op == MOVE


# ---- canonical form -------------------------------------------------------------------------------

def _norm(d: int, rank: int) -> int:
    return d % rank if rank else 0


def _step(node: Node, shapes: list[tuple[int, ...]], table: list[int] | None = None) -> Tree | None:
    """The tree step of one ATen move node over leaves ("in", k) of its tensor operands (whose
    shapes are `shapes`); None when the node's arguments are out of reach."""
    out = list(node.shape)
    a = node.attrs

    def leaf(k: int) -> Tree:
        return {"op": "in", "k": k, "shape": list(shapes[k])}

    src = shapes[0] if shapes else ()
    rank = len(src)
    if node.op == "slice.Tensor":
        d = _norm(a.get("dim", 0), rank)
        size, step = src[d], a.get("step", 1) or 1
        start = a.get("start") or 0
        start = min(max(start + size if start < 0 else start, 0), size)
        if step < 1:
            return None
        return {"op": "slice", "dim": d, "start": start, "step": step, "shape": out, "child": leaf(0)}
    if node.op == "select.int":
        d = _norm(a["dim"], rank)
        index = a["index"] + src[d] if a["index"] < 0 else a["index"]
        return {"op": "select", "dim": d, "index": index, "shape": out, "child": leaf(0)}
    if node.op == "constant_pad_nd.default":
        pad = list(a["pad"])
        before = [0] * rank
        for i in range(len(pad) // 2):
            before[rank - 1 - i] = pad[2 * i]
        value = a.get("value", 0)
        return {"op": "pad", "before": before, "value": value, "shape": out, "child": leaf(0)}
    if node.op in ("permute.default", "transpose.int", "t.default"):
        if node.op == "permute.default":
            dims = [_norm(d, rank) for d in a["dims"]]
        else:
            dims = list(range(rank))
            d0, d1 = (_norm(a["dim0"], rank), _norm(a["dim1"], rank)) if node.op == "transpose.int" else \
                ((0, 1) if rank == 2 else (0, 0))
            dims[d0], dims[d1] = dims[d1], dims[d0]
        return {"op": "permute", "dims": dims, "shape": out, "child": leaf(0)}
    if node.op == "flip.default":
        return {"op": "flip", "dims": sorted({_norm(d, rank) for d in a["dims"]}), "shape": out,
                "child": leaf(0)}
    if node.op == "index_select.default":
        if table is not None:
            return {"op": "index", "dim": _norm(a["dim"], rank), "table": list(table), "shape": out,
                    "child": leaf(0)}
        if len(shapes) < 2 or len(shapes[1]) > 1:
            return None
        return {"op": "index", "dim": _norm(a["dim"], rank), "k": 1, "shape": out, "child": leaf(0)}
    if node.op == "index.Tensor":
        return _take_step(a.get("indices") or [], src, [list(s) for s in shapes[1:]], out, leaf(0))
    if node.op == "unfold.default":
        d, size, step = _norm(a["dimension"], rank), a["size"], a["step"]
        if step < 1 or size < 1 or (rank and size > src[d]):
            return None
        return {"op": "windows", "dim": d, "step": step, "shape": out, "child": leaf(0)}
    if node.op == "diagonal.default":
        d1, d2 = _norm(a.get("dim1", 0), rank), _norm(a.get("dim2", 1), rank)
        if d1 == d2:
            return None
        return {"op": "diagonal", "dims": [d1, d2], "offset": a.get("offset", 0) or 0, "shape": out,
                "child": leaf(0)}
    if node.op == "gather.default":
        if len(shapes) < 2 or len(shapes[1]) != rank or list(shapes[1]) != out:
            return None
        return {"op": "gather", "dim": _norm(a["dim"], rank), "k": 1, "shape": out, "child": leaf(0)}
    if node.op == "cat.default":
        d = _norm(a.get("dim", 0), len(out))
        parts, offset = [], 0
        for k, s in enumerate(shapes):
            if len(s) != len(out):          # the legacy empty [0] operand: nothing to copy
                continue
            if s[d]:
                parts.append({"offset": offset, "child": leaf(k)})
            offset += s[d]
        return {"op": "cat", "dim": d, "parts": parts, "shape": out}
    return None


def _take_step(indices: list, src: tuple[int, ...], ishapes: list[list[int]], out: list[int], child: Tree) -> Tree | None:
    """x[..., i, j, ...] with index tensors (PyTorch's advanced indexing): they broadcast to one shape
    B, which replaces the indexed dims where those are adjacent, else comes first."""
    dims = [d for d, i in enumerate(indices) if i is not None]
    if not dims or len(ishapes) != len(dims):
        return None
    rest = [d for d in range(len(src)) if d not in dims]
    lead = dims[0] if dims == list(range(dims[0], dims[-1] + 1)) else 0
    nb = max(len(s) for s in ishapes)
    bshape = list(out[lead:lead + nb])          # the traced result holds B; check that it is theirs
    if [src[d] for d in rest[:lead]] + bshape + [src[d] for d in rest[lead:]] != list(out) or \
            any(n not in (1, m) for s in ishapes for n, m in zip(s, bshape[nb - len(s):])):
        return None
    return {"op": "take", "dims": dims, "ks": list(range(1, len(dims) + 1)), "ishapes": ishapes, "bshape": bshape,
            "lead": lead, "shape": list(out), "child": child}


def tensor_operands(node: Node) -> list[Ref]:
    """The node's tensor operands in order (cat keeps them in its `tensors` attribute; index.Tensor
    its index tensors in `indices`, after the indexed tensor)."""
    if node.op == "cat.default" and not node.operands:
        return [t for t in node.attrs.get("tensors", []) if isinstance(t, Ref)]
    if node.op == "index.Tensor":
        return [o for o in node.operands[:1] if isinstance(o, Ref)] + \
            [i for i in node.attrs.get("indices") or [] if isinstance(i, Ref)]
    return [o for o in node.operands if isinstance(o, Ref)]


def upsample_tree(node: Node, src: Any, tables: list[list[int]]) -> Node:
    """A ca_move node reading `src` through one index table per spatial dim (dims 2, 3, ...)."""
    tree: Tree = {"op": "in", "k": 0, "shape": list(src.shape)}
    shape = list(src.shape)
    for k, table in enumerate(tables):
        shape[2 + k] = len(table)
        tree = {"op": "index", "dim": 2 + k, "table": table, "shape": list(shape), "child": tree}
    return Node(node.name, MOVE, [node.operands[0]], {"tree": tree}, node.shape, node.dtype)


def interp_tree(node: Node, src: Any, taps: list[list[dict[str, Any]]]) -> Node:
    """A ca_move node weighing taps of `src` over its last len(taps) dims: `taps[k]` are the taps
    of the k-th of them, each an index table and a weight table over the output positions (and
    "sparse": True where a weight of 0 marks a tap that is not there: its element is not used,
    so an inf there does not make 0 * inf = NaN)."""
    rank = len(node.shape)
    dims = list(range(rank - len(taps), rank))
    return Node(node.name, MOVE, [node.operands[0]], {"tree": {
        "op": "interp", "dims": dims, "taps": taps, "shape": list(node.shape),
        "child": {"op": "in", "k": 0, "shape": list(src.shape)}}}, node.shape, node.dtype)


def arange_to_move(node: Node) -> Node | None:
    """An arange (no operands) as a ca_move node with an iota tree; None for other forms."""
    a = node.attrs
    if len(node.shape) != 1 or node.operands or not all(isinstance(a.get(k, 0), (int, float)) for k in
                                                          ("start", "step")):
        return None
    return Node(node.name, MOVE, [], {"tree": {"op": "iota", "start": a.get("start", 0) or 0,
                                               "step": a.get("step", 1) or 1, "shape": list(node.shape)}},
                node.shape, node.dtype)


def to_move(node: Node, values: dict[str, Any], foldable: set[str], table: list[int] | None = None) -> Node | None:
    """`node` (an ATen op of MOVE_OPS) as a ca_move node, with the trees of operands named in
    `foldable` (ca_move nodes whose only reader is `node`) folded in; None when it cannot be
    (an operand of another dtype, an index that is not a 1-D int64/int32 tensor). `table`: an
    index_select's index, when it is a constant (its operand is then not read)."""
    refs = tensor_operands(node)
    if table is not None:
        refs = refs[:1]
    if not refs or (node.op == "cat.default" and len(refs) != len(node.attrs.get("tensors", []))):
        return None
    data = refs[:1] if node.op in INDEXED_OPS else refs
    if any(values[r.name].dtype != node.dtype for r in data):
        return None
    if node.op in INDEXED_OPS and table is None and any(values[r.name].dtype not in INDEX_DTYPES for r in refs[1:]):
        return None
    tree = _step(node, [tuple(values[r.name].shape) for r in refs], table)
    if tree is None:
        return None
    operands: list[Ref] = []

    def place(ref: Ref) -> int:
        if ref not in operands:
            operands.append(ref)
        return operands.index(ref)

    def graft(t: Tree) -> Tree:
        """Replace each leaf of the new step by the operand's tree (folded) or a renumbered leaf."""
        if t["op"] == "in":
            ref = refs[t["k"]]
            child = values[ref.name]
            if ref.name in foldable and getattr(child, "op", None) == "full.default":
                return {"op": "const", "value": child.attrs["fill_value"], "shape": t["shape"]}
            if ref.name in foldable and getattr(child, "op", None) == MOVE:
                inner = child.attrs["tree"]
                own = [place(r) for r in child.operands]
                return _renumber(inner, own)
            return {**t, "k": place(ref)}
        out = dict(t)
        if "child" in t:
            out["child"] = graft(t["child"])
        if "parts" in t:
            out["parts"] = [{"offset": p["offset"], "child": graft(p["child"])} for p in t["parts"]]
        if t["op"] in ("index", "gather") and "k" in t:
            out["k"] = place(refs[t["k"]])
        if t["op"] == "take":
            out["ks"] = [place(refs[k]) for k in t["ks"]]
        return out

    tree = graft(tree)
    return Node(node.name, MOVE, list(operands), {"tree": tree}, node.shape, node.dtype)


def _renumber(t: Tree, mapping: list[int]) -> Tree:
    out = dict(t)
    if t["op"] in ("in", "index", "gather") and "k" in t:
        out["k"] = mapping[t["k"]]
    if t["op"] == "take":
        out["ks"] = [mapping[k] for k in t["ks"]]
    if "child" in t:
        out["child"] = _renumber(t["child"], mapping)
    if "parts" in t:
        out["parts"] = [{"offset": p["offset"], "child": _renumber(p["child"], mapping)} for p in t["parts"]]
    return out


def describe(t: Tree, names: list[str]) -> str:
    op = t["op"]
    if op == "in":
        return names[t["k"]]
    if op == "const":
        return f"full({t['value']})"
    if op == "iota":
        return f"arange({t['start']}, step {t['step']})"
    if op == "cat":
        return f"cat(dim {t['dim']}: " + ", ".join(describe(p["child"], names) for p in t["parts"]) + ")"
    inner = describe(t["child"], names)
    if op == "slice":
        return f"{inner}[dim {t['dim']}: {t['start']}::{t['step']}]"
    if op == "select":
        return f"{inner}[dim {t['dim']} = {t['index']}]"
    if op == "pad":
        return f"pad({inner}, before {t['before']}, value {t['value']})"
    if op == "index":
        size = t["child"]["shape"][t["dim"]]
        shift = _rotation(t["table"]) if "table" in t and len(t["table"]) == size else None
        how = names[t["k"]] if "k" in t else f"a roll by {shift}" if shift is not None else \
            f"a table of {len(t['table'])}"
        return f"index_select({inner}, dim {t['dim']}, {how})"
    if op == "gather":
        return f"gather({inner}, dim {t['dim']}, {names[t['k']]})"
    if op == "take":
        where = ", ".join(names[t["ks"][t["dims"].index(d)]] if d in t["dims"] else ":"
                          for d in range(t["dims"][-1] + 1))
        return f"{inner}[{where}]"
    if op == "windows":
        return f"unfold({inner}, dim {t['dim']}, size {t['shape'][-1]}, step {t['step']})"
    if op == "diagonal":
        return f"diagonal({inner}, offset {t['offset']}, dims {t['dims']})"
    if op == "interp":
        return f"interpolate({inner}, dims {t['dims']}, {len(t['taps'][0])} taps, to {t['shape']})"
    return f"{op}({inner}, {t['dims']})"


# ---- lowering -------------------------------------------------------------------------------------

def lower_move(graph: Graph, kernel: str) -> Lowering:
    """One gather kernel for a graph of one ca_move node over graph inputs, and the elementwise
    epilogue on its result the partitioner may add (ops of its size, reading it and group inputs
    broadcast to it)."""
    moves = [m for m in graph.nodes if m.op == MOVE]
    if len(moves) != 1:
        raise CodegenError(f"Task '{graph.task}': the data-movement family lowers one ca_move node over "
                           f"graph inputs; this graph has {', '.join(graph.ops())}.",
                           task=graph.task, ops=graph.ops())
    node = moves[0]
    names = [o.name for o in node.operands]
    inputs = {v.name: v for v in graph.inputs}
    missing = [n for n in names if n not in inputs]
    if missing:
        raise CodegenError(f"Task '{graph.task}': the data-movement group reads {missing}, which are not "
                           "its inputs", task=graph.task, ops=graph.ops())
    n = math.prod(node.shape)
    if n == 0:
        raise CodegenError(f"Task '{graph.task}': '{node.name}' has no elements ({list(node.shape)}); "
                           "there is nothing to launch", task=graph.task, ops=graph.ops())
    epi = _epilogue(graph, node, n)
    largest = max([n] + [math.prod(inputs[x].shape) for x in names + [v.name for v in epi.extra]])
    idx_t = "int" if largest < INT32_LIMIT else "long long"
    outs = output_names(len(graph.outputs), set(names) | {v.name for v in epi.extra})
    tree = node.attrs["tree"]
    plane = _transpose_plane(tree)
    knobs = list(KNOBS)
    grid, block = f"cdiv({n}, BLOCK * ITEMS)", ["BLOCK"]
    source = PRELUDE + _emit(kernel, node, [inputs[x] for x in names], idx_t, plane, graph, epi)
    if plane is not None:
        k, last = plane
        shape = tree["shape"]
        tiles = _cdiv(shape[k], TILE) * _cdiv(shape[last], TILE) * math.prod(
            s for d, s in enumerate(shape) if d not in (k, last))
        wide = min(shape[k], shape[last]) >= 16
        knobs.append(Knob("TILED", (1, 0) if wide else (0, 1),
                          f"1: {TILE} x {TILE} tiles through shared memory, reads and writes coalesced; 0: the gather"))
        grid = f"{tiles} if TILED else {grid}"
        block = [f"{TILE} if TILED else BLOCK", f"{TILE_ROWS} if TILED else 1"]
    default = {k.name: k.values[0] for k in knobs}
    program = {
        "format": "cuda-agent/program@1", "name": kernel, "source": source,
        "tunables": {k.name: list(k.values) for k in knobs},
        "schedule": default,
        "buffers": [{"name": name, "shape": list(graph.value(o).shape), "dtype": graph.value(o).dtype}
                    for name, o in zip(outs, graph.outputs)],
        "launches": [{"kernel": kernel, "grid": [grid], "block": block, "shared_bytes": 0,
                      "args": names + [v.name for v in epi.extra] + outs}],
        "outputs": outs,
    }

    def idle(s: Any) -> str | None:
        if s["BLOCK"] * s["ITEMS"] > max(n, 1024) and dict(s) != default:
            return f"BLOCK={s['BLOCK']} x ITEMS={s['ITEMS']} for {n} elements leaves threads idle"
        return None

    def tiled_alone(s: Any) -> str | None:
        if s.get("TILED") and (s["BLOCK"] != TILE * TILE_ROWS or s["ITEMS"] != KNOBS[1].values[0]):
            return (f"TILED=1 runs {TILE} x {TILE_ROWS} threads: BLOCK and ITEMS shape the gather only "
                    f"(BLOCK={TILE * TILE_ROWS}, ITEMS={KNOBS[1].values[0]} with TILED=1)")
        return None

    spec = ScheduleSpec(knobs, [idle, tiled_alone], defaults=default)
    notes = [f"data movement: {describe(node.attrs['tree'], names)} -> {node.dtype}{list(node.shape)}, "
             f"{n} elements, {idx_t} indices"]
    if epi.nodes:
        notes.append(f"epilogue: {', '.join(m.op for m in epi.nodes)}")
    return Lowering(program, spec, notes)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _transpose_plane(t: Tree) -> tuple[int, int] | None:
    """(k, last) when the tree is a permute of one operand that moves its innermost dim: output dim
    k holds the input's innermost, the output's innermost comes from another input dim."""
    if t["op"] != "permute" or t["child"]["op"] != "in" or len(t["dims"]) < 2:
        return None
    dims, last = t["dims"], len(t["dims"]) - 1
    if dims[last] == last or t["shape"][last] == 1 or t["child"]["shape"][last] == 1:
        return None
    return dims.index(last), last


def _emit_tiled(node: Node, plane: tuple[int, int], idx_t: str, stores: str) -> list[str]:
    """The TILED=1 body: one 32 x 32 tile of the (k, last) plane per block, through shared memory."""
    t = node.attrs["tree"]
    k, last = plane
    shape, dims, src = t["shape"], t["dims"], t["child"]["shape"]
    others = [d for d in range(len(shape)) if d not in (k, last)]
    out_t = STORAGE_CTYPE[node.dtype]
    pad = "    "
    lines = [f"{pad}__shared__ {out_t} tile[{TILE}][{TILE + 1}];",
             f"{pad}{idx_t} b = blockIdx.x;",
             f"{pad}const {idx_t} tl = b % {_cdiv(shape[last], TILE)}; b /= {_cdiv(shape[last], TILE)};",
             f"{pad}const {idx_t} tk = b % {_cdiv(shape[k], TILE)}; b /= {_cdiv(shape[k], TILE)};"]
    idx = [""] * len(shape)
    for d in reversed(others[1:]):
        lines.append(f"{pad}const {idx_t} o{d} = b % {shape[d]}; b /= {shape[d]};")
        idx[d] = f"o{d}"
    if others:
        lines.append(f"{pad}const {idx_t} o{others[0]} = b;")
        idx[others[0]] = f"o{others[0]}"
    idx[k], idx[last] = "ok", "ol"
    j = [""] * len(shape)
    for m, d in enumerate(dims):
        j[d] = idx[m]
    lines += [
        f"{pad}for (int r = threadIdx.y; r < {TILE}; r += {TILE_ROWS}) {{   // along the input's rows",
        f"{pad}    const {idx_t} ok = tk * {TILE} + threadIdx.x, ol = tl * {TILE} + r;",
        f"{pad}    if (ok < {shape[k]} && ol < {shape[last]}) tile[r][threadIdx.x] = in0[{_ravel(j, src)}];",
        f"{pad}}}",
        f"{pad}__syncthreads();",
        f"{pad}for (int r = threadIdx.y; r < {TILE}; r += {TILE_ROWS}) {{   // along the output's rows",
        f"{pad}    const {idx_t} ol = tl * {TILE} + threadIdx.x, ok = tk * {TILE} + r;",
        f"{pad}    if (ok < {shape[k]} && ol < {shape[last]}) store(tile[threadIdx.x][r], {_ravel(idx, shape)}, {stores});",
        f"{pad}}}",
    ]
    return lines


@dataclass
class _Epilogue:
    """Elementwise ops on the move's result, computed in the same kernel (see lower_move)."""

    alias: dict[str, str] = field(default_factory=dict)     # value -> the move or epilogue node it views
    nodes: list[Node] = field(default_factory=list)          # pointwise nodes, in order
    extra: list[Any] = field(default_factory=list)           # group inputs they read (one pointer each)
    reads: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)   # value -> (input, shape)


def _epilogue(graph: Graph, move: Node, n: int) -> _Epilogue:
    from core.codegen.partition import is_view      # (partition imports this module)

    inputs = {v.name: v for v in graph.inputs}
    epi = _Epilogue(alias={move.name: move.name}, reads={v.name: (v.name, tuple(v.shape)) for v in graph.inputs})
    extra: dict[str, Any] = {}

    def refuse(what: str, ops: list[str]) -> CodegenError:
        return CodegenError(f"Task '{graph.task}': the data-movement family takes a move and an elementwise "
                            f"epilogue on its result; {what}.", task=graph.task, ops=ops)

    for m in graph.nodes:
        if m is move:
            continue
        refs = [o.name for o in m.operands if isinstance(o, Ref)]
        if is_view(m, graph) and len(refs) == 1 and refs[0] in epi.reads and refs[0] not in epi.alias:
            epi.reads[m.name] = (epi.reads[refs[0]][0], tuple(m.shape))      # a group input viewed
            continue
        if math.prod(m.shape) != n:
            raise refuse(f"'{m.op}' (node '{m.name}') has {math.prod(m.shape)} elements, not the move's {n}",
                         [m.op])
        if is_view(m, graph) and len(refs) == 1 and refs[0] in epi.alias:
            epi.alias[m.name] = epi.alias[refs[0]]
        elif is_pointwise(m) and all(r in epi.alias or r in epi.reads for r in refs):
            for r in refs:
                if r in epi.alias:
                    continue
                source, shape = epi.reads[r]
                aligned = (1,) * (len(m.shape) - len(shape)) + shape
                if len(shape) > len(m.shape) or any(a not in (1, s) for a, s in zip(aligned, m.shape)):
                    raise refuse(f"'{m.op}' reads '{source}' as {list(shape)}, which does not broadcast to "
                                 f"{list(m.shape)}", [m.op])
                extra.setdefault(source, inputs[source])
            epi.alias[m.name] = m.name
            epi.nodes.append(m)
        else:
            raise refuse(f"it cannot fuse '{m.op}' (node '{m.name}')", [m.op])
    for o in graph.outputs:
        if o not in epi.alias:
            raise refuse(f"the group output '{o}' is not the move's result or computed from it", [move.op])
    epi.extra = list(extra.values())
    return epi


def _emit_epilogue(graph: Graph, move: Node, epi: _Epilogue, idx_t: str) -> str:
    """store(v, e, inputs..., outputs...): the epilogue on the moved value v (as stored) at flat
    index e, and every group output stored."""
    values = {v.name: v for v in graph.inputs}
    values.update({m.name: m for m in graph.nodes})
    raw_t = STORAGE_CTYPE[move.dtype]
    params = [f"{raw_t} v", f"{idx_t} e"]
    params += [f"const {STORAGE_CTYPE[v.dtype]}* __restrict__ x{k}" for k, v in enumerate(epi.extra)]
    params += [f"{STORAGE_CTYPE[values[o].dtype]}* __restrict__ y{k}" for k, o in enumerate(graph.outputs)]
    lines = [f"CA_HD void store({', '.join(params)}) {{"]
    ct = COMPUTE_CTYPE[move.dtype]
    var: dict[str, tuple[str, str]] = {move.name: ("mv", ct)}
    if epi.nodes:
        lines.append(f"    const {ct} mv = {load_expr(move.dtype, 'v')};")
    lines += emit_epilogue_chain(graph, epi.nodes, var, epi.alias, epi.reads,
                                 {v.name: f"x{k}" for k, v in enumerate(epi.extra)}, "data-movement", temp="t")
    for k, o in enumerate(graph.outputs):
        source = epi.alias[o]
        if source == move.name:
            lines.append(f"    y{k}[e] = v;")               # the moved value itself: the same bits
        else:
            lines.append(f"    y{k}[e] = {store_expr(values[o].dtype, var[source][0])};")
    lines.append("}")
    return "\n".join(lines)


def _ravel(idx: list[str], shape: list[int]) -> str:
    if not shape:
        return "0"
    expr = idx[0]
    for i, s in zip(idx[1:], shape[1:]):
        expr = f"({expr}) * {s} + {i}"
    return expr


def _rotation(table: list[int]) -> int | None:
    """s when table[i] = (i + s) mod n for every i (torch.roll's index), else None."""
    n = len(table)
    if not n:
        return None
    s = table[0] % n
    return s if all(v == (i + s) % n for i, v in enumerate(table)) else None


def _fill(value: Any, dtype: str) -> str:
    """A pad or constant value as stored in `dtype` (an integer tensor truncates it, as PyTorch does)."""
    ctype = COMPUTE_CTYPE[dtype]
    if ctype == "bool":
        value = bool(value)
    elif ctype not in ("float", "double"):
        value = int(value)
    return store_expr(dtype, literal(value, ctype))


class _Emitter:
    def __init__(self, kernel: str, dtype: str, operands: list[Any], idx_t: str):
        self.kernel, self.dtype, self.operands, self.idx_t = kernel, dtype, operands, idx_t
        self.count = 0
        self.tables: list[str] = []      # file-scope index and weight tables
        self.named: dict[tuple, str] = {}   # tables already written, by (ctype, values)

    def temp(self, lines: list[str], pad: str, expr: str) -> str:
        self.count += 1
        name = f"j{self.count}"
        lines.append(f"{pad}const {self.idx_t} {name} = {expr};")
        return name

    def table(self, values: list, ctype: str) -> str:
        """A file-scope constant table of `values` (written once), by name."""
        key = (ctype, tuple(values))
        if key not in self.named:
            self.named[key] = name = f"{self.kernel}_table{len(self.tables)}"
            self.tables.append(f"__device__ const {ctype} {name}[{len(values)}] = {{"
                               f"{', '.join(literal(v, ctype) for v in values)}}};")
        return self.named[key]

    def interp(self, t: Tree, level: int, out: list[str], j: list[str], pad: str) -> tuple[list[str], str]:
        """Statements computing the interpolation over t's dims from `level` on (`j`: the child's
        index so far), and the name of the compute-type value. Each tap's weight multiplies the value
        of the levels inside it; the taps are summed in order (ATen's h0 * (w0 * a + w1 * b) + ...)."""
        ct = COMPUTE_CTYPE[self.dtype]
        lines: list[str] = []
        if level == len(t["dims"]):
            lines += self.gen(t["child"], j, pad)
            self.count += 1
            lines.append(f"{pad}const {ct} q{self.count} = {load_expr(self.dtype, 'v')};")
            return lines, f"q{self.count}"
        d = t["dims"][level]
        terms = []
        for tap in t["taps"][level]:
            k = list(j)
            k[d] = self.temp(lines, pad, f"({self.idx_t}){self.table(tap['index'], 'int')}[{out[d]}]")
            self.count += 1
            weight = f"w{self.count}"
            lines.append(f"{pad}const {ct} {weight} = {self.table(tap['weight'], ct)}[{out[d]}];")
            inner, value = self.interp(t, level + 1, out, k, pad)
            lines += inner
            terms.append(f"({weight} != 0 ? {weight} * {value} : ({ct})0)" if tap.get("sparse") else
                         f"{weight} * {value}")
        self.count += 1
        lines.append(f"{pad}const {ct} q{self.count} = {' + '.join(terms)};")
        return lines, f"q{self.count}"

    def guarded(self, conds: list[str], child: Tree, idx: list[str], pad: str, fill: str) -> list[str]:
        """The child's element where every condition holds, else `fill`."""
        if not conds:
            return self.gen(child, idx, pad)
        return [f"{pad}if ({' && '.join(conds)}) {{", *self.gen(child, idx, pad + "    "),
                f"{pad}}} else {{", f"{pad}    v = {fill};", f"{pad}}}"]

    def gen(self, t: Tree, idx: list[str], pad: str) -> list[str]:
        """Statements that set `v` to the tree's element at `idx` (one index expression per dim)."""
        op, lines = t["op"], []
        if op == "in":
            lines.append(f"{pad}v = in{t['k']}[{_ravel(idx, t['shape'])}];")
            return lines
        if op == "const":
            lines.append(f"{pad}v = {_fill(t['value'], self.dtype)};")
            return lines
        if op == "iota":          # exact in int64; floats as start + i * step in double, then rounded
            ct = COMPUTE_CTYPE[self.dtype]
            wide = "long long" if ct not in ("float", "double") else "double"
            value = f"({wide}){literal(t['start'], wide)} + ({wide})({idx[0]}) * ({wide}){literal(t['step'], wide)}"
            lines.append(f"{pad}v = {store_expr(self.dtype, f'({ct})({value})')};")
            return lines
        if op == "slice":
            d = t["dim"]
            j = list(idx)
            j[d] = self.temp(lines, pad, f"{t['start']} + ({idx[d]}) * {t['step']}" if t["step"] != 1
                             else f"{t['start']} + {idx[d]}")
            return lines + self.gen(t["child"], j, pad)
        if op == "select":
            j = idx[:t["dim"]] + [str(t["index"])] + idx[t["dim"]:]
            return lines + self.gen(t["child"], j, pad)
        if op == "permute":
            j = [""] * len(idx)
            for k, d in enumerate(t["dims"]):
                j[d] = idx[k]
            return lines + self.gen(t["child"], j, pad)
        if op == "flip":
            j = list(idx)
            size = t["child"]["shape"]
            for d in t["dims"]:
                j[d] = self.temp(lines, pad, f"{size[d] - 1} - ({idx[d]})")
            return lines + self.gen(t["child"], j, pad)
        if op == "pad":
            size = t["child"]["shape"]
            j, conds = list(idx), []
            for d, b in enumerate(t["before"]):
                if b == 0 and t["shape"][d] == size[d]:
                    continue
                j[d] = self.temp(lines, pad, f"({idx[d]}) - ({b})" if b else idx[d])
                conds.append(f"{j[d]} >= 0 && {j[d]} < {size[d]}")
            return lines + self.guarded(conds, t["child"], j, pad, _fill(t["value"], self.dtype))
        if op == "index":
            d, size = t["dim"], t["child"]["shape"][t["dim"]]
            j = list(idx)
            shift = _rotation(t["table"]) if "table" in t and len(t["table"]) == size else None
            if shift is not None:           # torch.roll: (i + shift) mod size, no table
                j[d] = self.temp(lines, pad, f"({idx[d]}) + {shift}")
                lines.append(f"{pad}const {self.idx_t} w{self.count} = {j[d]} >= {size} ? {j[d]} - {size} : {j[d]};")
                j[d] = f"w{self.count}"
                return lines + self.gen(t["child"], j, pad)
            # An index known when lowering is a table in the source, else the index operand.
            source = self.table([int(v) for v in t["table"]], "int") if "table" in t else f"in{t['k']}"
            j[d] = self.temp(lines, pad, f"({self.idx_t}){source}[{idx[d]}]")
            # An index out of range (PyTorch raises there) gives 0, not a read outside the tensor.
            return lines + self.guarded([f"{j[d]} >= 0 && {j[d]} < {size}"], t["child"], j, pad,
                                        _fill(0, self.dtype))
        if op == "take":            # each indexed dim reads its index tensor at the broadcast position
            lead, nb, size = t["lead"], len(t["bshape"]), t["child"]["shape"]
            b = idx[lead:lead + nb]
            others = iter(idx[:lead] + idx[lead + nb:])
            j, conds = [""] * len(size), []
            for d in range(len(size)):
                if d not in t["dims"]:
                    j[d] = next(others)
                    continue
                q = t["dims"].index(d)
                ishape = t["ishapes"][q]
                at = [b[nb - len(ishape) + e] if n != 1 else "0" for e, n in enumerate(ishape)]
                v = self.temp(lines, pad, f"({self.idx_t})in{t['ks'][q]}[{_ravel(at, ishape)}]")
                j[d] = self.temp(lines, pad, f"{v} < 0 ? {v} + {size[d]} : {v}")     # negative: from the end
                conds.append(f"{j[d]} >= 0 && {j[d]} < {size[d]}")
            # Out of range (PyTorch raises there): 0, not a read outside the tensor.
            return lines + self.guarded(conds, t["child"], j, pad, _fill(0, self.dtype))
        if op == "windows":         # the window's position is the last index; dim d picks the window
            d = t["dim"]
            j = list(idx[:-1])
            j[d] = self.temp(lines, pad, f"({idx[d]}) * {t['step']} + ({idx[-1]})")
            return lines + self.gen(t["child"], j, pad)
        if op == "diagonal":        # the two dims leave; the last index walks the diagonal
            (d1, d2), off = t["dims"], t["offset"]
            rest = iter(idx[:-1])
            k = idx[-1]
            j = [""] * len(t["child"]["shape"])
            for d in range(len(j)):
                if d == d1:
                    j[d] = self.temp(lines, pad, f"({k}) + {-off}") if off < 0 else k
                elif d == d2:
                    j[d] = self.temp(lines, pad, f"({k}) + {off}") if off > 0 else k
                else:
                    j[d] = next(rest)
            return lines + self.gen(t["child"], j, pad)
        if op == "gather":          # the index has this step's shape: read it at this element
            d, size = t["dim"], t["child"]["shape"][t["dim"]]
            j = list(idx)
            j[d] = self.temp(lines, pad, f"({self.idx_t})in{t['k']}[{_ravel(idx, t['shape'])}]")
            # Out of range (PyTorch raises there): 0, not a read outside the tensor.
            return lines + self.guarded([f"{j[d]} >= 0 && {j[d]} < {size}"], t["child"], j, pad,
                                        _fill(0, self.dtype))
        if op == "interp":          # the tables hold indices inside the child: no guard
            lines, value = self.interp(t, 0, idx, list(idx), pad)
            return lines + [f"{pad}v = {store_expr(self.dtype, value)};"]
        if op == "cat":
            d, parts = t["dim"], t["parts"]
            for p_i, part in enumerate(parts):
                j = list(idx)
                if part["offset"]:
                    j[d] = f"({idx[d]}) - {part['offset']}"
                end = part["offset"] + part["child"]["shape"][d]
                last = p_i == len(parts) - 1
                if p_i == 0:
                    lines.append(f"{pad}{{" if last else f"{pad}if ({idx[d]} < {end}) {{")
                else:
                    lines.append(f"{pad}}} else {{" if last else f"{pad}}} else if ({idx[d]} < {end}) {{")
                lines += self.gen(part["child"], j, pad + "    ")
            lines.append(f"{pad}}}")
            return lines
        raise CodegenError(f"internal: unknown move step {op!r}")


def _emit(kernel: str, node: Node, operands: list[Any], idx_t: str, plane: tuple[int, int] | None,
          graph: Graph, epi: _Epilogue) -> str:
    out_t = STORAGE_CTYPE[node.dtype]
    shape = list(node.shape) or [1]
    em = _Emitter(kernel, node.dtype, operands, idx_t)
    pad = " " * 12
    body: list[str] = [f"{pad}{idx_t} r = i;"]
    idx = [""] * len(shape)
    for d in range(len(shape) - 1, 0, -1):
        body.append(f"{pad}const {idx_t} o{d} = r % {shape[d]}; r /= {shape[d]};")
        idx[d] = f"o{d}"
    body.append(f"{pad}const {idx_t} o0 = r;")
    idx[0] = "o0"
    if not node.shape:
        idx = []
    body.append(f"{pad}{out_t} v;")
    body += em.gen(node.attrs["tree"], idx, pad)
    stores = ", ".join([f"x{k}" for k in range(len(epi.extra))] + [f"y{k}" for k in range(len(graph.outputs))])
    body.append(f"{pad}store(v, i, {stores});")
    params = "".join(f"const {STORAGE_CTYPE[v.dtype]}* __restrict__ in{k}, " for k, v in enumerate(operands))
    params += "".join(f"const {STORAGE_CTYPE[v.dtype]}* __restrict__ x{k}, " for k, v in enumerate(epi.extra))
    values = {v.name: v for v in graph.inputs}
    values.update({m.name: m for m in graph.nodes})
    params += ", ".join(f"{STORAGE_CTYPE[values[o].dtype]}* __restrict__ y{k}" for k, o in enumerate(graph.outputs))
    n = math.prod(node.shape)
    gather = [
        f"    const {idx_t} first = ({idx_t})blockIdx.x * (BLOCK * ITEMS) + ({idx_t})threadIdx.x;",
        "    #pragma unroll",
        "    for (int it = 0; it < ITEMS; ++it) {",
        f"        const {idx_t} i = first + ({idx_t})it * BLOCK;",
        f"        if (i < {n}) {{",
        *body,
        "        }",
        "    }",
    ]
    if plane is not None:
        gather = ["#if TILED", *_emit_tiled(node, plane, idx_t, stores), "#else", *gather, "#endif"]
    return "\n".join([
        "",
        *em.tables,
        _emit_epilogue(graph, node, epi, idx_t),
        "extern \"C\" __global__ void __launch_bounds__(BLOCK)",
        f"{kernel}({params})",
        "{",
        *gather,
        "}",
        "",
    ])
