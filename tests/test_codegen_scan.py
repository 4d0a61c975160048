"""Scan family (core/codegen/lower_scan.py): the example scan tasks and small modules capture to one
scan group, the plan's buffers match the interpreted graph's outputs, flip -> cumsum -> flip is one
reverse-scan kernel, the source compiles with NVRTC for sm_80 and sm_90 at the default and
sampled schedules, and the constraints mask what they should.

No GPU here, so the generated kernels also RUN on the CPU: the source is compiled with g++ under
a small emulation of CUDA (one OS thread per CUDA thread, one block at a time; __syncthreads is a
block barrier, the shuffles exchange values through per-warp slots between two warp barriers,
__shared__ is `static`). That executes the real index math, tiles, carries, vector / scalar
paths, mirrored accesses, warp / sub-warp / block-wide scans and the SPLIT pass on small shapes,
and compares with eager PyTorch. A kernel that skips a barrier in one thread deadlocks the
emulation, which the barrier reports instead of hanging.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from core.codegen import CodegenError, Graph
from core.codegen.capture import capture, capture_module
from core.codegen.interpret import interpret
from core.codegen.lower_scan import FLIP, is_scan, lower_scan
from core.codegen.pointwise_ops import is_pointwise
from core.program import KernelProgram, LaunchLimits, ScalarArg, TensorArg, TensorInfo
from core.search.space import ScheduleSpace, env_from_task
from core.tasks import load_task
from core.toolchain import CompileCache, compile_cuda, nvrtc_info

TASKS = Path(__file__).resolve().parents[1] / "resources" / "tasks"
EXAMPLES = ["scan_cumsum", "scan_cumprod", "scan_cumsum_reverse", "scan_masked_cumsum"]
ARCHS = ("sm_80", "sm_90")
GXX = shutil.which("g++")
needs_nvrtc = pytest.mark.skipif(not nvrtc_info()[0], reason="NVRTC is not available")
needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ is not available")


# ---- small modules ------------------------------------------------------------------------------

class Cumsum(torch.nn.Module):
    def __init__(self, dim: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.dim, self.dtype = dim, dtype

    def forward(self, x):
        return torch.cumsum(x, dim=self.dim, dtype=self.dtype)


class MaskedCumsum(torch.nn.Module):
    def forward(self, x, mask):
        return torch.cumsum(x * mask, dim=-1)


class ReverseExclusive(torch.nn.Module):
    """Reverse cumsum and its exclusive form (`rev - x`), plus the unflipped scan of the flip."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        f = torch.cumsum(torch.flip(x, dims=[self.dim]), dim=self.dim)
        rev = torch.flip(f, dims=[self.dim])
        return rev, rev - x, f * 0.5


class Cumprod(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.cumprod(x, dim=self.dim)


class LogCumSumExp(torch.nn.Module):
    def forward(self, x):
        return torch.logcumsumexp(x, dim=1)


class BoolCumsum(torch.nn.Module):
    def forward(self, m):
        return torch.cumsum(m, dim=0)


class BroadcastRows(torch.nn.Module):
    """Row scan whose prologue reads a per-row constant and a per-column weight."""

    def forward(self, x, w, b):
        return torch.cumsum(x * w + b, dim=-1) * 2.0 - b


class BroadcastCols(torch.nn.Module):
    """Column scan with inputs that broadcast along outer, scanned and inner dims."""

    def forward(self, x, w, u, v):
        return torch.cumsum(x * w + u - v, dim=1)


class HalfCumsum(torch.nn.Module):
    def forward(self, x):
        return torch.cumsum(x.half(), dim=-1).float()


class RunningMax(torch.nn.Module):
    """cummax / cummin with a prologue, an epilogue on the values, and the indices returned."""

    def __init__(self, dim: int, op=torch.cummax, reverse: bool = False):
        super().__init__()
        self.dim, self.op, self.reverse = dim, op, reverse

    def forward(self, x):
        y = torch.flip(x, dims=[self.dim]) if self.reverse else x
        values, indices = self.op(y * 2 - 1, dim=self.dim)
        if self.reverse:
            values, indices = torch.flip(values, dims=[self.dim]), torch.flip(indices, dims=[self.dim])
        return values + 0.5, indices


class RunningBool(torch.nn.Module):
    """cummax of a mask (a running any) or cummin (a running all), with the indices."""

    def __init__(self, dim: int, op=torch.cummax):
        super().__init__()
        self.dim, self.op = dim, op

    def forward(self, m):
        return self.op(m, dim=self.dim)


def _rand(*shape, lo=0.0, hi=1.0, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=torch.float64)).to(dtype)


def _lse_input() -> torch.Tensor:
    x = _rand(5, 300, lo=-4.0, hi=4.0, seed=3)
    x[1, :7] = float("-inf")            # a leading run of -inf: stays -inf
    x[2, 50] = float("inf")             # +inf from there on
    x[3, 120] = float("nan")            # NaN from there on
    return x


def _ties(*shape, seed=0, dtype=torch.float32) -> torch.Tensor:
    """Values on a grid of eight, so running maxima and minima meet many ties."""
    return (torch.floor(_rand(*shape, hi=8.0, seed=seed, dtype=torch.float64)) / 8).to(dtype)


def _with_nans(*shape, seed=0) -> torch.Tensor:
    x = _ties(*shape, seed=seed)
    x[0, 5] = x[0, 40] = float("nan")        # two NaNs in row 0: the index moves to the later one (as eager)
    x[1, 0] = float("nan")
    return x


# name -> (module, inputs, input names); shapes chosen to hit tails, both layouts and the paths.
CASES = {
    "masked_rows": (MaskedCumsum(), [_rand(3, 1000), _rand(3, 1000, seed=1) < 0.5], ["x", "mask"]),
    "reverse_rows_odd": (ReverseExclusive(1), [_rand(3, 1003, lo=-1.0)], ["x"]),
    "reverse_rows": (ReverseExclusive(-1), [_rand(2, 2, 1000, lo=-1.0)], ["x"]),
    "cumprod_short": (Cumprod(1), [_rand(50, 64, lo=0.5, hi=1.5)], ["x"]),
    "cols": (Cumsum(1, torch.float64), [_rand(3, 37, 8, lo=-1.0)], ["x"]),
    "reverse_cols": (ReverseExclusive(0), [_rand(40, 6, lo=-1.0)], ["x"]),
    "cols_split": (Cumsum(0), [_rand(300, 8, lo=-1.0)], ["x"]),
    "rows_split": (Cumsum(1), [_rand(2, 5000, lo=-1.0)], ["x"]),
    "lse": (LogCumSumExp(), [_lse_input()], ["x"]),
    "bool_cols": (BoolCumsum(), [_rand(33, 10, seed=5) < 0.3], ["m"]),
    "broadcast_rows": (BroadcastRows(), [_rand(3, 4, 100), _rand(4, 1, seed=1), _rand(100, seed=2)], ["x", "w", "b"]),
    "broadcast_cols": (BroadcastCols(), [_rand(2, 5, 6, 3), _rand(5, 1, 1, seed=1), _rand(6, 3, seed=2),
                                         _rand(2, 1, 6, 1, seed=3)], ["x", "w", "u", "v"]),
    "half": (HalfCumsum(), [_rand(4, 256)], ["x"]),
    "cummax_rows": (RunningMax(1), [_ties(3, 1003)], ["x"]),
    "cummin_rows_reverse": (RunningMax(-1, torch.cummin, reverse=True), [_ties(2, 3, 300, seed=1)], ["x"]),
    "cummax_cols": (RunningMax(0), [_ties(40, 6, seed=2)], ["x"]),
    "cummin_cols_int": (RunningMax(1, torch.cummin), [(_ties(3, 37, 5, seed=3) * 8).to(torch.int32)], ["x"]),
    "cummax_half": (RunningMax(1), [_ties(4, 256, seed=4, dtype=torch.float16)], ["x"]),
    "cummax_nan": (RunningMax(1), [_with_nans(3, 200, seed=5)], ["x"]),
    "cummax_bool": (RunningBool(1), [_rand(3, 100, seed=6) > 0.9], ["m"]),
    "cummin_bool_cols": (RunningBool(0, torch.cummin), [_rand(40, 7, seed=7) > 0.1], ["m"]),
}


# Cases captured (so lowered, with their defaults and SPLIT offer) at a bigger shape than they run
# at: the plan is shape-generic, and the CPU emulation of 2 x 64K elements would take seconds.
CAPTURE_SHAPES = {"cols_split": [(16384, 8)], "rows_split": [(2, 65536)]}


@lru_cache(maxsize=None)
def case_graph(name: str) -> Graph:
    module, inputs, names = CASES[name]
    if name in CAPTURE_SHAPES:
        inputs = [torch.empty(shape, dtype=t.dtype, device="meta") for shape, t in zip(CAPTURE_SHAPES[name], inputs)]
    return capture_module(module, inputs, name, names)


@lru_cache(maxsize=None)
def case_lowering(name: str):
    return lower_scan(case_graph(name), f"{name}_scan")


@lru_cache(maxsize=None)
def task(name: str):
    return load_task(TASKS / f"{name}.py")


@lru_cache(maxsize=None)
def task_graph(name: str) -> Graph:
    return capture(task(name))


@lru_cache(maxsize=None)
def task_lowering(name: str):
    return lower_scan(task_graph(name), f"{name}_scan")


def _env(inputs: list, names: list[str]) -> dict:
    return {n: TensorInfo(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in zip(names, inputs)}


# ---- capture, grouping and plans ----------------------------------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_example_is_one_scan_group_whose_buffers_match_the_interpreted_outputs(name):
    graph = task_graph(name)
    scans = [n for n in graph.nodes if is_scan(n, graph)]
    assert len(scans) == 1
    assert all(n in scans or n.op == FLIP or is_pointwise(n) for n in graph.nodes)
    low = task_lowering(name)
    program = KernelProgram.from_json(low.program)
    assert program.tunables == low.spec.tunables() and program.schedule == low.spec.default()
    assert low.spec.legal(low.spec.default())
    plan = program.resolve(env_from_task(task(name)))
    meta = [torch.empty(spec.shape, dtype=getattr(torch, spec.dtype), device="meta")
            for spec in task(name).input_specs]
    expected = interpret(graph, dict(zip(task(name).input_names, meta)))
    got = [(b.shape, b.dtype) for b in plan.buffers if b.name in plan.outputs]
    assert got == [(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in expected]
    assert plan.outputs == tuple(graph.outputs)
    # 16384 rows of 4096 (or 1M rows of 64): one pass, no chunk-total kernel.
    assert [launch.kernel for launch in plan.launches] == [f"{name}_scan"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_small_module_buffers_match_the_interpreted_outputs(name):
    module, inputs, names = CASES[name]
    program = KernelProgram.from_json(case_lowering(name).program)
    plan = program.resolve(_env(inputs, names))
    outs = interpret(case_graph(name), dict(zip(names, inputs)))
    got = [(b.shape, b.dtype) for b in plan.buffers if b.name in plan.outputs]
    assert got == [(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in outs]


def test_reverse_cumsum_is_one_reverse_scan_kernel_without_a_flipped_copy():
    graph = task_graph("scan_cumsum_reverse")
    assert graph.ops() == ["flip.default", "cumsum.default", "flip.default"]
    low = task_lowering("scan_cumsum_reverse")
    program = low.program
    assert [b["name"] for b in program["buffers"]] == ["flip_1"]          # the output only
    assert len(program["launches"]) == 1
    assert KernelProgram.from_json(program).kernel_names() == ["scan_cumsum_reverse_scan"]
    src = program["source"]
    assert "(L - VEC - q)" in src and "t.v[VEC - 1 - j]" in src            # mirrored vector loads
    assert "w_o_flip_1.v[VEC - 1 - j]" in src                               # and mirrored stores
    assert any("reverse" in n for n in low.notes)
    # The forward scan reads and writes in memory order.
    fwd = task_lowering("scan_cumsum").program["source"]
    assert "(L - VEC - q)" not in fwd and "VEC - 1 - j" not in fwd


def test_scan_dtypes_and_accumulators():
    assert "typedef double" in task_lowering("scan_cumsum").program["source"]
    low = case_lowering("bool_cols")                                         # bool -> int64, as torch
    assert low.program["buffers"][0]["dtype"] == "int64"
    assert "typedef long long" in low.program["source"]
    assert "typedef float" in case_lowering("lse").program["source"]
    assert "typedef double" in case_lowering("cols").program["source"]       # dtype=float64
    assert case_lowering("cols").program["buffers"][0]["dtype"] == "float64"


def test_rows_and_columns_layouts_and_split_plans():
    assert "_rows<" in case_lowering("masked_rows").program["source"]
    assert "_cols<" in case_lowering("cols").program["source"]
    # 2 rows of 64K: a chunk-total pass, a scratch buffer of rows * SPLIT carries, SPLIT chunks
    # (resolved here for 2 rows of 5000).
    module, inputs, names = CASES["rows_split"]
    low = case_lowering("rows_split")
    assert low.spec.default() == {"BLOCK": 64, "LANES": 0, "VEC": 4, "ITEMS": 1, "SPLIT": 256}
    program = KernelProgram.from_json(low.program)
    sched = {**low.spec.default(), "SPLIT": 4}
    assert low.spec.legal(sched)
    plan = program.with_schedule(sched).resolve(_env(inputs, names))
    assert [launch.kernel for launch in plan.launches] == ["rows_split_scan_2", "rows_split_scan"]
    assert plan.launches[0].grid == (2, 3, 1) and plan.launches[1].grid == (2, 4, 1)
    assert [(b.name, b.shape, b.dtype) for b in plan.buffers] == [
        ("cumsum", (2, 5000), "float32"), ("scan_partials", (8,), "float64")]
    # SPLIT=1 keeps the first launch to one block that returns at once.
    plan = program.with_schedule({**sched, "SPLIT": 1}).resolve(_env(inputs, names))
    assert plan.launches[0].grid == (1, 1, 1) and plan.launches[1].grid == (2, 1, 1)
    # 2 rows of 1M: tiles small enough for 4 blocks per SM once split.
    big = lower_scan(capture_module(Cumsum(1), [torch.empty(2, 1 << 20, device="meta")], "big", ["x"]), "big_scan")
    assert big.spec.default() == {"BLOCK": 128, "LANES": 0, "VEC": 4, "ITEMS": 4, "SPLIT": 256}
    # 300 rows of 8192 fill the GPU without splitting: no SPLIT knob, no second kernel.
    fill = lower_scan(capture_module(Cumsum(1), [torch.empty(300, 8192, device="meta")], "fill", ["x"]), "fill")
    assert "SPLIT" not in fill.spec.tunables() and len(fill.program["launches"]) == 1
    assert "fill_2" not in fill.program["source"] and len(fill.program["buffers"]) == 1
    # Sub-warp rows: BLOCK / LANES rows per block.
    cp = task_lowering("scan_cumprod")
    plan = KernelProgram.from_json(cp.program).resolve(env_from_task(task("scan_cumprod")))
    assert cp.spec.default()["LANES"] == 16
    assert plan.launches[0].grid == (1048576 // (256 // 16), 1, 1) and plan.launches[0].block == (256, 1, 1)
    # Columns: one thread per VEC columns of each outer index.
    low = case_lowering("cols")
    plan = KernelProgram.from_json(low.program).with_schedule(
        {"BLOCK": 64, "VEC": 4, "ITEMS": 2}).resolve(_env(CASES["cols"][1], ["x"]))
    assert plan.launches[0].grid == (1, 1, 1)                                # 3 * 8 / 4 = 6 threads
    assert [a.value for a in plan.launches[0].args if isinstance(a, ScalarArg)] == [3, 37, 8]


def test_constraints_mask_illegal_and_wasteful_schedules():
    spec = task_lowering("scan_cumsum").spec                    # fp32 [16384, 4096]
    base = spec.default()
    assert base == {"BLOCK": 256, "LANES": 32, "VEC": 4, "ITEMS": 4}
    assert "16 bytes" in spec.why_illegal({**base, "VEC": 8})
    assert "more than 16" in spec.why_illegal({**base, "LANES": 0, "ITEMS": 8, "VEC": 4})
    assert spec.legal({**base, "LANES": 0, "ITEMS": 4, "VEC": 4, "BLOCK": 256})
    assert spec.legal({**base, "ITEMS": 8})
    assert "not one of" in spec.why_illegal({**base, "LANES": 2})
    cp = task_lowering("scan_cumprod").spec                     # rows of 64
    assert "half as many items" in cp.why_illegal({**cp.default(), "ITEMS": 2})
    assert "half of them" in cp.why_illegal({**cp.default(), "LANES": 32})
    assert cp.legal({**cp.default(), "LANES": 32, "VEC": 2})
    odd = case_lowering("reverse_rows_odd").spec                # rows of 1003
    assert odd.default()["VEC"] == 1
    assert "does not divide" in odd.why_illegal({**odd.default(), "VEC": 2})
    few = case_lowering("masked_rows").spec                     # 3 rows of 1000
    assert "only 3 rows" in few.why_illegal({**few.default(), "LANES": 32, "BLOCK": 256})
    cols = case_lowering("cols").spec                           # [3, 37, 8] over dim 1, fp64 output
    assert "16 bytes" in cols.why_illegal({**cols.default(), "VEC": 4})
    assert "only 12 column groups" in cols.why_illegal({**cols.default(), "BLOCK": 256, "VEC": 2})
    split = case_lowering("cols_split").spec                    # [16384, 8] over dim 0: 8 lines
    assert split.default() == {"BLOCK": 64, "VEC": 4, "ITEMS": 4, "SPLIT": 64}
    assert "chunks of 64, shorter than 1024" in split.why_illegal({**split.default(), "SPLIT": 256})
    for low in [task_lowering(n) for n in EXAMPLES] + [case_lowering(n) for n in CASES]:
        assert low.spec.legal(low.spec.default())


def test_search_space_plugs_in_the_constraints():
    t = task("scan_masked_cumsum")
    low = task_lowering("scan_masked_cumsum")
    program = KernelProgram.from_json(low.program)
    space = ScheduleSpace.from_program(program, t, constraints=low.spec.constraints)
    assert space.legal(space.default())
    legal = sorted(space.key(s) for s in space.enumerate())
    assert legal == sorted(space.key(s) for s in low.spec.enumerate() if space.legal(s))
    assert len(legal) >= 20
    mask = space.mask(space.default())
    assert any(mask) and not all(mask)


def test_groups_the_family_cannot_lower_are_refused_clearly():
    class TwoScans(torch.nn.Module):
        def forward(self, x):
            return torch.cumsum(torch.cumsum(x, 1), 1)

    class FlipOtherDim(torch.nn.Module):
        def forward(self, x):
            return torch.flip(torch.cumsum(x, 1), dims=[0])

    class MixedOrientation(torch.nn.Module):
        def forward(self, x):
            return torch.cumsum(torch.flip(x, dims=[1]) + x, 1)

    x = torch.rand(4, 8)
    with pytest.raises(CodegenError, match=r"Task 'two': the scan family lowers one .* this group has 2 scans\."):
        lower_scan(capture_module(TwoScans(), [x], "two", ["x"]), "k")
    with pytest.raises(CodegenError, match=r"Task 'flip0': 'flip' flips dim 0 .* not the scanned dim 1"):
        lower_scan(capture_module(FlipOtherDim(), [x], "flip0", ["x"]), "k")
    with pytest.raises(CodegenError, match=r"Task 'mixed': 'add' \(add.Tensor\) combines a value with its flip"):
        lower_scan(capture_module(MixedOrientation(), [x], "mixed", ["x"]), "k")
    graph = capture_module(LogCumSumExp(), [x], "lse_int", ["x"])
    assert is_scan(graph.nodes[0], graph)


# ---- NVRTC ----------------------------------------------------------------------------------------

def _schedules(spec, seed: str, count: int) -> list[dict]:
    return [spec.default()] + spec.sample(random.Random(seed), count)


@needs_nvrtc
def test_default_and_sampled_schedules_compile_for_sm80_and_sm90(tmp_path_factory):
    cache = CompileCache(tmp_path_factory.getbasetemp() / "scan-cache")
    jobs = []
    for name in EXAMPLES:
        low = task_lowering(name)
        jobs += [(name, low, s, arch) for s in _schedules(low.spec, name, 2) for arch in ARCHS]
    # The small modules run under the CPU emulation below; here their CUDA compiles (one arch each).
    others = ("reverse_cols", "rows_split", "cols_split", "lse", "broadcast_rows", "broadcast_cols", "half",
              "bool_cols")
    for i, name in enumerate(others):
        low = case_lowering(name)
        jobs += [(name, low, s, ARCHS[i % 2]) for s in _schedules(low.spec, name, 0)]

    def build(job):
        name, low, schedule, arch = job
        program = KernelProgram.from_json(low.program).with_schedule(schedule)
        return job, compile_cuda(program.source, arch=arch, options=program.compile_options(), cache=cache)

    with ThreadPoolExecutor(2) as pool:
        for (name, _, schedule, arch), result in pool.map(build, jobs):
            assert result.ok, f"{name} {schedule} {arch}:\n{result.error_summary()}"
    # Every sampled schedule also resolves within the launch limits for the task's shapes.
    for name in EXAMPLES:
        low = task_lowering(name)
        for schedule in _schedules(low.spec, name, 2):
            KernelProgram.from_json(low.program).with_schedule(schedule).resolve(env_from_task(task(name)),
                                                                                 LaunchLimits())


# ---- running the kernels on the CPU ---------------------------------------------------------------

# Split reductions' arrival counting (lower_reduce's last-block merge), for the emulations here and
# in test_codegen_reduce: blocks run one after another, so plain memory is coherent.
SPLIT_STANDINS = r"""
static inline void __threadfence() {}
// Atomics: the threads of a block run concurrently (the scatter family's updates, arrival counts).
static inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
template <class T> static inline T ca_atomic_add_float(T* p, T v) {
    T old = *p, next;
    do { next = old + v; } while (!__atomic_compare_exchange(p, &old, &next, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return old;
}
static inline float atomicAdd(float* p, float v) { return ca_atomic_add_float(p, v); }
static inline double atomicAdd(double* p, double v) { return ca_atomic_add_float(p, v); }
template <class T> static inline T atomicCAS(T* p, T expected, T desired) {
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expected;                                   // the old value, whether or not it swapped
}
template <class T> static inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
template <class T> T __ldcg(const T* p) { return *p; }
"""

EMULATION = r"""
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct ca_dim3 { unsigned x = 1, y = 1, z = 1; };
thread_local ca_dim3 threadIdx, blockIdx;
// The thread's number in its block, x fastest: warps are 32 consecutive numbers, as on the GPU
// (1-D, 2-D and 3-D blocks alike).
thread_local unsigned ca_lin;
ca_dim3 blockDim, gridDim;

// A reusable barrier that reports a deadlock (a thread that skipped it) instead of hanging.
struct CaBarrier {
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    int count = 0, n = 0;
    long gen = 0;
    void reset(int threads) { n = threads; count = 0; }
    void wait(const char* what) {
        pthread_mutex_lock(&m);
        const long g = gen;
        if (++count == n) {
            count = 0;
            ++gen;
            pthread_cond_broadcast(&cv);
            pthread_mutex_unlock(&m);
            return;
        }
        timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += 20;
        while (gen == g) {
            if (pthread_cond_timedwait(&cv, &m, &deadline)) {
                fprintf(stderr, "deadlock at %s: %d of %d threads arrived\n", what, count, n);
                _Exit(3);
            }
        }
        pthread_mutex_unlock(&m);
    }
};
static CaBarrier ca_block_barrier;
static CaBarrier ca_warp_barrier[32];
static unsigned long long ca_slot[32][32];

inline void __syncthreads() { ca_block_barrier.wait("__syncthreads"); }

template <class T> T ca_exchange(T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    const int w = ca_lin / 32, lane = ca_lin % 32;
    memcpy(&ca_slot[w][lane], &v, sizeof(T));
    ca_warp_barrier[w].wait("a shuffle");
    T out;
    memcpy(&out, &ca_slot[w][src], sizeof(T));
    ca_warp_barrier[w].wait("a shuffle");
    return out;
}
template <class T> T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
    const int lane = ca_lin % 32, base = lane / width * width, src = lane - (int)delta;
    return ca_exchange(v, src < base ? lane : src);
}
template <class T> T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
    const int lane = ca_lin % 32, base = lane / width * width, src = lane + (int)delta;
    return ca_exchange(v, src >= base + width ? lane : src);
}
template <class T> T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
    const int lane = ca_lin % 32, base = lane / width * width, src = lane ^ mask;
    return ca_exchange(v, src < base || src >= base + width ? lane : src);
}
template <class T> T __shfl_sync(unsigned, T v, int src, int width = 32) {
    const int lane = ca_lin % 32, base = lane / width * width;
    return ca_exchange(v, base + src % width);
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define __shared__ static
#define CA_HD inline

struct CaArg {
    void* p;
    long long i;
    double f;
    template <class T> operator T*() const { return (T*)p; }
    operator long long() const { return i; }
    operator int() const { return (int)i; }
    operator unsigned long long() const { return (unsigned long long)i; }
    operator unsigned() const { return (unsigned)i; }
    operator double() const { return f; }
    operator float() const { return (float)f; }
};

template <class F> struct CaThread { F* fn; unsigned tx; ca_dim3 block; };
template <class F> void* ca_thread_main(void* arg) {
    CaThread<F>* t = (CaThread<F>*)arg;
    ca_lin = t->tx;
    threadIdx = ca_dim3{t->tx % blockDim.x, (t->tx / blockDim.x) % blockDim.y, t->tx / (blockDim.x * blockDim.y)};
    blockIdx = t->block;
    (*t->fn)();
    return nullptr;
}
// Blocks run one after another (so `static` shared memory is private to the running block);
// the threads of a block run concurrently.
template <class F> void ca_launch(F fn, ca_dim3 grid, ca_dim3 block) {
    gridDim = grid;
    blockDim = block;
    const unsigned n = block.x * block.y * block.z;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    pthread_t* threads = (pthread_t*)malloc(n * sizeof(pthread_t));
    CaThread<F>* ctx = (CaThread<F>*)malloc(n * sizeof(CaThread<F>));
    for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
        ca_block_barrier.reset((int)n);
        for (unsigned w = 0; w < (n + 31) / 32; ++w) ca_warp_barrier[w].reset(32);
        for (unsigned t = 0; t < n; ++t) {
            ctx[t] = CaThread<F>{&fn, t, ca_dim3{bx, by, bz}};
            if (pthread_create(&threads[t], &attr, ca_thread_main<F>, &ctx[t])) { perror("pthread"); _Exit(4); }
        }
        for (unsigned t = 0; t < n; ++t) pthread_join(threads[t], nullptr);
    }
    free(threads);
    free(ctx);
}
// Exactly n bytes (AddressSanitizer reports any access past them), 256-byte aligned like cudaMalloc.
static unsigned char* ca_alloc(size_t n, int fill) {
    void* p = nullptr;
    if (posix_memalign(&p, 256, n ? n : 1)) _Exit(7);
    memset(p, fill, n);
    return (unsigned char*)p;
}
static unsigned char* ca_read(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) { perror(path); _Exit(5); }
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char* data = ca_alloc(n, 0);
    if (fread(data, 1, n, f) != (size_t)n) _Exit(6);
    fclose(f);
    return data;
}
static void ca_write(const char* path, const void* data, size_t n) {
    FILE* f = fopen(path, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
}
""" + SPLIT_STANDINS

# Out-of-bounds and misaligned (vector) accesses, out-of-range local array indices: the run fails.
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                "int64": torch.int64, "bool": torch.bool}


def emulated_launch(launch, names: dict[str, str]) -> str:
    """The EMULATION call of one plan launch; `names` maps the plan's tensors to C++ variables."""
    args = []
    for a in launch.args:
        if isinstance(a, TensorArg):
            args.append(f"CaArg{{{names[a.name]}, 0, 0.0}}")
        else:
            assert isinstance(a, ScalarArg)
            args.append(f"CaArg{{nullptr, {int(a.value)}LL, {float(a.value)!r}}}")
    block = (list(launch.block) + [1, 1])[:3]
    return (f"ca_launch([&] {{ {launch.kernel}({', '.join(args)}); }}, "
            f"ca_dim3{{{launch.grid[0]}, {launch.grid[1]}, {launch.grid[2]}}}, "
            f"ca_dim3{{{block[0]}, {block[1]}, {block[2]}}});")


def _harness(program: KernelProgram, plan, inputs: dict[str, torch.Tensor]) -> str:
    lines = [EMULATION, program.source, "int main() {"]
    for i, name in enumerate(inputs):
        lines.append(f'    unsigned char* b_{name} = ca_read("in{i}.bin");')
    for buf in plan.buffers:
        nbytes = torch.empty(buf.shape, dtype=TORCH_DTYPES[buf.dtype], device="meta").nbytes
        # Garbage, not zeros: a kernel must not rely on fresh buffers being cleared.
        lines.append(f"    unsigned char* b_{buf.name} = ca_alloc({nbytes}, {0 if buf.zeroed else 0xA5});")
    for launch in plan.launches:
        lines.append("    " + emulated_launch(launch, {b: f"b_{b}" for b in [*inputs, *(x.name for x in plan.buffers)]}))
    for i, name in enumerate(plan.outputs):
        buf = next(b for b in plan.buffers if b.name == name)
        nbytes = torch.empty(buf.shape, dtype=TORCH_DTYPES[buf.dtype], device="meta").nbytes
        lines.append(f'    ca_write("out{i}.bin", b_{name}, {nbytes});')
    lines += ["    return 0;", "}"]
    return "\n".join(lines)


def emulate(name: str, schedule: dict) -> list[torch.Tensor]:
    """Run the generated program for CASES[name] at `schedule` on the CPU; its outputs."""
    module, inputs, names = CASES[name]
    program = KernelProgram.from_json(case_lowering(name).program).with_schedule(schedule)
    plan = program.resolve(_env(inputs, names))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for i, t in enumerate(inputs):
            (work / f"in{i}.bin").write_bytes(t.contiguous().numpy().tobytes())
        (work / "main.cpp").write_text(_harness(program, plan, dict(zip(names, inputs))))
        options = [o for o in program.compile_options()]
        build = subprocess.run([GXX, "-std=c++17", "-O1", "-w", "-pthread", *SANITIZE, *options, "main.cpp", "-o", "main"],
                               cwd=work, capture_output=True, text=True, timeout=240)
        assert build.returncode == 0, f"{name} {schedule}: g++ failed:\n{build.stderr[:4000]}"
        env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0"}
        run = subprocess.run(["./main"], cwd=work, capture_output=True, text=True, timeout=240, env=env)
        assert run.returncode == 0, f"{name} {schedule}: the emulated kernels failed:\n{run.stderr[:2000]}"
        outs = []
        for i, oname in enumerate(plan.outputs):
            buf = next(b for b in plan.buffers if b.name == oname)
            data = bytearray((work / f"out{i}.bin").read_bytes())
            outs.append(torch.frombuffer(data, dtype=TORCH_DTYPES[buf.dtype]).reshape(buf.shape).clone())
        return outs


# (case, schedule overrides): warp, sub-warp and block-wide rows, several tiles per row, the vector
# and the scalar paths, reverse, columns with tails, SPLIT, int64, logcumsumexp, broadcasting.
EMULATED = [
    ("masked_rows", {"LANES": 32, "BLOCK": 64, "VEC": 4, "ITEMS": 2}),        # 4 tiles of 256, vector path
    ("masked_rows", {"LANES": 0, "BLOCK": 64, "VEC": 2, "ITEMS": 2}),         # block rows, 4 tiles of 256
    ("reverse_rows_odd", {"LANES": 8, "BLOCK": 64, "VEC": 1, "ITEMS": 4}),    # scalar path, sub-warp, reverse
    ("reverse_rows_odd", {"LANES": 0, "BLOCK": 128, "VEC": 1, "ITEMS": 2}),   # block rows, reverse, tail tile
    ("reverse_rows", {"LANES": 16, "BLOCK": 64, "VEC": 4, "ITEMS": 4}),       # reverse vector loads / stores
    ("cumprod_short", {}),                                                    # default: LANES 16, 4 rows per warp
    ("cols", {"BLOCK": 64, "VEC": 2, "ITEMS": 4}),                            # columns, fp64 result, L tail
    ("reverse_cols", {"BLOCK": 64, "VEC": 2, "ITEMS": 8}),                    # columns, reverse + epilogue
    ("cols_split", {"BLOCK": 64, "VEC": 1, "ITEMS": 2, "SPLIT": 4}),          # column chunks + carries
    ("rows_split", {"LANES": 0, "BLOCK": 64, "VEC": 4, "ITEMS": 4, "SPLIT": 4}),      # block rows, 4 chunks
    ("rows_split", {"LANES": 32, "BLOCK": 64, "VEC": 4, "ITEMS": 8, "SPLIT": 2}),     # warp rows, 2 chunks
    ("lse", {}),
    ("bool_cols", {}),
    ("broadcast_rows", {"LANES": 16, "BLOCK": 64, "VEC": 4, "ITEMS": 1}),
    ("broadcast_cols", {}),
    ("half", {}),
    ("cummax_rows", {"LANES": 32, "BLOCK": 64, "VEC": 1, "ITEMS": 4}),       # warp rows, scalar path, tail
    ("cummax_rows", {"LANES": 0, "BLOCK": 128, "VEC": 1, "ITEMS": 2}),       # block rows: warp totals
    ("cummin_rows_reverse", {"LANES": 8, "BLOCK": 64, "VEC": 2, "ITEMS": 2}),    # reverse, sub-warp, vectors
    ("cummin_rows_reverse", {"LANES": 0, "BLOCK": 64, "VEC": 2, "ITEMS": 1}),
    ("cummax_cols", {"BLOCK": 64, "VEC": 2, "ITEMS": 4}),
    ("cummin_cols_int", {"BLOCK": 64, "VEC": 1, "ITEMS": 8}),
    ("cummax_half", {}),
    ("cummax_nan", {"LANES": 16, "BLOCK": 64, "VEC": 2, "ITEMS": 2}),
    ("cummax_bool", {"LANES": 32, "BLOCK": 64, "VEC": 2, "ITEMS": 2}),
    ("cummax_bool", {"LANES": 0, "BLOCK": 64, "VEC": 1, "ITEMS": 1}),
    ("cummin_bool_cols", {"BLOCK": 64, "VEC": 1, "ITEMS": 4}),
]


@needs_gxx
def test_generated_kernels_run_correctly_under_cpu_emulation():
    jobs = []
    for name, overrides in EMULATED:
        spec = case_lowering(name).spec
        schedule = {**spec.default(), **overrides}
        assert spec.legal(schedule), f"{name} {schedule}: {spec.why_illegal(schedule)}"
        jobs.append((name, schedule))
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda job: (job, emulate(*job)), jobs))
    for (name, schedule), outs in results:
        module, inputs, _ = CASES[name]
        expected = module(*inputs)
        expected = list(expected) if isinstance(expected, tuple) else [expected]
        assert len(outs) == len(expected)
        for got, want in zip(outs, expected):
            assert got.dtype == want.dtype and got.shape == want.shape, (name, schedule)
            if want.dtype in (torch.int64, torch.bool):
                assert torch.equal(got, want), (name, schedule)
            else:
                tol = 1e-2 if name == "half" else 1e-4
                torch.testing.assert_close(got, want, atol=tol, rtol=tol, equal_nan=True,
                                           msg=lambda m: f"{name} {schedule}: {m}")
