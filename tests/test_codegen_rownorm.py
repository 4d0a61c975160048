"""The row-normalise family (core/codegen/lower_rownorm.py) and the row groups partition.py forms.

No GPU. Four kinds of checks:
- the example norms, logsumexp and row losses become fewer kernels (one row group where they were a
  reduction and a pointwise pass), their merged programs resolve to the task's output shapes and
  compile with NVRTC for sm_80 and sm_90 at the default and a sampled schedule;
- the partition's semantics: each group's sub-graph of small versions of those tasks is run with
  interpret.py, reading earlier groups' buffers, and compared with the task's Model;
- the generated CUDA of small versions of the tasks and of synthetic row groups RUNS on the CPU: g++
  builds it against the scan tests' CUDA stand-in (a thread per CUDA thread, __syncthreads a
  barrier that reports deadlocks, shuffles through per-warp slots, `static` shared memory) plus a
  static buffer for the dynamic shared memory, with AddressSanitizer and UBSan; every launch of the
  program runs at several schedules (registers, shared memory and no cache; warp and block rows;
  the vector and the scalar path, with misaligned inputs) and is compared with eager PyTorch;
- constraints, refusals and the fallback to the split path.
"""
from __future__ import annotations

import copy
import os
import random
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import core.codegen.lower_rownorm as rn
from core.codegen import CodegenError, Graph, generate, generate_from_graph
from core.codegen.capture import capture_module
from core.codegen.generate import GeneratedProgram
from core.codegen.lower_reduce import PART_ELEMENTS
from core.codegen.partition import canonicalize, partition
from core.program import KernelProgram, LaunchLimits, TensorArg, TensorInfo
from core.search.space import env_from_task
from core.tasks import load_task
from core.toolchain import CompileCache, compile_cuda, nvrtc_info
from tests.test_codegen_partition import run_partition
from tests.test_codegen_scan import EMULATION, SANITIZE, emulated_launch

TASKS = Path(__file__).resolve().parents[1] / "resources" / "tasks"
GXX = shutil.which("g++")
needs_nvrtc = pytest.mark.skipif(not nvrtc_info()[0], reason="NVRTC is not available")
needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ is not available")

# Example task -> (groups before the row family, groups now, kernel launches before, now).
EXAMPLES = {
    "norm_layernorm": ("reduce+pointwise", "rownorm", 2, 1),
    "fused_add_layernorm": ("reduce+pointwise", "rownorm", 2, 1),
    "norm_rmsnorm_bf16": ("reduce+pointwise", "rownorm", 2, 1),
    "norm_groupnorm": ("reduce+pointwise", "rownorm", 2, 1),
    "norm_instancenorm2d": ("reduce+pointwise", "rownorm", 2, 1),
    "red_logsumexp_dim1": ("rowreduce+reduce", "rownorm", 2, 1),
    "loss_cosine_similarity": ("reduce+reduce+reduce+reduce", "rownorm+reduce", 4, 2),
    "loss_triplet_margin": ("reduce+reduce+reduce", "rownorm+reduce", 3, 2),
    # The two log-softmaxes are split into their reductions, and the sum over everything reduces
    # each row first (partition._two_level): one row group, then a sum of 16384 values.
    "loss_kl_div": ("rowreduce+rowreduce+reduce", "rownorm+reduce", 4, 2),
    # Strided rows (a softmax over dim 1): each thread takes VEC neighbouring rows.
    "softmax_dim1_fp16": ("reduce+reduce+pointwise", "rownorm", 3, 1),
    # Last-dim softmaxes: the row family read each row twice (max and sum, then the output).
    "softmax_lastdim": ("rowreduce", "rownorm", 1, 1),
    "softmax_log_lastdim": ("rowreduce", "rownorm", 1, 1),
}
# Examples with reductions the row family must leave alone (few long rows).
UNTOUCHED = {"norm_batchnorm2d_train": "reduce+pointwise"}


@lru_cache(maxsize=None)
def _task(name: str):
    return load_task(TASKS / f"{name}.py")


@lru_cache(maxsize=None)
def _generated(name: str) -> GeneratedProgram:
    return generate(_task(name))


def test_examples_become_fewer_kernels_and_plans_match_the_outputs():
    for name, (_, family, _, launches) in EXAMPLES.items():
        gen = _generated(name)
        assert gen.family == family, (name, gen.family)
        assert len(gen.program.launches) == launches, name
        task = _task(name)
        plan = gen.program.resolve(env_from_task(task), LaunchLimits())
        buffers = {b.name: b for b in plan.buffers}
        assert [(buffers[o].shape, buffers[o].dtype) for o in plan.outputs] == \
            [(tuple(s.shape), s.dtype) for s in task.output_specs], name
        assert gen.spec.legal(gen.spec.default()) and gen.spec.default() == gen.program.schedule
        group = gen.groups[0]
        assert group.family == "rownorm" and group.anchors
    for name, family in UNTOUCHED.items():
        assert _generated(name).family == family


def test_row_groups_read_the_rows_once():
    # norm_layernorm: one launch reads x, the weight and the bias and writes y, nothing else (x stays in
    # registers between the statistics and the normalisation); the split path also read x again and
    # wrote and read the statistics.
    gen = _generated("norm_layernorm")
    (group,) = gen.groups
    assert [r.base for r in group.reads] == ["norm.weight", "norm.bias", "x"]
    assert [b.name for b in gen.program.buffers] == gen.program.outputs
    assert gen.program.launches[0].args == ["norm.weight", "norm.bias", "x", "add_1"]
    assert gen.program.schedule["CACHE"] == 0 and any("cached per CACHE): x" in n for n in gen.notes)
    # The cosine loss: sum((a / |a|) * (b / |b|)) = sum(a * b) / |a| / |b|, so one pass over a and b
    # (the norms' factors leave the sum); three values per row out, which the mean's group divides.
    gen = _generated("loss_cosine_similarity")
    assert [r.base for r in gen.groups[0].reads] == ["a", "b"]
    assert sorted(gen.groups[0].outputs) == ["linalg_vector_norm", "linalg_vector_norm_1", "sum_1_hoisted"]
    assert any("1 pass over each row" in n for n in gen.notes), gen.notes


def _sum_ops(fn, shapes, dtype=torch.float32) -> list[str]:
    graph = capture_module(Fn(fn).to("meta"), [torch.empty(s, device="meta", dtype=dtype) for s in shapes],
                           "g", [f"x{i}" for i in range(len(shapes))])
    canon = canonicalize(graph, rows=True)
    return [f"{n.op}({', '.join(getattr(o, 'name', repr(o)) for o in n.operands)})" for n in canon.nodes]


def test_factors_constant_along_the_reduced_dims_leave_the_sum():
    ops = _sum_ops(lambda m, x, y: ((x / x.norm(dim=-1, keepdim=True)) * y).sum(-1), [(8, 64), (8, 64)])
    # The sum reads x * y only; the norm, viewed as one value per row, divides its result.
    assert ops == ["linalg_vector_norm.default(x0)", "mul.Tensor(x0, x1)", "sum.dim_IntList(sum_1_term)",
                   "view.default(linalg_vector_norm)", "div.Tensor(sum_1_hoisted, linalg_vector_norm_out)"]
    # Factors that vary along the reduced dim, fp16 (the reference rounds its intermediates), and a
    # product whose every varying factor divides stay as they were.
    for fn, dtype in ((lambda m, x, y: (x * y).sum(-1), torch.float32),
                      (lambda m, x, y: (x / x.norm(dim=-1, keepdim=True) * y).sum(-1), torch.float16),
                      (lambda m, x, y: (x.amax(-1, keepdim=True) / y).sum(-1), torch.float32)):
        ops = _sum_ops(fn, [(8, 64), (8, 64)], dtype)
        assert not any("hoisted" in o or "_out" in o for o in ops), ops
    # Over dim 0 (columns): a per-column constant leaves the sum, a per-row one does not.
    ops = _sum_ops(lambda m, x, y: (x * y.sum(0, keepdim=True)).sum(0), [(16, 32), (16, 32)])
    assert any("hoisted" in o for o in ops), ops
    ops = _sum_ops(lambda m, x, y: (x * y.sum(1, keepdim=True)).sum(0), [(16, 32), (16, 32)])
    assert not any("hoisted" in o for o in ops), ops


def _row_source(fn: Callable, shapes: list[tuple[int, ...]], dtype: torch.dtype = torch.float32) -> str:
    """The generated source of fn's row group (one kernel), captured on meta tensors."""
    inputs = [torch.empty(s, device="meta", dtype=dtype) for s in shapes]
    gen = generate_from_graph(capture_module(Fn(fn).to("meta"), inputs, "g", [f"x{i}" for i in range(len(inputs))]))
    assert gen.family == "rownorm", gen.family
    return gen.program.source


def test_divisions_by_a_row_constant_become_one_reciprocal_per_row():
    src = _row_source(lambda m, x: torch.softmax(x, -1), [(300, 64)])
    assert "reciprocal.default" in src and "div.Tensor" not in src
    assert re.search(r"= \(e\d+ \* c\d+_0\);  // mul.Tensor", src), src
    # fp16: the reciprocal is computed in fp32 and not rounded to fp16.
    src = _row_source(lambda m, x: x / x.sum(-1, keepdim=True), [(300, 64)], torch.float16)
    rcp = re.search(r"(\w+) (\w+) = \(1\.0f / [^;]+\);  // reciprocal.default\n(.*)", src)
    assert rcp and rcp.group(1) == "float" and "round_f16" not in rcp.group(3), src
    # A divisor that varies along the row, and a floor division, stay divisions.
    src = _row_source(lambda m, x, y: x / (y + 1.0) / x.sum(-1, keepdim=True), [(300, 64), (300, 64)])
    assert src.count("div.Tensor") == 1 and "reciprocal.default" in src
    src = _row_source(lambda m, x: torch.div(x, x.amax(-1, keepdim=True), rounding_mode="floor"), [(300, 64)])
    assert "reciprocal.default" not in src


def test_fast_exp_only_where_its_error_reaches_fp16_or_bf16_roundings_alone():
    def fast_exps(fn, dtype, shape=(300, 64)):
        body = _row_source(fn, [shape], dtype)
        return body.count("ca_exp_fast(e"), body.count("expf(e")
    # fp16/bf16 softmaxes: the exp reaches the output through the row sum and a product only.
    assert fast_exps(lambda m, x: torch.softmax(x, 1), torch.float16, (8, 40, 24)) == (2, 0)
    assert fast_exps(lambda m, x: torch.softmax(x, -1), torch.bfloat16) == (2, 0)
    # fp32 results, a log of the sum (log-softmax: an absolute error) and an exp that is also added
    # keep the precise expf.
    assert fast_exps(lambda m, x: torch.softmax(x, -1), torch.float32)[0] == 0
    assert fast_exps(lambda m, x: torch.log_softmax(x, -1), torch.bfloat16)[0] == 0
    assert fast_exps(lambda m, x: torch.softmax(x.float(), -1) + x.float(), torch.float16)[0] == 0
    assert fast_exps(lambda m, x: torch.softmax(x.float(), -1), torch.float16)[0] == 0   # fp32 output


# ---- NVRTC ------------------------------------------------------------------------------------------

@needs_nvrtc
def test_example_programs_compile_for_sm80_and_sm90(tmp_path):
    cache = CompileCache(tmp_path / "cache")
    jobs = []
    for name in EXAMPLES:
        gen = _generated(name)
        jobs += [(name, gen.spec.default(), arch) for arch in ("sm_80", "sm_90")]
        # The row group's shared-memory cache (dynamic shared memory), else a sampled schedule.
        prefix = "G0_" if len(gen.groups) > 1 else ""
        shared = {**gen.spec.default(), prefix + "CACHE": 2, prefix + "ITEMS": 1}
        extra = [shared] if prefix + "CACHE" in gen.program.tunables and gen.spec.legal(shared) else \
            gen.spec.sample(random.Random(name), 1)
        jobs += [(name, s, "sm_90") for s in extra]

    def build(job):
        name, schedule, arch = job
        program = _generated(name).program.with_schedule(schedule)
        return job, compile_cuda(program.source, arch=arch, options=program.compile_options(), cache=cache)

    with ThreadPoolExecutor(2) as pool:
        for (name, schedule, arch), result in pool.map(build, jobs):
            assert result.ok, f"{name} {schedule} {arch}:\n{result.error_summary()}"


# ---- small versions of the tasks and synthetic row groups ------------------------------------------------

def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, scale: float = 1.0, shift: float = 0.0, seed: int = 0,
           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.randn(shape, generator=_gen(seed)) * scale + shift).to(dtype)


def _targets(rows: int, classes: int) -> torch.Tensor:
    """Class indices, every seventh ignored (-100, PyTorch's default ignore_index)."""
    t = torch.randint(0, classes, (rows,), generator=_gen(11))
    t[::7] = -100
    return t


def _kdim_targets(shape: tuple[int, ...], classes: int) -> torch.Tensor:
    t = torch.randint(0, classes, shape, generator=_gen(12))
    t.view(-1)[::7] = -100
    return t


def _task_model(name: str, *init: Any) -> torch.nn.Module:
    """The task's Model built with other init arguments (smaller rows)."""
    namespace: dict[str, Any] = {}
    exec(compile(_task(name).source, str(TASKS / f"{name}.py"), "exec"), namespace)
    torch.manual_seed(0)
    return namespace["Model"](*init)


class Fn(torch.nn.Module):
    def __init__(self, fn: Callable, **params: torch.Tensor):
        super().__init__()
        self.fn = fn
        for k, v in params.items():
            self.register_buffer(k, v)

    def forward(self, *xs):
        return self.fn(self, *xs)


def _logsumexp_input() -> torch.Tensor:
    x = _randn(7, 300, scale=30.0, seed=3)
    x[1, :] = float("-inf")             # an all -inf row: PyTorch's max shift keeps it -inf
    x[2, 50] = float("inf")
    x[3, 120] = float("nan")
    return x


def _stats_and_norm(m, x):
    """Per-row outputs beside the normalised rows: mean, an unbiased std, a clamped norm."""
    mu = x.mean(-1, keepdim=True)
    sd = x.std(-1, keepdim=True)
    y = (x - mu) / (sd + 1e-5) * m.w + m.b
    return y, mu.squeeze(-1), sd, torch.linalg.vector_norm(x, dim=-1).clamp(min=1.0)


def _strided_stats(m, x):
    """Statistics over dim 1 of [N, C, W] (strided rows), a weight along the rows' elements (C) and
    one per row (W), per-row outputs."""
    mu = x.mean(1, keepdim=True)
    sd = x.var(1, keepdim=True, correction=1).sqrt()
    return (x - mu) / (sd + 1e-3) * m.w + m.b, mu, x.amax(1)


def _softmax_by_hand(m, x):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True) * m.w


def _large_then_small(shape: tuple[int, ...], dim: int) -> torch.Tensor:
    """0.06 everywhere and 2^20 first along dim: 0.06 is under half of 2^20's fp32 ulp (0.125), so an
    fp32 sum that holds the 2^20 drops every 0.06 added to it."""
    x = torch.full(shape, 0.06)
    x.narrow(dim, 0, 1).fill_(2.0 ** 20)
    return x


def _hoisted_factors(m, x, y):
    weighted = ((x / x.norm(dim=-1, keepdim=True)) * y * m.w / m.r).sum(-1)
    return weighted + (x * x.amax(-1, keepdim=True)).mean(-1)


# name -> (module, inputs, input names)
CASES: dict[str, tuple[torch.nn.Module, list[torch.Tensor], list[str]]] = {
    "layernorm": (_task_model("norm_layernorm", 1000), [_randn(3, 1000, scale=2.0, shift=0.5)], ["x"]),
    "rmsnorm_bf16": (_task_model("norm_rmsnorm_bf16", 512, 1e-6),
                     [_randn(5, 512, dtype=torch.bfloat16)], ["x"]),
    "groupnorm_odd": (_task_model("norm_groupnorm", 4, 12), [_randn(3, 12, 5, 7, seed=1)], ["x"]),
    "groupnorm": (_task_model("norm_groupnorm", 32, 256), [_randn(2, 256, 4, 4, seed=2)], ["x"]),
    "instancenorm": (_task_model("norm_instancenorm2d", 6), [_randn(3, 6, 5, 8, scale=2.0, shift=-1.0)], ["x"]),
    "fused_add_layernorm": (_task_model("fused_add_layernorm", 256), [_randn(6, 256), _randn(6, 256, seed=1)],
                            ["x", "residual"]),
    "cosine": (_task_model("loss_cosine_similarity"), [_randn(9, 130), _randn(9, 130, seed=1)], ["a", "b"]),
    "logsumexp": (_task_model("red_logsumexp_dim1"), [_logsumexp_input()], ["x"]),
    # Factors constant along the row (a norm, a max, a per-row weight) leave the sums: one pass.
    "hoisted_factors": (Fn(_hoisted_factors, w=_randn(130, seed=14), r=_randn(9, 1, seed=15).abs() + 0.5),
                        [_randn(9, 130), _randn(9, 130, seed=1)], ["x", "y"]),
    "triplet": (_task_model("loss_triplet_margin", 1.0), [_randn(9, 70), _randn(9, 70, seed=1),
                                                         _randn(9, 70, seed=2)], ["anchor", "positive", "negative"]),
    "stats_and_norm": (Fn(_stats_and_norm, w=_randn(64, seed=4), b=_randn(64, seed=5)),
                       [_randn(5, 3, 64, scale=3.0, shift=100.0, seed=6)], ["x"]),
    "layernorm_fp16": (torch.nn.LayerNorm(192).half(), [_randn(4, 192, dtype=torch.float16)], ["x"]),
    "softmax_by_hand": (Fn(_softmax_by_hand, w=_randn(2000, seed=7)), [_randn(3, 2000, scale=4.0)], ["x"]),
    "kl_div": (_task_model("loss_kl_div"), [_randn(9, 100, scale=3.0), _randn(9, 100, seed=1)],
               ["pred_logits", "target_logits"]),
    # Probabilities as the target: xlogy(t, t), whose decomposition has isnan.
    "kl_div_probs": (Fn(lambda m, x, y: F.kl_div(F.log_softmax(x, -1), F.softmax(y, -1), reduction="batchmean")),
                     [_randn(9, 100, scale=3.0), _randn(9, 100, seed=1)], ["x", "y"]),
    "softmax_dim1_fp16": (_task_model("softmax_dim1_fp16"), [_randn(3, 40, 24, scale=3.0, dtype=torch.float16)],
                          ["x"]),
    "softmax_last": (_task_model("softmax_lastdim"), [_randn(5, 300, scale=4.0)], ["x"]),
    "log_softmax_last_bf16": (Fn(lambda m, x: torch.log_softmax(x, -1)), [_randn(4, 3, 260, scale=4.0,
                                                                                  dtype=torch.bfloat16)], ["x"]),
    "softmax_scaled": (Fn(lambda m, x: torch.softmax(x, -1) * 2.0 - 0.5), [_randn(6, 129, scale=3.0)], ["x"]),
    # gather picks one element per row (the target class): a masked row sum in the row group.
    "cross_entropy": (_task_model("loss_cross_entropy"), [_randn(300, 70, scale=3.0), _targets(300, 70)],
                      ["logits", "targets"]),
    "nll_per_row": (Fn(lambda m, x, t: F.nll_loss(x, t, reduction="none")), [_randn(280, 33), _targets(280, 33)],
                    ["x", "targets"]),
    # Class weights: two picks per row (the weighted value and the weight, for the weighted mean).
    "nll_weighted": (Fn(lambda m, x, t: F.nll_loss(x, t, weight=m.w), w=_randn(40, seed=12).abs() + 0.1),
                     [_randn(300, 40), _targets(300, 40)], ["x", "targets"]),
    "cross_entropy_sum_bf16": (Fn(lambda m, x, t: F.cross_entropy(x, t, reduction="sum")),
                               [_randn(270, 50, scale=3.0, dtype=torch.bfloat16), _targets(270, 50)],
                               ["x", "targets"]),
    # A batch of one row: a row group of a single row (a short one; a long one is split).
    "cross_entropy_one_row": (Fn(lambda m, x, t: F.cross_entropy(x, t)), [_randn(1, 70, scale=3.0), torch.tensor([13])],
                              ["x", "targets"]),
    "log_softmax_one_row_fp16": (Fn(lambda m, x: torch.log_softmax(x, -1)),
                                 [_randn(1, 300, scale=4.0, dtype=torch.float16)], ["x"]),
    # Picks along a middle dim (strided rows): K-dim cross-entropy, a gather of one row per column.
    "cross_entropy_kdim": (Fn(lambda m, x, t: F.cross_entropy(x, t)),
                           [_randn(6, 40, 30, scale=3.0), _kdim_targets((6, 30), 40)], ["x", "targets"]),
    "gather_cols": (Fn(lambda m, x, i: torch.gather(x, 0, i) * 2.0),
                    [_randn(64, 300), torch.randint(0, 64, (1, 300), generator=_gen(13))], ["x", "i"]),
    "strided_stats": (Fn(_strided_stats, w=_randn(16, 1, seed=8), b=_randn(1, 40, seed=9)),
                      [_randn(4, 16, 40, scale=2.0, shift=50.0, seed=10)], ["x"]),
    # A large element, then elements under half its fp32 ulp: test_fp32_partials_stay_within_their_bound.
    "partial_rows": (Fn(lambda m, x: x / x.sum(-1, keepdim=True)), [_large_then_small((3, 2048), -1)], ["x"]),
    "partial_cols": (Fn(lambda m, x: x / x.sum(1, keepdim=True)), [_large_then_small((2, 1024, 8), 1)], ["x"]),
}


@lru_cache(maxsize=None)
def _case_gen(name: str) -> GeneratedProgram:
    """The case generated as generate() does: captured on meta tensors."""
    module, inputs, names = CASES[name]
    meta = copy.deepcopy(module).to("meta")
    graph = capture_module(meta, [t.to("meta") for t in inputs], name, names)
    return generate_from_graph(graph)


def _tensors(name: str) -> dict[str, torch.Tensor]:
    module, inputs, names = CASES[name]
    return {**dict(zip(names, inputs)), **module.state_dict()}


def _expected(name: str) -> list[torch.Tensor]:
    module, inputs, _ = CASES[name]
    with torch.no_grad():
        out = module(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _tolerance(t: torch.Tensor) -> float:
    return 1e-2 if t.dtype in (torch.float16, torch.bfloat16) else 1e-4


def test_every_case_forms_a_row_group_and_its_partition_reproduces_the_model():
    for name in CASES:
        gen = _case_gen(name)
        assert gen.groups[0].family == "rownorm", (name, gen.family)
        part = partition(canonicalize(gen.graph, rows=True), rows=True)
        assert [g.family for g in part.groups] == [g.family for g in gen.groups]
        got = run_partition(part, _tensors(name))
        for g, e in zip(got, _expected(name)):
            assert g.shape == e.shape and g.dtype == e.dtype, name
            torch.testing.assert_close(g, e, atol=_tolerance(e), rtol=_tolerance(e), equal_nan=True,
                                       msg=lambda m: f"{name}: {m}")


def test_the_instance_norm_space_is_split_for_its_per_channel_weights():
    group = _case_gen("instancenorm").groups[0]
    reads = {r.base: r.shape for r in group.reads}
    # [1, N*C, H, W] statistics; the weight repeated N times: the row space splits N*C into N, C.
    assert reads["x"] == (1, 3, 6, 5, 8) and reads["norm.weight"] == (1, 1, 6, 1, 1)


# ---- the CPU runs of the generated CUDA -------------------------------------------------------------

DYNAMIC_SMEM_BYTES = 228 * 1024
EMULATED_SMEM = f"""
static inline float rsqrtf(float x) {{ return 1.0f / sqrtf(x); }}
static inline double rsqrt(double x) {{ return 1.0 / sqrt(x); }}
// Dynamic shared memory: one static buffer (blocks run one at a time).
alignas(16) static unsigned char ca_dynamic_smem[{DYNAMIC_SMEM_BYTES}];
#define CA_DYNAMIC_SMEM(name) unsigned char* const name = ca_dynamic_smem
"""
TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                "bfloat16": torch.bfloat16, "int64": torch.int64, "bool": torch.bool}


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    return torch.empty(shape, dtype=TORCH_DTYPES[dtype], device="meta").nbytes


def _run_code(index: int, program: KernelProgram, plan, inputs: dict[str, torch.Tensor], misaligned: bool) -> str:
    """Namespace s<index>: the program at one schedule (its knobs as macros) and run(), which launches
    the plan's kernels on the inputs and writes the outputs."""
    defines = "".join(f"#define {k} {v}\n" for k, v in program.schedule.items())
    undefs = "".join(f"#undef {k}\n" for k in program.schedule)
    # Several schedules share one executable: no C linkage, so each namespace has its own kernels.
    source = program.source.replace('extern "C" ', "")
    lines = [f"namespace s{index} {{", defines + source, "int run() {"]
    # A merged program's kernels sit in namespaces ca_g0, ca_g1, ...
    lines += [f"    using namespace {ns};" for ns in sorted(set(re.findall(r"namespace (ca_g\d+) \{", source)))]
    for i, (name, t) in enumerate(inputs.items()):
        var = f"in{i}"
        lines.append(f'    unsigned char* {var} = ca_read("in{i}.bin");')
        if misaligned:      # one element off: the kernels must take their scalar paths
            lines += [f"    {{ unsigned char* m = ca_alloc({t.nbytes + t.element_size()}, 0);",
                      f"      memcpy(m + {t.element_size()}, {var}, {t.nbytes}); {var} = m + {t.element_size()}; }}"]
    names = {name: f"in{i}" for i, name in enumerate(inputs)}
    for buf in plan.buffers:
        names[buf.name] = f"b{len(names)}"
        # Garbage, not zeros: a kernel must not rely on fresh buffers being cleared.
        fill = 0 if buf.zeroed else 0xA5     # a zeroed buffer holds zeros when the run starts
        lines.append(f"    unsigned char* {names[buf.name]} = ca_alloc({_nbytes(buf.shape, buf.dtype)}, {fill});")
    for launch in plan.launches:
        assert launch.shared_bytes <= DYNAMIC_SMEM_BYTES
        assert all(isinstance(a, TensorArg) for a in launch.args)
        lines.append("    " + emulated_launch(launch, names))
    for i, name in enumerate(plan.outputs):
        buf = next(b for b in plan.buffers if b.name == name)
        lines.append(f'    ca_write("out{index}_{i}.bin", {names[name]}, {_nbytes(buf.shape, buf.dtype)});')
    lines += ["    return 0;", "}", undefs + f"}}  // namespace s{index}"]
    return "\n".join(lines)


def emulate(name: str, runs: list[tuple[dict, bool]]) -> list[list[torch.Tensor]]:
    """Run the case's whole generated program at each (schedule, misaligned inputs) on the CPU (one
    executable for all of them); the outputs of each run."""
    gen = _case_gen(name)
    tensors = _tensors(name)
    inputs = {v.name: tensors[v.name].contiguous() for v in gen.graph.inputs}
    env = {n: TensorInfo(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in inputs.items()}
    programs = [gen.program.with_schedule(schedule) for schedule, _ in runs]
    plans = [program.resolve(env) for program in programs]
    code = [EMULATION, EMULATED_SMEM]
    code += [_run_code(k, program, plan, inputs, misaligned)
             for k, (program, plan, (_, misaligned)) in enumerate(zip(programs, plans, runs))]
    code += ["int main(int argc, char** argv) {", "    switch (atoi(argv[1])) {"]
    code += [f"    case {k}: return s{k}::run();" for k in range(len(runs))]
    code += ["    }", "    return 1;", "}"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for i, t in enumerate(inputs.values()):
            (work / f"in{i}.bin").write_bytes(t.view(-1).view(torch.uint8).numpy().tobytes())
        (work / "main.cpp").write_text("\n".join(code))
        build = subprocess.run([GXX, "-std=c++17", "-O1", "-w", "-pthread", *SANITIZE, "main.cpp", "-o", "main"],
                               cwd=work, capture_output=True, text=True, timeout=300)
        assert build.returncode == 0, f"{name}: g++ failed:\n{build.stderr[:4000]}"
        outs = []
        for k, ((schedule, _), plan) in enumerate(zip(runs, plans)):
            run = subprocess.run(["./main", str(k)], cwd=work, capture_output=True, text=True, timeout=240,
                                 env={**os.environ, "ASAN_OPTIONS": "detect_leaks=0"})
            assert run.returncode == 0, f"{name} {schedule}: the emulated kernels failed:\n{run.stderr[:2000]}"
            got = []
            for i, oname in enumerate(plan.outputs):
                buf = next(b for b in plan.buffers if b.name == oname)
                data = bytearray((work / f"out{k}_{i}.bin").read_bytes())
                got.append(torch.frombuffer(data, dtype=TORCH_DTYPES[buf.dtype]).reshape(buf.shape).clone())
            outs.append(got)
        return outs


# (case, overrides of the row group's knobs, misaligned inputs). Every case also runs at its default.
EMULATED = [
    ("layernorm", {"CACHE": 2, "ROW_MODE": 0, "BLOCK": 128, "VEC": 4, "ITEMS": 1}, False),  # shared memory, 2 tiles
    ("layernorm", {"CACHE": 1, "ROW_MODE": 0, "BLOCK": 64, "VEC": 2, "ITEMS": 4}, True),    # re-read, scalar path
    ("layernorm", {"CACHE": 0, "BLOCK": 64, "ROW_MODE": 1, "VEC": 4, "ITEMS": 8}, False),  # a warp per row
    ("rmsnorm_bf16", {"CACHE": 2, "ROW_MODE": 1, "BLOCK": 64, "VEC": 8, "ITEMS": 1}, True),
    ("groupnorm_odd", {"ROW_MODE": 0, "BLOCK": 64, "ITEMS": 2}, False),
    ("groupnorm", {"CACHE": 1, "ROW_MODE": 0, "BLOCK": 32, "VEC": 2, "ITEMS": 2}, True),
    ("instancenorm", {"CACHE": 2, "ROW_MODE": 0, "BLOCK": 32, "ITEMS": 1}, False),
    ("fused_add_layernorm", {"CACHE": 2, "ROW_MODE": 0, "BLOCK": 64, "VEC": 2, "ITEMS": 1}, False),
    ("cosine", {"ROW_MODE": 0, "BLOCK": 64, "VEC": 1, "ITEMS": 2}, False),
    ("hoisted_factors", {"ROW_MODE": 1, "BLOCK": 128, "VEC": 2, "ITEMS": 1}, True),
    ("logsumexp", {"CACHE": 2, "ROW_MODE": 0, "BLOCK": 64, "VEC": 4, "ITEMS": 1}, True),
    ("triplet", {"ROW_MODE": 0, "BLOCK": 32, "VEC": 2, "ITEMS": 1}, True),
    ("stats_and_norm", {"CACHE": 1, "ROW_MODE": 0, "BLOCK": 32, "VEC": 4, "ITEMS": 1}, False),
    ("layernorm_fp16", {"CACHE": 0, "ROW_MODE": 0, "BLOCK": 32, "VEC": 8, "ITEMS": 1}, True),
    ("softmax_by_hand", {"CACHE": 0, "ROW_MODE": 0, "BLOCK": 256, "VEC": 4, "ITEMS": 2}, False),
    ("kl_div", {"CACHE": 2, "ROW_MODE": 0, "BLOCK": 32, "VEC": 2, "ITEMS": 2}, True),   # three phases
    ("softmax_last", {"CACHE": 2, "ROW_MODE": 0, "BLOCK": 64, "VEC": 4, "ITEMS": 1}, True),
    ("softmax_last", {"CACHE": 1, "ROW_MODE": 1, "BLOCK": 64, "VEC": 2, "ITEMS": 2}, False),   # a warp per row
    ("log_softmax_last_bf16", {"CACHE": 2, "ROW_MODE": 0, "BLOCK": 32, "VEC": 4, "ITEMS": 2}, False),
    ("softmax_scaled", {"CACHE": 1, "ROW_MODE": 0, "BLOCK": 32, "VEC": 1, "ITEMS": 4}, True),
    ("cross_entropy", {"CACHE": 2, "ROW_MODE": 0, "BLOCK": 32, "VEC": 2, "ITEMS": 1}, True),
    ("cross_entropy", {"CACHE": 1, "ROW_MODE": 1, "BLOCK": 64, "VEC": 1, "ITEMS": 2}, False),
    ("nll_per_row", {"ROW_MODE": 0, "BLOCK": 32, "VEC": 1, "ITEMS": 1}, True),
    # Strided rows: COLW threads side by side, BLOCK / COLW along each row.
    ("softmax_dim1_fp16", {"CACHE": 2, "BLOCK": 64, "COLW": 8, "VEC": 2, "ITEMS": 2}, True),
    ("softmax_dim1_fp16", {"CACHE": 1, "BLOCK": 128, "COLW": 4, "VEC": 4, "ITEMS": 1}, False),
    ("cross_entropy_kdim", {"CACHE": 2, "BLOCK": 64, "COLW": 8, "VEC": 2, "ITEMS": 1}, True),
    ("gather_cols", {"BLOCK": 128, "COLW": 32, "VEC": 4, "ITEMS": 1}, False),
    ("strided_stats", {"CACHE": 0, "BLOCK": 64, "COLW": 4, "VEC": 2, "ITEMS": 1}, False),
    ("strided_stats", {"CACHE": 2, "BLOCK": 32, "COLW": 32, "VEC": 1, "ITEMS": 4}, True),
]


def _schedule(name: str, overrides: dict) -> dict:
    gen = _case_gen(name)
    prefix = "G0_" if len(gen.groups) > 1 else ""
    schedule = {**gen.spec.default(), **{prefix + k: v for k, v in overrides.items()}}
    assert gen.spec.legal(schedule), f"{name} {schedule}: {gen.spec.why_illegal(schedule)}"
    return schedule


@needs_gxx
def test_generated_cuda_runs_correctly_on_the_cpu():
    runs: dict[str, list[tuple[dict, bool]]] = {name: [(_case_gen(name).spec.default(), False)] for name in CASES}
    for name, overrides, misaligned in EMULATED:
        runs[name].append((_schedule(name, overrides), misaligned))
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda name: (name, emulate(name, runs[name])), list(runs)))
    for name, outs in results:
        expected = _expected(name)
        for (schedule, misaligned), got in zip(runs[name], outs):
            assert len(got) == len(expected)
            for g, want in zip(got, expected):
                assert g.dtype == want.dtype and g.shape == want.shape, (name, schedule)
                tol = _tolerance(want)
                torch.testing.assert_close(g, want, atol=tol, rtol=tol, equal_nan=True,
                                           msg=lambda m: f"{name} {schedule} (misaligned={misaligned}): {m}")


@needs_gxx
@pytest.mark.parametrize("name,dim,overrides", [
    ("partial_rows", -1, [{"CACHE": 1, "ROW_MODE": 0, "BLOCK": 32, "VEC": 4, "ITEMS": 4},    # 2048 / 32 threads:
                          {"CACHE": 1, "ROW_MODE": 1, "BLOCK": 32, "VEC": 1, "ITEMS": 16}]),  # 64 elements each
    ("partial_cols", 1, [{"CACHE": 1, "BLOCK": 32, "COLW": 4, "VEC": 2, "ITEMS": 16}]),   # 8 threads a row: 128 each
])
def test_fp32_partials_stay_within_their_bound(name, dim, overrides):
    """A thread sums at most PART_ELEMENTS elements in fp32 before its double accumulator: the
    row's sum is off by at most that many fp32 roundings of its magnitudes, so each output x / sum
    is within that (relative to the sum) and two roundings. One fp32 sum over a thread's share would
    drop every 0.06 after the 2^20, an error of 7e-6 where the bound is 7e-7."""
    x = CASES[name][1][0].double()
    total = x.sum(dim, keepdim=True)
    exact = x / total
    bound = PART_ELEMENTS * 2.0 ** -24 * x.abs().sum(dim, keepdim=True) / total.abs() + 2 * 2.0 ** -24
    runs = [(_case_gen(name).spec.default(), False)] + [(_schedule(name, o), False) for o in overrides]
    for (schedule, _), (got,) in zip(runs, emulate(name, runs)):
        rel = (got.double() - exact).abs() / exact.abs()
        assert (rel <= bound).all(), f"{name} at {schedule}: relative error {rel.max():.3g} over {bound.min():.3g}"


# ---- canonical rewrites, constraints, refusals ------------------------------------------------------

def _meta_graph(module: torch.nn.Module, shapes: list[tuple[int, ...]], name: str = "g") -> Graph:
    inputs = [torch.empty(s, device="meta") for s in shapes]
    return capture_module(module.to("meta"), inputs, name, [f"x{i}" for i in range(len(inputs))])


def test_softmaxes_split_into_row_groups_when_their_rows_fit():
    lone = _meta_graph(Fn(lambda m, x: torch.softmax(x, -1)), [(300, 64)])
    assert canonicalize(lone).ops() == ["_softmax.default"]
    assert canonicalize(lone, rows=True).ops()[0] == "amax.default"    # max, sum and output: one row group
    assert generate_from_graph(lone).family == "rownorm"
    scaled = _meta_graph(Fn(lambda m, x: torch.softmax(x, -1) * 2.0), [(300, 64)])
    gen = generate_from_graph(scaled)
    assert gen.family == "rownorm" and len(gen.program.kernel_names()) == 1
    # A few long rows do not fill the GPU with a block per row: the row family keeps them.
    few_long = _meta_graph(Fn(lambda m, x: torch.log_softmax(x, -1)), [(4, 65536)])
    assert canonicalize(few_long, rows=True).ops() == ["_log_softmax.default"]
    assert generate_from_graph(few_long).family == "rowreduce"
    summed = _meta_graph(Fn(lambda m, x: (torch.log_softmax(x, -1) * x).sum()), [(300, 64)])
    gen = generate_from_graph(summed)
    assert gen.family == "rownorm+reduce" and len(gen.groups[0].anchors) == 3
    # A total over values with no row statistics stays one reduction.
    mse = _meta_graph(Fn(lambda m, x, y: ((x - y) ** 2).mean()), [(300, 64), (300, 64)])
    assert generate_from_graph(mse).family == "reduce"


def test_gathers_other_than_one_pick_per_row_are_general_gathers():
    # Several picks per row, and a pick per column of a single long column: no row group takes
    # them, so the data-movement family copies them (a gather step reading the index per element).
    for fn, shapes, idx in ((lambda m, x, i: torch.gather(x, 1, i), [(64, 300)], (64, 5)),
                            (lambda m, x, i: torch.gather(x, 0, i), [(100000, 1)], (1, 1))):
        graph = capture_module(Fn(fn).to("meta"), [torch.empty(shapes[0], device="meta"),
                                                   torch.empty(idx, dtype=torch.int64, device="meta")], "g", ["x", "i"])
        assert canonicalize(graph, rows=True).nodes[0].attrs["tree"]["op"] == "gather"
        assert generate_from_graph(graph).family == "move"


def test_constraints_mask_what_the_kernel_cannot_do():
    spec = _generated("norm_layernorm").spec
    default = spec.default()
    assert default == {"BLOCK": 256, "ROW_MODE": 0, "VEC": 4, "ITEMS": 4, "CACHE": 0}
    assert "hold 1024 of its 4096" in spec.why_illegal({**default, "ITEMS": 1})
    assert "VEC=8 is not one of" in spec.why_illegal({**default, "VEC": 8})     # 32-byte fp32 vectors
    assert "registers per thread" in spec.why_illegal({**default, "BLOCK": 64, "ITEMS": 16, "VEC": 4})
    assert "at most 16 at BLOCK=1024" in spec.why_illegal({**default, "BLOCK": 1024, "ITEMS": 8, "VEC": 4})
    assert spec.legal({**default, "CACHE": 2, "ITEMS": 1}) and spec.legal({**default, "CACHE": 1, "ITEMS": 2})
    assert "more than the 4 vectors" in spec.why_illegal({**default, "CACHE": 1, "ITEMS": 16})
    odd = _case_gen("groupnorm_odd").spec                    # rows of 105: only scalar accesses
    assert "does not divide" in odd.why_illegal({**odd.default(), "VEC": 2})
    assert all(s["VEC"] == 1 for s in odd.enumerate())
    for gen in (_generated("norm_groupnorm"), _generated("norm_instancenorm2d")):
        env = env_from_task(_task(gen.graph.task))
        for schedule in gen.spec.sample(random.Random(0), 20):
            plan = gen.program.with_schedule(schedule).resolve(env, LaunchLimits(max_shared_bytes=227 * 1024))
            assert all(launch.shared_bytes <= rn.MAX_SMEM_BYTES for launch in plan.launches)


def test_rows_too_long_for_any_cache_fall_back_to_the_split_path(monkeypatch):
    graph = _meta_graph(torch.nn.LayerNorm(131072), [(300, 131072)], "huge_rows")
    gen = generate_from_graph(graph)
    assert gen.family == "reduce+pointwise"
    assert any("rownorm family refused the row group of 'var_mean'" in n for n in gen.notes)
    plain = partition(canonicalize(graph))
    assert [g.family for g in plain.groups] == [g.family for g in gen.groups]

    # A refusal for any other reason (here: every row group) takes the same way back.
    monkeypatch.setattr(rn, "MAX_REREAD_ROW_BYTES", 0)
    gen = _case_gen.__wrapped__("kl_div")
    assert gen.family == "rowreduce+rowreduce+reduce"


def test_clear_errors_for_groups_the_family_cannot_lower():
    with pytest.raises(CodegenError, match="Task 't': the row-normalise family needs at least one reduction"):
        rn.lower_rownorm(Graph("t", [], [], [], {}), "k")
    two = _meta_graph(Fn(lambda m, x: x - x.mean(0, keepdim=True) * x.mean(1, keepdim=True)), [(300, 64)], "t")
    with pytest.raises(CodegenError, match="'mean' and 'mean_1' do not reduce the same rows"):
        rn.lower_rownorm(two, "k")
    arg = _meta_graph(Fn(lambda m, x: x.argmax(-1)), [(300, 64)], "t")
    with pytest.raises(CodegenError, match="does not take the reductions argmax.default"):
        rn.lower_rownorm(arg, "k")
