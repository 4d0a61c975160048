"""Pointwise and row-reduction families: which tasks generate() accepts, plans resolve with the task's shapes, the
generated source compiles with NVRTC for sm_80 and sm_90 under the default and sampled legal
schedules, and the constraints mask what they should. No GPU: the pointwise kernels also run on the CPU
(g++ with sanitizers, see the last part), which checks their index math against eager PyTorch."""
from __future__ import annotations

import math
import os
import random
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from core.codegen import CodegenError, generate
from core.codegen import lower_pointwise as lp
from core.codegen.capture import capture_module
from core.codegen.generate import generate_from_graph
from core.program import KernelProgram, LaunchLimits, ScalarArg, TensorArg, TensorInfo
from core.search.space import ScheduleSpace, env_from_task
from core.toolchain import CompileCache, compile_cuda, nvrtc_info
from tests.test_codegen_cases import (POINTWISE_SYNTHETIC, POINTWISE_TASKS, ROWREDUCE_SYNTHETIC, ROWREDUCE_TASKS,
                                      SYNTHETIC, load)

ALL_POINTWISE = POINTWISE_TASKS + POINTWISE_SYNTHETIC
ALL_ROWREDUCE = ROWREDUCE_TASKS + ROWREDUCE_SYNTHETIC
ALL_GENERATED = ALL_POINTWISE + ALL_ROWREDUCE
ARCHS = ("sm_80", "sm_90")
SAMPLED = 20
needs_nvrtc = pytest.mark.skipif(not nvrtc_info()[0], reason="NVRTC is not available")


@lru_cache(maxsize=None)
def generated(name: str):
    return generate(load(name))


def _family_or_error(name: str) -> tuple[str, str | None, str | None]:
    """(name, family, None) or (name, None, error message); runs in a worker process."""
    import warnings

    warnings.filterwarnings("ignore")
    try:
        return name, generate(load(name)).family, None
    except CodegenError as exc:
        return name, None, str(exc)


@pytest.mark.parametrize("name", ALL_GENERATED)
def test_plan_resolves_to_the_reference_outputs(name):
    task, gen = load(name), generated(name)
    assert gen.family == ("pointwise" if name in ALL_POINTWISE else "rowreduce")
    program = KernelProgram.from_json(gen.program.to_json())      # round-trips as data
    assert program.tunables == gen.spec.tunables()
    if gen.family == "rowreduce":
        assert program.schedule == gen.spec.default()
    plan = program.resolve(env_from_task(task))
    by_name = {b.name: b for b in plan.buffers}
    got = [(by_name[o].shape, by_name[o].dtype) for o in plan.outputs]      # in the model's output order
    assert got == [(s.shape, s.dtype) for s in task.output_specs]
    assert gen.spec.legal(gen.spec.default()) and gen.spec.legal(program.schedule)
    # The search starts from the program's schedule.
    assert ScheduleSpace.from_program(program, task, constraints=gen.space_constraints).default() == program.schedule


# The program's default schedule: 16-byte vectors and ITEMS=2 where the constraints allow, else narrower.
DEFAULTS = {
    "act_gelu": {"BLOCK": 256, "VEC": 4, "ITEMS": 2, "GRID": 0},               # fp32 [8192, 8192]
    "act_silu_bf16": {"BLOCK": 256, "VEC": 8, "ITEMS": 2, "GRID": 0},
    "fused_bias_gelu_scale_fp16": {"BLOCK": 256, "VEC": 8, "ITEMS": 2, "GRID": 0},
    "zoo_activations": {"BLOCK": 256, "VEC": 4, "ITEMS": 2, "GRID": 0},        # 16384 elements
    "promote_scalar_fp16": {"BLOCK": 64, "VEC": 2, "ITEMS": 1, "GRID": 0},     # small: narrower, fewer
    "broadcast_where": {"BLOCK": 256, "VEC": 1, "ITEMS": 1, "GRID": 0},        # 120 elements: the knobs' first values
}


@pytest.mark.parametrize("name", ALL_POINTWISE)
def test_default_schedule_is_the_widest_legal_vector(name):
    gen = generated(name)
    default = gen.program.schedule
    assert gen.spec.legal(default)
    if name in DEFAULTS:
        assert default == DEFAULTS[name]
    assert default["GRID"] == 0
    # No legal schedule has a wider vector (the constraints refuse the rest).
    assert all(s["VEC"] <= default["VEC"] for s in gen.spec.enumerate())
    gen.program.resolve(env_from_task(load(name)), LaunchLimits())


@pytest.mark.parametrize("name", ALL_GENERATED)
def test_search_space_plugs_in_the_constraints(name):
    task, gen = load(name), generated(name)
    space = ScheduleSpace.from_program(gen.program, task, constraints=gen.space_constraints)
    assert space.legal(space.default())
    legal = sorted(space.key(s) for s in space.enumerate())
    assert legal == sorted(space.key(s) for s in gen.spec.enumerate() if space.legal(s))
    assert len(legal) >= 4  # only BLOCK varies for a 120-element tensor
    mask = space.mask(space.default())
    assert any(mask) and not all(mask)


def _schedules(name: str) -> list[dict]:
    """The program's default plus 20 sampled legal schedules for example tasks (5 for synthetic ones)."""
    gen = generated(name)
    count = SAMPLED if name not in SYNTHETIC else 5
    return [dict(gen.program.schedule)] + gen.spec.sample(random.Random(name), count)


@needs_nvrtc
@pytest.mark.parametrize("name", ALL_GENERATED)
def test_default_and_sampled_schedules_compile(name, tmp_path_factory):
    gen = generated(name)
    cache = CompileCache(tmp_path_factory.getbasetemp() / "codegen-cache")
    jobs = [(s, arch) for s in _schedules(name) for arch in ARCHS]

    def build(job):
        schedule, arch = job
        program = gen.program.with_schedule(schedule)
        return job, compile_cuda(program.source, arch=arch, options=program.compile_options(), cache=cache)

    with ThreadPoolExecutor(2) as pool:
        for (schedule, arch), result in pool.map(build, jobs):
            assert result.ok, f"{name} {schedule} {arch}:\n{result.error_summary()}"
    # Every sampled schedule also resolves within the launch limits for the task's shapes.
    env = env_from_task(load(name))
    for schedule in _schedules(name):
        gen.program.with_schedule(schedule).resolve(env, LaunchLimits())


def test_constraints_mask_wide_and_non_dividing_vectors():
    spec = generated("act_gelu").spec                  # float32 [8192, 8192]
    base = spec.default()
    assert "16 bytes" in spec.why_illegal({**base, "VEC": 8})       # 32-byte float32 access
    assert spec.legal({**base, "VEC": 4})
    bf16 = generated("act_silu_bf16").spec             # 8 x bf16 = 16 bytes: allowed
    assert bf16.legal({**bf16.default(), "VEC": 8})
    tiny = generated("broadcast_where").spec           # [4, 5, 6]: 120 elements
    assert "larger than the tensor" in tiny.why_illegal({"BLOCK": 64, "VEC": 2, "ITEMS": 1, "GRID": 0})
    odd = generated("zoo_activations").spec            # [64, 256]: 16384 elements, 64 blocks of 256
    assert "caps nothing" in odd.why_illegal({**odd.default(), "GRID": 1024})
    # broadcast_where's output [4, 5, 6]: VEC=4 does not divide the innermost size 6.
    bw = generated("broadcast_where").spec
    reason = bw.why_illegal({**bw.default(), "VEC": 4})
    assert "does not divide" in reason and "6" in reason
    assert "does not divide" not in (bw.why_illegal({**bw.default(), "VEC": 2}) or "")
    assert "not one of" in spec.why_illegal({**base, "BLOCK": 96})


def test_fp16_bias_uses_suffix_access_and_rounds_between_ops():
    gen = generated("fused_bias_gelu_scale_fp16")
    assert any("'bias' float16[16384]: suffix access" in n for n in gen.notes)
    src = gen.program.source
    assert "round_f16" in src and "erff" in src and "#include" not in src
    launch = gen.program.launches[0]
    assert launch.args[:3] == ["bias", "x", "out"]


def test_plan_follows_other_shapes_of_the_same_rank():
    gen = generated("act_gelu")
    from core.program import TensorInfo
    plan = gen.program.with_schedule({"BLOCK": 128, "VEC": 4, "ITEMS": 2, "GRID": 0}).resolve(
        {"x": TensorInfo((3, 1001), "float32")})
    assert plan.buffers[0].shape == (3, 1001)
    assert plan.launches[0].grid == (-(-3003 // (128 * 4 * 2)), 1, 1)


def test_row_reduction_constraints_and_plan():
    gen = generated("rowreduce_amax_fp16")                # [6, 5, 300] -> [6, 5, 1], 30 rows
    assert gen.spec.legal({"BLOCK": 256, "ROW_MODE": 0})
    assert "idle" in gen.spec.why_illegal({"BLOCK": 1024, "ROW_MODE": 0})
    assert "only 30 rows" in gen.spec.why_illegal({"BLOCK": 1024, "ROW_MODE": 1})
    plan = gen.program.with_schedule({"BLOCK": 128, "ROW_MODE": 1}).resolve(env_from_task(load("rowreduce_amax_fp16")))
    assert plan.launches[0].grid == (-(-30 // 4), 1, 1) and plan.buffers[0].shape == (6, 5, 1)

# ---- pointwise indexing: layouts, literal sizes, 32/64-bit paths, and a CPU run of the kernels ----------
#
# g++ builds the generated CUDA (the `__CUDACC__` part included) against a small stand-in for the execution
# model and launches it as the plan says. The pointwise kernel has no barriers, shared memory or shuffles,
# so running the threads of the grid one after another is an exact emulation. It is built with ASan and
# UBSan: an out-of-bounds or misaligned (vector) access fails the run. Outputs are compared with eager
# PyTorch at the evaluator's tolerances.

GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="no host C++ compiler")


class BatchNormEval(torch.nn.Module):          # [C] statistics read as [1, C, 1, 1]: one value per vector
    def forward(self, x, mean, var, w, b):
        return F.batch_norm(x, mean, var, w, b, training=False, eps=1e-5)


class MiddleDims(torch.nn.Module):             # [N, C, 1, 1] and [C, 1, 1] against [N, C, H, W]
    def forward(self, x, y, z):
        return torch.relu(x * y + z), x - z


class Alternating(torch.nn.Module):            # [A, 1, C, 1] and [1, B, 1, D] (varies innermost: vector loads)
    def forward(self, x, a, b, w, s):
        return (x * a + b) * w - s


class Rows(torch.nn.Module):                    # a layer norm's normalisation: [N, 1] statistics, [D] weights
    def forward(self, x, mean, rstd, w, b, keep):
        return torch.where(keep, (x - mean) * rstd * w + b, -x)


class Odd(torch.nn.Module):                     # 105 elements, innermost 5: no vector width divides
    def forward(self, x, y):
        return torch.sigmoid(x) * y


class Ragged(torch.nn.Module):                  # 24 elements in rows of 6: VEC=4 divides n, not the rows
    def forward(self, x, m):
        return x * m


class ScalarSuffix(torch.nn.Module):
    def forward(self, x, s, bias):
        return x * s + bias


def _r(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 7 * len(shape) + sum(shape))
    return (torch.randn(shape, generator=g) * 1.5).to(dtype)


def _bn_inputs(n: int, c: int, h: int, w: int) -> list[torch.Tensor]:
    return [_r(n, c, h, w), _r(c, seed=1), _r(c, seed=2).abs() + 0.5, _r(c, seed=3), _r(c, seed=4)]


H, BF = torch.float16, torch.bfloat16
EMU_CASES = {   # name -> (module, inputs it is generated and run with, input names)
    "bn_eval": (BatchNormEval(), _bn_inputs(2, 3, 5, 8), ["x", "mean", "var", "w", "b"]),
    "middle_fp16": (MiddleDims(), [_r(2, 3, 4, 8, dtype=H), _r(2, 3, 1, 1, dtype=H, seed=1), _r(3, 1, 1, dtype=H, seed=2)],
                    ["x", "y", "z"]),
    "alternating_bf16": (Alternating(), [_r(3, 4, 5, 8, dtype=BF), _r(3, 1, 5, 1, dtype=BF, seed=1),
                                         _r(1, 4, 1, 8, dtype=BF, seed=2), _r(8, dtype=BF, seed=3),
                                         _r(dtype=BF, seed=4)], ["x", "a", "b", "w", "s"]),
    "rows_fp32": (Rows(), [_r(6, 40), _r(6, 1, seed=1), _r(6, 1, seed=2).abs(), _r(40, seed=3), _r(40, seed=4),
                           _r(6, 1, seed=5) > 0], ["x", "mean", "rstd", "w", "b", "keep"]),
    "odd_fp16": (Odd(), [_r(3, 7, 5, dtype=H), _r(3, 1, 5, dtype=H, seed=1)], ["x", "y"]),
    "ragged_rows": (Ragged(), [_r(4, 6), _r(4, 1, seed=1)], ["x", "m"]),
    "scalar_suffix": (ScalarSuffix(), [_r(4, 6, 8), _r(1, seed=1), _r(6, 8, seed=2)], ["x", "s", "bias"]),
}
# The same programs launched with other shapes of the same broadcast pattern: the literal sizes do not
# match, so the kernel takes its run-time-size path.
OTHER_SHAPES = {
    "bn_eval": _bn_inputs(3, 5, 4, 6),
    "middle_fp16": [_r(3, 2, 5, 4, dtype=H), _r(3, 2, 1, 1, dtype=H, seed=1), _r(2, 1, 1, dtype=H, seed=2)],
    "rows_fp32": [_r(5, 24), _r(5, 1, seed=1), _r(5, 1, seed=2).abs(), _r(24, seed=3), _r(24, seed=4),
                  _r(5, 1, seed=5) > 0],
}


@dataclass(frozen=True)
class EmuRun:
    case: str
    schedule: tuple                   # (BLOCK, VEC, ITEMS, GRID)
    index64: bool = False             # generated as if the shapes needed 64-bit indices (INDEX32_LIMIT lowered)
    pad: bool = False                 # every input and output one element off: misaligned, the scalar path
    other: bool = False               # run with OTHER_SHAPES[case]
    blocks: int = 0                   # launch this many blocks instead of the plan's grid: grid-stride loops


def _runs() -> list[EmuRun]:
    runs = []
    vecs = {"bn_eval": (4, 2), "middle_fp16": (8, 4, 2), "alternating_bf16": (8, 4, 2), "rows_fp32": (4, 8),
            "odd_fp16": (2, 8), "ragged_rows": (4, 2), "scalar_suffix": (4, 8)}
    for case, widths in vecs.items():
        runs.append(EmuRun(case, (256, 1, 1, 0)))                          # the knobs' first values
        for k, vec in enumerate(widths):
            runs.append(EmuRun(case, (64, vec, (1, 2, 4)[k % 3], 0)))      # several blocks, partial tiles
        runs.append(EmuRun(case, (64, widths[0], 2, 0), blocks=2))         # a grid-stride loop over 2 blocks
        runs.append(EmuRun(case, (64, widths[0], 1, 0), index64=True))
        runs.append(EmuRun(case, (64, widths[-1], 2, 0), index64=True, blocks=1))
        runs.append(EmuRun(case, (64, widths[0], 2, 0), pad=True))
    for case in OTHER_SHAPES:
        runs.append(EmuRun(case, (64, 2, 2, 0), other=True))
        runs.append(EmuRun(case, (64, 1, 1, 0), other=True, blocks=3))
        runs.append(EmuRun(case, (64, 2, 1, 0), index64=True, other=True))
    return runs


EMU_RUNS = _runs()

EMU_HEADER = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
struct ca_dim3 { unsigned x = 1, y = 1, z = 1; };
static ca_dim3 threadIdx, blockIdx, blockDim, gridDim;
#define __CUDACC__
#define __global__
#define __launch_bounds__(...)
#define CA_HD inline
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
// No barriers, shared memory or shuffles in these kernels: threads run one after another.
template <class F> void ca_launch(F kernel, unsigned grid, unsigned block) {
    gridDim.x = grid; blockDim.x = block;
    for (unsigned b = 0; b < grid; ++b)
        for (unsigned t = 0; t < block; ++t) { blockIdx.x = b; threadIdx.x = t; kernel(); }
}
// Exactly `bytes` after `pad` (ASan flags any access past them), 64-byte aligned before the pad.
static char* ca_alloc(long long bytes, long long pad) {
    void* p = nullptr;
    if (posix_memalign(&p, 64, bytes + pad)) exit(3);
    memset(p, 0xA5, bytes + pad);            // garbage: a kernel must not rely on cleared outputs
    return (char*)p + pad;
}
static char* ca_read(const std::string& path, long long bytes, long long pad) {
    char* b = ca_alloc(bytes, pad);
    FILE* f = fopen(path.c_str(), "rb");
    if (!f || fread(b, 1, bytes, f) != (size_t)bytes) { perror(path.c_str()); exit(2); }
    fclose(f);
    return b;
}
struct CaPtr {                                 // a buffer passed as any kernel pointer type
    void* p;
    template <class T> operator T*() const { return (T*)p; }
};
static void ca_write(const std::string& path, const void* b, long long bytes) {
    FILE* f = fopen(path.c_str(), "wb");
    fwrite(b, 1, bytes, f);
    fclose(f);
}
"""
EMU_SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]


@lru_cache(maxsize=None)
def emu_program(case: str, index64: bool = False) -> KernelProgram:
    module, inputs, names = EMU_CASES[case]
    graph = capture_module(module, inputs, case, names)
    if index64:   # every size "needs" 64-bit indices: the 64-bit path, vectors and literals included
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(lp, "INDEX32_LIMIT", 16)     # below any tile: every launch takes the 64-bit path
            gen = generate_from_graph(graph)
    else:
        gen = generate_from_graph(graph)
    assert gen.family == "pointwise", (case, gen.family)
    return gen.program


def _emu_inputs(run: EmuRun) -> list[torch.Tensor]:
    return OTHER_SHAPES[run.case] if run.other else EMU_CASES[run.case][1]


ITEMSIZE_OF = {"float32": 4, "float16": 2, "bfloat16": 2, "bool": 1}


def _nbytes(shape, dtype: str) -> int:
    return math.prod(shape) * ITEMSIZE_OF[dtype]


def _emu_case_code(index: int, run: EmuRun) -> tuple[str, str]:
    block, vec, items, grid = run.schedule
    program = emu_program(run.case, run.index64).with_schedule({"BLOCK": block, "VEC": vec, "ITEMS": items,
                                                                 "GRID": grid})
    names = EMU_CASES[run.case][2]
    inputs = _emu_inputs(run)
    plan = program.resolve({n: TensorInfo(tuple(t.shape), str(t.dtype).removeprefix("torch."))
                            for n, t in zip(names, inputs)})
    defines = [f"#define {k} {v}" for k, v in program.schedule.items()]
    undefs = [f"#undef {k}" for k in program.schedule]
    source = program.source.replace('extern "C" ', "")
    space = "\n".join([f"namespace c{index} {{", *defines, source, *undefs, "}"])
    lines = [f"    case {index}: {{"]
    ptr = {}
    for i, (name, t) in enumerate(zip(names, inputs)):
        itemsize = t.element_size()
        ptr[name] = f"p{len(ptr)}"
        lines.append(f'        char* {ptr[name]} = ca_read(dir + "/in{i}.bin", {t.numel() * itemsize}, '
                     f"{itemsize if run.pad else 0});")
    for b in plan.buffers:
        ptr[b.name] = f"p{len(ptr)}"
        lines.append(f"        char* {ptr[b.name]} = ca_alloc({_nbytes(b.shape, b.dtype)}, "
                     f"{ITEMSIZE_OF[b.dtype] if run.pad else 0});")
    for launch in plan.launches:
        args = []
        for a in launch.args:
            if isinstance(a, TensorArg):
                args.append(f"CaPtr{{{ptr[a.name]}}}")
            else:
                assert isinstance(a, ScalarArg) and a.ctype == "int64"
                args.append(f"{int(a.value)}LL")
        lines.append(f"        ca_launch([&] {{ c{index}::{launch.kernel}({', '.join(args)}); }}, "
                     f"{run.blocks or launch.grid[0]}, {launch.block[0]});")
    for k, name in enumerate(plan.outputs):
        b = next(b for b in plan.buffers if b.name == name)
        lines.append(f'        ca_write(dir + "/out{k}.bin", {ptr[name]}, {_nbytes(b.shape, b.dtype)});')
    lines += ["        return 0;", "    }"]
    return space, "\n".join(lines)


@lru_cache(maxsize=1)
def _emu_binary(tmp: str) -> Path:
    """Every run in one executable: one g++ compile."""
    spaces, cases = zip(*(_emu_case_code(i, run) for i, run in enumerate(EMU_RUNS)))
    code = [EMU_HEADER, *spaces, "int main(int argc, char** argv) {", "    const std::string dir = argv[2];",
            "    switch (atoi(argv[1])) {", *cases, "    }", "    return 1;", "}"]
    folder = Path(tmp)
    (folder / "emu.cpp").write_text("\n".join(code))
    done = subprocess.run([GXX, "-O1", "-std=c++17", "-w", *EMU_SANITIZE, "emu.cpp", "-o", "emu"], cwd=folder,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[:6000]
    return folder / "emu"


def emulate(index: int, tmp: str, work: Path, expected: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run EMU_RUNS[index] on the CPU; the program's outputs, shaped as `expected`."""
    run = EMU_RUNS[index]
    for i, t in enumerate(_emu_inputs(run)):
        (work / f"in{i}.bin").write_bytes(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0"}
    done = subprocess.run([str(_emu_binary(tmp)), str(index), str(work)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, f"{run}: the emulated kernel failed:\n{done.stderr[:3000]}"
    return [torch.frombuffer(bytearray((work / f"out{k}.bin").read_bytes()), dtype=ref.dtype).reshape(ref.shape)
            for k, ref in enumerate(expected)]


def _eager(run: EmuRun) -> list[torch.Tensor]:
    module = EMU_CASES[run.case][0]
    result = module(*_emu_inputs(run))
    return list(result) if isinstance(result, tuple) else [result]


@needs_gxx
@pytest.mark.parametrize("index", range(len(EMU_RUNS)),
                         ids=[f"{r.case}-{'-'.join(map(str, r.schedule))}{'-index64' if r.index64 else ''}"
                              f"{'-pad' if r.pad else ''}{'-other' if r.other else ''}{f'-{r.blocks}blocks' if r.blocks else ''}"
                              for r in EMU_RUNS])
def test_generated_kernel_runs_correctly_on_the_cpu(index, tmp_path_factory):
    tmp = str(tmp_path_factory.getbasetemp() / "pointwise-emu")
    os.makedirs(tmp, exist_ok=True)
    run = EMU_RUNS[index]
    expected = _eager(run)
    got = emulate(index, tmp, tmp_path_factory.mktemp(run.case), expected)
    for k, (out, ref) in enumerate(zip(got, expected)):
        tol = 1e-2 if ref.dtype in (torch.float16, torch.bfloat16) else 1e-4
        torch.testing.assert_close(out, ref, atol=tol, rtol=tol, equal_nan=True,
                                   msg=lambda m: f"{run} output {k}: {m}")


def test_layouts_merge_dims_that_every_general_access_treats_alike():
    low = lambda case: lp._layout(*_layout_args(case))
    bn = low("bn_eval")                       # [2, 3, 5, 8] with [1, 3, 1, 1] statistics: [N, C, H*W]
    assert (bn.sizes, bn.masks, bn.first, bn.passed) == ([2, 3, 40], [(False, True, False)], 1, [1, 2])
    mid = low("middle_fp16")                  # y [2, 3, 1, 1], z [1, 3, 1, 1]: [N, C, H*W], two patterns
    assert (mid.sizes, mid.masks, mid.first) == ([2, 3, 32], [(True, True, False), (False, True, False)], 0)
    alt = low("alternating_bf16")             # a [3, 1, 5, 1], b [1, 4, 1, 8]: nothing merges
    assert alt.sizes == [3, 4, 5, 8] and alt.masks == [(True, False, True, False), (False, True, False, True)]
    assert alt.exprs == ["out.shape[0]", "out.shape[1]", "out.shape[2]", "out.shape[3]"]
    rows = low("rows_fp32")                   # [6, 1] statistics: the offset is i / 40
    assert (rows.sizes, rows.first, rows.passed) == ([6, 40], 0, [1])
    assert low("scalar_suffix").sizes == []   # suffix and scalar modes need no dims
    # The batch norm task passes n, C and H*W, nothing per input.
    args = generated("norm_batchnorm2d_eval").program.launches[0].args
    assert args[-3:] == ["int64(out.numel)", "int64(out.shape[1])", "int64(out.shape[2] * out.shape[3])"]


def _layout_args(case: str):
    module, inputs, names = EMU_CASES[case]
    graph = generate_from_graph(capture_module(module, inputs, case, names)).groups[0].graph
    shape = tuple(graph.value(graph.outputs[0]).shape)
    accesses = []
    for v in graph.inputs:
        aligned = (1,) * (len(shape) - len(v.shape)) + tuple(v.shape)
        accesses.append(lp._Access(v, "in_" + v.name, lp._mode(aligned, shape), aligned))
    return shape, "out", accesses


def test_sizes_are_literals_for_the_generation_shapes_and_indices_32_bit():
    src = generated("norm_batchnorm2d_eval").program.source
    assert "if (a_n == 67108864LL && a_d1 == 64LL && a_d2 == 16384LL) {" in src
    assert "<unsigned, true>(" in src and "67108864u, 64u, 16384u);" in src
    assert "<unsigned, false>(" in src and "(unsigned)a_d2);" in src          # other shapes: a scalar loop
    assert "<unsigned long long, false>(" in src and "(unsigned long long)a_d2);" in src
    assert "16384ull" not in src and "<unsigned long long, true>" not in src  # 2^26 elements: 32-bit only
    assert "long long rem" not in src and " % d" in src
    plain = generated("act_gelu").program.source   # nothing is divided: no literals, vectors in 32 bits
    assert "a_n ==" not in plain and "<unsigned, true>(in_x, o_out, (unsigned)a_n);" in plain
    assert "<unsigned long long, false>(in_x, o_out, (unsigned long long)a_n);" in plain
    with pytest.MonkeyPatch.context() as mp:       # shapes that need 64-bit indices get vectors there
        mp.setattr(lp, "INDEX32_LIMIT", 16)
        big = emu_program.__wrapped__("bn_eval", True).source
    assert "<unsigned long long, true>(" in big and "240ull, 3ull, 40ull);" in big and "240u," not in big
    assert "<= 16LL) {" in big


@needs_nvrtc
def test_a_program_over_2_to_the_32_elements_has_64_bit_literal_sizes():
    class Big(torch.nn.Module):
        def forward(self, x, s):
            return (x * s).half()

    inputs = [torch.empty(65536, 65536, dtype=torch.float16, device="meta"),
              torch.empty(65536, 1, dtype=torch.float32, device="meta")]
    gen = generate_from_graph(capture_module(Big(), inputs, "big", ["x", "s"]))
    src = gen.program.source
    assert "<unsigned long long, true>(" in src and "4294967296ull, 65536ull);" in src and "4294967296u," not in src
    env = {"x": TensorInfo((65536, 65536), "float16"), "s": TensorInfo((65536, 1), "float32")}
    # The per-row fp32 value is read once per vector, so VEC=8 of fp16 is legal (16-byte accesses).
    for schedule in (gen.spec.default(), {"BLOCK": 256, "VEC": 8, "ITEMS": 2, "GRID": 16384}):
        assert gen.spec.legal(schedule)
        program = gen.program.with_schedule(schedule)
        program.resolve(env, LaunchLimits())
        for arch in ARCHS:
            result = compile_cuda(program.source, arch=arch, options=program.compile_options())
            assert result.ok, result.error_summary()


def test_vector_loads_of_general_inputs_count_in_the_access_width():
    class Wide(torch.nn.Module):             # b [4, 1, 8] float32 varies innermost: a VEC-wide fp32 load
        def forward(self, x, b):
            return (x * b).half()

    gen = generate_from_graph(capture_module(Wide(), [_r(4, 16, 8, dtype=H), _r(4, 1, 8)], "wide", ["x", "b"]))
    assert "16 bytes" in gen.spec.why_illegal({"BLOCK": 64, "VEC": 8, "ITEMS": 1, "GRID": 0})
    assert gen.spec.legal({"BLOCK": 64, "VEC": 4, "ITEMS": 1, "GRID": 0})


@needs_nvrtc
@pytest.mark.parametrize("case", list(EMU_CASES))
def test_emulated_cases_compile_with_nvrtc(case, tmp_path_factory):
    cache = CompileCache(tmp_path_factory.getbasetemp() / "codegen-cache")
    runs = [r for r in EMU_RUNS if r.case == case and not r.other and not r.pad][:2]
    jobs = [(r.schedule, arch, False) for r in runs for arch in ARCHS] + [(runs[-1].schedule, "sm_90", True)]

    def build(job):
        (block, vec, items, grid), arch, index64 = job
        p = emu_program(case, index64).with_schedule({"BLOCK": block, "VEC": vec, "ITEMS": items, "GRID": grid})
        return job, compile_cuda(p.source, arch=arch, options=p.compile_options(), cache=cache)

    with ThreadPoolExecutor(2) as pool:
        for job, result in pool.map(build, jobs):
            assert result.ok, f"{case} {job}:\n{result.error_summary()}"
