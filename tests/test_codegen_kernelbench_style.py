"""Operators written the way KernelBench writes them, none of them an example task or a fuzz family's
template: level-1 style single ops (a matrix times a scalar, einsum, diag(A) @ B, triu / tril of a
product, both operands transposed, SELU / softsign / hard sigmoid / ELU / hardtanh, Frobenius / L1 /
L2 norms, prod / argmin / min reductions, minGPT's GELU, the exclusive cumsum, the hinge loss, dilated
asymmetric, depthwise-separable and grouped 3-D transposed convolutions) and level-2 style chains
(a product or convolution followed by activations, norms, reductions and pools, several fusion
groups). Each must generate, and its CUDA must match the Model under the fuzz harness's CPU emulation
(AddressSanitizer on) at the default schedule and one random legal schedule."""
from __future__ import annotations

import random
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import tests.test_codegen_fuzz as fuzz
from tests.test_codegen_fuzz import GXX, FuzzCase, report, run_fuzz

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"


def _task(forward: list[str], inputs: str, init: list[str] | None = None, params: str = "",
          init_inputs: str = "[]", args: str = "x") -> str:
    body = "".join(f"        {line}\n" for line in init or ["pass"])
    code = "".join(f"        {line}\n" for line in forward)
    return HEADER + (f"class Model(nn.Module):\n    def __init__(self{params}):\n        super().__init__()\n{body}"
                     f"    def forward(self, {args}):\n{code}\n"
                     f"def get_inputs():\n    return {inputs}\n\ndef get_init_inputs():\n    return {init_inputs}\n")


CASES = {
    "mat_scalar": _task(["return A * s"], "[torch.randn(256, 256), 3.14]", args="A, s"),
    "tensor3d_matmul": _task(["return torch.matmul(A, B)"], "[torch.randn(8, 64, 32), torch.randn(32, 48)]", args="A, B"),
    "einsum4d": _task(["return torch.einsum('bijl,lk->bijk', A, B)"], "[torch.randn(4, 8, 16, 32), torch.randn(32, 24)]",
                      args="A, B"),
    "diag_matmul": _task(["return torch.diag(A) @ B"], "[torch.randn(128), torch.randn(128, 96)]", args="A, B"),
    "triu_matmul": _task(["return torch.triu(torch.matmul(A, B))"],
                         "[torch.triu(torch.randn(128, 128)), torch.triu(torch.randn(128, 128))]", args="A, B"),
    "tril_matmul": _task(["return torch.tril(torch.matmul(A, B))"],
                         "[torch.tril(torch.randn(128, 128)), torch.tril(torch.randn(128, 128))]", args="A, B"),
    "both_transposed": _task(["return torch.matmul(A.T, B.T)"], "[torch.randn(64, 128), torch.randn(96, 64)]", args="A, B"),
    "selu": _task(["return torch.selu(x)"], "[torch.randn(64, 512)]"),
    "hardsigmoid": _task(["return F.hardsigmoid(x)"], "[torch.randn(64, 512)]"),
    "softsign": _task(["return x / (1 + torch.abs(x))"], "[torch.randn(64, 512)]"),
    "elu": _task(["return F.elu(x, alpha=1.0)"], "[torch.randn(64, 512)]"),
    "hardtanh": _task(["return F.hardtanh(x, min_val=-1., max_val=1.)"], "[torch.randn(64, 512)]"),
    "frobenius_norm": _task(["norm = torch.norm(x, p='fro')", "return x / norm"], "[torch.randn(4, 16, 16, 16)]"),
    "l1_norm": _task(["return x / torch.sum(torch.abs(x), dim=1, keepdim=True)"], "[torch.randn(64, 512)]"),
    "l2_norm": _task(["return x / torch.norm(x, p=2, dim=1, keepdim=True)"], "[torch.randn(64, 512)]"),
    "mean_dim": _task(["return torch.mean(x, dim=1)"], "[torch.randn(16, 256, 64)]"),
    "prod_dim": _task(["return torch.prod(x, dim=1)"], "[torch.randn(16, 256, 64)]"),
    "argmin_dim": _task(["return torch.argmin(x, dim=1)"], "[torch.randn(16, 256, 64)]"),
    "min_dim": _task(["return torch.min(x, dim=1)[0]"], "[torch.randn(16, 256, 64)]"),
    "mingpt_gelu": _task(["import math", "return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * "
                          "(x + 0.044715 * torch.pow(x, 3.0))))"], "[torch.randn(64, 512)]"),
    "exclusive_cumsum": _task(["exclusive = torch.cat((torch.zeros_like(x.select(1, 0).unsqueeze(1)), x), dim=1)[:, :-1]",
                               "return torch.cumsum(exclusive, dim=1)"], "[torch.randn(64, 512)]"),
    "hinge_loss": _task(["return torch.mean(torch.clamp(1 - p * t, min=0))"],
                        "[torch.randn(128, 1), torch.randint(0, 2, (128, 1)).float() * 2 - 1]", args="p, t"),
    "conv_asymmetric_dilated": _task(["return self.conv(x)"], "[torch.randn(2, 8, 12, 16)]",
                                     ["self.conv = nn.Conv2d(c, 16, (3, 5), stride=(2, 1), padding=(1, 2), "
                                      "dilation=(2, 1), bias=False)"], ", c", "[8]"),
    "conv_depthwise_separable": _task(["return self.pw(self.dw(x))"], "[torch.randn(2, 16, 12, 12)]",
                                      ["self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c)", "self.pw = nn.Conv2d(c, 32, 1)"],
                                      ", c", "[16]"),
    "conv_transpose3d_groups": _task(["return self.conv(x)"], "[torch.randn(1, 8, 4, 5, 4)]",
                                     ["self.conv = nn.ConvTranspose3d(c, 8, 3, stride=2, padding=1, output_padding=1, "
                                      "groups=4)"], ", c", "[8]"),
    "conv_relu_biasadd": _task(["x = torch.relu(self.conv(x))", "return x + self.bias"], "[torch.randn(2, 8, 12, 12)]",
                               ["self.conv = nn.Conv2d(c, 16, 3)", "self.bias = nn.Parameter(torch.randn(16, 1, 1))"],
                               ", c", "[8]"),
    "matmul_sigmoid_sum": _task(["x = torch.sigmoid(self.linear(x))", "return torch.sum(x, dim=1, keepdim=True)"],
                                "[torch.randn(64, 128)]", ["self.linear = nn.Linear(i, o)"], ", i, o", "[128, 64]"),
    "gemm_groupnorm_swish_mul_swish": _task(
        ["x = self.gemm(x)", "x = self.gn(x)", "x = x * torch.sigmoid(x)", "x = x * self.w", "return x * torch.sigmoid(x)"],
        "[torch.randn(64, 128)]", ["self.gemm = nn.Linear(i, o)", "self.gn = nn.GroupNorm(8, o)",
                                    "self.w = nn.Parameter(torch.randn(o))"], ", i, o", "[128, 64]"),
    "conv_min_tanh_tanh": _task(["x = self.conv(x)", "x = torch.min(x, dim=1, keepdim=True)[0]",
                                 "return torch.tanh(torch.tanh(x))"], "[torch.randn(2, 8, 12, 12)]",
                                ["self.conv = nn.Conv2d(c, 16, 3)"], ", c", "[8]"),
    "gemm_max_subtract_gelu": _task(["x = self.gemm(x)", "x = torch.max(x, dim=1, keepdim=True).values",
                                     "x = x - x.mean(dim=1, keepdim=True)", "return F.gelu(x)"],
                                    "[torch.randn(64, 128)]", ["self.gemm = nn.Linear(i, o)"], ", i, o", "[128, 64]"),
    "conv_transpose_gap_bias_lse_sum_mul": _task(
        ["x = self.conv(x)", "x = torch.mean(x, dim=(2, 3), keepdim=True)", "x = x + self.bias",
         "x = torch.logsumexp(x, dim=1, keepdim=True)", "x = torch.sum(x, dim=(2, 3))", "return x * 10.0"],
        "[torch.randn(2, 8, 10, 10)]", ["self.conv = nn.ConvTranspose2d(c, 16, 3, stride=2)",
                                         "self.bias = nn.Parameter(torch.randn(16, 1, 1))"], ", c", "[8]"),
    "matmul_scale_residual": _task(["x = self.m(x)", "y = x.clone().detach()", "x = x * 0.5", "return x + y"],
                                   "[torch.randn(64, 128)]", ["self.m = nn.Linear(i, o)"], ", i, o", "[128, 64]"),
    "conv3d_softmax_pool_pool": _task(["x = self.conv(x)", "x = torch.softmax(x, dim=1)", "return self.p2(self.p1(x))"],
                                      "[torch.randn(1, 3, 10, 10, 10)]",
                                      ["self.conv = nn.Conv3d(c, 16, 3)", "self.p1 = nn.MaxPool3d(2)",
                                       "self.p2 = nn.MaxPool3d(2)"], ", c", "[3]"),
    "gemm_bn_gelu_gn_mean_relu": _task(
        ["x = self.gemm(x)", "x = self.bn(x)", "x = F.gelu(x)", "x = self.gn(x)", "x = torch.mean(x, dim=1, keepdim=True)",
         "return torch.relu(x)"], "[torch.randn(64, 128)]",
        ["self.gemm = nn.Linear(i, o)", "self.bn = nn.BatchNorm1d(o)", "self.gn = nn.GroupNorm(8, o)"], ", i, o",
        "[128, 64]"),
    "conv_transpose3d_bn_subtract_mean": _task(
        ["x = self.bn(self.conv(x))", "return x - torch.mean(x, dim=(2, 3, 4), keepdim=True)"],
        "[torch.randn(1, 4, 4, 5, 4)]", ["self.conv = nn.ConvTranspose3d(c, 8, 3, stride=2, padding=1)",
                                         "self.bn = nn.BatchNorm3d(8)"], ", c", "[4]"),
    "conv_hardswish_relu": _task(["x = self.conv(x)", "x = F.hardswish(x)", "return torch.relu(x)"],
                                 "[torch.randn(2, 8, 12, 12)]", ["self.conv = nn.Conv2d(c, 16, 3)"], ", c", "[8]"),
    "matmul_avgpool_gelu_scale_max": _task(
        ["x = self.m(x)", "x = self.pool(x.unsqueeze(1)).squeeze(1)", "x = F.gelu(x)", "x = x * 2.0",
         "return torch.max(x, dim=1).values"], "[torch.randn(64, 128)]",
        ["self.m = nn.Linear(i, o)", "self.pool = nn.AvgPool1d(4)"], ", i, o", "[128, 64]"),
}


def emulate_cases(cases: dict[str, str], seed: int, monkeypatch) -> list:
    """Generate each source and run its CUDA under the fuzz harness's CPU emulation at the default
    and one random legal schedule; fails on any refusal, skip or mismatch. The outcomes."""
    monkeypatch.setattr(fuzz, "SCHEDULES", 1)
    fuzz_cases = [FuzzCase(name, "kernelbench-style", source) for name, source in sorted(cases.items())]
    with tempfile.TemporaryDirectory() as tmp:
        outcomes = run_fuzz(fuzz_cases, seed, Path(tmp))
    failed = [o for o in outcomes if o.failures or o.skipped]
    assert not failed, report(outcomes)[:20000] + str([(o.case.name, o.skipped) for o in outcomes if o.skipped])
    return outcomes


def compile_cases(cases: dict[str, str], cache_dir: Path) -> None:
    """Generate each source and compile it with NVRTC for sm_80 and sm_90 at the default and one
    sampled schedule; fails with the compiler's message on the first error."""
    from core.codegen import generate
    from core.tasks import load_task_from_source
    from core.toolchain import CompileCache, compile_cuda

    cache = CompileCache(cache_dir)
    jobs = []
    for name in sorted(cases):
        gen = generate(load_task_from_source(cases[name], name))
        for schedule in [gen.spec.default()] + gen.spec.sample(random.Random(name), 1):
            jobs += [(name, gen.program.with_schedule(schedule), arch) for arch in ("sm_80", "sm_90")]

    def build(job):
        name, program, arch = job
        return name, arch, compile_cuda(program.source, arch=arch, options=program.compile_options(), cache=cache)

    with ThreadPoolExecutor(2) as pool:
        for name, arch, result in pool.map(build, jobs):
            assert result.ok, f"{name} {arch}:\n{result.error_summary()}"


@pytest.mark.skipif(GXX is None, reason="no host C++ compiler")
@pytest.mark.timeout(900)
def test_kernelbench_style_operators_generate_and_match_the_model(monkeypatch):
    outcomes = emulate_cases(CASES, 5, monkeypatch)
    assert all(o.runs == 2 for o in outcomes), [(o.case.name, o.runs) for o in outcomes]
