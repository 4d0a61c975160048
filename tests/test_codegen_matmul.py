"""The matmul and conv families: what canonicalize makes of mm / bmm / addmm / linear / convolutions,
the schedule space, and the generated CUDA run on the CPU (the fuzz harness's thread-per-CUDA-thread emulation with
AddressSanitizer) against the task's Model, at the default schedule and random legal ones."""
from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest

from core.codegen import CodegenError, generate
from core.codegen.capture import capture
from core.codegen import lower_matmul
from core.codegen.lower_matmul import CONV, MATMUL, Product, schedule_spec, smem_bytes, threads
from core.codegen.partition import canonicalize
from core.codegen.schedule import Knob
from core.program import LaunchLimits
from core.search.space import env_from_task
from core.tasks import load_task, load_task_from_source
from core.toolchain import CompileCache, compile_cuda
from tests.test_codegen_fuzz import GXX, FuzzCase, report, run_fuzz
from tests.test_export import nvcc_setup  # noqa: F401  (a fixture)

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
TASKS = Path(__file__).resolve().parents[1] / "resources" / "tasks"
# Example tasks whose products the family now lowers (before: "no code generator lowers 'mm.default'").
EXAMPLE_TASKS = ["mm_square", "mm_batched", "mm_bf16_rect", "mm_fp16", "mm_odd_shapes", "mm_tall_skinny",
                 "mm_transposed_b", "fused_linear_gelu_scale", "fused_matmul_bias_residual_relu", "fused_swiglu_bf16",
                 "conv_1d", "conv_2d", "conv_3d", "conv_transpose2d", "fused_conv_bn_relu", "fused_conv_relu_maxpool"]
# Depthwise convolutions (groups = channels) go to the pooling family's window kernel instead.
DEPTHWISE = {"conv2d_depthwise"}


def _task(forward: str, inputs: str, init: str = "pass", args: str = "x, y") -> str:
    return HEADER + f'''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        {init}

    def forward(self, {args}):
        {forward}

def get_inputs():
    return {inputs}

def get_init_inputs():
    return []
'''


# Odd sizes everywhere: every tile has a tail in M, N and K.
CASES = {
    "linear_gelu_scale": _task("return F.gelu(self.fc(x)) * 2.0", "[torch.randn(17, 45)]",
                               "self.fc = nn.Linear(45, 33)", "x"),
    "linear3d_nobias": _task("return self.fc(x)", "[torch.randn(3, 7, 20)]",
                             "self.fc = nn.Linear(20, 12, bias=False)", "x"),
    "mm": _task("return torch.mm(x, y)", "[torch.randn(19, 37), torch.randn(37, 23)]"),
    "mm_transposed_a": _task("return x.T @ y", "[torch.randn(37, 19), torch.randn(37, 23)]"),
    "mm_transposed_b_relu": _task("return torch.relu(x @ y.t())", "[torch.randn(19, 37), torch.randn(23, 37)]"),
    "bmm": _task("return torch.bmm(x, y)", "[torch.randn(3, 13, 29), torch.randn(3, 29, 11)]"),
    "bmm_transposed": _task("return torch.bmm(x.transpose(1, 2), y.transpose(1, 2))",
                            "[torch.randn(2, 29, 13), torch.randn(2, 11, 29)]"),
    "addmm_alpha_beta": _task("return torch.addmm(b, x, y, beta=0.5, alpha=2.0)",
                              "[torch.randn(16, 21), torch.randn(21, 18), torch.randn(18)]", args="x, y, b"),
    "linear_fp16_residual": _task("return torch.relu(self.fc(x)) + x[:, :24]", "[torch.randn(40, 36).half()]",
                                  "self.fc = nn.Linear(36, 24).half()", "x"),
    "linear_bf16_sigmoid_scale": _task("return torch.sigmoid(self.fc(x)) * self.scale",
                                       "[torch.randn(9, 50).bfloat16()]",
                                       "self.fc = nn.Linear(50, 30).bfloat16()\n"
                                       "        self.scale = nn.Parameter(torch.randn(30).bfloat16())", "x"),
    "mm_fp64": _task("return x @ y - 1.0", "[torch.randn(11, 14).double(), torch.randn(14, 10).double()]"),
    "matmul_broadcast_batch": _task("return torch.matmul(x, y)", "[torch.randn(3, 16, 20), torch.randn(20, 9)]"),
    "mm_k1": _task("return x @ y", "[torch.randn(17, 1), torch.randn(1, 13)]"),
    # A transposed batch times one matrix: torch.matmul expands the matrix over the batch, which the
    # kernel reads once for all (batch stride 0) instead of a copy per batch.
    "batch_transposed_times_matrix": _task("return torch.matmul(x.transpose(-1, -2), y.t())",
                                           "[torch.randn(3, 29, 7), torch.randn(5, 29)]"),
    "linear_then_row_mean": _task("return self.fc(x).mean(dim=1)", "[torch.randn(12, 40)]",
                                  "self.fc = nn.Linear(40, 70)", "x"),
    "mm_larger_tiles": _task("return x @ y", "[torch.randn(130, 72), torch.randn(72, 140)]"),
    # Contiguous dims that are multiples of 4 (K of A, N of B): the SIMT kernel loads 16-byte chunks, and
    # K = 36 and N = 44 end in a partial slice and tile of whole chunks; then both operands transposed.
    "mm_chunked_tails": _task("return x @ y", "[torch.randn(33, 36), torch.randn(36, 44)]"),
    "mm_chunked_transposed": _task("return x.t() @ y.t()", "[torch.randn(36, 20), torch.randn(44, 36)]"),
    # fp16/bf16 with dims that are multiples of 8: MMA=1 stages 16-byte chunks (along k for A and a
    # transposed B, along the rows for a transposed A and a plain B); K and M have tails.
    "mm_fp16_chunks": _task("return x @ y", "[torch.randn(50, 72).half(), torch.randn(72, 40).half()]"),
    "bmm_bf16_transposed_chunks": _task("return torch.bmm(x.transpose(1, 2), y.transpose(1, 2)) + 1.0",
                                        "[torch.randn(2, 40, 24).bfloat16(), torch.randn(2, 32, 40).bfloat16()]"),
    # Convolutions, lowered as implicit products by the same kernel (the conv family).
    "conv2d_stride_pad_relu": _task("return torch.relu(self.c(x))", "[torch.randn(2, 3, 9, 10)]",
                                    "self.c = nn.Conv2d(3, 8, 3, stride=2, padding=1)", "x"),
    "conv1d_dilated_nobias": _task("return self.c(x)", "[torch.randn(2, 4, 20)]",
                                   "self.c = nn.Conv1d(4, 6, 5, dilation=2, bias=False)", "x"),
    # Depthwise: the pooling family's window kernel (24 x 20 planes: several legal schedules).
    "conv2d_depthwise": _task("return self.c(x) * 0.5", "[torch.randn(2, 8, 24, 20)]",
                              "self.c = nn.Conv2d(8, 8, 3, padding=1, groups=8)", "x"),
    "conv2d_groups_rect_kernel": _task("return self.c(x)", "[torch.randn(1, 6, 11, 8)]",
                                       "self.c = nn.Conv2d(6, 9, (3, 2), stride=(1, 2), padding=(2, 0), groups=3)", "x"),
    "conv3d": _task("return self.c(x)", "[torch.randn(1, 2, 5, 6, 7)]", "self.c = nn.Conv3d(2, 4, 3, padding=1)", "x"),
    "conv2d_fp16_then_maxpool": _task("return F.max_pool2d(torch.relu(self.c(x)), 2)", "[torch.randn(2, 4, 12, 12).half()]",
                                      "self.c = nn.Conv2d(4, 5, 3, padding=1).half()", "x"),
    # Transposed convolutions: output o takes input (o + padding - tap * dilation) / stride where it divides.
    "conv_transpose2d_stride_groups": _task("return torch.tanh(self.c(x))", "[torch.randn(2, 8, 5, 4)]",
                                            "self.c = nn.ConvTranspose2d(8, 6, (3, 2), stride=(2, 1), padding=(1, 0), "
                                            "output_padding=(1, 0), groups=2, dilation=(1, 2))", "x"),
    "conv_transpose1d_nobias": _task("return self.c(x)", "[torch.randn(2, 3, 7)]",
                                     "self.c = nn.ConvTranspose1d(3, 4, 4, stride=3, padding=2, bias=False)", "x"),
    # Phases whose first tap needs dilation's inverse modulo the stride (2 * 2 = 1 mod 3), and phases
    # no tap reaches (dilation and stride both 2): their outputs are the bias alone.
    "conv_transpose2d_dilated_phases": _task("return self.c(x)", "[torch.randn(2, 4, 4, 5)]",
                                             "self.c = nn.ConvTranspose2d(4, 3, 3, stride=(3, 2), padding=(1, 0), "
                                             "output_padding=(1, 1), dilation=2)", "x"),
    "conv_transpose3d_fp16": _task("return torch.relu(self.c(x))", "[torch.randn(1, 4, 3, 4, 3).half()]",
                                   "self.c = nn.ConvTranspose3d(4, 8, 3, stride=2, padding=1).half()", "x"),
    "conv2d_bn_eval": _task("return torch.relu(self.bn(self.c(x)))", "[torch.randn(2, 3, 8, 8)]",
                            "self.c = nn.Conv2d(3, 6, 3, bias=False)\n        self.bn = nn.BatchNorm2d(6).eval()", "x"),
}


def _generated(name: str):
    return generate(load_task_from_source(CASES[name], name))


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_case_has_a_product_group(name):
    gen = _generated(name)
    families = [g.family for g in gen.groups] if gen.groups else [gen.family]
    expected = "pool" if name in DEPTHWISE else "conv" if name.startswith("conv") else "matmul"
    assert expected in families, gen.notes


def _canonical(name: str):
    return canonicalize(capture(load_task_from_source(CASES[name], name)))


def test_linear_reads_its_weight_where_it_lies_and_fuses_bias_and_activation():
    canon = _canonical("linear_gelu_scale")
    (mm,) = [n for n in canon.nodes if n.op == MATMUL]
    assert [o.name for o in mm.operands] == ["x", "fc.weight"] and mm.attrs == {"trans_a": False, "trans_b": True}
    assert not any(n.op.startswith(("permute", "ca_move")) for n in canon.nodes)    # no transposed copy
    gen = _generated("linear_gelu_scale")
    assert gen.family == "matmul" and "epilogue: add.Tensor, gelu.default, mul.Tensor" in gen.notes


def test_transposes_fold_into_the_flags():
    (mm,) = [n for n in _canonical("bmm_transposed").nodes if n.op == MATMUL]
    assert mm.attrs == {"trans_a": True, "trans_b": True}
    (mm,) = [n for n in _canonical("mm_transposed_a").nodes if n.op == MATMUL]
    assert mm.attrs == {"trans_a": True, "trans_b": False}


def test_a_matrix_broadcast_over_the_batch_is_read_once_for_all():
    canon = _canonical("batch_transposed_times_matrix")
    (mm,) = [n for n in canon.nodes if n.op == MATMUL]
    assert [o.name for o in mm.operands] == ["x", "y"] and mm.attrs == {"trans_a": True, "trans_b": True}
    assert [n.op for n in canon.nodes if n.op != MATMUL] == ["view.default"]      # no copies before it
    assert "matmul: 3 x [7 x 29]ᵀ @ [29 x 5]ᵀ" in _generated("batch_transposed_times_matrix").notes[0]


def test_a_convolution_is_a_product_of_its_input_and_weight_with_the_bias_after_it():
    canon = _canonical("conv2d_stride_pad_relu")
    ops = [n.op for n in canon.nodes]
    assert ops == [CONV, "view.default", "add.Tensor", "relu.default"]
    gen = _generated("conv2d_stride_pad_relu")
    assert gen.family == "conv" and "as [50 x 27] @ [27 x 8]" in gen.notes[0], gen.notes
    # Groups are the batch of products: 3 groups of 2 -> 3 channels over 3x2 taps, 13x4 outputs.
    assert "as 3 x [52 x 12] @ [12 x 3]" in _generated("conv2d_groups_rect_kernel").notes[0]


def test_a_transposed_convolution_is_a_product_of_its_input_and_weight_too():
    canon = _canonical("conv_transpose2d_stride_groups")
    (conv,) = [n for n in canon.nodes if n.op == CONV]
    assert conv.attrs["transposed"] is True and conv.attrs["output_padding"] == [1, 0]
    gen = _generated("conv_transpose2d_stride_groups")
    # 2 groups of 4 -> 3 channels over 3x2 taps; output (5-1)*2 - 2 + 2 + 1 + 1 = 10 by (4-1) + 2 + 1 = 6.
    # Stride 2 along the height: 2 output phases per group, each 5 x 6 outputs of 2 x 2 taps (no
    # multiplication by the zeros between input rows: 16 of K, not 24).
    assert gen.family == "conv" and "transposed conv" in gen.notes[0] and "as 4 x [60 x 16] @ [16 x 3]" in gen.notes[0], \
        gen.notes
    assert "2 groups x 2 output phases" in gen.notes[0]


@pytest.mark.skipif(GXX is None, reason="no host C++ compiler")
def test_a_transposed_convolution_past_the_grid_limit_takes_every_tap(monkeypatch):
    # Groups x phases past the grid's z limit (here made 3: 2 groups x 2 phases): one product per group
    # over every tap, zeros where the stride does not divide, as correct as the split.
    monkeypatch.setattr(lower_matmul, "MAX_GRID_YZ", 3)
    gen = _generated("conv_transpose2d_stride_groups")
    assert "as 2 x [120 x 24] @ [24 x 3]" in gen.notes[0] and "not split" in gen.notes[0], gen.notes
    with tempfile.TemporaryDirectory() as tmp:
        outcomes = run_fuzz([FuzzCase("unsplit", "matmul", CASES["conv_transpose2d_stride_groups"])], 4, Path(tmp))
    assert not outcomes[0].failures and outcomes[0].runs >= 2, report(outcomes)


def test_addmm_scales_become_elementwise_ops_after_the_product():
    canon = _canonical("addmm_alpha_beta")
    ops = [(n.op, n.attrs) for n in canon.nodes]
    assert ops[0][0] == MATMUL
    assert ("mul.Tensor", {}) in ops and ("add.Tensor", {"alpha": 0.5}) in ops


def test_schedule_space_limits_threads_shared_memory_and_waste():
    spec = schedule_spec(Product(1, 4096, 4096, 4096, False, True, "float32"))
    # PREFETCH on for SIMT tiles at least 16 wide (faster on an H200), off for the narrow ones. Fragments
    # read from shared memory 4 at a time (SVEC), the rows padded by 4 to keep the reads aligned. An 8 x 8
    # thread tile of 256 threads held to two blocks an SM (OCC), a smaller one not.
    assert spec.default() == {"BM": 128, "BN": 128, "BK": 8, "TM": 8, "TN": 8, "PREFETCH": 1, "GROUP_M": 1, "SVEC": 4,
                              "OCC": 1}
    assert schedule_spec(Product(1, 4096, 32, 4096, False, True, "float32")).default()["OCC"] == 0
    assert smem_bytes(Product(1, 4096, 4096, 4096, False, True, "float32"), spec.default()) == 2 * 8 * (128 + 128 + 8) * 4
    assert smem_bytes(Product(1, 4096, 4096, 4096, False, True, "float32"), {**spec.default(), "SVEC": 1}) == \
        2 * 8 * (128 + 128 + 2) * 4
    narrow = schedule_spec(Product(64, 4096, 1, 9, True, True, "float32")).default()
    assert narrow["PREFETCH"] == 0 and narrow["TM"] == narrow["TN"] == 1 and narrow["SVEC"] == 1
    assert "several rows or columns" in spec.why_illegal({**spec.default(), "BM": 32, "BN": 32, "TM": 1, "TN": 1,
                                                          "PREFETCH": 0})
    assert spec.legal({**spec.default(), "TM": 2, "TN": 1, "BM": 64, "BN": 32, "PREFETCH": 0})  # rows 2 at a time
    for s in spec.enumerate():
        assert 32 <= threads(s) <= 1024 and s["TM"] * s["TN"] <= 64
        assert smem_bytes(Product(1, 4096, 4096, 4096, False, True, "float32"), s) <= 48 * 1024
    assert "threads" in spec.why_illegal({"BM": 128, "BN": 128, "BK": 8, "TM": 1, "TN": 1, "PREFETCH": 0, "GROUP_M": 1, "SVEC": 1, "OCC": 0})
    assert "next slice" in spec.why_illegal({"BM": 64, "BN": 64, "BK": 32, "TM": 8, "TN": 8, "PREFETCH": 1, "GROUP_M": 1, "SVEC": 1, "OCC": 0})
    assert spec.legal({"BM": 128, "BN": 128, "BK": 8, "TM": 8, "TN": 8, "PREFETCH": 1, "GROUP_M": 1, "SVEC": 1, "OCC": 0})
    small = schedule_spec(Product(1, 16, 20, 8, False, False, "float32"))
    assert small.default()["BM"] <= 16 and "larger than" in small.why_illegal(
        {"BM": 128, "BN": 32, "BK": 8, "TM": 4, "TN": 4, "PREFETCH": 0, "GROUP_M": 1, "SVEC": 1, "OCC": 0})
    fp64 = Product(1, 4096, 4096, 4096, False, False, "float64")
    assert "shared memory" in schedule_spec(fp64).why_illegal({"BM": 128, "BN": 128, "BK": 32, "TM": 8, "TN": 8,
                                                                "PREFETCH": 0, "GROUP_M": 1, "SVEC": 1, "OCC": 0})


def test_tensor_cores_are_a_knob_of_half_products_only():
    half = Product(1, 4096, 4096, 4096, False, False, "bfloat16")
    assert schedule_spec(half).default()["MMA"] == int(lower_matmul.MMA_BY_DEFAULT)
    spec = schedule_spec(half, tensor_cores_first=True)
    # Both operands come in 16-byte chunks: the cp.async ring, three slices of 64 deep. A [M, K] as 128
    # rows of 64 + 8, B [K, N] as 64 rows of 128 + 8, per slice.
    assert spec.default() == {"BM": 128, "BN": 128, "BK": 64, "TM": 4, "TN": 4, "PREFETCH": 0, "GROUP_M": 1, "SVEC": 1,
                              "OCC": 0, "MMA": 1, "STAGES": 3}
    assert "ldmatrix" in spec.why_illegal({**spec.default(), "SVEC": 4})
    assert "already holds" in spec.why_illegal({**spec.default(), "OCC": 1})
    assert spec.legal({**spec.default(), "STAGES": 0, "OCC": 1})
    assert schedule_spec(half, tensor_cores_first=False).default()["SVEC"] == 4
    assert threads(spec.default()) == 256 and smem_bytes(half, spec.default()) == 3 * (128 * 72 + 64 * 136) * 2
    assert smem_bytes(half, {**spec.default(), "STAGES": 0, "BK": 32}) == 256 * 40 * 2
    assert schedule_spec(Product(1, 4096, 4096, 24, False, False, "float16"), True).default()["BK"] == 32
    assert "16 at a time" in spec.why_illegal({**spec.default(), "BK": 8})
    assert "does not divide" in spec.why_illegal({**spec.default(), "BN": 16, "TN": 4})
    assert spec.legal({**spec.default(), "TM": 8, "TN": 4})          # a 128 x 32 warp tile: 128 accumulators
    assert "accumulators" in spec.why_illegal({**spec.default(), "TM": 8, "TN": 8})
    assert "replaces PREFETCH" in spec.why_illegal({**spec.default(), "STAGES": 3, "PREFETCH": 1})
    assert "MMA=1" in spec.why_illegal({**spec.default(), "STAGES": 3, "MMA": 0})
    for s in spec.enumerate():
        assert 32 <= threads(s) <= 1024
        assert smem_bytes(half, s) <= (227 if s["STAGES"] else 48) * 1024
    assert "MMA" not in schedule_spec(Product(1, 4096, 4096, 4096, False, False, "float32")).default()
    # A short K still takes the tensor cores: the k steps past K multiply zeros. K = 3 is not 16-byte
    # chunks of A, so the slices go through registers.
    short_k = schedule_spec(Product(1, 512, 512, 3, False, False, "float16"), True).default()
    assert short_k["MMA"] == 1 and short_k["STAGES"] == 0
    assert spec.legal({**spec.default(), "GROUP_M": 16})
    one_row = schedule_spec(Product(1, 100, 4096, 512, False, False, "float16"), True)
    assert "one row of" in one_row.why_illegal({**one_row.default(), "BM": 128, "TM": 4, "GROUP_M": 8})


def test_a_default_that_fills_the_gpu_is_preferred():
    spec = schedule_spec(Product(1, 1024, 1024, 512, False, False, "float16"))
    s = spec.default()
    assert (1024 // s["BM"]) * (1024 // s["BN"]) >= 132


def test_products_the_family_does_not_take_say_why():
    src = _task("return torch.matmul(x, y)", "[torch.randn(2, 3, 4, 5), torch.randn(5, 6).int()]")
    with pytest.raises((CodegenError, RuntimeError)):
        generate(load_task_from_source(src, "mixed"))


@pytest.mark.skipif(GXX is None, reason="no host C++ compiler")
def test_generated_matmuls_match_the_model_under_cpu_emulation():
    cases = [FuzzCase(name, "matmul", source) for name, source in sorted(CASES.items())]
    with tempfile.TemporaryDirectory() as tmp:
        outcomes = run_fuzz(cases, 3, Path(tmp))
    failed = [o for o in outcomes if o.failures or o.skipped]
    assert not failed, report(outcomes)[:20000]
    assert all(o.runs >= 2 for o in outcomes), [(o.case.name, o.runs) for o in outcomes]


@pytest.mark.parametrize("name", EXAMPLE_TASKS)
def test_example_tasks_with_products_generate_and_compile(name, tmp_path_factory):
    task = load_task(TASKS / f"{name}.py")
    gen = generate(task)
    assert {"matmul", "conv"} & set([g.family for g in gen.groups] or [gen.family]), gen.notes
    env = env_from_task(task)
    cache = CompileCache(tmp_path_factory.getbasetemp() / "matmul-cache")
    schedules = [gen.spec.default()] + gen.spec.sample(random.Random(name), 2)
    if any(k.endswith("MMA") for k in gen.spec.default()):
        saved, lower_matmul.MMA_BY_DEFAULT = lower_matmul.MMA_BY_DEFAULT, True     # the tensor-core default too
        try:
            schedules.append(generate(task).spec.default())
        finally:
            lower_matmul.MMA_BY_DEFAULT = saved
        assert all(v for k, v in schedules[-1].items() if k.endswith("MMA")), schedules[-1]
    for schedule in schedules:
        program = gen.program.with_schedule(schedule)
        program.resolve(env, LaunchLimits())
        result = compile_cuda(program.source, arch="sm_90", options=program.compile_options(), cache=cache)
        assert result.ok, f"{name} {schedule}:\n{result.error_summary()}"


@pytest.mark.skipif(GXX is None, reason="no host C++ compiler")
def test_prefetching_schedules_match_the_model_under_cpu_emulation(monkeypatch):
    """PREFETCH=1 (two shared buffers, the next slice in registers) as every case's first schedule."""
    def prefetching(product):
        spec = schedule_spec(product)
        if spec.legal({**spec.default(), "PREFETCH": 1}):
            spec.defaults = {**spec.defaults, "PREFETCH": 1}
        return spec

    monkeypatch.setattr(lower_matmul, "schedule_spec", prefetching)
    names = ["mm", "bmm_transposed", "linear_fp16_residual", "mm_fp64", "mm_k1", "mm_larger_tiles",
             "conv2d_groups_rect_kernel", "conv3d"]
    for name in names:        # a product of several groups has its knobs as G<i>_PREFETCH
        assert [v for k, v in _generated(name).spec.default().items() if k.endswith("PREFETCH")] == [1], name
    cases = [FuzzCase(name, "matmul", CASES[name]) for name in names]
    with tempfile.TemporaryDirectory() as tmp:
        outcomes = run_fuzz(cases, 4, Path(tmp))
    assert not [o for o in outcomes if o.failures or o.skipped], report(outcomes)[:20000]


MMA_CASES = ["linear_fp16_residual", "linear_bf16_sigmoid_scale", "mm_fp16_chunks", "bmm_bf16_transposed_chunks",
             "conv2d_fp16_then_maxpool", "conv_transpose3d_fp16"]


@pytest.mark.skipif(GXX is None, reason="no host C++ compiler")
def test_tensor_core_schedules_match_the_model_under_cpu_emulation(monkeypatch):
    """MMA=1 in every schedule drawn (the default and random ones, PREFETCH either way) for the fp16 /
    bf16 cases, mma.sync emulated lane by lane with the PTX fragment layout (WARP_MMA)."""
    def tensor_cores_only(product):
        spec = schedule_spec(product, tensor_cores_first=True)
        spec.knobs = [Knob("MMA", (1,), k.doc) if k.name == "MMA" else k for k in spec.knobs]
        return spec

    monkeypatch.setattr(lower_matmul, "schedule_spec", tensor_cores_only)
    for name in MMA_CASES:
        assert [v for k, v in _generated(name).spec.default().items() if k.endswith("MMA")] == [1], name
    cases = [FuzzCase(name, "matmul", CASES[name]) for name in MMA_CASES]
    with tempfile.TemporaryDirectory() as tmp:
        outcomes = run_fuzz(cases, 5, Path(tmp))
    assert not [o for o in outcomes if o.failures or o.skipped], report(outcomes)[:20000]
    assert all(o.runs >= 2 for o in outcomes), [(o.case.name, o.runs) for o in outcomes]


@pytest.mark.skipif(GXX is None, reason="no host C++ compiler")
def test_cp_async_ring_schedules_match_the_model_under_cpu_emulation(monkeypatch):
    """MMA=1 with STAGES 2-4 in every schedule drawn: the ring's layouts (k or rows contiguous), its
    ldmatrix.trans reads (emulated with the PTX layout), gathered and element-by-element slices."""
    def ring_only(product):
        spec = schedule_spec(product, tensor_cores_first=True)
        spec.knobs = [Knob("MMA", (1,), k.doc) if k.name == "MMA" else
                      Knob("STAGES", (3, 2, 4), k.doc) if k.name == "STAGES" else k for k in spec.knobs]
        spec.defaults = {**spec.defaults, "STAGES": 3}
        if spec.legal({**spec.default(), "GROUP_M": 8}):      # tiles walked 8 row tiles at a time
            spec.defaults = {**spec.defaults, "GROUP_M": 8}
        return spec

    monkeypatch.setattr(lower_matmul, "schedule_spec", ring_only)
    grouped = 0
    for name in MMA_CASES:
        default = _generated(name).spec.default()
        assert [v for k, v in default.items() if k.endswith("STAGES")] == [3], (name, default)
        grouped += any(v == 8 for k, v in default.items() if k.endswith("GROUP_M"))
    assert grouped >= 2
    cases = [FuzzCase(name, "matmul", CASES[name]) for name in MMA_CASES]
    with tempfile.TemporaryDirectory() as tmp:
        outcomes = run_fuzz(cases, 6, Path(tmp))
    assert not [o for o in outcomes if o.failures or o.skipped], report(outcomes)[:20000]
    assert all(o.runs >= 2 for o in outcomes), [(o.case.name, o.runs) for o in outcomes]


def test_exported_product_and_convolution_programs_compile_with_nvcc(nvcc_setup, tmp_path):
    """`cuda-agent export` of a generated product (GELU epilogue), a convolution + pool and a row
    group + reduce program: the .cu with its launcher and PyTorch binding builds with nvcc (no GPU
    needed). Programs of several groups keep each group's kernel in a namespace, which the launcher
    must name (it did not: every multi-group export failed to build before 2026-12-05). mm_fp16's
    default is the tensor cores' cp.async ring: 107 KB of dynamic shared memory, which the launcher
    must opt in to, and a __launch_bounds__ chosen by the preprocessor."""
    import subprocess

    from core.project.export import check_program, nvcc_build_command, render_cu

    for name in ("fused_linear_gelu_scale", "fused_conv_relu_maxpool", "loss_kl_div", "mm_fp16"):
        task = load_task(TASKS / f"{name}.py")
        program = generate(task).program
        check_program(program, task)
        cu = tmp_path / f"{name}.cu"
        cu.write_text(render_cu(program, task, name=name))
        if name == "mm_fp16":
            assert program.schedule["STAGES"] == 3 and "cudaFuncAttributeMaxDynamicSharedMemorySize" in cu.read_text()
        done = subprocess.run(nvcc_build_command(cu, tmp_path / f"{name}.o", [nvcc_setup]),
                              capture_output=True, text=True)
        assert done.returncode == 0, f"{name}.cu does not compile:\n{done.stderr[-4000:]}"
