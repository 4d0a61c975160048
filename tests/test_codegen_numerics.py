"""Numerics of the pointwise family's element code against eager PyTorch, over extreme inputs.

The fp16/bf16 paths use cheap forms (hardware conversions, max.NaN, reciprocal multiplies, fast
exp/rcp/tanh, an erf approximation; see docs/codegen.md, "Element code"). g++ builds the generated
kernels with the host fallbacks of those helpers (the test harness of test_codegen_pointwise.py: ASan,
UBSan, threads run one after another) and runs them at the program's default schedule and a scalar
one, on inputs with NaN, +-Inf, signed zeros, subnormals, the dtype's extremes, values around the
clamp points and random values. A second pass multiplies every fast helper's result by its GPU error
bound (CA_APPROX_ERR, both signs) to show the tolerance holds with the hardware's error too. NVRTC
compiles the same programs for sm_80 and sm_90, and the PTX shows the device paths are taken.
"""
from __future__ import annotations

import math
import os
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from core.codegen.capture import capture_module
from core.codegen.generate import generate_from_graph
from core.program import KernelProgram, ScalarArg, TensorArg, TensorInfo
from core.toolchain import compile_ptx, nvrtc_info
from tests.test_codegen_pointwise import EMU_HEADER, EMU_SANITIZE, GXX

H, BF, F32 = torch.float16, torch.bfloat16, torch.float32
N = 1024                    # elements per input: a multiple of every VEC, several blocks at BLOCK 64


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


# name -> (function, dtype, number of inputs)
CASES = {
    "hardswish_fp16": (F.hardswish, H, 1),
    "hardswish_bf16": (F.hardswish, BF, 1),
    "hardswish_fp32": (F.hardswish, F32, 1),
    "gelu_tanh_bf16": (lambda x: F.gelu(x, approximate="tanh"), BF, 1),
    "gelu_tanh_fp16": (lambda x: F.gelu(x, approximate="tanh"), H, 1),
    "gelu_tanh_fp32": (lambda x: F.gelu(x, approximate="tanh"), F32, 1),
    "gelu_fp16": (F.gelu, H, 1),
    "gelu_bf16": (F.gelu, BF, 1),
    "gelu_fp32": (F.gelu, F32, 1),
    "silu_mul_bf16": (lambda x: x * torch.sigmoid(x), BF, 1),
    "silu_fp16": (F.silu, H, 1),
    "silu_fp32": (F.silu, F32, 1),
    "exp_tanh_fp16": (lambda x: torch.exp(x * 0.25) - torch.tanh(x), H, 1),
    "exp_tanh_bf16": (lambda x: torch.exp(x * 0.25) - torch.tanh(x), BF, 1),
    "hardsigmoid_relu6_fp16": (lambda x: F.hardsigmoid(x) + F.relu6(x), H, 1),
    "leaky_relu_bf16": (lambda x: F.leaky_relu(x, 0.1) + torch.relu(-x), BF, 1),
    "leaky_relu_fp32": (lambda x: F.leaky_relu(x, 0.1) + torch.relu(-x), F32, 1),
    "leaky_relu_slope0_fp32": (lambda x: F.leaky_relu(x, 0.0), F32, 1),     # +inf stays inf (no inf * 0)
    "div_consts_fp32": (lambda x: x / 3.0 + x / 0.1 - x / 4, F32, 1),
    "div_consts_fp16": (lambda x: x / 3.0 + x / 6 - x / 0.5, H, 1),
    "div_tensor_bf16": (lambda x, y: x / y, BF, 2),
    "bias_gelu_scale_clamp_fp16": (lambda x, b: torch.clamp(F.gelu(x + b) * 1.7, -4.0, 4.0), H, 2),
    "clamp_odd_bounds_fp16": (lambda x: torch.clamp(x * 1.1, -0.1, 0.1), H, 1),
    "max_min_bf16": (lambda x, y: torch.maximum(x, y) - torch.minimum(x, 2 * y), BF, 2),
    # Eager rounds every intermediate: (x + 1000) - 1000 in bf16 keeps multiples of 4. A chain kept in
    # fp32 would return x and miss by up to 2.
    "cancel_bf16": (lambda x: (x + 1000.0) - 1000.0, BF, 1),
}


def _specials(dtype: torch.dtype) -> list[float]:
    info = torch.finfo(dtype)
    tiny, sub = info.tiny, info.tiny * info.eps          # smallest normal, a subnormal
    vals = [0.0, -0.0, math.nan, math.inf, -math.inf, info.max, -info.max, tiny, -tiny, sub, -sub,
            1e-40, -1e-40, 1e4, -1e4, 88.0, -88.0, 89.0, -89.0, 100.0, -100.0, 20.0, -20.0, 9.0, -9.0]
    for c in (3.0, 4.0, 6.0, 0.1):                        # around the clamp points, one ulp each side
        for s in (c, -c):
            t = torch.tensor(s, dtype=dtype)
            vals += [s, torch.nextafter(t, torch.tensor(math.inf, dtype=dtype)).item() if dtype == F32 else
                     (t.float() * (1 + info.eps)).item(), (t.float() * (1 - info.eps / 2)).item()]
    if dtype != H:
        vals += [1e30, -1e30, 3e38, -3e38]
    return vals


def _inputs(dtype: torch.dtype, count: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = []
    for k in range(count):
        specials = torch.tensor(_specials(dtype), dtype=torch.float64)
        specials = specials if k == 0 else specials.flip(0)
        rest = N - len(specials)
        scales = torch.cat([torch.full((rest // 2,), 3.0), torch.full((rest - rest // 2,), 30.0)])
        x = torch.cat([specials, torch.randn(rest, generator=g, dtype=torch.float64) * scales])
        out.append(x.to(dtype))
    return out


@lru_cache(maxsize=None)
def program(case: str) -> KernelProgram:
    fn, dtype, count = CASES[case]
    names = [f"x{i}" for i in range(count)]
    gen = generate_from_graph(capture_module(Fn(fn), _inputs(dtype, count), case, names))
    assert gen.family == "pointwise", (case, gen.family)
    return gen.program


SCALAR = {"BLOCK": 64, "VEC": 1, "ITEMS": 1, "GRID": 0}
RUNS = [(case, which) for case in CASES for which in ("default", "scalar")]
# CA_APPROX_ERR(kind) for kind 0 exp, 1 rcp, 2 tanh: the GPU's relative error bounds
# (ex2.approx.ftz 2^-22 plus the 2^-24 rounding of x * log2(e) at |x| <= 90, rcp.approx 2^-23,
# tanh.approx 2^-10.987), rounded up.
ERRORS = {"exact": (0.0, 0.0, 0.0), "plus": (2e-6, 2e-7, 5.1e-4), "minus": (-2e-6, -2e-7, -5.1e-4)}


def _case_code(index: int, case: str, which: str) -> tuple[str, str]:
    prog = program(case)
    prog = prog if which == "default" else prog.with_schedule(SCALAR)
    dtype, count = CASES[case][1], CASES[case][2]
    plan = prog.resolve({f"x{i}": TensorInfo((N,), str(dtype).removeprefix("torch.")) for i in range(count)})
    source = prog.source.replace('extern "C" ', "")
    space = "\n".join([f"namespace c{index} {{", *[f"#define {k} {v}" for k, v in prog.schedule.items()],
                       source, *[f"#undef {k}" for k in prog.schedule], "}"])
    item = torch.tensor([], dtype=dtype).element_size()
    lines = [f"    case {index}: {{"]
    ptr = {}
    for i in range(count):
        ptr[f"x{i}"] = f"p{i}"
        lines.append(f'        char* p{i} = ca_read(dir + "/in{i}.bin", {N * item}, 0);')
    for b in plan.buffers:
        ptr[b.name] = f"p{len(ptr)}"
        lines.append(f"        char* {ptr[b.name]} = ca_alloc({math.prod(b.shape) * item}, 0);")
    for launch in plan.launches:
        args = [f"CaPtr{{{ptr[a.name]}}}" if isinstance(a, TensorArg) else f"{int(a.value)}LL" for a in launch.args]
        assert all(isinstance(a, (TensorArg, ScalarArg)) for a in launch.args)
        lines.append(f"        ca_launch([&] {{ c{index}::{launch.kernel}({', '.join(args)}); }}, "
                     f"{launch.grid[0]}, {launch.block[0]});")
    lines += [f'        ca_write(dir + "/out0.bin", {ptr[plan.outputs[0]]}, {N * item});', "        return 0;", "    }"]
    return space, "\n".join(lines)


@lru_cache(maxsize=1)
def _binary(tmp: str) -> Path:
    spaces, cases = zip(*(_case_code(i, case, which) for i, (case, which) in enumerate(RUNS)))
    head = ["static float ca_err[3] = {0, 0, 0};", "#define CA_APPROX_ERR(kind) (1.0f + ca_err[kind])"]
    code = [EMU_HEADER, *head, *spaces, "int main(int argc, char** argv) {", "    const std::string dir = argv[2];",
            "    for (int k = 0; k < 3; ++k) ca_err[k] = (float)atof(argv[3 + k]);",
            "    switch (atoi(argv[1])) {", *cases, "    }", "    return 1;", "}"]
    folder = Path(tmp)
    (folder / "numerics.cpp").write_text("\n".join(code))
    done = subprocess.run([GXX, "-O1", "-std=c++17", "-w", *EMU_SANITIZE, "numerics.cpp", "-o", "numerics"],
                          cwd=folder, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[:6000]
    return folder / "numerics"


def _cuda_gelu(x: torch.Tensor) -> torch.Tensor:
    """Eager CUDA's erf GELU (ATen GeluCUDAKernelImpl): x * 0.5 * (1 + erf(x / sqrt(2))) in fp32. CPU
    eager's vectorised GELU differs at the ends of the range (NaN at +inf, inf for x near FLT_MAX,
    where 2x overflows); the evaluator compares with CUDA eager."""
    f = x.float()
    return (f * 0.5 * (1 + torch.erf(f * 0.7071067811865476))).to(x.dtype)


# Reference functions where CPU eager is not what CUDA eager computes.
REFERENCE = {
    "gelu_fp16": _cuda_gelu, "gelu_bf16": _cuda_gelu, "gelu_fp32": _cuda_gelu,
    "bias_gelu_scale_clamp_fp16": lambda x, b: torch.clamp(_cuda_gelu(x + b) * 1.7, -4.0, 4.0),
}


def _eager(case: str) -> torch.Tensor:
    fn, dtype, count = CASES[case]
    return REFERENCE.get(case, fn)(*_inputs(dtype, count))


@pytest.mark.skipif(GXX is None, reason="no host C++ compiler")
@pytest.mark.parametrize("index", range(len(RUNS)), ids=[f"{c}-{w}" for c, w in RUNS])
def test_element_code_matches_eager_on_extreme_inputs(index, tmp_path_factory):
    case, which = RUNS[index]
    tmp = tmp_path_factory.getbasetemp() / "numerics-emu"
    os.makedirs(tmp, exist_ok=True)
    work = tmp_path_factory.mktemp(case)
    fn, dtype, count = CASES[case]
    for i, t in enumerate(_inputs(dtype, count)):
        (work / f"in{i}.bin").write_bytes(t.view(torch.uint8).numpy().tobytes())
    expected = _eager(case)
    tol = 1e-4 if dtype == F32 else 1e-2
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0"}
    for mode, errs in ERRORS.items():
        if mode != "exact" and which != "default":
            continue
        done = subprocess.run([str(_binary(str(tmp))), str(index), str(work), *map(str, errs)],
                              capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, f"{case}: the emulated kernel failed:\n{done.stderr[:3000]}"
        got = torch.frombuffer(bytearray((work / "out0.bin").read_bytes()), dtype=dtype)
        # Non-finite values must agree exactly (assert_close checks that), NaN where eager has NaN.
        torch.testing.assert_close(got, expected, atol=tol, rtol=tol, equal_nan=True,
                                   msg=lambda m: f"{case} ({which} schedule, {mode} errors): {m}")


def test_fast_forms_are_used_only_where_the_result_is_rounded_to_16_bits():
    assert "ca_exp_fast" in program("silu_mul_bf16").source.split("_body(")[1]
    assert "ca_phi_fast" in program("gelu_fp16").source.split("_body(")[1]
    for case in ("silu_fp32", "gelu_fp32", "gelu_tanh_fp32", "div_consts_fp32", "leaky_relu_fp32"):
        body = program(case).source.split("_body(")[1]
        assert "_fast(" not in body, case
    # hardswish's decomposition computes in fp32 and casts to fp16 once: its division by 6 is a multiply.
    body = program("hardswish_fp16").source.split("_body(")[1].split("\n}")[0]
    assert " / " not in body and "0.1666666716337204f" in body
    # Rounding is not repeated: the output node is not rounded before its store, and the product
    # read only by the clamp (bounds -4 and 4 are fp16 values) leaves its rounding to the clamp's.
    fused = program("bias_gelu_scale_clamp_fp16").source.split("_body(")[1].split("\n}")[0]
    assert fused.count("round_f16(") == 2, fused
    odd = program("clamp_odd_bounds_fp16").source.split("_body(")[1].split("\n}")[0]
    assert odd.count("round_f16(") == 1, odd       # -0.1 is no fp16 value: the product is rounded first


@pytest.mark.skipif(not nvrtc_info()[0], reason="NVRTC is not available")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_device_paths_compile_and_use_the_hardware_forms(arch):
    cases = ["hardswish_fp16", "silu_mul_bf16", "gelu_tanh_bf16", "bias_gelu_scale_clamp_fp16", "exp_tanh_fp16",
             "max_min_bf16", "gelu_fp32"]
    ptx = {}
    for case in cases:
        prog = program(case)
        ok, text = compile_ptx(prog.source, arch=arch, options=prog.compile_options())
        assert ok, f"{case} {arch}:\n{text[:3000]}"
        ptx[case] = text
    assert "cvt.rn.bf16.f32" in ptx["silu_mul_bf16"] and "ex2.approx.ftz.f32" in ptx["silu_mul_bf16"]
    assert "rcp.approx.ftz.f32" in ptx["gelu_tanh_bf16"] and "tanh.approx.f32" in ptx["exp_tanh_fp16"]
    assert "max.NaN.f32" in ptx["bias_gelu_scale_clamp_fp16"] and "min.NaN.f32" in ptx["max_min_bf16"]
    for case in ("hardswish_fp16", "silu_mul_bf16", "gelu_tanh_bf16", "bias_gelu_scale_clamp_fp16"):
        assert "div.rn.f32" not in ptx[case], case          # no IEEE division left in these chains
    assert "div.rn.f32" not in ptx["hardswish_fp16"] and "erf" not in ptx["bias_gelu_scale_clamp_fp16"]
