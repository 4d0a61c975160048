"""generate(task) -> GeneratedProgram: capture the reference, cut it into fusion groups, lower each
group with its family, merge the groups into one multi-kernel KernelProgram.

Families: pointwise (elementwise chains with broadcasting), rowreduce (softmax / log-softmax or a
lone sum, mean, amax, amin over the last dim), reduce (any reduction over any dims with a
pointwise prologue and epilogue), rownorm (reductions over the same rows with the elementwise
ops that use their results on the rows again, one kernel: norms, logsumexp, row distances,
softmax over any dim), scan (cumsum / cumprod / logcumsumexp / cummax / cummin with flips and
pointwise ops around them), pool (max / avg pooling with a pointwise epilogue), matmul (a matrix product, batched or not, its operands
read where they lie, transposed or not, with a pointwise epilogue), conv (a convolution as an implicit
product by the same kernel). partition.py forms the groups; a family that refuses a group's prologue or epilogue is retried without it (those ops then run in a pointwise
group); a refused row group is retried with its reductions unfused, on the graph canonicalised
without the row rewrites (the reduce + pointwise path). A graph with an op that no family lowers
raises CodegenError naming the first such op and the task.

Merging: a graph of one group is the family's program as it is (its knob names, kernel name,
buffers). With several groups, group i's knobs become `G{i}_<knob>` in tunables, schedule,
constraints and every plan expression; in the CUDA source each group's code sits between
`#define <knob> G{i}_<knob>` lines and their #undef (the -D options carry the prefixed names, so
the family's code compiles unchanged) and inside `namespace ca_g{i}` (helpers of two groups of
one family do not collide); the shared PRELUDE comes once. Each group's output buffers become the
partition's buffers (a value read by a later group, or a forward output), its scratch buffers
get a `g{i}_` prefix, and a group input that is a reshaped alias of a buffer or task input has its
`.shape[i]` / `.numel` rewritten to expressions of the tensor it aliases.
"""
from __future__ import annotations

import itertools
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from core.codegen.capture import capture
from core.codegen.cuda_emit import PRELUDE
from core.codegen.errors import CodegenError
from core.codegen.graph import Graph, Node, Ref
from core.codegen.partition import (FAMILIES, Group, Partition, anchor_family, canonicalize, family_lower,
                                    family_module, is_view, partition, reshape_exprs)
from core.codegen.pointwise_ops import IOTA, is_pointwise
from core.codegen.schedule import Constraint, Knob, ScheduleSpec


@dataclass
class GeneratedProgram:
    program: Any                          # core.program.KernelProgram
    spec: ScheduleSpec                    # knobs + constraints (program.tunables mirrors the knobs)
    family: str                           # the group's family, or "reduce+pointwise" for several groups
    graph: Graph
    notes: list[str] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)   # the fusion groups, in launch order

    @property
    def space_constraints(self) -> list[Constraint]:
        """For core.search.ScheduleSpace.from_program(program, task, constraints=...)."""
        return self.spec.constraints


def kernel_name(task_name: str, family: str) -> str:
    name = re.sub(r"\W", "_", task_name)
    if not re.match(r"[A-Za-z_]", name):
        name = "k_" + name
    return f"{name}_{family}"


# ---- which ops have a lowering --------------------------------------------------------------------

def unsupported_nodes(graph: Graph) -> list[Node]:
    """Nodes of a canonical graph that no family lowers."""
    anchors = {n.name for n in graph.nodes if anchor_family(n, graph)}
    scans = family_module("scan") is not None
    bad = []
    for n in graph.nodes:
        if n.name in anchors or is_pointwise(n) or is_view(n, graph):
            continue
        if n.op == "getitem" and isinstance(n.operands[0], Ref) and n.operands[0].name in anchors:
            continue
        if n.op == "flip.default" and scans:
            continue
        bad.append(n)
    return bad


def _available() -> str:
    have = [name for name in ("reduce", "scan", "pool", "matmul", "select", "scatter") if family_module(name) is not None]
    parts = ["elementwise ops (arithmetic, comparisons, where, clamp, the common activations)",
             "softmax / log-softmax and sum / mean / amax / amin over the last dim",
             "data movement (cat, slicing, split / chunk / unbind, constant, reflect, replicate and circular padding, "
             "permute / transpose, flip, index_select, gather, integer indexing, unfold, diagonal) as copies",
             "upsampling (nearest, nearest-exact, linear, bilinear, trilinear, bicubic; antialiased bilinear and "
             "bicubic)"]
    text = {"reduce": "reductions over any dims (sum, mean, prod, max/min, argmax/argmin, var/std, "
                      "norms) with elementwise ops around them; a gather of one element per row along one dim "
                      "(cross-entropy, NLL, also over [N, C, d...])",
            "scan": "cumsum / cumprod / logcumsumexp / cummax / cummin (also reversed with flips)",
            "pool": "max / avg pooling",
            "matmul": "matrix products (mm, bmm, matmul, nn.Linear, addmm) and convolutions (transposed ones too) "
                      "with elementwise ops on the result",
            "select": "sort / argsort / topk (sorted) / kthvalue / median / nanmedian along rows of up to 2^24",
            "scatter": "index_put (x[i] = v, x[i] += v, index_add / index_copy / index_fill, F.fold, F.max_unpool), "
                       "index_reduce, scatter, scatter_add, scatter_reduce (sum, prod, mean, amax, amin), "
                       "nn.EmbeddingBag (sum, mean) and histc"}
    return "; ".join(parts + [text[h] for h in have])


# Ops that only move data (named after the op that computes, when both lack a lowering).
_LAYOUT_OPS = {"permute", "transpose", "t", "expand", "slice", "select", "view", "reshape", "_unsafe_view",
               "unsqueeze", "squeeze", "clone", "cat", "stack", "split", "split_with_sizes", "index_select",
               "getitem", "_to_copy", "alias", "flip", "repeat", "constant_pad_nd"}


def _unsupported_error(graph: Graph, bad: list[Node]) -> CodegenError:
    first = next((n for n in bad if n.base not in _LAYOUT_OPS), bad[0])
    others = sorted({n.op for n in bad} - {first.op})
    also = f" (also without a lowering: {', '.join(others)})" if others else ""
    return CodegenError(
        f"Task '{graph.task}': no code generator lowers '{first.op}' (node '{first.name}', "
        f"{first.dtype}{list(first.shape)}){also}. Code generation covers {_available()}; write the "
        f"kernel program by hand or use another solution for this task.",
        task=graph.task, ops=[n.op for n in bad])


# ---- lowering the groups --------------------------------------------------------------------------

# Prologue/epilogue permissions tried, in order, for an anchor whose family refuses its group.
_FALLBACKS = [(True, True), (True, False), (False, True), (False, False)]


def _lower_all(canon: Graph, graph: Graph) -> tuple[Partition, list[Any], list[str]]:
    options: dict[str, tuple[bool, bool]] = {}
    unfused: set[str] = set()
    notes: list[str] = []
    while True:
        part = partition(canon, options, rows=True, unfused=unfused)
        single = len(part.groups) == 1
        lowered = []
        retry = False
        for g in part.groups:
            kernel = kernel_name(canon.task, g.family if single else f"{g.family}{g.index}")
            try:
                lowering = _lower_group(g, kernel)
            except CodegenError as exc:
                if g.family == "rownorm":
                    # The split path: each reduction its own group, the elementwise ops after them
                    # in pointwise groups (or reduce epilogues), without the rewrites made for rows.
                    unfused |= set(g.anchors)
                    canon = canonicalize(graph)
                    notes.append(f"the rownorm family refused the row group of {', '.join(map(repr, g.anchors))} "
                                 f"({exc}); its reductions and the ops after them run as separate kernels")
                    retry = True
                    break
                if g.anchor is None:
                    raise
                fam = FAMILIES[anchor_family(canon.value(g.anchor), canon)]
                current = options.get(g.anchor, (fam.prologue, fam.epilogue))
                # The next permission that drops something this group has.
                later = [o for o in _FALLBACKS[_FALLBACKS.index(current) + 1:]
                         if (g.prologue and not o[0]) or (g.epilogue and not o[1])]
                if not later:
                    raise
                options[g.anchor] = later[0]
                dropped = " and ".join(w for w, keep, have in (("prologue", later[0][0], g.prologue),
                                                                ("epilogue", later[0][1], g.epilogue))
                                       if have and not keep)
                notes.append(f"the {g.family} family refused the {dropped} of '{g.anchor}' ({exc}); "
                             f"those ops run in a pointwise group")
                retry = True
                break
            lowered.append(lowering)
        if not retry:
            return part, lowered, notes


def _lower_group(g: Group, kernel: str) -> Any:
    if g.family != "rownorm" and any(n.op == IOTA for n in g.graph.nodes):
        raise CodegenError(f"Task '{g.graph.task}': a gather that picks one element per row is lowered only in a "
                           f"row group (rownorm); here it landed in a {g.family} group.", task=g.graph.task,
                           ops=["gather.default"])
    try:
        lowering = family_lower(g.family)(g.graph, kernel)
    except CodegenError:
        raise
    except Exception as exc:      # a bug in a family must not take the caller down with it
        raise CodegenError(f"Task '{g.graph.task}': the {g.family} family failed on group {g.index} "
                           f"({type(exc).__name__}: {exc}); this is a bug in "
                           f"{FAMILIES[g.family].module}.", task=g.graph.task) from exc
    _check_outputs(g, lowering)
    return lowering


def _env(graph: Graph) -> dict[str, Any]:
    from core.program import TensorInfo

    env: dict[str, Any] = dict(graph.constants)
    for v in graph.inputs:
        env[v.name] = TensorInfo(tuple(v.shape), v.dtype)
    return env


def _check_outputs(g: Group, lowering: Any) -> None:
    """The family's program resolves for the group's inputs and writes what the group must."""
    from core.program import KernelProgram, ProgramError

    try:
        plan = KernelProgram.from_json(lowering.program).resolve(_env(g.graph))
    except ProgramError as exc:
        raise CodegenError(f"Task '{g.graph.task}': the {g.family} family's program for group {g.index} "
                           f"does not resolve: {exc}", task=g.graph.task) from exc
    buffers = {b.name: b for b in plan.buffers}
    if len(plan.outputs) != len(g.outputs):
        raise CodegenError(f"Task '{g.graph.task}': the {g.family} family wrote {len(plan.outputs)} outputs "
                           f"for group {g.index}, which must write {len(g.outputs)}.", task=g.graph.task)
    for name, value in zip(plan.outputs, g.graph.outputs):
        b, v = buffers[name], g.graph.value(value)
        if math.prod(b.shape) != math.prod(v.shape) or b.dtype != v.dtype:
            raise CodegenError(f"Task '{g.graph.task}': the {g.family} family's buffer '{name}' is "
                               f"{b.dtype}{list(b.shape)}, but group {g.index} writes '{value}' as "
                               f"{v.dtype}{list(v.shape)}.", task=g.graph.task)


# ---- expression renaming --------------------------------------------------------------------------

# A (possibly dotted) name, and a literal index after `.shape`.
_NAME_RUN = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.\w+)*)(\s*\[\s*(-?\d+)\s*\])?")


@dataclass
class _Rename:
    """What a name of a family's program becomes in the merged program."""

    bare: str                             # the name itself (a pointer argument, a knob)
    dims: list[str] | None = None         # its dims as expressions when it is a reshaped alias


def _paren(expr: str) -> str:
    if re.fullmatch(r"[\w.\[\]-]+", expr):
        return expr
    if expr.startswith("(") and expr.endswith(")"):
        depth = 0
        for k, c in enumerate(expr):
            depth += {"(": 1, ")": -1}.get(c, 0)
            if depth == 0 and k < len(expr) - 1:
                break
        else:
            return expr               # already one parenthesised group
    return f"({expr})"


def rename_expr(expr: Any, names: dict[str, _Rename]) -> Any:
    """`expr` with every name of `names` replaced (x.shape[i], x.numel, x.ndim of an alias become
    expressions of the tensor it aliases). Numbers pass through."""
    if not isinstance(expr, str):
        return expr

    def replace(m: re.Match[str]) -> str:
        parts = m.group(1).split(".")
        for k in range(len(parts), 0, -1):
            key = ".".join(parts[:k])
            if key in names:
                break
        else:
            return m.group(0)
        r, rest, index = names[key], parts[k:], m.group(3)
        tail = m.group(2) or ""
        if not rest:
            return r.bare + tail
        if r.dims is None:
            return ".".join([r.bare] + rest) + tail
        if rest == ["shape"] and index is not None:
            return _paren(r.dims[int(index)])
        if rest == ["numel"]:           # a reshape keeps the element count
            return f"{r.bare}.numel" + tail
        if rest == ["ndim"]:
            return str(len(r.dims)) + tail
        raise CodegenError(f"cannot rewrite the expression '{expr}' for a reshaped tensor '{key}'")

    return _NAME_RUN.sub(replace, expr)


# ---- merging --------------------------------------------------------------------------------------

@dataclass
class MergedScheduleSpec(ScheduleSpec):
    """The knobs of several groups: each group's constraints apply to its own (prefixed) knobs,
    so the legal schedules are the product of the groups' legal schedules and are sampled
    group by group (the full product can be millions)."""

    parts: list[tuple[str, ScheduleSpec]] = field(default_factory=list)

    def _legal_parts(self) -> list[list[dict[str, int]]]:
        return [[{prefix + k: v for k, v in s.items()} for s in spec.enumerate()] for prefix, spec in self.parts]

    def enumerate(self) -> list[dict[str, int]]:
        parts = self._legal_parts()
        total = math.prod(len(p) for p in parts)
        if total > 1_000_000:
            raise ValueError(f"{total} legal schedules over {len(parts)} fusion groups are too many to "
                             f"list; draw some with sample() or search with core.search.ScheduleSpace")
        return list(self._product(parts))

    @staticmethod
    def _product(parts: list[list[dict[str, int]]]) -> Iterator[dict[str, int]]:
        for combo in itertools.product(*parts):
            merged: dict[str, int] = {}
            for s in combo:
                merged.update(s)
            yield merged

    def sample(self, rng: random.Random, count: int) -> list[dict[str, int]]:
        parts = self._legal_parts()
        total = math.prod(len(p) for p in parts)
        if total <= count:
            out = list(self._product(parts))
            rng.shuffle(out)
            return out
        seen: set[tuple[int, ...]] = set()
        out = []
        while len(out) < count:
            pick = tuple(rng.randrange(len(p)) for p in parts)
            if pick in seen:
                continue
            seen.add(pick)
            merged: dict[str, int] = {}
            for p, i in zip(parts, pick):
                merged.update(p[i])
            out.append(merged)
        return out


def _prefixed_constraint(constraint: Constraint, prefix: str, names: list[str]) -> Constraint:
    def check(schedule: Any) -> str | None:
        own = {n: schedule[prefix + n] for n in names if prefix + n in schedule}
        reason = constraint(own)
        return f"group {prefix[:-1]}: {reason}" if reason else None
    return check


def _strip_prelude(source: str) -> str:
    return source.replace(PRELUDE, "", 1) if PRELUDE in source else source


def merge(part: Partition, lowered: list[Any], task: str) -> tuple[dict[str, Any], ScheduleSpec, list[str]]:
    """One program (JSON dict) from the lowered groups, its schedule space and notes."""
    single = len(part.groups) == 1
    decl = {b.value: b for b in part.buffers}
    decl_of = {b.name: b for b in part.buffers}
    input_names = {v.name for v in part.graph.inputs}
    buffers: list[dict[str, Any]] = []
    launches: list[dict[str, Any]] = []
    tunables: dict[str, list[int]] = {}
    schedule: dict[str, int] = {}
    knobs: list[Knob] = []
    constraints: list[Constraint] = []
    spec_parts: list[tuple[str, ScheduleSpec]] = []
    sources: list[str] = []
    notes: list[str] = []
    outputs_of: dict[str, str] = {}        # canonical value -> merged buffer name
    taken = set(input_names) | {b.name for b in part.buffers} | set(part.graph.constants)
    for g, lw in zip(part.groups, lowered):
        prog = lw.program
        prefix = "" if single else f"G{g.index}_"
        names: dict[str, _Rename] = {}
        for r in g.reads:
            if r.alias:
                base_dims = [f"{r.base}.shape[{k}]" for k in range(len(r.base_shape))]
                names[r.name] = _Rename(r.base, reshape_exprs(base_dims, r.base_shape, r.shape))
            else:
                names[r.name] = _Rename(r.base)
        for knob in prog["tunables"]:
            names[knob] = _Rename(prefix + knob)
        family_outputs = dict(zip(prog["outputs"], g.outputs))
        resolved = _resolved_shapes(g, lw)
        for b in prog["buffers"]:
            shape = [str(rename_expr(e, names)) for e in b["shape"]]
            value = family_outputs.get(b["name"])
            if value is None:                          # the family's scratch buffer
                new = b["name"] if single else _fresh(f"g{g.index}_{b['name']}", taken)
                names[b["name"]] = _Rename(new)
                buffers.append({"name": new, "shape": shape, "dtype": rename_expr(b["dtype"], names),
                                **({"zeroed": True} if b.get("zeroed") else {})})
                continue
            d = decl[value]
            name = b["name"] if single and b["name"] not in input_names else d.name
            have = resolved[b["name"]]
            exprs = shape if have == d.shape else reshape_exprs(shape, have, d.shape)
            names[b["name"]] = _Rename(name, None if have == d.shape else [_paren(e) for e in shape])
            buffers.append({"name": name, "shape": exprs, "dtype": d.dtype})
            outputs_of[value] = name
        for launch in prog["launches"]:
            launches.append({
                "kernel": launch["kernel"],
                "grid": [rename_expr(e, names) for e in launch["grid"]],
                "block": [rename_expr(e, names) for e in launch["block"]],
                "shared_bytes": rename_expr(launch.get("shared_bytes", 0), names),
                "args": [rename_expr(e, names) for e in launch["args"]],
            })
        for knob in prog["tunables"]:
            tunables[prefix + knob] = list(prog["tunables"][knob])
            schedule[prefix + knob] = prog["schedule"].get(knob, prog["tunables"][knob][0])
        knobs += [Knob(prefix + k.name, k.values, k.doc) for k in lw.spec.knobs]
        own = [k.name for k in lw.spec.knobs]
        constraints += [c if single else _prefixed_constraint(c, prefix, own) for c in lw.spec.constraints]
        spec_parts.append((prefix, lw.spec))
        sources.append(prog["source"] if single else _wrap_source(prog["source"], g, list(prog["tunables"])))
        head = "" if single else f"group {g.index} ({g.family}): "
        notes += [head + n for n in lw.notes]
    program = {
        "format": "cuda-agent/program@1",
        "name": lowered[0].program["name"] if single else kernel_name(task, "fused"),
        "source": sources[0] if single else PRELUDE + "".join(sources),
        "tunables": tunables,
        "schedule": schedule,
        "buffers": buffers,
        "launches": launches,
        "outputs": [outputs_of[decl_of[o].value] for o in part.outputs],
    }
    spec = (ScheduleSpec(knobs, constraints, defaults=schedule) if single else
            MergedScheduleSpec(knobs, constraints, defaults=schedule, parts=spec_parts))
    return program, spec, notes


def _fresh(name: str, taken: set[str]) -> str:
    out, i = name, 1
    while out in taken:
        out, i = f"{name}_{i}", i + 1
    taken.add(out)
    return out


def _resolved_shapes(g: Group, lw: Any) -> dict[str, tuple[int, ...]]:
    from core.program import KernelProgram

    plan = KernelProgram.from_json(lw.program).resolve(_env(g.graph))
    return {b.name: tuple(b.shape) for b in plan.buffers}


def _wrap_source(source: str, g: Group, knobs: list[str]) -> str:
    prefix = f"G{g.index}_"
    lines = [f"\n// ==== group {g.index}: {g.family}" + (f" around '{g.anchor}'" if g.anchor else "") + " ===="]
    lines += [f"#define {k} {prefix}{k}" for k in knobs]
    lines += [f"namespace ca_g{g.index} {{", _strip_prelude(source).strip("\n"), f"}}  // namespace ca_g{g.index}"]
    lines += [f"#undef {k}" for k in knobs]
    return "\n".join(lines) + "\n"


# ---- entry points ---------------------------------------------------------------------------------

def generate_from_graph(graph: Graph) -> GeneratedProgram:
    from core.program import KernelProgram

    canon = canonicalize(graph, rows=True)
    bad = unsupported_nodes(canon)
    if bad:
        raise _unsupported_error(graph, bad)
    part, lowered, fallbacks = _lower_all(canon, graph)
    data, spec, notes = merge(part, lowered, graph.task)
    notes += fallbacks
    program = KernelProgram.from_json(data)
    program.validate()
    families = [g.family for g in part.groups]
    family = families[0] if len(families) == 1 else "+".join(families)
    if len(families) > 1:
        notes[:0] = [f"{len(families)} fusion groups, launched in order:"] + [
            f"group {g.index}: {g.describe()}" for g in part.groups]
    return GeneratedProgram(program, spec, family, graph, notes, part.groups)


def generate(task: Any) -> GeneratedProgram:
    """Capture the task's forward and lower it to one KernelProgram with its schedule space."""
    return generate_from_graph(capture(task))
