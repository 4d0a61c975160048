"""The pooling family on the GPU: pools with odd settings (ceil mode, dilation, padding not counted,
divisor_override, indices, fp16 / bf16 / fp64) and depthwise convolutions (strides, dilation, wide
padding, 1-D to 3-D, fp16, bias and epilogues) through the evaluator at the default schedule and
sampled legal ones. The CPU tests (tests/test_codegen_pool.py) play the same code on the host at small
shapes; these shapes span many blocks and planes."""
from __future__ import annotations

import random

import pytest

from core.codegen import generate
from core.tasks import load_task_from_source
from tests.gpu.codegen_check import failures_at
from tests.test_codegen_matmul import _task

pytestmark = pytest.mark.gpu

SAMPLED = 4

CASES = {
    "max2d_ceil_dil_idx": _task(
        "return F.max_pool2d(x, (3, 2), (2, 3), (1, 1), dilation=(1, 2), ceil_mode=True, return_indices=True)",
        "[torch.randn(4, 24, 41, 66)]", args="x"),
    "max3d_bf16_idx": _task("return F.max_pool3d(x, (2, 3, 3), (1, 2, 2), (1, 1, 0), return_indices=True)[1]",
                            "[torch.randn(2, 8, 9, 18, 30).bfloat16()]", args="x"),
    "avg2d_ceil_nopad_fp16": _task("return F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)",
                                   "[torch.randn(4, 32, 45, 61).half()]", args="x"),
    "avg3d_divisor_fp64": _task("return F.avg_pool3d(x, 3, 2, 1, ceil_mode=True, divisor_override=5)",
                                "[torch.randn(2, 6, 13, 17, 22).double()]", args="x"),
    "avg1d_sub": _task("return F.avg_pool1d(x, 4, 3, 2, ceil_mode=True) - 1.0", "[torch.randn(8, 48, 301)]",
                       args="x"),
    "dwconv2d_stride_dil": _task("return self.c(x) + 0.5", "[torch.randn(4, 24, 37, 50)]",
                                 "self.c = nn.Conv2d(24, 24, 3, stride=(2, 1), padding=(1, 2), dilation=(1, 2), "
                                 "groups=24, bias=False)", "x"),
    "dwconv1d_fp16_relu": _task("return torch.relu(self.c(x))", "[torch.randn(8, 64, 257).half()]",
                                "self.c = nn.Conv1d(64, 64, 5, padding=2, groups=64).half()", "x"),
    "dwconv3d_wide_pad": _task("return self.c(x)", "[torch.randn(2, 16, 9, 14, 19)]",
                               "self.c = nn.Conv3d(16, 16, (2, 3, 3), stride=(1, 2, 2), padding=(2, 1, 3), "
                               "groups=16)", "x"),
    "dwconv2d_7x7_bias_gelu": _task("return F.gelu(self.c(x))", "[torch.randn(2, 96, 56, 56)]",
                                    "self.c = nn.Conv2d(96, 96, 7, padding=3, groups=96)", "x"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_pool_case_is_correct_on_the_gpu(name):
    task = load_task_from_source(CASES[name], name)
    gen = generate(task)
    families = [g.family for g in gen.groups] if gen.groups else [gen.family]
    assert families == ["pool"], (families, gen.notes)
    schedules = [gen.spec.default()] + gen.spec.sample(random.Random(name), SAMPLED)
    failures = failures_at(task, gen, schedules)
    assert not failures, "\n".join(failures)
