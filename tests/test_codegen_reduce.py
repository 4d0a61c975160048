"""The reduce family (core/codegen/lower_reduce.py).

Three kinds of checks, none needing a GPU:
- plans: the program's buffers match the shapes and dtypes that interpret.py gives for the group,
  launches resolve within the limits, the constraints mask what they should;
- NVRTC: the example tasks' programs compile for sm_80 and sm_90 at the default and sampled
  schedules;
- a CPU run of the generated CUDA: the source is compiled with g++ against a small stand-in for
  the CUDA execution model (each thread of a block an OS thread, __syncthreads a barrier,
  __shfl_xor_sync through per-warp slots), launched as the plan says on small inputs, and compared
  with interpret.py (PyTorch) on the same inputs. This runs the real index math, vector and scalar
  paths, the shuffle/shared-memory trees, the split's second kernel and the epilogue.
"""
from __future__ import annotations

import math
import random
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from core.codegen import CodegenError, Graph, Ref
from core.codegen import lower_reduce as lr
from core.codegen.capture import capture, capture_module
from core.codegen.interpret import interpret
from core.codegen.lower_reduce import is_reduce, lower_reduce
from core.program import KernelProgram, LaunchLimits, TensorInfo
from core.search.space import ScheduleSpace, env_from_task
from core.tasks import load_task
from core.toolchain import CompileCache, compile_cuda, nvrtc_info
from core.toolchain.resources import find_nvcc, resource_report
from tests.test_codegen_scan import SPLIT_STANDINS

TASKS = Path(__file__).resolve().parents[1] / "resources" / "tasks"
ARCHS = ("sm_80", "sm_90")
GXX = shutil.which("g++")
needs_nvrtc = pytest.mark.skipif(not nvrtc_info()[0], reason="NVRTC is not available")
needs_gxx = pytest.mark.skipif(GXX is None, reason="no host C++ compiler")


# ---- graphs ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """A small reduction group: fn(module, *inputs) on concrete inputs (NaNs and ties included)."""

    name: str
    fn: Callable
    inputs: tuple
    schedules: tuple = ()         # run beyond the default (each must be legal)
    misaligned: bool = False      # also run the last schedule with every input off by one element
    split: bool = False           # lower with the split thresholds forced down (small inputs, split path)
    run: bool = True              # run on the CPU (False: only used by the plan/constraint tests)


_GEN = torch.Generator().manual_seed(0)


def _t(*shape: int, scale: float = 2.0, shift: float = 0.5) -> torch.Tensor:
    return torch.randn(shape, generator=_GEN) * scale + shift


def _ints(*shape: int) -> torch.Tensor:
    return torch.randint(-3, 4, shape, generator=_GEN, dtype=torch.int32)


def _nan_ties(shape: tuple[int, ...], nans: tuple[int, ...]) -> torch.Tensor:
    """Small integers (many ties: the first index must win) and NaNs at these flat positions
    (two in one output: the first NaN must win)."""
    x = torch.randint(-4, 5, shape, generator=_GEN).float()
    x.view(-1)[list(nans)] = float("nan")
    return x


def _identity_rows(value: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows where the arg-reduction's identity (value: -inf for max, +inf for min, the integer
    limits) ties: all of row 0, the start of row 1 before one other element, the end of row 2 after
    one, and a NaN after identities in row 3 (floats only). The first index must win every tie."""
    x = torch.randint(-4, 5, (4, 300), generator=_GEN).to(dtype)
    x[0] = value
    x[1, :250] = value
    x[2, 40:] = value
    if dtype.is_floating_point:
        x[3, :100] = value
        x[3, 150] = float("nan")
    return x


def _rms_part(m, x):
    xf = x.float()
    return torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)


def _lse_first_group(m, x):
    """logsumexp's first group: amax, zeroed where infinite; written as [N, 1] and squeezed [N]."""
    mx = x.amax(1, keepdim=True)
    safe = torch.where(mx.abs() == float("inf"), 0.0, mx)
    return safe, safe.squeeze(1)


def _special_rows(n: int, c: int) -> torch.Tensor:
    x = _t(n, c)
    x[1, 7] = float("nan")
    x[2, :] = float("-inf")
    x[3, 5] = float("inf")
    return x


def _large_then_small(rows: int, n: int) -> torch.Tensor:
    """Rows of 2^20 followed by 0.06s: 0.06 is under half of 2^20's fp32 ulp (0.125), so an fp32 sum
    that holds the 2^20 drops every 0.06 added to it."""
    x = torch.full((rows, n), 0.06)
    x[:, 0] = 2.0 ** 20
    return x


def _lse_second_group(m, x, mx):
    """logsumexp's second group: exp(x - m) summed, log, + squeeze(m); m = the first group's amax."""
    return torch.log(torch.exp(x - mx).sum(1)) + mx.squeeze(1)


PARAMS = {"w24": _t(24), "b324": _t(3, 24), "w96": _t(96)}
_lse_x = _t(5, 300)
CASES = [
    Case("rows_sum", lambda m, x: x.sum(-1), (_t(6, 100),),
         ({"ROW_MODE": 1, "BLOCK": 64, "VEC": 2, "UNROLL": 1}, {"ROW_MODE": 0, "BLOCK": 32, "VEC": 1, "UNROLL": 2},
          {"ROW_MODE": 1, "ROWS": 2, "BLOCK": 64, "VEC": 2, "UNROLL": 1},      # 6 rows: the 2nd block's 2nd warp idles
          {"ROW_MODE": 0, "ROWS": 4, "BLOCK": 64, "VEC": 1, "UNROLL": 1}),     # 2 warps merge 4 rows; a 2-row tail
         misaligned=True),
    Case("cols_mean", lambda m, x: x.mean(0), (_t(37, 64),), ({"BLOCK": 128, "COLW": 32, "VEC": 2, "UNROLL": 4},),
         misaligned=True),
    Case("var_general", lambda m, x: x.var((0, 2), correction=0), (_t(5, 6, 40),),
         ({"BLOCK": 32, "ROW_MODE": 0, "VEC": 4, "UNROLL": 1}, {"BLOCK": 128, "ROW_MODE": 0, "ROWS": 4, "VEC": 1}),
         misaligned=True),
    Case("var_mean_rows", lambda m, x: torch.var_mean(x, 1), (_t(7, 160, shift=50.0),),
         ({"BLOCK": 64, "ROW_MODE": 0, "ROWS": 4, "VEC": 2, "UNROLL": 1},
          {"BLOCK": 64, "ROW_MODE": 1, "ROWS": 4, "VEC": 1, "UNROLL": 2}), misaligned=True),
    Case("all_rows", lambda m, x: (x > -3).all(1), (_ints(7, 70),),
         ({"BLOCK": 64, "ROW_MODE": 0, "ROWS": 2, "VEC": 1, "UNROLL": 1},)),
    Case("std_mean_keepdim_cols", lambda m, x: torch.std_mean(x, (0, 1), keepdim=True), (_t(7, 9, 16, shift=100.0),)),
    Case("argmax_cols_ties_nan", lambda m, x: x.argmax(1), (_nan_ties((4, 50, 12), (63, 483, 1000)),),
         ({"BLOCK": 64, "COLW": 32, "VEC": 1, "UNROLL": 2},)),
    Case("argmin_flat_ties", lambda m, x: x.argmin(), (torch.randint(-9, 9, (9, 70), generator=_GEN).float(),),
         ({"BLOCK": 64, "ROW_MODE": 0, "ROWS": 4},)),          # one output: 3 of the block's 4 rows are past the end
    Case("max_dim_nan", lambda m, x: torch.max(x, -1), (_nan_ties((10, 64), (138, 178, 300)),),
         ({"ROW_MODE": 0, "BLOCK": 32, "VEC": 2, "UNROLL": 1}, {"ROW_MODE": 0, "ROWS": 4, "BLOCK": 32, "VEC": 2},
          {"ROW_MODE": 0, "ROWS": 4, "BLOCK": 64, "VEC": 1, "UNROLL": 1}), misaligned=True),
    Case("max_dim_identity_ties", lambda m, x: torch.max(x, -1), (_identity_rows(float("-inf")),),
         ({"ROW_MODE": 1, "BLOCK": 64, "VEC": 4, "UNROLL": 2}, {"ROW_MODE": 0, "BLOCK": 32, "VEC": 1, "UNROLL": 1}),
         misaligned=True),
    Case("argmin_identity_ties_split", lambda m, x: x.argmin(1), (_identity_rows(float("inf")),), split=True),
    Case("argmax_int_limit_cols", lambda m, x: x.argmax(0),
         (_identity_rows(-2.0 ** 31, torch.int32).T.contiguous(),), ({"BLOCK": 64, "COLW": 32, "VEC": 1, "UNROLL": 2},)),
    Case("rmsnorm_part_bf16", _rms_part, (_t(6, 64).to(torch.bfloat16),),
         ({"ROW_MODE": 1, "ROWS": 4, "BLOCK": 32},), misaligned=True),
    Case("rows_general_grp", lambda m, x, s: (x * s).sum((0, 2)), (_t(5, 6, 40), _t(5, 1, 1)),
         ({"BLOCK": 32, "ROW_MODE": 0, "VEC": 4, "UNROLL": 1},), misaligned=True),
    Case("prologue_bcast_epilogue", lambda m, x, s: (x * s + m.w24).sum(1) * 0.5 + m.b324 - m.w24,
         (_t(3, 40, 24), _t(40, 1)),
         ({"BLOCK": 64, "COLW": 32, "VEC": 4, "UNROLL": 1},), misaligned=True),
    Case("rows_weight_and_row_scale", lambda m, x, r: (x * m.w96 * r).sum(-1) + r.squeeze(1), (_t(6, 96), _t(6, 1)),
         ({"ROW_MODE": 1, "BLOCK": 128, "VEC": 4, "UNROLL": 1}, {"ROW_MODE": 0, "ROWS": 4, "BLOCK": 64, "VEC": 1}),
         misaligned=True),
    Case("norm_p3", lambda m, x: torch.linalg.vector_norm(x, ord=3, dim=(0, 2)), (_t(5, 6, 8),),
         ({"ROW_MODE": 0, "ROWS": 4, "BLOCK": 32},)),
    Case("norm_neg_inf", lambda m, x: torch.linalg.vector_norm(x, ord=float("-inf"), dim=0), (_t(33, 8),)),
    Case("mse_split", lambda m, x, y: torch.nn.functional.mse_loss(x, y), (_t(20, 64), _t(20, 64)),
         ({"BLOCK": 64, "VEC": 2, "UNROLL": 2, "SPLIT": 4},), misaligned=True, split=True),
    Case("mean_dim0_split", lambda m, x: x.mean(0), (_t(120, 64),),
         ({"BLOCK": 128, "COLW": 32, "VEC": 1, "UNROLL": 2, "SPLIT": 2},), misaligned=True, split=True),
    Case("max_rows_split", lambda m, x: torch.max(x, 1), (_nan_ties((3, 500), (600, 950, 20)),), split=True),
    # The last block's merge of a column tile: 4 threads per output and a tile past the last output
    # (80 of 96 columns), then 4 outputs per thread (BLOCK 64 < 256 outputs of a tile).
    Case("mean_cols_split_partial_tile", lambda m, x: x.mean(0), (_t(120, 80),),
         ({"BLOCK": 128, "COLW": 32, "VEC": 1, "UNROLL": 1, "SPLIT": 4},), split=True),
    Case("argmax_cols_split", lambda m, x: x.argmax(0), (_nan_ties((120, 256), (5, 300, 301, 9000)),),
         ({"BLOCK": 64, "COLW": 64, "VEC": 4, "UNROLL": 1, "SPLIT": 4},
          {"BLOCK": 256, "COLW": 32, "VEC": 2, "UNROLL": 1, "SPLIT": 4}), split=True),
    Case("count_nonzero", lambda m, x: (x != 0).sum(1), (_ints(5, 7),)),
    Case("int_prod", lambda m, x: x.prod(1), (_ints(5, 7),), ({"ROW_MODE": 1, "ROWS": 2, "BLOCK": 64},)),
    Case("any_cols", lambda m, x: (x > 0).any(0), (_ints(5, 40),)),
    Case("int_amax_cols_keepdim", lambda m, x: x.amax(0, keepdim=True), (_ints(5, 40),)),
    Case("fp16_mean", lambda m, x: x.half().mean((0, 2)), (_t(4, 6, 32),),
         ({"ROW_MODE": 0, "ROWS": 4, "BLOCK": 64, "VEC": 2},), misaligned=True),
    Case("sum_fp64_dtype", lambda m, x: x.sum(1, dtype=torch.float64), (_t(6, 50),),
         ({"ROW_MODE": 1, "ROWS": 4, "BLOCK": 64, "VEC": 1},)),
    Case("logsumexp_group1", _lse_first_group, (_special_rows(6, 300),),
         ({"ROW_MODE": 0, "ROWS": 4, "BLOCK": 64, "VEC": 4},)),
    Case("logsumexp_group2", _lse_second_group, (_lse_x, _lse_x.amax(1, keepdim=True)),
         ({"ROW_MODE": 1, "ROWS": 2, "BLOCK": 64, "VEC": 2},)),
    Case("scalar_input", lambda m, x: x.sum(), (_t(),)),
    # One large element, then elements under half its fp32 ulp: see test_fp32_partials_stay_within_their_bound.
    Case("sum_partial_rows", lambda m, x: x.sum(1), (_large_then_small(4, 4096),),
         ({"ROW_MODE": 0, "BLOCK": 32, "VEC": 4, "UNROLL": 4}, {"ROW_MODE": 1, "BLOCK": 32, "VEC": 1, "UNROLL": 2})),
    Case("sum_partial_cols", lambda m, x: x.sum(0), (_large_then_small(128, 4096).T.contiguous(),),
         ({"BLOCK": 256, "COLW": 32, "VEC": 4, "UNROLL": 4},)),
    Case("rank6_rows_keepdim", lambda m, x, w: (x * w).sum((1, 3, 5), keepdim=True), (_t(2, 3, 2, 3, 2, 4), _t(3, 1, 4)),
         ({"BLOCK": 32, "ROW_MODE": 0, "VEC": 2, "UNROLL": 1}, {"BLOCK": 32, "ROW_MODE": 0, "ROWS": 2, "VEC": 2}),
         misaligned=True),
    Case("rank6_cols", lambda m, x: x.amax((0, 2, 4)), (_t(2, 3, 2, 3, 2, 4),),
         ({"BLOCK": 64, "COLW": 32, "VEC": 2, "UNROLL": 1},), misaligned=True),
    Case("rank8_var", lambda m, x: x.var((0, 3, 4, 7)), (_t(2, 2, 3, 2, 2, 1, 2, 3),),
         ({"BLOCK": 32, "ROW_MODE": 1, "ROWS": 4},)),
    # Used by the plan and constraint tests only.
    Case("odd_cols", lambda m, x: x.sum(0), (_t(300, 7),), run=False),
    Case("var_mean_cols", lambda m, x: torch.var_mean(x, 0), (_t(300, 1024),), run=False),
    Case("cumsum_then_sum", lambda m, x: torch.cumsum(x, 1).sum(1), (_t(4, 8),), run=False),
    Case("anchors", lambda m, x: (
        x.sum(1), x.sum(), x.mean((0, 2)), x.amax(-1), x.amin(0, keepdim=True), torch.max(x, 1), torch.min(x),
        x.argmax(), x.argmin(2), x.prod(1), x.var(1), torch.var_mean(x, 0), x.std(), torch.norm(x, p=3, dim=1),
        torch.linalg.vector_norm(x, ord=float("inf")), (x > 0).any(1), (x > 0).all(), torch.softmax(x, -1)),
        (_t(4, 5, 6),), run=False),
]
BY_NAME = {c.name: c for c in CASES}


class _AllCases(torch.nn.Module):
    def __init__(self):
        super().__init__()
        for name, value in PARAMS.items():
            self.register_buffer(name, value)

    def forward(self, *xs):
        outs, pos = [], 0
        for case in CASES:
            outs += _flat(case.fn(self, *xs[pos:pos + len(case.inputs)]))
            pos += len(case.inputs)
        return tuple(outs)


def _flat(result) -> list[torch.Tensor]:
    if isinstance(result, (tuple, list)):
        return [t for r in result for t in _flat(r)]
    return [result]


@lru_cache(maxsize=1)
def _captured() -> tuple[Graph, dict[str, list[str]], dict[str, torch.Tensor]]:
    """Every case in one torch.export (captures cost ~0.5 s each); its outputs and data by case."""
    names = [f"{case.name}_{i}" for case in CASES for i in range(len(case.inputs))]
    data = [t for case in CASES for t in case.inputs]
    graph = capture_module(_AllCases(), data, "reduce_cases", names)
    outputs, pos = {}, 0
    for case in CASES:
        count = len(_flat(case.fn(_AllCases(), *case.inputs)))
        outputs[case.name] = graph.outputs[pos:pos + count]
        pos += count
    values = dict(zip(names, data)) | dict(PARAMS)
    return graph, outputs, values


def _group(name: str) -> Graph:
    """The case's fusion group: the nodes its outputs need and the inputs they read."""
    graph, outputs, _ = _captured()
    by_name = {n.name: n for n in graph.nodes}
    keep, todo = set(), list(outputs[name])
    while todo:
        n = todo.pop()
        if n in by_name and n not in keep:
            keep.add(n)
            todo += [o.name for o in by_name[n].operands if isinstance(o, Ref)]
    read = {o.name for n in keep for o in by_name[n].operands if isinstance(o, Ref)}
    return Graph(name, [v for v in graph.inputs if v.name in read], [n for n in graph.nodes if n.name in keep],
                 list(outputs[name]), {})


def _case_values(name: str) -> dict[str, torch.Tensor]:
    _, _, values = _captured()
    return {v.name: values[v.name] for v in _group(name).inputs}


def _subgraph(graph: Graph, keep: list[str], outputs: list[str]) -> Graph:
    return Graph(graph.task, list(graph.inputs), [n for n in graph.nodes if n.name in keep], outputs,
                 dict(graph.constants))


@lru_cache(maxsize=None)
def _task_graph(name: str) -> Graph:
    return capture(load_task(TASKS / f"{name}.py"))


@lru_cache(maxsize=None)
def _example(name: str) -> Graph:
    graph = _task_graph(name.removesuffix("_meanpart"))
    if name == "norm_rmsnorm_bf16_meanpart":    # x -> float -> pow 2 -> mean keepdim -> + eps -> rsqrt
        graph = _subgraph(graph, ["_to_copy", "pow_1", "mean", "add", "rsqrt"], ["rsqrt"])
    return graph


EXAMPLES = ["red_mean_dim0", "red_var_dim1", "red_std_keepdim_bf16", "red_argmax_dim1", "red_max_lastdim",
            "red_l2norm_dim1", "red_sum_dim1", "loss_mse", "norm_rmsnorm_bf16_meanpart"]


def _meta_outputs(graph: Graph) -> list[tuple[tuple[int, ...], str]]:
    inputs = {v.name: torch.empty(v.shape, dtype=getattr(torch, v.dtype), device="meta") for v in graph.inputs}
    return [(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in interpret(graph, inputs)]


def _env(graph: Graph) -> dict:
    return {v.name: TensorInfo(tuple(v.shape), v.dtype) for v in graph.inputs}


def _lower(case: Case, kernel: str = "k"):
    """Lower a small case; ROWS > 1 is allowed on tiny grids (the mask is about filling an H200)."""
    graph = _group(case.name)
    saved = lr.SPLIT_BELOW_BLOCKS, lr.SPLIT_MIN_ELEMENTS, lr.SPLIT_MIN_ROW, lr.ROWS_MIN_THREADS
    lr.ROWS_MIN_THREADS = 1
    if case.split:
        lr.SPLIT_BELOW_BLOCKS, lr.SPLIT_MIN_ELEMENTS, lr.SPLIT_MIN_ROW = 10**9, 0, 0
    try:
        return lower_reduce(graph, kernel)
    finally:
        lr.SPLIT_BELOW_BLOCKS, lr.SPLIT_MIN_ELEMENTS, lr.SPLIT_MIN_ROW, lr.ROWS_MIN_THREADS = saved


# ---- anchors and plans -----------------------------------------------------------------------------

def test_is_reduce_recognises_the_anchor_ops_only():
    graph = _group("anchors")
    anchors = {n.op for n in graph.nodes if is_reduce(n, graph)}
    assert anchors == {"sum.dim_IntList", "mean.dim", "amax.default", "amin.default", "max.dim", "min.default",
                       "argmax.default", "argmin.default", "prod.dim_int", "var.correction", "var_mean.correction",
                       "linalg_vector_norm.default", "any.dim", "any.dims"}
    others = {n.op for n in graph.nodes if not is_reduce(n, graph)}
    assert others == {"_softmax.default", "gt.Scalar", "getitem", "sqrt.default", "logical_not.default"}


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_plans_resolve_to_the_interpreted_shapes(name):
    graph = _example(name)
    low = lower_reduce(graph, "k")
    program = KernelProgram.from_json(low.program)
    assert program.kernel_names() == ["k"]   # a split merges in its last block, not a second kernel
    assert low.spec.tunables() == program.tunables and low.spec.default() == program.schedule
    assert low.spec.legal(low.spec.default())
    plan = program.resolve(_env(graph))
    by_name = {b.name: b for b in plan.buffers}
    assert list(plan.outputs) == graph.outputs
    assert [(by_name[o].shape, by_name[o].dtype) for o in graph.outputs] == _meta_outputs(graph)
    # Every sampled schedule resolves within the launch limits, with the grid the kernel expects.
    for schedule in [low.spec.default()] + low.spec.sample(random.Random(name), 8):
        resolved = program.with_schedule(schedule).resolve(_env(graph), LaunchLimits())
        _check_grid(low, schedule, resolved)


def _check_grid(low, schedule: dict, resolved) -> None:
    """The first launch covers every output (and every part of a split) exactly once."""
    launch = resolved.launches[0]
    notes = low.notes[0]
    n_out = int(re.search(r"(\d+) outputs", notes).group(1))
    split = schedule.get("SPLIT", 1)
    blocks = launch.grid[0] * launch.grid[1]
    threads = launch.block[0] * launch.block[1]
    if "rows kernel" in notes:
        per_block = schedule.get("ROWS", 1) * (schedule["BLOCK"] // 32 if schedule.get("ROW_MODE") == 1 else 1)
        assert launch.block == (schedule["BLOCK"], 1, 1)
        assert blocks * per_block >= n_out * split and (blocks - 1) * per_block < n_out * split
    else:
        assert threads == schedule["BLOCK"] and launch.block[0] == schedule["COLW"]
        assert launch.grid[1] == split
        cols = launch.grid[0] * schedule["COLW"] * schedule["VEC"]
        assert cols >= n_out and cols - schedule["COLW"] * schedule["VEC"] < n_out
    assert len(resolved.launches) == 1
    counters = [b for b in resolved.buffers if b.zeroed]
    if "split" in notes:
        # One zeroed arrival counter per block along x: per output (rows) or column tile (cols).
        assert [(b.shape, b.dtype) for b in counters] == [((launch.grid[0] // split if "rows kernel" in notes
                                                            else launch.grid[0],), "int32")]
    else:
        assert counters == []


def test_the_split_appears_only_for_few_outputs_with_long_reductions():
    notes = {name: lower_reduce(_example(name), "k").notes[0] for name in
             ("red_mean_dim0", "red_sum_dim1", "loss_mse", "red_max_lastdim")}
    assert "cols kernel, split" in notes["red_mean_dim0"]          # 4096 columns of 16384
    assert "rows kernel" in notes["red_sum_dim1"] and "split" not in notes["red_sum_dim1"]
    assert "rows kernel, split" in notes["loss_mse"]               # one output of 67M elements
    low = lower_reduce(_example("loss_mse"), "k")
    assert low.spec.default()["SPLIT"] == 1024
    plan = KernelProgram.from_json(low.program).resolve(_env(_example("loss_mse")))
    assert [(b.name, b.shape, b.dtype, b.zeroed) for b in plan.buffers] == [
        ("mean", (), "float32", False), ("partials", (1, 1024), "float64", False), ("arrivals", (1,), "int32", True)]
    assert [launch.kernel for launch in plan.launches] == ["k"]
    assert [a.name for a in plan.launches[0].args][-3:] == ["mean", "partials", "arrivals"]


def test_constraints_mask_illegal_and_idle_schedules():
    spec = lower_reduce(_example("red_sum_dim1"), "k").spec          # fp32 rows of 16384
    base = spec.default()
    assert base == {"BLOCK": 256, "ROW_MODE": 0, "ROWS": 1, "VEC": 4, "UNROLL": 4}
    assert 8 not in spec.tunables()["VEC"]                         # 32-byte fp32 vectors are not offered
    bf16 = lower_reduce(_example("red_std_keepdim_bf16"), "k").spec
    assert bf16.default()["VEC"] == 8 and bf16.legal({**bf16.default(), "VEC": 2})
    rows = lower_reduce(_example("red_max_lastdim"), "k").spec        # 65536 rows of 1024: a warp per row
    assert rows.default()["ROW_MODE"] == 1
    assert "idle" in rows.why_illegal({**rows.default(), "ROW_MODE": 0, "BLOCK": 512, "VEC": 4})
    cols = lower_reduce(_example("red_mean_dim0"), "k").spec
    assert "more than BLOCK" in cols.why_illegal({**cols.default(), "BLOCK": 64, "COLW": 128})
    # A 7-wide innermost dim: no vector divides it.
    odd = _lower(BY_NAME["odd_cols"]).spec
    assert odd.default()["VEC"] == 1 and "does not divide" in odd.why_illegal({**odd.default(), "VEC": 2})
    # ROWS: outputs per block (or warp); more than one only while the grid can still fill an H200.
    assert spec.legal({**base, "ROWS": 2}) and spec.legal({**base, "ROWS": 2, "BLOCK": 512})
    assert "SMs would idle" in spec.why_illegal({**base, "ROWS": 4})          # 1024 blocks x 256 threads
    assert "SMs would idle" in spec.why_illegal({**base, "ROW_MODE": 1, "BLOCK": 1024, "ROWS": 4})   # 32 blocks
    assert bf16.default()["ROWS"] == 1
    assert rows.default()["ROWS"] == 2                                    # 65536 rows: 8 warps x 2 rows a block
    assert rows.legal({**rows.default(), "ROWS": 4})
    assert "ROWS" not in lower_reduce(_example("loss_mse"), "k").spec.tunables()   # the split keeps one row
    tiny = lower_reduce(_group("rows_sum"), "k").spec                     # 6 rows
    assert tiny.default()["ROWS"] == 1 and "SMs would idle" in tiny.why_illegal({**tiny.default(), "ROWS": 2})
    # var_mean keeps three doubles per accumulator: 1024 threads x 4 outputs do not fit in shared memory.
    vm = _lower(BY_NAME["var_mean_cols"]).spec
    assert "shared memory" in vm.why_illegal({**vm.default(), "BLOCK": 1024, "COLW": 32, "VEC": 4})


def test_schedule_space_takes_the_constraints():
    task = load_task(TASKS / "red_argmax_dim1.py")
    low = lower_reduce(capture(task), "red_argmax_dim1")
    program = KernelProgram.from_json(low.program)
    space = ScheduleSpace.from_program(program, task, constraints=low.spec.constraints)
    assert space.legal(space.default())
    legal = sorted(space.key(s) for s in space.enumerate())
    assert legal == sorted(space.key(s) for s in low.spec.enumerate())
    assert len(legal) >= 20
    program.resolve(env_from_task(task))


def test_offsets_match_numpy_indexing():
    rng = random.Random(0)
    for _ in range(300):
        rank = rng.randint(1, 5)
        sizes = [rng.choice([1, 2, 3, 4, 5]) for _ in range(rank)]
        present = [rng.random() < 0.6 for _ in range(rank)]
        shape = [s if p else 1 for s, p in zip(sizes, present)]
        strides = list(lr._strides(tuple(shape), tuple(sizes)))
        expr = lr._offset_expr("i", sizes, strides).replace("/", "//")
        ref = torch.arange(math.prod(shape)).reshape(shape).expand(sizes).reshape(-1)
        for i in range(math.prod(sizes)):
            assert eval(expr, {"i": i}) == int(ref[i]), (sizes, shape, expr)


def test_clear_errors_for_groups_the_family_cannot_lower():
    full = _task_graph("norm_rmsnorm_bf16")          # the epilogue multiplies the [N, C] input by the result
    with pytest.raises(CodegenError, match=r"Task 'norm_rmsnorm_bf16': epilogue node 'mul' \(mul.Tensor\) has "
                                           r"shape \[16384, 8192\]"):
        lower_reduce(full, "k")
    with pytest.raises(CodegenError, match=r"exactly one reduction; this group has 'amax' \(amax.default\), "
                                           r"'sum_1' \(sum.dim_IntList\)"):
        lower_reduce(_task_graph("red_logsumexp_dim1"), "k")
    with pytest.raises(CodegenError, match=r"fuses only elementwise ops and views around '_log_softmax.default'|"
                                           r"exactly one reduction"):
        lower_reduce(_task_graph("loss_cross_entropy"), "k")
    cum = _group("cumsum_then_sum")
    with pytest.raises(CodegenError, match=r"Task 'cumsum_then_sum': the reduce family fuses only elementwise ops and views "
                                           r"around 'sum.dim_IntList'; this group also has cumsum.default"):
        lower_reduce(cum, "k")


# ---- NVRTC -----------------------------------------------------------------------------------------

@needs_nvrtc
def test_example_programs_compile_for_sm80_and_sm90(tmp_path):
    cache = CompileCache(tmp_path / "cache")
    jobs = []
    for name in EXAMPLES:
        low = lower_reduce(_example(name), f"{name}_reduce")
        program = KernelProgram.from_json(low.program)
        jobs += [(name, low.spec.default(), arch, program) for arch in ARCHS]
        for schedule in low.spec.sample(random.Random(name), 1):
            jobs.append((name, schedule, "sm_90", program.with_schedule(schedule)))

    _compile_all(jobs, cache)


@needs_nvrtc
def test_rows_per_block_compiles_for_sm80_and_sm90(tmp_path):
    """ROWS > 1 in both row modes, on fp32, bf16 and the value-and-index accumulators."""
    cache = CompileCache(tmp_path / "cache")
    jobs = []
    for name in ("red_sum_dim1", "red_var_dim1", "red_std_keepdim_bf16", "red_max_lastdim", "red_argmax_dim1"):
        graph = _example(name) if name != "red_argmax_dim1" else _group("max_dim_nan")
        low = lower_reduce(graph, f"{name}_reduce")
        assert "ROWS" in low.spec.tunables(), name
        program = KernelProgram.from_json(low.program)
        for extra in ({"ROW_MODE": 0, "ROWS": 4}, {"ROW_MODE": 1, "ROWS": 2, "BLOCK": 128}):
            schedule = {**low.spec.default(), **extra}
            jobs += [(name, schedule, arch, program.with_schedule(schedule)) for arch in ARCHS]

    _compile_all(jobs, cache)


@needs_nvrtc
def test_split_programs_compile_for_sm80_and_sm90(tmp_path):
    """The last-block merge (fences, the arrival atomic, __ldcg of every partial type) on each
    split case: double and fp32 sums, value-and-index pairs, rows and cols kernels."""
    cache = CompileCache(tmp_path / "cache")
    jobs = []
    for case in (c for c in CASES if c.split):
        low = _lower(case, f"{case.name}_reduce")
        program = KernelProgram.from_json(low.program)
        assert any(b.get("zeroed") for b in low.program["buffers"]), case.name
        for schedule in [low.spec.default()] + [{**low.spec.default(), **x} for x in case.schedules]:
            for occ in (0, 1, 2):
                occupied = {**schedule, "OCC": occ}
                jobs += [(case.name, occupied, arch, program.with_schedule(occupied)) for arch in ARCHS]

    _compile_all(jobs, cache)


def test_only_split_kernels_have_the_occupancy_knob():
    for name, split in (("red_mean_dim0", True), ("loss_mse", True), ("red_sum_dim1", False), ("red_var_dim1", False)):
        low = lower_reduce(_example(name), "k")
        assert ("OCC" in low.spec.default()) is split, name
        if split:
            assert low.spec.default()["OCC"] == 0          # off unless the search turns it on
            assert ("#if OCC == 1\n__launch_bounds__(BLOCK, 2048 / BLOCK)\n#elif OCC == 2\n__launch_bounds__(BLOCK, 1)\n"
                    "#else\n__launch_bounds__(BLOCK)\n#endif") in low.program["source"]
        else:
            assert "OCC" not in low.program["source"]


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found (the register report needs it)")
def test_occupancy_knob_reaches_the_compiler():
    """OCC=1 holds a split kernel to the registers that 2048 / BLOCK resident blocks leave (32 at 256
    threads); OCC=0 leaves nvcc's own choice, as before the knob (44 for red_mean_dim0's default);
    OCC=2 lets it take more (64)."""
    low = lower_reduce(_example("red_mean_dim0"), "red_mean_dim0_reduce")
    program = KernelProgram.from_json(low.program)
    registers = {}
    for occ in (0, 1, 2):
        built = program.with_schedule({**low.spec.default(), "OCC": occ})
        report = resource_report(built.source, arch="sm_90", options=built.compile_options())
        registers[occ] = report["red_mean_dim0_reduce"].registers
    assert registers[1] <= 32 < registers[0] < registers[2]


def _compile_all(jobs: list, cache: CompileCache) -> None:
    """Compile (name, schedule, arch, program) jobs on two threads; every one must compile."""
    def build(job):
        name, schedule, arch, program = job
        return job, compile_cuda(program.source, arch=arch, options=program.compile_options(), cache=cache)

    with ThreadPoolExecutor(2) as pool:
        for (name, schedule, arch, _), result in pool.map(build, jobs):
            assert result.ok, f"{name} {schedule} {arch}:\n{result.error_summary()}"


# ---- CPU runs of the generated CUDA ------------------------------------------------------------

EMU_HEADER = r"""
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>
// A CPU stand-in for the CUDA execution model (tests only): every thread of a block is an OS thread,
// blocks run one after another, __syncthreads is a block barrier, __shfl_xor_sync trades values
// through per-warp slots between two warp barriers, __shared__ arrays are statics (one block at a time).
struct ca_dim3 { unsigned x = 1, y = 1, z = 1; };
thread_local ca_dim3 threadIdx, blockIdx;
static ca_dim3 blockDim, gridDim;
thread_local int ca_tid;
struct CaBlock {
    std::unique_ptr<std::barrier<>> all;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    unsigned long long slots[1024];
};
static CaBlock* ca_block;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__ __restrict
#define CA_HD inline
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline void __syncthreads() { ca_block->all->arrive_and_wait(); }
template <class T> T __shfl_xor_sync(unsigned, T v, int o) {
    const int warp = ca_tid >> 5, lane = ca_tid & 31;
    unsigned long long raw = 0;
    memcpy(&raw, &v, sizeof(T));
    ca_block->slots[ca_tid] = raw;
    ca_block->warps[warp]->arrive_and_wait();
    raw = ca_block->slots[(warp << 5) | (lane ^ o)];
    ca_block->warps[warp]->arrive_and_wait();
    T r;
    memcpy(&r, &raw, sizeof(T));
    return r;
}
struct CaPtr {
    void* p;
    template <class T> operator T*() const { return (T*)p; }
};
template <class F> void ca_launch(F kernel, ca_dim3 grid, ca_dim3 block) {
    gridDim = grid;
    blockDim = block;
    const int nt = block.x * block.y * block.z;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                CaBlock b;
                b.all = std::make_unique<std::barrier<>>(nt);
                for (int w = 0; w * 32 < nt; ++w)
                    b.warps.push_back(std::make_unique<std::barrier<>>(nt - w * 32 < 32 ? nt - w * 32 : 32));
                ca_block = &b;
                std::vector<std::thread> threads;
                threads.reserve(nt);
                for (int t = 0; t < nt; ++t)
                    threads.emplace_back([&, t] {
                        ca_tid = t;
                        threadIdx.x = t % block.x;
                        threadIdx.y = (t / block.x) % block.y;
                        threadIdx.z = t / (block.x * block.y);
                        blockIdx.x = bx; blockIdx.y = by; blockIdx.z = bz;
                        kernel();
                    });
                for (auto& t : threads) t.join();
            }
}
static void* ca_read(const std::string& path, long long bytes, long long pad) {
    char* b = (char*)aligned_alloc(64, ((bytes + pad + 63) / 64) * 64 + 64);
    FILE* f = fopen(path.c_str(), "rb");
    if (!f || fread(b + pad, 1, bytes, f) != (size_t)bytes) { perror(path.c_str()); exit(2); }
    fclose(f);
    return b + pad;
}
static void* ca_alloc(long long bytes) {
    char* b = (char*)aligned_alloc(64, ((bytes + 63) / 64) * 64 + 64);
    memset(b, 0xff, bytes);   // what is never written reads as NaN / -1
    return b;
}
static void ca_write(const std::string& path, const void* b, long long bytes) {
    FILE* f = fopen(path.c_str(), "wb");
    fwrite(b, 1, bytes, f);
    fclose(f);
}
""" + SPLIT_STANDINS

ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
            "int8": 1, "uint8": 1, "bool": 1}


def _file(name: str) -> str:
    return re.sub(r"\W", "_", name) + ".bin"


@dataclass
class Run:
    """One generated program run on the CPU at one schedule."""

    case: str
    graph: Graph
    program: KernelProgram
    schedule: dict
    pad: bool                     # misalign every input by one element: the scalar fallback


def _case_code(index: int, run: Run) -> tuple[str, str]:
    program = run.program.with_schedule(run.schedule)
    plan = program.resolve(_env(run.graph))
    source = program.source.replace('extern "C" ', "")
    defines = "".join(f"#define {k} {v}\n" for k, v in program.schedule.items())
    undefs = "".join(f"#undef {k}\n" for k in program.schedule)
    space = f"namespace c{index} {{\n{defines}{source}\n{undefs}}}\n"
    inputs = {v.name: v for v in run.graph.inputs}
    lines = [f"    case {index}: {{"]
    cvar = {}
    for name, v in inputs.items():
        nbytes = math.prod(v.shape) * ITEMSIZE[v.dtype]
        pad = ITEMSIZE[v.dtype] if run.pad else 0
        cvar[name] = f"b{len(cvar)}"
        lines.append(f'        void* {cvar[name]} = ca_read(dir + "/{_file(name)}", {nbytes}, {pad});')
    for b in plan.buffers:
        cvar[b.name] = f"b{len(cvar)}"
        nbytes = math.prod(b.shape) * ITEMSIZE[b.dtype]
        lines.append(f"        void* {cvar[b.name]} = ca_alloc({nbytes});"
                     + (f" memset({cvar[b.name]}, 0, {nbytes});" if b.zeroed else ""))
    # A split program runs twice, its outputs refilled in between: the first run must leave the
    # zeroed arrival counters zeroed, or the second merges at the wrong block.
    zeroed = [b for b in plan.buffers if b.zeroed]
    for n_run in range(2 if zeroed else 1):
        if n_run:
            lines += [f"        memset({cvar[b.name]}, 0xff, {math.prod(b.shape) * ITEMSIZE[b.dtype]});"
                      for b in plan.buffers if b.name in plan.outputs]
        for launch in plan.launches:
            args = ", ".join(f"CaPtr{{{cvar[a.name]}}}" for a in launch.args)
            g, bl = launch.grid, launch.block
            lines.append(f"        ca_launch([&] {{ c{index}::{launch.kernel}({args}); }}, "
                         f"ca_dim3{{{g[0]}, {g[1]}, {g[2]}}}, ca_dim3{{{bl[0]}, {bl[1]}, {bl[2]}}});")
    for b in zeroed:
        nbytes = math.prod(b.shape) * ITEMSIZE[b.dtype]
        lines += [f"        for (long long i = 0; i < {nbytes}; ++i)",
                  f"            if (((unsigned char*){cvar[b.name]})[i]) {{ fprintf(stderr, \"zeroed buffer {b.name} "
                  f"left nonzero\\n\"); return 4; }}"]
    for b in plan.buffers:
        if b.name in plan.outputs:
            lines.append(f'        ca_write(dir + "/out_{_file(b.name)}", {cvar[b.name]}, '
                         f"{math.prod(b.shape) * ITEMSIZE[b.dtype]});")
    lines += ["        return 0;", "    }"]
    return space, "\n".join(lines)


def _build(runs: list[Run], folder: Path) -> Path:
    spaces, cases = zip(*(_case_code(i, run) for i, run in enumerate(runs)))
    code = [EMU_HEADER, *spaces, "int main(int argc, char** argv) {",
            "    const int which = atoi(argv[1]);", "    const std::string dir = argv[2];",
            "    switch (which) {", *cases, "    }", "    return 1;", "}"]
    src = folder / "emu.cpp"
    src.write_text("\n".join(code))
    exe = folder / "emu"
    done = subprocess.run([GXX, "-O1", "-std=c++20", "-pthread", "-w", str(src), "-o", str(exe)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[:6000]
    return exe


@lru_cache(maxsize=1)
def _emulated(tmp: str) -> tuple[Path, dict[str, list[tuple[int, Run]]]]:
    """All CPU runs in one executable (one g++ compile); run indices by case."""
    runs: list[Run] = []
    by_case: dict[str, list[tuple[int, Run]]] = {}
    for case in CASES:
        if not case.run:
            continue
        low = _lower(case)
        program = KernelProgram.from_json(low.program)
        default = low.spec.default()
        chosen = [(default, False)] + [({**default, **s}, False) for s in case.schedules]
        if case.misaligned:
            chosen.append((chosen[-1][0], True))
        for schedule, misaligned in chosen:
            assert low.spec.legal(schedule), (case.name, schedule, low.spec.why_illegal(schedule))
            run = Run(case.name, _group(case.name), program, schedule, misaligned)
            by_case.setdefault(case.name, []).append((len(runs), run))
            runs.append(run)
    return _build(runs, Path(tmp)), by_case


def _emulated_outputs(case: str, tmp_path_factory):
    """(run, output name, interpreted output, emulated output's raw bytes) for each run of the case."""
    exe, by_case = _emulated(str(tmp_path_factory.getbasetemp()))
    inputs = _case_values(case)
    work = tmp_path_factory.mktemp(case)
    for name, value in inputs.items():
        (work / _file(name)).write_bytes(value.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    for index, run in by_case[case]:
        expected = interpret(run.graph, inputs)
        done = subprocess.run([str(exe), str(index), str(work)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        for name, ref in zip(run.graph.outputs, expected):
            yield run, name, ref, bytearray((work / f"out_{_file(name)}").read_bytes())


@needs_gxx
@pytest.mark.parametrize("case", [c.name for c in CASES if c.run])
def test_generated_cuda_runs_correctly_on_the_cpu(case, tmp_path_factory):
    by_rows: dict = {}        # schedule without ROWS -> outputs: ROWS must not change a single bit
    for run, name, ref, raw in _emulated_outputs(case, tmp_path_factory):
        got = torch.frombuffer(raw, dtype=ref.dtype).reshape(ref.shape)
        tol = 1e-2 if ref.dtype in (torch.float16, torch.bfloat16) else 1e-4
        torch.testing.assert_close(got, ref, atol=tol, rtol=tol, equal_nan=True,
                                   msg=lambda m: f"{case} {name} at {run.schedule} (misaligned={run.pad}): {m}")
        key = (name, run.pad, tuple(sorted((k, v) for k, v in run.schedule.items() if k != "ROWS")))
        seen = by_rows.setdefault(key, bytes(raw))
        assert seen == bytes(raw), f"{case} {name}: ROWS={run.schedule.get('ROWS')} changed the result bits"


@needs_gxx
@pytest.mark.parametrize("case,dim", [("sum_partial_rows", 1), ("sum_partial_cols", 0)])
def test_fp32_partials_stay_within_their_bound(case, dim, tmp_path_factory):
    """A thread sums at most PART_ELEMENTS elements in fp32 before its double accumulator, so a sum
    is off by at most that many fp32 roundings of its magnitudes (plus the result's own rounding).
    Here a thread's share is 128 elements or more: one fp32 sum over it would drop every 0.06 after
    the 2^20 (about 7.6 where the bound is 0.56)."""
    x = _case_values(case)[f"{case}_0"].double()
    exact = x.sum(dim)
    bound = lr.PART_ELEMENTS * 2.0 ** -24 * x.abs().sum(dim) + exact.abs() * 2.0 ** -24
    for run, name, ref, raw in _emulated_outputs(case, tmp_path_factory):
        err = (torch.frombuffer(raw, dtype=torch.float32).double() - exact).abs()
        assert (err <= bound).all(), f"{case} at {run.schedule}: error {err.max():.3g} over the bound {bound.min():.3g}"
