"""The partitioner (core/codegen/partition.py) and the merge into one program (generate.py).

No GPU. Three kinds of checks:
- every memory-bound example task: which groups it gets, the merged program validates, its output
  buffers have the shapes and dtypes interpret.py gives for the task's shapes (on meta tensors),
  its plan resolves within the launch limits, and it compiles with NVRTC (sm_90) at the default
  and 2 sampled schedules;
- the partition's semantics: every group's sub-graph is run with interpret.py on small inputs,
  each group reading the buffers of earlier groups through the aliases the partition declares,
  and the program's outputs are compared with the task's Model (this checks the grouping, views,
  layouts and canonical rewrites; the families' CUDA is checked by their own tests);
- unit tests on small synthetic graphs: prologue / epilogue folding, materialised buffers, view
  aliases, recomputation, copies, fallbacks when a family refuses a group, and the renaming of
  knobs, kernels and buffers when groups are merged.
"""
from __future__ import annotations

import multiprocessing
import random
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from core.codegen import CodegenError, generate, generate_from_graph
import core.codegen.partition as pt
from core.codegen.capture import capture_module
from core.codegen.generate import GeneratedProgram, merge, rename_expr, _Rename
from core.codegen.graph import Graph, GraphInput, Node, Ref
from core.codegen.interpret import interpret
from core.codegen.lower_pointwise import Lowering
from core.codegen.partition import (BufferDecl, Group, Partition, Read, canonicalize, partition, refine,
                                    reshape_exprs)
from core.codegen.schedule import Knob, ScheduleSpec
from core.program import KernelProgram, LaunchLimits
from core.search.space import ScheduleSpace, env_from_task
from core.tasks import load_task
from core.toolchain import CompileCache, compile_cuda, nvrtc_info

TASKS = Path(__file__).resolve().parents[1] / "resources" / "tasks"
needs_nvrtc = pytest.mark.skipif(not nvrtc_info()[0], reason="NVRTC is not available")

# What each memory-bound example task becomes: its groups' families in launch order.
EXPECTED = {
    "act_gelu": "pointwise", "act_gelu_tanh_bf16": "pointwise", "act_hardswish_fp16": "pointwise",
    "act_leaky_relu": "pointwise", "act_mish": "pointwise", "act_silu_bf16": "pointwise",
    "act_softplus": "pointwise", "fused_bias_gelu_scale_fp16": "pointwise",
    "fused_add_layernorm": "rownorm",
    "loss_cosine_similarity": "rownorm+reduce",
    "loss_kl_div": "rownorm+reduce",
    # The log-softmax's statistics and the target's pick (a gather, as a masked row sum) in one row
    # group; then the count of targets not ignored, and the mean.
    "loss_cross_entropy": "rownorm+reduce+reduce",
    "loss_mse": "reduce", "loss_smooth_l1": "reduce",
    "loss_triplet_margin": "rownorm+reduce",
    "mm_matvec": "reduce",                  # torch.mv decomposes to mul + sum: a reduction
    "norm_batchnorm2d_eval": "pointwise",   # running statistics: one elementwise kernel
    "norm_batchnorm2d_train": "reduce+pointwise", "norm_groupnorm": "rownorm",
    "norm_instancenorm2d": "rownorm", "norm_layernorm": "rownorm",
    "norm_rmsnorm_bf16": "rownorm",
    "pool_avg1d": "pool", "pool_avg2d": "pool", "pool_avg3d": "pool",
    "pool_max1d": "pool", "pool_max2d": "pool", "pool_max3d": "pool",
    "red_argmax_dim1": "reduce", "red_l2norm_dim1": "reduce", "red_logsumexp_dim1": "rownorm",
    "red_max_lastdim": "reduce", "red_mean_dim0": "reduce", "red_std_keepdim_bf16": "reduce",
    "red_sum_dim1": "rowreduce", "red_var_dim1": "reduce",
    "scan_cumprod": "scan", "scan_cumsum": "scan", "scan_cumsum_reverse": "scan", "scan_masked_cumsum": "scan",
    "softmax_dim1_fp16": "rownorm", "softmax_lastdim": "rownorm",
    "softmax_log_lastdim": "rownorm",
}
# Memory-bound examples that stay unsupported, and the op the error names (none at present).
REFUSED: dict[str, str] = {}

# Small inputs of the example tasks for the semantic check (tensor inputs, in forward order).
SMALL = {
    "fused_add_layernorm": [(5, 4096), (5, 4096)], "fused_bias_gelu_scale_fp16": [(3, 16384)],
    "loss_cosine_similarity": [(5, 33), (5, 33)], "loss_kl_div": [(5, 33), (5, 33)],
    "loss_cross_entropy": [(5, 33), (5,)],
    "loss_mse": [(5, 33), (5, 33)], "loss_smooth_l1": [(5, 33), (5, 33)],
    "loss_triplet_margin": [(5, 33), (5, 33), (5, 33)], "mm_matvec": [(5, 33), (33,)],
    "norm_batchnorm2d_eval": [(2, 64, 3, 5)], "norm_batchnorm2d_train": [(2, 64, 3, 5)],
    "norm_groupnorm": [(2, 256, 3, 5)], "norm_instancenorm2d": [(2, 64, 3, 5)],
    "norm_layernorm": [(5, 4096)], "norm_rmsnorm_bf16": [(3, 8192)],
    "pool_avg1d": [(2, 3, 33)], "pool_max1d": [(2, 3, 33)], "pool_avg2d": [(2, 3, 9, 9)],
    "pool_max3d": [(2, 2, 6, 8, 8)], "red_argmax_dim1": [(3, 7, 5)], "red_logsumexp_dim1": [(5, 33)],
    "red_max_lastdim": [(3, 4, 9)], "red_mean_dim0": [(7, 5)], "red_std_keepdim_bf16": [(5, 33)],
    "scan_cumsum_reverse": [(5, 33)], "scan_masked_cumsum": [(5, 33), (5, 33)],
    "softmax_dim1_fp16": [(2, 7, 5)],
}


def run_partition(part: Partition, tensors: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Run the groups in launch order with interpret.py: each reads its inputs (task tensors or
    earlier groups' buffers) with the shapes it declares, and writes its buffers."""
    env = dict(tensors)
    declared = {b.value: b for b in part.buffers}
    for group in part.groups:
        reads = {r.name: env[r.base].reshape(r.shape) for r in group.reads}
        for value, result in zip(group.outputs, interpret(group.graph, reads)):
            decl = declared[value]
            assert result.numel() == torch.Size(decl.shape).numel() and result.dtype == getattr(torch, decl.dtype)
            env[decl.name] = result.reshape(decl.shape)
    return [env[name] for name in part.outputs]


def small_inputs(task, shapes: list[tuple[int, ...]], seed: int = 0) -> list:
    gen = torch.Generator().manual_seed(seed)
    out, shapes = [], iter(shapes)
    for value in task.make_inputs(seed, device="meta"):
        if not isinstance(value, torch.Tensor):
            out.append(value)
        elif value.dtype == torch.bool:
            out.append(torch.rand(next(shapes), generator=gen) > 0.5)
        elif value.dtype.is_floating_point:
            out.append((2.0 * torch.randn(next(shapes), generator=gen)).to(value.dtype))
        else:
            out.append(torch.randint(0, 4, next(shapes), generator=gen).to(value.dtype))
    return out


def check_semantics(model: torch.nn.Module, inputs: list, name: str, input_names: list[str],
                    tolerance: tuple[float, float], device: str = "meta", rows: bool = False) -> Partition:
    """The partition of the model's graph (captured on meta tensors, as generate() does, or on the
    CPU), run group by group, reproduces the model; `rows`: with row groups, as generate() makes them."""
    scalars = {n: v for n, v in zip(input_names, inputs) if not isinstance(v, torch.Tensor)}
    traced = [v.to(device) if isinstance(v, torch.Tensor) else v for v in inputs]
    copy = __import__("copy").deepcopy(model).to(device)
    graph = capture_module(copy, traced, name, input_names, scalars)
    part = partition(canonicalize(graph, rows=rows), rows=rows)
    tensors = {n: v for n, v in zip(input_names, inputs) if isinstance(v, torch.Tensor)}
    tensors.update(model.state_dict())
    with torch.no_grad():
        expected = model(*inputs)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    got = run_partition(part, tensors)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        torch.testing.assert_close(g, e, atol=tolerance[0], rtol=tolerance[1], equal_nan=True)
    return part


# ---- the example tasks (checked in two worker processes: capture and NVRTC dominate) ------------

def _example(job: tuple[str, str]) -> dict[str, Any]:
    """Everything the example-task tests assert, computed in a worker process."""
    import warnings

    warnings.filterwarnings("ignore")
    name, cache_dir = job
    task = load_task(TASKS / f"{name}.py")
    out: dict[str, Any] = {"name": name}
    try:
        gen = generate(task)
    except CodegenError as exc:
        out.update(error=str(exc), ops=exc.ops)
        return out
    out["family"] = gen.family
    program = KernelProgram.from_json(gen.program.to_json())
    program.validate()
    env = env_from_task(task)
    metas = {v.name: torch.empty(v.shape, dtype=getattr(torch, v.dtype), device="meta") for v in gen.graph.inputs}
    out["reference"] = [(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in interpret(gen.graph, metas)]
    out["specs"] = [(tuple(s.shape), s.dtype) for s in task.output_specs]
    schedules = [gen.spec.default()] + gen.spec.sample(random.Random(name), 2)
    out["legal"] = all(gen.spec.legal(s) for s in schedules)
    out["default_is_program_schedule"] = gen.spec.default() == program.schedule
    out["plans"], out["compiled"] = [], []
    cache = CompileCache(Path(cache_dir))
    for schedule in schedules:
        bound = program.with_schedule(schedule)
        plan = bound.resolve(env, LaunchLimits())
        buffers = {b.name: b for b in plan.buffers}
        out["plans"].append([(buffers[o].shape, buffers[o].dtype) for o in plan.outputs])
        result = compile_cuda(bound.source, arch="sm_90", options=bound.compile_options(), cache=cache)
        out["compiled"].append((schedule, result.ok, result.error_summary() if not result.ok else ""))
    if name in SMALL:
        model = task.make_model(seed=0, device="cpu")
        check_semantics(model, small_inputs(task, SMALL[name]), name, task.input_names, task.tolerance(),
                        rows="rownorm" in gen.family)
        out["semantics"] = True
    return out


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> dict[str, dict[str, Any]]:
    cache = str(tmp_path_factory.mktemp("partition-cache"))
    names = sorted(EXPECTED) + sorted(REFUSED)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        return {r["name"]: r for r in pool.map(_example, [(n, cache) for n in names])}


def test_generate_accepts_exactly_these_examples():
    """Every example task is either generated with the expected groups or refused clearly."""
    names = sorted(p.stem for p in TASKS.glob("*.py"))
    memory_bound = [n for n in names if n.split("_")[0] in ("act", "red", "softmax", "norm", "scan", "loss", "pool")]
    assert set(memory_bound) <= set(EXPECTED) | set(REFUSED)
    assert set(EXPECTED) | set(REFUSED) <= set(names)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_groups_plan_and_compile(name, examples):
    r = examples[name]
    assert "error" not in r, r.get("error")
    assert r["family"] == EXPECTED[name]
    assert r["reference"] == r["specs"], "the captured graph's outputs are the task's outputs"
    assert all(plan == r["specs"] for plan in r["plans"]), "output buffers match the forward outputs"
    assert r["legal"] and r["default_is_program_schedule"]
    for schedule, ok, log in r["compiled"]:
        assert ok or not nvrtc_info()[0], f"{name} {schedule}:\n{log}"
    if name in SMALL:
        assert r["semantics"]


# ---- canonical rewrites -------------------------------------------------------------------------

class Fn(torch.nn.Module):
    def __init__(self, fn, **params: torch.Tensor):
        super().__init__()
        self.fn = fn
        for k, v in params.items():
            self.register_buffer(k, v)

    def forward(self, *xs):
        return self.fn(self, *xs)


def graph_of(fn, inputs: list[torch.Tensor], name: str = "g", **params: torch.Tensor) -> tuple[Graph, Fn]:
    model = Fn(fn, **params)
    names = [f"x{i}" if i else "x" for i in range(len(inputs))]
    return capture_module(model, inputs, name, names), model


def semantics(fn, inputs: list[torch.Tensor], tol: float = 1e-5, **params: torch.Tensor) -> Partition:
    model = Fn(fn, **params)
    names = [f"x{i}" if i else "x" for i in range(len(inputs))]
    return check_semantics(model, inputs, "g", names, (tol, tol))


def families(part: Partition) -> list[str]:
    return [g.family for g in part.groups]


def test_softmax_over_a_middle_dim_becomes_two_reductions_and_a_pointwise_group():
    x = torch.randn(3, 7, 5, dtype=torch.bfloat16)
    for fn in (lambda m, x: torch.softmax(x, dim=1), lambda m, x: torch.log_softmax(x, dim=0)):
        part = semantics(fn, [x], tol=1e-2)
        assert families(part) == ["reduce", "reduce", "pointwise"]
        ops = part.graph.ops()
        assert "_softmax.default" not in ops and "_log_softmax.default" not in ops
        assert ops[0] == "_to_copy.default"                 # computed in fp32, as eager does for bf16
    last = canonicalize(graph_of(lambda m, x: torch.softmax(x, -1), [x])[0])
    assert last.ops() == ["_softmax.default"]                # the row family keeps the last dim


def test_expand_and_repeat_become_broadcasts():
    part = semantics(lambda m, x, y: (x + y.expand(4, 5), x * m.w.repeat(4, 1)),
                     [torch.randn(4, 5), torch.randn(1, 5)], w=torch.randn(1, 5))
    assert families(part) == ["pointwise"] and len(part.groups[0].outputs) == 2
    part = semantics(lambda m, x: x * m.w.repeat(3).view(1, 6, 1), [torch.randn(2, 6, 4)], w=torch.randn(2))
    assert families(part) == ["pointwise"]
    w = next(r for r in part.groups[0].reads if r.base == "w")
    assert w.alias and w.shape == (1, 1, 2, 1)               # the repeat is a broadcast dim of the space


def test_outputs_that_are_inputs_or_repeated_get_copies():
    part = semantics(lambda m, x: (x, x.view(-1), x * 2, (x * 2).view(-1)), [torch.randn(3, 4)])
    assert families(part) == ["pointwise"]
    assert len(set(part.outputs)) == 4                       # four distinct buffers
    graph, _ = graph_of(lambda m, x: (x.sum(1), x.sum(1)), [torch.randn(3, 4)])
    gen = generate_from_graph(graph)
    assert len(set(gen.program.outputs)) == 2


def test_var_mean_splits_when_the_reduce_family_does_not_take_it(monkeypatch):
    real = pt.family_module("reduce")

    class NoVarMean:
        lower_reduce = staticmethod(real.lower_reduce)

        @staticmethod
        def is_reduce(node, graph):
            return node.op != "var_mean.correction" and real.is_reduce(node, graph)

    monkeypatch.setitem(pt._MODULES, "core.codegen.lower_reduce", NoVarMean)
    part = check_semantics(torch.nn.LayerNorm(16), [torch.randn(5, 16)], "ln", ["x"], (1e-5, 1e-5))
    assert [part.graph.value(g.anchor).op for g in part.groups if g.anchor] == ["var.correction", "mean.dim"]
    assert families(part) == ["reduce", "rowreduce", "pointwise"]   # a lone last-dim mean: the row family


def test_dead_nodes_and_buffer_mutations_are_dropped():
    class BN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(6)               # training mode: updates running stats

        def forward(self, x):
            return self.bn(x) + 1.0

    model, x = BN(), torch.randn(4, 6)
    part = check_semantics(model, [x], "bn", ["x"], (1e-5, 1e-5))
    assert families(part) == ["reduce", "pointwise"] and len(part.outputs) == 1
    assert not any("running" in r.base for g in part.groups for r in g.reads)


# ---- grouping -----------------------------------------------------------------------------------

def test_prologue_and_epilogue_fold_into_the_reduction():
    part = semantics(lambda m, x: ((x * 2.0 + 1.0).sum(1) * 3.0).sqrt(), [torch.rand(4, 9)])
    (g,) = part.groups
    assert g.family == "reduce" and [r.base for r in g.reads] == ["x"]
    assert [part.graph.value(n).op for n in g.prologue] == ["mul.Tensor", "add.Tensor"]
    assert [part.graph.value(n).op for n in g.epilogue] == ["mul.Tensor", "sqrt.default"]
    assert part.buffers[0].value == g.outputs[0] == part.graph.outputs[0]


def test_values_crossing_groups_are_buffers_and_views_of_them_aliases():
    part = semantics(lambda m, x: torch.logsumexp(x, dim=1), [torch.randn(5, 40)])
    first, second = part.groups
    assert (first.family, second.family) == ("rowreduce", "reduce")
    assert [b.name for b in part.buffers] == ["amax", second.outputs[0]]
    amax = [r for r in second.reads if r.base == "amax"]
    # The prologue reads amax [5, 1] as it is; the epilogue adds its squeezed [5] form: an alias.
    assert sorted((r.shape, r.alias) for r in amax) == [((5,), True), ((5, 1), False)]


def test_a_shared_pointwise_value_is_recomputed_not_stored():
    part = semantics(lambda m, x: ((x * 2.0).sum(0), (x * 2.0).amax(0)), [torch.randn(6, 5)])
    assert families(part) == ["reduce", "reduce"]
    assert all(g.prologue and [r.base for r in g.reads] == ["x"] for g in part.groups)
    part = semantics(lambda m, x: (lambda y: (y, y.sum(1)))(torch.exp(x)), [torch.randn(6, 5)])
    assert families(part) == ["pointwise", "rowreduce"]     # a returned value is read, not recomputed
    assert [r.base for r in part.groups[1].reads] == [part.buffers[0].name]


def test_views_inside_a_group_refine_its_index_space():
    # Group norm: statistics over [N, G, C/G * H * W], the affine over [N, C, H, W].
    model = torch.nn.GroupNorm(4, 8)
    with torch.no_grad():
        model.weight.uniform_(0.5, 1.5)
        model.bias.uniform_(-0.5, 0.5)
    x = torch.randn(3, 8, 5, 6)
    # Traced on the CPU, PyTorch's decomposition differs (as_strided views of the statistics).
    for device in ("meta", "cpu"):
        part = check_semantics(model, [x], "gn", ["x"], (1e-5, 1e-5), device=device)
        assert families(part) == ["reduce", "pointwise"]
        reads = {r.base: r.shape for r in part.groups[1].reads}
        assert reads["x"] == (3, 4, 2, 30) and reads["weight"] == (1, 4, 2, 1)
        assert reads["getitem"] == (3, 4, 1, 1) or reads["getitem_1"] == (3, 4, 1, 1)
        assert part.buffers[-1].shape == (3, 8, 5, 6)        # the output keeps the forward's shape


def test_a_view_that_fits_no_space_is_materialised():
    # [6, 4] -> [4, 6] shares no common refinement: the value before the view is stored.
    part = semantics(lambda m, x, y: (x * 2.0 + y).view(4, 6) * m.w, [torch.randn(6, 4), torch.randn(6, 1)],
                     w=torch.randn(6))
    assert families(part) == ["pointwise", "pointwise"]


def test_families_without_prologue_get_a_pointwise_group_first():
    x = torch.randn(2, 3, 8, 8)
    part = semantics(lambda m, x: F.max_pool2d(torch.relu(x), 2), [x])
    assert families(part) == ["pointwise", "pool"]
    part = semantics(lambda m, x: F.max_pool2d(x, 2) * 2.0 + m.b, [x], b=torch.randn(3, 1, 1))
    assert families(part) == ["pool"] and part.groups[0].epilogue
    part = semantics(lambda m, x: F.avg_pool1d(x, 4, 2, 1).sum(-1), [torch.randn(2, 3, 33)])
    assert families(part) == ["pool", "rowreduce"]
    assert part.groups[0].reads[0].shape == (2, 3, 1, 33)    # the 1-D pool's unsqueeze is an alias


def test_scans_take_flips_and_pointwise_ops_around_them():
    x, mask = torch.randn(4, 30), torch.rand(4, 30) > 0.5
    part = semantics(lambda m, x, k: torch.flip(torch.cumsum(torch.flip(x * k, [1]), 1), [1]) - x, [x, mask])
    (g,) = part.groups
    assert g.family == "scan" and g.prologue and g.epilogue


def test_a_family_that_refuses_its_group_is_retried_without_prologue(monkeypatch):
    real = pt.family_module("reduce")

    class NoPrologue:
        is_reduce = staticmethod(real.is_reduce)

        @staticmethod
        def lower_reduce(graph, kernel):
            if graph.nodes[0].op != "sum.dim_IntList":
                raise CodegenError("no prologue, please")
            return real.lower_reduce(graph, kernel)

    monkeypatch.setitem(pt._MODULES, "core.codegen.lower_reduce", NoPrologue)
    graph, _ = graph_of(lambda m, x: (x * 2.0).sum(0), [torch.randn(6, 5)])
    gen = generate_from_graph(graph)
    assert gen.family == "pointwise+reduce"
    assert any("refused the prologue of 'sum_1' (no prologue, please)" in n for n in gen.notes)


def test_unsupported_ops_are_named():
    graph, _ = graph_of(lambda m, x: torch.mode(x, dim=1).values * 2.0, [torch.randn(3, 4)])
    with pytest.raises(CodegenError, match=r"Task 'g': no code generator lowers 'mode.default'"):
        generate_from_graph(graph)
    # A transpose that moves data is a copy (the move family), with the multiply as its epilogue.
    graph, _ = graph_of(lambda m, x: x.t() * 2.0, [torch.randn(3, 4)])
    assert generate_from_graph(graph).family == "move"
    graph, _ = graph_of(lambda m, x: x.unsqueeze(0).permute(1, 0, 2) * 2.0, [torch.randn(3, 4)])
    assert generate_from_graph(graph).family == "pointwise"  # moving a size-1 dim is only a view


def test_softmax_with_an_epilogue():
    # Rows a row group takes: the softmax and its epilogue are one kernel.
    graph, model = graph_of(lambda m, x: torch.softmax(x, dim=-1) * 2.0, [torch.randn(4, 8)])
    gen = generate_from_graph(graph)
    assert gen.family == "rownorm" and len(gen.groups) == 1
    # A few long rows: the row family's softmax, then a pointwise group (formerly refused: "the graph
    # combines the row reduction ... with other ops").
    graph, model = graph_of(lambda m, x: torch.softmax(x, dim=-1) * 2.0, [torch.randn(4, 16384)])
    gen = generate_from_graph(graph)
    assert gen.family == "rowreduce+pointwise"
    assert [g.outputs for g in gen.groups] == [["_softmax"], ["mul"]]


# ---- layouts and shapes -------------------------------------------------------------------------

def test_refine_and_reshape_expressions():
    assert refine((64, 256, 64, 64), (64, 32, 8, 4096)) == (64, 32, 8, 64, 64)
    assert refine((6, 4), (4, 6)) is None and refine((3, 1, 5), (3, 5)) == (3, 5)
    assert reshape_exprs(["x.shape[0]", "x.shape[1]"], (16, 65536), (16, 1, 65536)) == \
        ["x.shape[0]", "1", "x.shape[1]"]
    assert reshape_exprs(["a", "b", "c"], (64, 256, 4096), (64, 32, 8, 4096)) == ["a", "32", "8", "c"]


def test_rename_expr_touches_whole_names_only():
    names = {"BLOCK": _Rename("G1_BLOCK"), "x_4d": _Rename("x", ["x.shape[0]", "1", "(x.shape[1] * 2)"]),
             "out": _Rename("add_1"), "bn.weight": _Rename("bn.weight")}
    assert rename_expr("cdiv(x_4d.numel, BLOCK * BLOCK_ROWS) + xBLOCK", names) == \
        "cdiv(x.numel, G1_BLOCK * BLOCK_ROWS) + xBLOCK"
    assert rename_expr("int64(x_4d.shape[2]) + x_4d.shape[-3] + x_4d.ndim", names) == \
        "int64((x.shape[1] * 2)) + x.shape[0] + 3"
    assert rename_expr("out.shape[1] if BLOCK > 1.5e2 else bn.weight.shape[0]", names) == \
        "add_1.shape[1] if G1_BLOCK > 1.5e2 else bn.weight.shape[0]"
    assert rename_expr(7, names) == 7 and rename_expr("dtype(x_4d)", names) == "dtype(x)"


# ---- merging ------------------------------------------------------------------------------------

def _fake_group(index: int, reads: list[Read], out: str) -> Group:
    inputs = [GraphInput(r.name, r.kind, r.shape, "float32") for r in reads]
    node = Node(out, "neg.default", [Ref(reads[0].name)], {}, reads[0].shape, "float32")
    return Group(index, "pointwise", None, Graph("t", inputs, [node], [out]), [out], reads)


def _fake_lowering(kernel: str, x: str, knobs: dict[str, list[int]]) -> Lowering:
    # Helpers with the same name in both groups, identifiers that contain knob names, a knob in #if.
    source = f"""
struct VECS {{ float v[VEC]; }};
__device__ float twice(float a) {{ return 2.0f * a; }}
extern "C" __global__ void __launch_bounds__(BLOCK) {kernel}(const float* x, float* y, long long n) {{
    const int BLOCK_ROWS = BLOCK / 32, MY_VEC = VEC + 1;
    long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
#if VEC > 1
    if (i < n) y[i] = twice(x[i]) * MY_VEC + BLOCK_ROWS;
#else
    if (i < n) y[i] = -x[i];
#endif
}}
"""
    spec = ScheduleSpec([Knob(k, tuple(v)) for k, v in knobs.items()],
                        [lambda s: "VEC=4 is refused" if s["VEC"] == 4 else None])
    program = {"format": "cuda-agent/program@1", "name": kernel, "source": source, "tunables": knobs,
               "schedule": {k: v[0] for k, v in knobs.items()},
               "buffers": [{"name": "out", "shape": [f"{x}.shape[0]", f"{x}.shape[1]"], "dtype": "float32"},
                           {"name": "scratch", "shape": [f"{x}.numel", "BLOCK"], "dtype": f"dtype({x})"}],
               "launches": [{"kernel": kernel, "grid": [f"cdiv({x}.numel, BLOCK)"], "block": ["BLOCK"],
                             "shared_bytes": "VEC * 4", "args": [x, "out", f"int64({x}.numel)"]}],
               "outputs": ["out"]}
    return Lowering(program, spec, [f"{kernel} note"])


def _fake_partition() -> Partition:
    g0 = _fake_group(0, [Read("x_3d", "x", (6, 4), (6, 2, 2), "input")], "y")
    g1 = _fake_group(1, [Read("y_2d", "y", (6, 2, 2), (12, 2), "buffer")], "z")
    graph = Graph("t", [GraphInput("x", "input", (6, 4), "float32")], [], ["z"])
    return Partition(graph, [g0, g1], [BufferDecl("y", "y", (6, 2, 2), "float32", 0),
                                       BufferDecl("z", "z", (12, 2), "float32", 1)], ["z"])


def test_merge_renames_knobs_kernels_and_buffers():
    knobs = {"BLOCK": [128, 256], "VEC": [1, 2, 4]}
    lowered = [_fake_lowering("t_pointwise0", "x_3d", knobs), _fake_lowering("t_pointwise1", "y_2d", knobs)]
    data, spec, notes = merge(_fake_partition(), lowered, "t")
    program = KernelProgram.from_json(data)
    program.validate()
    assert program.tunables == {"G0_BLOCK": [128, 256], "G0_VEC": [1, 2, 4], "G1_BLOCK": [128, 256],
                                "G1_VEC": [1, 2, 4]}
    assert [b.name for b in program.buffers] == ["y", "g0_scratch", "z", "g1_scratch"]
    assert program.buffers[0].shape == ["6", "2", "2"]        # declared as the partition says
    assert program.buffers[1].shape == ["x.numel", "G0_BLOCK"] and program.buffers[1].dtype == "dtype(x)"
    first, second = program.launches
    assert first.args == ["x", "y", "int64(x.numel)"] and first.shared_bytes == "G0_VEC * 4"
    assert second.args == ["y", "z", "int64(y.numel)"] and second.grid == ["cdiv(y.numel, G1_BLOCK)"]
    assert program.outputs == ["z"]
    src = program.source
    assert src.count("CA_HD float ca_i2f") == 1                # the prelude once
    assert "#define BLOCK G0_BLOCK" in src and "#undef VEC" in src and "namespace ca_g1 {" in src
    plan = program.with_schedule({"G0_BLOCK": 128, "G0_VEC": 2, "G1_BLOCK": 256, "G1_VEC": 1}).resolve(
        {"x": __import__("core.program", fromlist=["TensorInfo"]).TensorInfo((6, 4), "float32")})
    assert [l.grid for l in plan.launches] == [(1, 1, 1), (1, 1, 1)] and plan.launches[0].shared_bytes == 8
    assert [k.name for k in spec.knobs] == list(program.tunables)
    assert spec.why_illegal({**spec.default(), "G1_VEC": 4}) == "group G1: VEC=4 is refused"
    assert spec.legal({**spec.default(), "G1_VEC": 2})
    drawn = spec.sample(random.Random(0), 5)
    assert len({tuple(sorted(s.items())) for s in drawn}) == 5 and all(spec.legal(s) for s in drawn)
    assert len(spec.enumerate()) == (2 * 2) ** 2
    assert "group 1 (pointwise): t_pointwise1 note" in notes
    if nvrtc_info()[0]:
        for schedule in [spec.default(), {"G0_BLOCK": 256, "G0_VEC": 2, "G1_BLOCK": 128, "G1_VEC": 1}]:
            bound = program.with_schedule(schedule)
            result = compile_cuda(bound.source, arch="sm_90", options=bound.compile_options())
            assert result.ok, result.error_summary()


@needs_nvrtc
def test_multi_group_pool_reduce_program_compiles_at_sampled_schedules(tmp_path):
    # The pool family's `#if SMEM` and the reduce family's split kernels under prefixed knobs.
    graph, _ = graph_of(lambda m, x: F.max_pool2d(x, 2).sum(dim=(0, 2, 3)), [torch.randn(8, 16, 64, 64)])
    gen = generate_from_graph(graph)
    assert gen.family == "pool+reduce" and all(k.startswith(("G0_", "G1_")) for k in gen.program.tunables)
    space = ScheduleSpace.from_program(gen.program, None, constraints=gen.space_constraints)
    assert space.legal(space.default())
    cache = CompileCache(tmp_path)
    env = {"x": __import__("core.program", fromlist=["TensorInfo"]).TensorInfo((8, 16, 64, 64), "float32")}
    schedules = [gen.spec.default()] + gen.spec.sample(random.Random(1), 2)
    schedules.append({**gen.spec.default(), "G0_SMEM": 1})
    for schedule in schedules:
        if not gen.spec.legal(schedule):
            continue
        bound = gen.program.with_schedule(schedule)
        bound.resolve(env, LaunchLimits())
        result = compile_cuda(bound.source, arch="sm_90", options=bound.compile_options(), cache=cache)
        assert result.ok, f"{schedule}\n{result.error_summary()}"


def test_one_group_keeps_the_family_program():
    graph, _ = graph_of(lambda m, x: torch.nn.functional.gelu(x) * 2.0, [torch.randn(4, 64)])
    gen = generate_from_graph(graph)
    assert isinstance(gen, GeneratedProgram) and gen.family == "pointwise"
    assert set(gen.program.tunables) == {"BLOCK", "VEC", "ITEMS", "GRID"}
    assert gen.program.launches[0].kernel == "g_pointwise" and gen.program.outputs == ["out"]
    assert type(gen.spec) is ScheduleSpec and "namespace ca_g" not in gen.program.source
