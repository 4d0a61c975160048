"""The generators' synthetic cases on the GPU: the CPU tests build their element code on the host
and compile them with NVRTC; this runs them on the H200, checked by the evaluator against PyTorch,
at the default schedule and a random sample of legal ones. Covers what no example task exercises:
every activation at once, broadcasting with `where`, type promotion, bf16 math, inverse and hyperbolic
trig, atan2/hypot/copysign, float and integer modulo, pow with a tensor exponent or a scalar base, fmax/fmin,
erfinv/lgamma/erfcx/i0, signbit and bitwise ops, tensor clamp bounds, fp16/bf16 row reductions,
row groups of a single row (cross-entropy and log-softmax over a batch of one), and the data-movement
family's cases (tests/test_codegen_move.py: cat, slices, chunk, unbind, pads, transposes, flips,
roll, KernelBench's exclusive cumsum, gather), alone and next to pointwise and scan kernels, and the
ops code generation took on 2026-12-06 (tests/test_codegen_kernelbench_more.py: one-value tensors made
in forward, nn.Embedding, torch.gather, adaptive pools that divide, unfold, diagonal), cummax /
cummin, upsampling and the selection family (2026-12-07: against ATen's CUDA kernels, which the
CPU tests cannot see; the selections' indices compared exactly, ties included), and the thirty-first
session's operators (LATE_GPU)."""
from __future__ import annotations

import random

import pytest

from core.codegen import generate
from core.tasks import load_task_from_source
from tests.gpu.codegen_check import failures_at
from tests.test_codegen_cases import HEADER, SYNTHETIC
from tests.test_codegen_kernelbench_more import CASES as MORE
from tests.test_codegen_kernelbench_more import BILINEAR, MASK_PUTS, MORE_OPS, SPECIAL, UPSAMPLING
from tests.test_codegen_select import CASES as SELECTIONS
from tests.test_codegen_move import CASES as MOVES

pytestmark = pytest.mark.gpu

SAMPLED = 3

ONE_ROW = {
    "cross_entropy_one_row": HEADER + '''
class Model(nn.Module):
    def forward(self, x, t):
        return F.cross_entropy(x, t)

def get_inputs():
    return [3.0 * torch.randn(1, 1000), torch.tensor([417])]

def get_init_inputs():
    return []
''',
    "log_softmax_one_row_fp16": HEADER + '''
class Model(nn.Module):
    def forward(self, x):
        return torch.log_softmax(x, -1)

def get_inputs():
    return [(4.0 * torch.randn(1, 4000)).half()]

def get_init_inputs():
    return []
''',
}

def _running(body: str, inputs: str) -> str:
    return HEADER + f"""
class Model(nn.Module):
    def forward(self, x):
        {body}

def get_inputs():
    return [{inputs}]

def get_init_inputs():
    return []
"""


# cummax / cummin (the scan family, 2026-12-06): ties (relu's zeros, integers), NaN (sqrt of negatives:
# the index moves to the latest NaN), reversed, columns, fp16; indices compared exactly.
RUNNING = {
    "running_cummax_relu_ties": _running("v, i = torch.cummax(torch.relu(x), dim=1)\n        return v * 2.0, i",
                                         "torch.randn(256, 1000)"),
    "running_cummin_cols_fp16": _running("return torch.cummin(x, dim=0)", "torch.randn(512, 384).half()"),
    "running_cummax_reversed": _running("v, i = torch.cummax(x.flip(-1), dim=-1)\n        return v.flip(-1), i.flip(-1)",
                                        "torch.randn(64, 4096)"),
    "running_cummax_nan": _running("return torch.cummax(torch.sqrt(x), dim=1)", "torch.randn(128, 777)"),
    "running_cummin_int": _running("return torch.cummin(x, dim=1)", "torch.randint(-5, 5, (200, 300))"),
    "running_cummax_bool": _running("return torch.cummax(x > 1.5, dim=1)", "torch.randn(100, 500)"),
}

NEW_OPS = ["conv3d_gn_min_clamp", "scalar_tensors_on_device", "scalar_tensor_half", "embedding", "gather_dim1",
           "adaptive_avgpool3d", "adaptive_maxpool_indices", "adaptive_avgpool_3x3", "trace"]

# Larger than the CPU cases: interpolation weights near 0 and 1, rows past a warp, odd sizes (the
# adaptive average pools and rrelu ride along under the same names' dict).
UPSAMPLE_GPU = {name: source.replace("torch.randn(2, 3, 8, 10)", "torch.randn(4, 16, 37, 53)")
                .replace("torch.randn(1, 2, 4, 5, 6)", "torch.randn(2, 4, 9, 17, 23)")
                .replace("torch.randn(2, 3, 9)", "torch.randn(8, 16, 301)") for name, source in UPSAMPLING.items()}

# The selection cases as the CPU tests write them, and rows that use every knob: many short rows
# per block, long rows (stable order of fp16 ties over 4096; 16384 in dynamic shared memory past 48 KB),
# a strided dim.
SELECT_GPU = {f"select_{k}": v for k, v in SELECTIONS.items()}
SELECT_GPU.update({
    "select_topk_many_rows": _running("return torch.topk(x, 16, dim=-1)", "torch.randn(4096, 512)"),
    "select_sort_fp16_ties_long": _running("return torch.sort(x.half().round(), dim=-1)", "torch.randn(64, 4096)"),
    "select_argsort_strided": _running("return torch.argsort(x, dim=1, descending=True)", "torch.randn(8, 1000, 24)"),
    "select_median_rows": _running("return torch.median(x, dim=-1)", "torch.randn(2048, 129)"),
    "select_topk_rows_16384": _running("return torch.topk(x, 5, dim=-1)", "torch.randn(64, 16384)"),
    "select_sort_fp64_rows_12000": _running("return torch.sort(x.double(), dim=-1)", "torch.randn(8, 12000)"),
    # Rows longer than 16384: chunks sorted in shared memory, then merge passes in global memory.
    "select_sort_long_rows": _running("return torch.sort(x, dim=-1)", "torch.randn(16, 100000)"),
    "select_argsort_long_strided": _running("return torch.argsort(x, dim=0, descending=True)", "torch.randn(40000, 8)"),
    "select_topk_long_row": _running("return torch.topk(x, 50, dim=-1)", "torch.randn(4, 300000)"),
    "select_median_whole_1m": _running("return torch.median(x)", "torch.randn(1024, 1024)"),
    "select_kthvalue_long_int": _running("return torch.kthvalue(x, 1000, dim=1).values", "torch.randint(-500, 500, (4, 70000))"),
})



def _args(body: str, args: str, inputs: str) -> str:
    return HEADER + f"""
class Model(nn.Module):
    def forward(self, {args}):
        {body}

def get_inputs():
    return [{inputs}]

def get_init_inputs():
    return []
"""


# The scatter family (2026-12-07): sums by atomics, whose order changes from run to run, as ATen's.
SCATTER_GPU = {
    "scatter_index_add_rows": _args("return y.index_add(0, i, x)", "x, i, y",
                                    "torch.randn(65536, 64), torch.randint(0, 4096, (65536,)), torch.randn(4096, 64)"),
    "scatter_index_add_bf16": _args("return y.index_add(0, i, x)", "x, i, y",
                                    "torch.randn(8192, 128).bfloat16(), torch.randint(0, 512, (8192,)), "
                                    "torch.randn(512, 128).bfloat16()"),
    "scatter_add_rows": _args("return y.scatter_add(1, i, x)", "x, i, y",
                              "torch.randn(256, 4096), torch.randint(0, 1024, (256, 4096)), torch.randn(256, 1024)"),
    "scatter_reduce_amax_without_self": _args("return y.scatter_reduce(1, i, x, 'amax', include_self=False)", "x, i, y",
                                              "torch.randn(256, 4096), torch.randint(0, 1024, (256, 4096)), "
                                              "torch.randn(256, 1024)"),
    "scatter_reduce_mean": _args("return y.scatter_reduce(1, i, x, 'mean')", "x, i, y",
                                 "torch.randn(256, 4096), torch.randint(0, 1024, (256, 4096)), torch.randn(256, 1024)"),
    "scatter_index_assign": _args("y = y.clone()\n        y[i] = x\n        return y", "x, i, y",
                                  "torch.randn(1000, 256), torch.randperm(8192)[:1000], torch.randn(8192, 256)"),
    "scatter_one_hot": _args("return torch.zeros_like(x).scatter(1, t.unsqueeze(1), 1.0)", "x, t",
                             "torch.randn(4096, 1000), torch.randint(0, 1000, (4096,))"),
    "scatter_fold": _args("return F.fold(x, (64, 64), 3, padding=1)", "x", "torch.randn(8, 16 * 9, 64 * 64)"),
    "scatter_max_unpool2d": _args("v, i = F.max_pool2d(x, 2, return_indices=True)\n        return F.max_unpool2d(v, i, 2)",
                                  "x", "torch.randn(8, 32, 64, 64)"),
    "scatter_embedding_bag_mean": HEADER + """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(100000, 64, mode='mean')

    def forward(self, i, o):
        return self.bag(i, o)

def get_inputs():
    return [torch.randint(0, 100000, (65536,)), torch.arange(0, 65536, 32)]

def get_init_inputs():
    return []
""",
}

# Thirtieth session, after its GPU calls (CPU-checked only so far).
CAPTURED_GPU = {
    "captured_adaptive_maxpool_uneven": _args("return F.adaptive_max_pool2d(x, (7, 5), return_indices=True)", "x",
                                              "torch.randn(16, 64, 30, 29)"),
    "captured_pad_circular": _args("return F.pad(x, (3, 3, 3, 3), mode='circular')", "x", "torch.randn(16, 64, 64, 64)"),
    "captured_cov": _args("return torch.cov(x)", "x", "torch.randn(256, 4096)"),
    "captured_gaussian_nll": _args("return F.gaussian_nll_loss(x, y, v.abs() + 0.1)", "x, y, v",
                                   "torch.randn(4096, 256), torch.randn(4096, 256), torch.randn(4096, 1)"),
}

# Thirty-first session, after its GPU calls (CPU-checked only then): mask puts as wheres, nn.Bilinear,
# digamma / polygamma / zeta / nextafter / ldexp, slice_scatter, scatter reduce=, addmv / addbmm,
# shifts, diagonal_scatter, pdist; against ATen's CUDA kernels here.
LATE_GPU = {f"late_{k}": v for k, v in {**MASK_PUTS, **BILINEAR, **SPECIAL, **MORE_OPS}.items()}

SOURCES = {**LATE_GPU, **CAPTURED_GPU, **SCATTER_GPU, **SYNTHETIC, **ONE_ROW, **RUNNING, **UPSAMPLE_GPU, **SELECT_GPU, **{f"move_{k}": v for k, v in MOVES.items()}, **{f"new_{k}": MORE[k] for k in NEW_OPS}}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_synthetic_case_is_correct_on_the_gpu(name):
    task = load_task_from_source(SOURCES[name], name)
    gen = generate(task)
    schedules = [gen.spec.default()] + gen.spec.sample(random.Random(name), SAMPLED)
    failures = failures_at(task, gen, schedules)
    assert not failures, "\n".join(failures)
