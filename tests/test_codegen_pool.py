"""The pooling family (core/codegen/lower_pool.py) without a GPU.

- The six pool example tasks and small modules with odd settings (ceil_mode, padding, dilation,
  count_include_pad=False, divisor_override, 3-D, fp16/bf16/fp64, indices, epilogues) lower; the
  plan's buffers have the shapes interpret.py / torch give; the output size rule is PyTorch's.
- The generated CUDA compiles with NVRTC for sm_80 and sm_90 at the default and sampled legal schedules.
- The generated code itself runs on the CPU: everything before the `__global__` (tile_of, fill,
  compute, epilogue) is host C++ when CA_HD is `inline`; a harness plays the grid (fill for every
  thread of a block, then compute: the barrier's order) for many schedules and compares with torch.
- A pure-Python emulation of the kernel's window index math (tile decode, shifted column span,
  sentinels, PyTorch's first index and divisor) against torch.nn.functional.
- The constraints mask what they should; the partitioner helpers find the pool's view chain.
"""
from __future__ import annotations

import math
import random
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from core.codegen import CodegenError
from core.codegen.capture import capture, capture_module
from core.codegen.cuda_emit import PRELUDE
from core.codegen.interpret import interpret
from core.codegen.lower_pool import (PoolGeometry, depthwise_geometry, grid3, is_pool, loaded_span, lower_pool,
                                     output_size, pool_chain, pool_geometry, schedule_spec, span, tile_cols, vec_fits,
                                     vec_shift)
from core.codegen.partition import canonicalize
from core.program import KernelProgram, LaunchLimits, ScalarArg, TensorInfo
from core.search.space import ScheduleSpace, env_from_task
from core.tasks import load_task, load_task_from_source
from core.toolchain import CompileCache, compile_cuda, nvrtc_info

TASKS_DIR = Path(__file__).resolve().parents[1] / "resources" / "tasks"
TASKS = ["pool_avg1d", "pool_avg2d", "pool_avg3d", "pool_max1d", "pool_max2d", "pool_max3d"]
ARCHS = ("sm_80", "sm_90")
GXX = shutil.which("g++")
needs_nvrtc = pytest.mark.skipif(not nvrtc_info()[0], reason="NVRTC is not available")
needs_gxx = pytest.mark.skipif(GXX is None, reason="no host C++ compiler")


class Fn(nn.Module):
    def __init__(self, fn, weight: torch.Tensor | None = None):
        super().__init__()
        self.fn = fn
        if weight is not None:
            self.scale = nn.Parameter(weight)

    def forward(self, x):
        return self.fn(self, x)


def _ints(shape, dtype=torch.float32, special=True, seed=0) -> torch.Tensor:
    """Small integers (ties on purpose), with NaN, -inf and +inf sprinkled in for max pools."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-4, 5, shape, generator=gen).to(torch.float64)
    if special:
        flat = x.view(-1)
        flat[7::37] = float("nan")
        flat[5::23] = float("-inf")
        flat[3::41] = float("inf")
    return x.to(dtype)


def _randn(shape, dtype=torch.float32, seed=0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


# name -> (forward(self, x), input, weight or None). Shapes are small: the host run plays every thread.
CASES = {
    # Ceil mode with the last window clipped by the right padding, dilation, indices returned.
    "max2d_ceil_dil_idx": (lambda m, x: F.max_pool2d(x, (3, 2), (2, 3), (1, 1), dilation=(1, 2), ceil_mode=True,
                                                     return_indices=True), _ints((2, 3, 9, 16)), None),
    # 1-D: unsqueeze -> pool2d -> squeeze for values and indices; empty stride = kernel size.
    "max1d_idx_default_stride": (lambda m, x: F.max_pool1d(x, 4, padding=2, return_indices=True),
                                 _ints((3, 2, 24)), None),
    "max1d_dilated_ceil": (lambda m, x: F.max_pool1d(x, 3, 2, 1, dilation=2, ceil_mode=True), _ints((2, 3, 20)), None),
    # Unbatched (C, H, W) and a relu * 2 epilogue in fp16.
    "max2d_unbatched_fp16_relu": (lambda m, x: F.relu(F.max_pool2d(x, 2)) * 2, _ints((3, 8, 16), torch.float16), None),
    "max3d_ceil_dil_idx": (lambda m, x: F.max_pool3d(x, (2, 3, 3), (1, 2, 2), (1, 1, 0), dilation=(2, 1, 2),
                                                     ceil_mode=True, return_indices=True),
                           _ints((2, 2, 6, 7, 12)), None),
    "max2d_bf16_idx_only": (lambda m, x: F.max_pool2d(x, 3, 1, 1, return_indices=True)[1],
                            _ints((2, 2, 5, 8), torch.bfloat16), None),
    # Average pools: padding not counted, ceil mode past the right padding, divisor_override, 3-D.
    "avg2d_ceil_nopad": (lambda m, x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                         _randn((2, 3, 8, 16)), None),
    "avg2d_ceil_pad_rect": (lambda m, x: F.avg_pool2d(x, (3, 2), (2, 1), (1, 1), ceil_mode=True),
                            _randn((2, 3, 8, 12)), None),
    "avg3d_ceil_divisor": (lambda m, x: F.avg_pool3d(x, 3, 2, 1, ceil_mode=True, divisor_override=5),
                           _randn((2, 2, 5, 6, 8)), None),
    "avg3d_nopad_fp64": (lambda m, x: F.avg_pool3d(x, (2, 3, 3), (2, 2, 1), (1, 1, 1), count_include_pad=False),
                         _randn((1, 2, 4, 5, 8), torch.float64), None),
    "avg1d_bf16_sub": (lambda m, x: F.avg_pool1d(x, 4, 3, 2, ceil_mode=True) - 1.0,
                       _randn((3, 4, 19), torch.bfloat16), None),
    # 66000 planes: more than a grid's y/z limit, so the kernel decodes its tile from a flat grid.
    "max2d_flat_grid_many_planes": (lambda m, x: F.max_pool2d(x, 2, return_indices=True),
                                    _ints((1, 65600, 2, 4)), None),
    # A per-channel weight broadcast in the epilogue, and a sigmoid.
    "avg2d_channel_scale": (lambda m, x: torch.sigmoid(F.avg_pool2d(x, 2, 2) * m.scale),
                            _randn((2, 4, 6, 8)), _randn((4, 1, 1), seed=3)),
    # Depthwise convolutions (groups = channels): windows times the channel's weights, zero padding,
    # strides, dilation, padding past half the kernel, 1-D to 3-D, fp16 with an epilogue.
    "dwconv2d_stride_dil": (lambda m, x: F.conv2d(x, m.scale, None, (2, 1), (1, 2), (1, 2), groups=3) + 0.5,
                            _randn((2, 3, 9, 16)), _randn((3, 1, 3, 3), seed=4)),
    "dwconv1d_fp16_relu": (lambda m, x: torch.relu(F.conv1d(x, m.scale, None, 1, 2, groups=4)),
                           _randn((2, 4, 24), torch.float16), _randn((4, 1, 5), torch.float16, seed=5)),
    "dwconv3d_wide_pad": (lambda m, x: F.conv3d(x, m.scale, None, (1, 2, 2), (2, 1, 3), groups=2),
                          _randn((1, 2, 5, 6, 8)), _randn((2, 1, 2, 3, 3), seed=6)),
}
DEPTHWISE = [name for name in CASES if name.startswith("dwconv")]

# The schedules the host run plays for every case: structural variety, not performance.
HOST_SCHEDULES = [
    {"BLOCK": 64, "ROWS": 1, "OUT_W": 1, "VEC": 1, "SMEM": 0},
    {"BLOCK": 64, "ROWS": 2, "OUT_W": 2, "VEC": 2, "SMEM": 0},
    {"BLOCK": 64, "ROWS": 4, "OUT_W": 4, "VEC": 4, "SMEM": 0},
    {"BLOCK": 64, "ROWS": 8, "OUT_W": 1, "VEC": 4, "SMEM": 0},
    {"BLOCK": 64, "ROWS": 1, "OUT_W": 1, "VEC": 1, "SMEM": 1},
    {"BLOCK": 64, "ROWS": 2, "OUT_W": 2, "VEC": 4, "SMEM": 1},
    {"BLOCK": 64, "ROWS": 4, "OUT_W": 4, "VEC": 2, "SMEM": 1},
    {"BLOCK": 128, "ROWS": 16, "OUT_W": 8, "VEC": 8, "SMEM": 1},
]


def _small_task_input(name: str) -> torch.Tensor:
    """An input of the example task's rank, small enough to play every thread on the CPU."""
    shape = {1: (2, 3, 64), 2: (2, 3, 12, 16), 3: (2, 2, 6, 8, 8)}[int(name[-2])]
    return _ints(shape) if "max" in name else _randn(shape)


@lru_cache(maxsize=None)
def task(name: str):
    return load_task(TASKS_DIR / f"{name}.py")


@lru_cache(maxsize=None)
def task_lowering(name: str):
    return lower_pool(capture(task(name)), name)


@lru_cache(maxsize=None)
def case(name: str):
    """(graph, lowering, inputs by name, model) of a synthetic case or a small task model."""
    if name in CASES:
        fn, x, weight = CASES[name]
        model, names = Fn(fn, weight), ["x"]
    else:
        x = _small_task_input(name)
        model, names = task(name).make_model(seed=0, device="cpu"), task(name).input_names
    graph = capture_module(model, [x], name, list(names))
    if name in DEPTHWISE:       # the conv family's CONV node, which canonicalize makes
        graph = canonicalize(graph)
    inputs = {names[0]: x, **{k: v.detach() for k, v in model.state_dict().items()}}
    return graph, lower_pool(graph, f"k_{name}"), inputs, model


HOST_CASES = list(CASES) + TASKS


# ---- lowering and plans ------------------------------------------------------------------------

@pytest.mark.parametrize("name", TASKS)
def test_task_plan_resolves_to_the_reference_outputs(name):
    low = task_lowering(name)
    program = KernelProgram.from_json(KernelProgram.from_json(low.program).to_json())
    assert program.tunables == low.spec.tunables() and program.schedule == low.spec.default()
    plan = program.resolve(env_from_task(task(name)))
    assert [(b.shape, b.dtype) for b in plan.buffers] == [(s.shape, s.dtype) for s in task(name).output_specs]
    assert list(plan.outputs) == [b.name for b in plan.buffers]
    assert low.spec.legal(low.spec.default())
    space = ScheduleSpace.from_program(program, task(name), constraints=low.spec.constraints)
    assert space.legal(space.default())
    legal = sorted(space.key(s) for s in space.enumerate())
    assert legal == sorted(space.key(s) for s in low.spec.enumerate() if space.legal(s))
    assert len(legal) >= 20
    mask = space.mask(space.default())
    assert any(mask) and not all(mask)
    # Enough blocks for 132 SMs at the default; sizes travel as typed scalars.
    launch = plan.launches[0]
    assert math.prod(launch.grid) >= 2 * 132
    assert [a.ctype for a in launch.args if isinstance(a, ScalarArg)] == ["int32"] * 6


@pytest.mark.parametrize("name", list(CASES))
def test_synthetic_plan_shapes_match_interpret(name):
    graph, low, inputs, model = case(name)
    expected = interpret(graph, inputs)
    with torch.no_grad():
        eager = model(inputs["x"])
    eager = list(eager) if isinstance(eager, (tuple, list)) else [eager]
    assert [tuple(t.shape) for t in expected] == [tuple(t.shape) for t in eager]
    program = KernelProgram.from_json(low.program)
    env = {k: TensorInfo(tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in inputs.items()}
    plan = program.resolve(env)
    assert [(b.shape, b.dtype) for b in plan.buffers] == \
        [(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in expected]
    assert low.spec.legal(low.spec.default())


def test_output_size_rule_matches_torch():
    rng = random.Random(0)
    for _ in range(300):
        k, s, d = rng.randint(1, 5), rng.randint(1, 4), rng.randint(1, 3)
        p = rng.randint(0, k // 2)
        size = rng.randint(1, 30)
        ceil = rng.random() < 0.5
        x = torch.zeros(1, 1, size)
        try:
            want = F.max_pool1d(x, k, s, p, dilation=d, ceil_mode=ceil).shape[-1]
        except RuntimeError:
            assert output_size(size, k, s, p, d, ceil) < 1
            continue
        assert output_size(size, k, s, p, d, ceil) == want, (size, k, s, p, d, ceil)
    # The ceil-mode rule: a last window starting past the input and left padding is dropped.
    assert output_size(5, 2, 2, 1, 1, True) == 3 and output_size(4, 3, 3, 0, 1, True) == 2


def test_geometry_of_the_examples():
    g = _geometry_of_task("pool_max1d")
    assert (g.planes, g.in_size, g.out_size) == (16 * 64, (1, 1, 65536), (1, 1, 32768))
    assert (g.kernel, g.stride, g.padding, g.dilation) == ((1, 1, 4), (1, 1, 2), (0, 0, 1), (1, 1, 1))
    assert "outputs: squeeze (value)" in task_lowering("pool_max1d").notes
    g = _geometry_of_task("pool_avg2d")
    assert (g.kind, g.count_include_pad, g.divisor, g.out_size) == ("avg", False, 0, (1, 128, 128))
    g = _geometry_of_task("pool_max3d")
    assert (g.planes, g.in_size, g.out_size, g.kernel) == (128, (64, 128, 128), (32, 64, 64), (3, 3, 3))


# ---- partitioner helpers and errors -----------------------------------------------------------

def test_pool_chain_absorbs_the_1d_views_and_getitems():
    graph = case("max1d_idx_default_stride")[0]
    anchor = next(n for n in graph.nodes if is_pool(n, graph))
    assert pool_chain(anchor, graph) == [n.name for n in graph.nodes]   # unsqueeze, pool, 2 getitems, 2 squeezes
    graph = case("max2d_unbatched_fp16_relu")[0]
    anchor = next(n for n in graph.nodes if is_pool(n, graph))
    assert [graph.value(n).op for n in pool_chain(anchor, graph)] == ["max_pool2d_with_indices.default", "getitem"]
    assert not any(is_pool(n, graph) for n in graph.nodes if n is not anchor)


def test_unsupported_groups_raise_clear_errors():
    two = capture_module(Fn(lambda m, x: F.max_pool2d(x, 2) + F.avg_pool2d(x, 2)), [torch.randn(1, 2, 4, 4)],
                         "two_pools", ["x"])
    with pytest.raises(CodegenError, match="Task 'two_pools'.*2 pooling nodes"):
        lower_pool(two, "k")
    summed = capture_module(Fn(lambda m, x: F.max_pool2d(x, 2).sum(dim=-1)), [torch.randn(1, 2, 4, 4)],
                            "pool_sum", ["x"])
    with pytest.raises(CodegenError, match="Task 'pool_sum'.*sum.dim_IntList"):
        lower_pool(summed, "k")
    ints = capture_module(Fn(lambda m, x: x.float() + 1), [torch.ones(2, 2, dtype=torch.int32)], "no_pool", ["x"])
    with pytest.raises(CodegenError, match="0 pooling nodes"):
        lower_pool(ints, "k")


# ---- NVRTC ------------------------------------------------------------------------------------

def _compile_schedules(low, seed: str) -> list[dict]:
    """The default, one sampled legal schedule, and the first legal ones with SMEM + VEC > 1 and
    with direct VEC > 1 loads + OUT_W > 1, so every code path is compiled."""
    legal = low.spec.enumerate()
    picked = [low.spec.default()] + random.Random(seed).sample(legal, 1)
    for want in ({"SMEM": (1,), "VEC": (2, 4, 8)}, {"SMEM": (0,), "VEC": (2, 4, 8), "OUT_W": (2, 4, 8)}):
        hit = next((s for s in legal if all(s[k] in v for k, v in want.items())), None)
        assert hit is not None, f"no legal schedule with {want}"
        picked.append(hit)
    unique = {tuple(sorted(s.items())): s for s in picked}
    return list(unique.values())


def _compile_all(program, schedules, cache) -> None:
    jobs = [(s, arch) for s in schedules for arch in ARCHS]

    def build(job):
        schedule, arch = job
        p = program.with_schedule(schedule)
        return job, compile_cuda(p.source, arch=arch, options=p.compile_options(), cache=cache)

    with ThreadPoolExecutor(2) as pool:
        for (schedule, arch), result in pool.map(build, jobs):
            assert result.ok, f"{program.name} {schedule} {arch}:\n{result.error_summary()}"


@needs_nvrtc
@pytest.mark.parametrize("name", TASKS)
def test_task_schedules_compile(name, tmp_path_factory):
    low = task_lowering(name)
    program = KernelProgram.from_json(low.program)
    schedules = _compile_schedules(low, name)
    _compile_all(program, schedules, CompileCache(tmp_path_factory.getbasetemp() / "pool-cache"))
    env = env_from_task(task(name))
    geo = _geometry_of_task(name)
    od, oh, ow = geo.out_size
    for schedule in schedules:
        launch = program.with_schedule(schedule).resolve(env, LaunchLimits()).launches[0]
        # The grid holds exactly the output tiles: (tiles_w, tiles_h, planes * OD).
        assert launch.grid == (-(-ow // tile_cols(schedule)), -(-oh // schedule["ROWS"]), geo.planes * od)
        assert launch.block == (schedule["BLOCK"], 1, 1) and launch.shared_bytes == 0


@needs_nvrtc
def test_the_depthwise_example_task_is_a_window_kernel_and_compiles(tmp_path_factory):
    """conv_depthwise2d (128 channels, 3x3, padding 1, bias) generates one pooling-family kernel with the
    bias in its epilogue; its default and sampled schedules compile. A channel multiplier of 2 and a
    transposed depthwise convolution stay with the conv family."""
    from core.codegen import generate

    dw = load_task(TASKS_DIR / "conv_depthwise2d.py")
    gen = generate(dw)
    assert [g.family for g in gen.groups] == ["pool"] and "depthwise convolution 3x3" in gen.notes[0], gen.notes
    schedules = [gen.spec.default()] + gen.spec.sample(random.Random(3), 3)
    _compile_all(gen.program, schedules, CompileCache(tmp_path_factory.getbasetemp() / "pool-cache"))
    for layer in ("nn.Conv2d(4, 8, 3, groups=4)", "nn.ConvTranspose2d(4, 4, 3, groups=4)"):
        src = ("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def __init__(self):\n"
               f"        super().__init__()\n        self.c = {layer}\n    def forward(self, x):\n"
               "        return self.c(x)\n\ndef get_inputs():\n    return [torch.randn(2, 4, 10, 10)]\n\n"
               "def get_init_inputs():\n    return []\n")
        families = [g.family for g in generate(load_task_from_source(src, "not_depthwise")).groups]
        assert families == ["conv"], (layer, families)


@needs_nvrtc
@pytest.mark.parametrize("name", list(CASES))
def test_synthetic_schedules_compile(name, tmp_path_factory):
    _, low, _, _ = case(name)
    program = KernelProgram.from_json(low.program)
    _compile_all(program, [low.spec.default(), HOST_SCHEDULES[5]],
                 CompileCache(tmp_path_factory.getbasetemp() / "pool-cache"))


# ---- the generated code on the CPU ------------------------------------------------------------

CTYPES = {"float32": "float", "float64": "double", "float16": "unsigned short", "bfloat16": "unsigned short",
          "int64": "long long", "bool": "unsigned char"}


def _host_schedules(name: str) -> list[dict]:
    low = case(name)[1]
    if name == "max2d_flat_grid_many_planes":      # 65600 blocks: a few schedules suffice
        return [low.spec.default(), HOST_SCHEDULES[1], HOST_SCHEDULES[4]]
    return [low.spec.default()] + HOST_SCHEDULES


def _host_function(index: int, name: str, schedule: dict) -> tuple[str, str]:
    """One case x schedule: the generated helpers in their own namespace and a runner playing the grid."""
    graph, low, inputs, _ = case(name)
    program = KernelProgram.from_json(low.program).with_schedule(schedule)
    env = {k: TensorInfo(tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in inputs.items()}
    plan = program.resolve(env, LaunchLimits())
    launch = plan.launches[0]
    sizes = [a.value for a in launch.args if isinstance(a, ScalarArg)]
    tensors = [a.name for a in launch.args if not isinstance(a, ScalarArg)]
    dtypes = {**{k: e.dtype for k, e in env.items()}, **{b.name: b.dtype for b in plan.buffers}}
    numels = {**{k: math.prod(e.shape) for k, e in env.items()}, **{b.name: math.prod(b.shape) for b in plan.buffers}}
    ns = f"k_{name}_pool"
    assert program.source.startswith(PRELUDE)
    body = program.source[len(PRELUDE):].split('extern "C" __global__')[0]    # the prelude is included once
    defines = "".join(f"#define {k} {v}\n" for k, v in schedule.items())
    undefs = "".join(f"#undef {k}\n" for k in schedule)
    space = f"{defines}namespace h{index} {{\n{body}\n}}\n{undefs}"
    lines = [f"static void run{index}(char** files) {{"]
    for i, t in enumerate(tensors):
        ct = CTYPES[dtypes[t]]
        lines.append(f"    {ct}* t{i} = ({ct}*)buffer(files[{i}], {numels[t]} * sizeof({ct}), {int(t in env)});")
    ID, IH, IW, OD, OH, OW = sizes
    block = schedule["BLOCK"]
    lines += [
        f"    alignas(32) static h{index}::{ns}::acc_t tile[h{index}::{ns}::TILE_ELEMS];",
        f"    for (unsigned bz = 0; bz < {launch.grid[2]}; ++bz)",
        f"    for (unsigned by = 0; by < {launch.grid[1]}; ++by)",
        f"    for (unsigned bx = 0; bx < {launch.grid[0]}; ++bx) {{",
        f"        const h{index}::{ns}::Tile t = h{index}::{ns}::tile_of(bx, by, bz, {OD}, {OH}, {OW});",
        f"        if ({schedule['SMEM']}) for (int tid = 0; tid < {block}; ++tid) "
        f"h{index}::{ns}::fill(tile, t0, t, tid, {ID}, {IH}, {IW});",
        f"        for (int tid = 0; tid < {block}; ++tid) h{index}::{ns}::compute(tile, "
        + "".join(f"t{i}, " for i in range(len(tensors)))
        + f"t, tid, {ID}, {IH}, {IW}, {OD}, {OH}, {OW});",
        "    }",
    ]
    for i, t in enumerate(tensors):
        if t not in env:
            lines.append(f"    save(files[{i}], t{i}, {numels[t]} * sizeof(*t{i}));")
    lines.append("}")
    return space, "\n".join(lines)


@lru_cache(maxsize=1)
def _harness(tmp: str) -> tuple[str, dict]:
    """One host program with every case x schedule; returns its path and (case, schedule) -> number."""
    jobs = [(name, s) for name in HOST_CASES for s in _host_schedules(name)]
    spaces, runners, numbers = [], [], {}
    for i, (name, schedule) in enumerate(jobs):
        space, runner = _host_function(i, name, schedule)
        spaces.append(space)
        runners.append(runner)
        numbers[(name, tuple(sorted(schedule.items())))] = i
    dispatch = "\n".join(f"    case {i}: run{i}(argv + 2); return 0;" for i in range(len(jobs)))
    code = "\n".join([
        "#include <cmath>", "#include <cstdio>", "#include <cstdlib>",
        "static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }",
        "static inline double rsqrt(double x) { return 1.0 / sqrt(x); }",
        PRELUDE,
        *spaces,
        "static void* buffer(const char* path, long long bytes, int read) {",
        "    void* b = aligned_alloc(64, (bytes + 63) / 64 * 64);",
        "    if (read) { FILE* f = fopen(path, \"rb\");",
        "        if (!f || fread(b, 1, bytes, f) != (size_t)bytes) { perror(path); exit(2); } fclose(f); }",
        "    return b; }",
        "static void save(const char* path, const void* b, long long bytes) {",
        "    FILE* f = fopen(path, \"wb\"); fwrite(b, 1, bytes, f); fclose(f); }",
        *runners,
        "int main(int argc, char** argv) {",
        "    switch (atoi(argv[1])) {", dispatch, "    }", "    return 1;", "}"])
    src = Path(tmp) / "pool_harness.cpp"
    src.write_text(code)
    exe = Path(tmp) / "pool_harness"
    done = subprocess.run([GXX, "-O0", "-std=c++17", "-DCA_HD=inline", "-w", str(src), "-o", str(exe), "-lm"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[:4000]
    return str(exe), numbers


def _tolerance(dtype: torch.dtype) -> tuple[float, float]:
    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2, 1e-2
    if dtype == torch.float64:
        return 1e-12, 1e-12
    if dtype == torch.float32:
        return 1e-5, 1e-5
    return 0.0, 0.0


@needs_gxx
@pytest.mark.parametrize("name", HOST_CASES)
def test_generated_code_matches_torch_on_cpu(name, tmp_path_factory):
    exe, numbers = _harness(str(tmp_path_factory.getbasetemp()))
    graph, low, inputs, _ = case(name)
    expected = interpret(graph, inputs)
    work = tmp_path_factory.mktemp(name)
    launch = low.program["launches"][0]
    tensors = [a for a in launch["args"] if "(" not in a]
    for schedule in _host_schedules(name):
        files = []
        for t in tensors:
            path = work / f"{t}.bin"
            if t in inputs:
                path.write_bytes(inputs[t].contiguous().view(torch.uint8).numpy().tobytes())
            files.append(str(path))
        number = numbers[(name, tuple(sorted(schedule.items())))]
        done = subprocess.run([exe, str(number), *files], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        for out, ref in zip(graph.outputs, expected):
            got = torch.frombuffer(bytearray((work / f"{out}.bin").read_bytes()), dtype=ref.dtype).reshape(ref.shape)
            atol, rtol = _tolerance(ref.dtype)
            torch.testing.assert_close(got, ref, atol=atol, rtol=rtol, equal_nan=True,
                                       msg=lambda m: f"{name} {schedule} output {out}: {m}")


def test_host_cases_cover_both_grid_decodes():
    assert all(grid3(_geometry(name)) for name in HOST_CASES if name != "max2d_flat_grid_many_planes")
    assert not grid3(_geometry("max2d_flat_grid_many_planes"))
    assert len(case("max2d_flat_grid_many_planes")[1].program["launches"][0]["grid"]) == 1


def test_host_schedules_cover_the_vector_paths():
    # The host run must exercise aligned vector loads with and without shared memory.
    geo = _geometry("avg2d_ceil_nopad")          # W 16, stride 2, padding 1
    assert vec_fits(geo, {**HOST_SCHEDULES[1], "SMEM": 0}) and vec_shift(geo, HOST_SCHEDULES[1]) == 1
    assert vec_fits(geo, HOST_SCHEDULES[5]) and vec_fits(geo, HOST_SCHEDULES[2])
    assert not vec_fits(geo, HOST_SCHEDULES[3])   # OUT_W 1 x stride 2 is not a multiple of 4: scalar loads


# ---- a pure-Python emulation of the window index math ------------------------------------------

def _geometry(name: str) -> PoolGeometry:
    graph = case(name)[0]
    anchor = next(n for n in graph.nodes if is_pool(n, graph))
    if name in DEPTHWISE:
        return depthwise_geometry(name, anchor, graph)
    operand = graph.value(anchor.operands[0].name)
    return pool_geometry(name, anchor, tuple(operand.shape), operand.dtype)


def _emulate(geo: PoolGeometry, s: dict, x: list[float]) -> tuple[list[float], list[int]]:
    """The kernel's direct path, element by element in Python: tile decode, the VEC_R-shifted column
    span with sentinels, the max / sum loop, PyTorch's first index and divisor. Returns flat outputs."""
    (ID, IH, IW), (OD, OH, OW) = geo.in_size, geo.out_size
    (KD, KH, KW), (SD, SH, SW), (PD, PH, PW), (DD, DH, DW) = geo.kernel, geo.stride, geo.padding, geo.dilation
    is_max = geo.kind == "max"
    sentinel = -math.inf if is_max else 0.0
    tw_cols, tpr, out_w = tile_cols(s), s["BLOCK"] // s["ROWS"], s["OUT_W"]
    r_shift, vspan = vec_shift(geo, s), loaded_span(geo, s)
    n_out = geo.planes * OD * OH * OW
    values, indices = [None] * n_out, [None] * n_out
    tiles_w, tiles_h = -(-OW // tw_cols), -(-OH // s["ROWS"])
    for bx in range(tiles_w * tiles_h * geo.planes * OD):     # the flat grid's decode
        tw, rest = bx % tiles_w, bx // tiles_w
        th, pd = rest % tiles_h, rest // tiles_h
        plane, od = pd // OD, pd % OD
        for tid in range(s["BLOCK"]):
            tr, tc = tid // tpr, tid % tpr
            oh, ow0 = th * s["ROWS"] + tr, tw * tw_cols + tc * out_w
            if oh >= OH or ow0 >= OW:
                continue
            base = plane * ID * IH * IW
            d0, h0, c0 = od * SD - PD, oh * SH - PH, ow0 * SW - PW
            first = lambda v, dil: v + (-v + dil - 1) // dil * dil if v < 0 else v
            acc = [sentinel] * out_w
            arg = [(first(d0, DD) * IH + first(h0, DH)) * IW + first(c0 + j * SW, DW) for j in range(out_w)]
            for kd in range(KD):
                id_ = d0 + kd * DD
                if not 0 <= id_ < ID:
                    continue
                for kh in range(KH):
                    ih = h0 + kh * DH
                    if not 0 <= ih < IH:
                        continue
                    row = (id_ * IH + ih) * IW
                    v = [x[base + row + c0 - r_shift + t] if 0 <= c0 - r_shift + t < IW else sentinel
                         for t in range(vspan)]
                    for j in range(out_w):
                        for k in range(KW):
                            val = v[r_shift + j * SW + k * DW]
                            if is_max:
                                if val > acc[j] or math.isnan(val):
                                    acc[j], arg[j] = val, row + c0 + j * SW + k * DW
                            else:
                                acc[j] += val
            for j in range(out_w):
                ow = ow0 + j
                if ow >= OW:
                    break
                result = acc[j]
                if not is_max:
                    lo, hi, pool, count = [d0, h0, c0 + j * SW], [], 1, 1
                    for start, k, size, pad in zip(lo, (KD, KH, KW), (ID, IH, IW), (PD, PH, PW)):
                        end = min(start + k, size + pad)
                        pool *= end - start
                        count *= max(0, min(end, size) - max(start, 0))
                        hi.append(min(end, size) - max(start, 0))
                    divide = geo.divisor or (pool if geo.count_include_pad else count)
                    result = 0.0 if min(hi) <= 0 else acc[j] / divide
                e = ((plane * OD + od) * OH + oh) * OW + ow
                values[e], indices[e] = result, arg[j]
    assert None not in values
    return values, indices


EMULATED = [
    ("max2d_ceil_dil_idx", {"BLOCK": 64, "ROWS": 2, "OUT_W": 2, "VEC": 2, "SMEM": 0}),
    ("max3d_ceil_dil_idx", {"BLOCK": 16, "ROWS": 4, "OUT_W": 1, "VEC": 1, "SMEM": 0}),
    ("max1d_idx_default_stride", {"BLOCK": 8, "ROWS": 1, "OUT_W": 4, "VEC": 4, "SMEM": 0}),
    ("avg2d_ceil_nopad", {"BLOCK": 16, "ROWS": 2, "OUT_W": 2, "VEC": 4, "SMEM": 0}),
    ("avg3d_ceil_divisor", {"BLOCK": 64, "ROWS": 1, "OUT_W": 1, "VEC": 1, "SMEM": 0}),
    ("avg2d_ceil_pad_rect", {"BLOCK": 16, "ROWS": 4, "OUT_W": 1, "VEC": 1, "SMEM": 0}),
]


@pytest.mark.parametrize("name,schedule", EMULATED)
def test_python_emulation_of_the_window_math(name, schedule):
    graph, _, inputs, _ = case(name)
    geo = _geometry(name)
    x = inputs["x"].to(torch.float64)
    values, indices = _emulate(geo, schedule, x.reshape(-1).tolist())
    pool_in = x.reshape(geo.planes, *geo.in_size)          # the pool as a 3-D pool over planes
    k, st, p = list(geo.kernel), list(geo.stride), list(geo.padding)
    if geo.kind == "max":
        ref, ref_idx = F.max_pool3d(pool_in, k, st, p, dilation=list(geo.dilation), ceil_mode=geo.ceil_mode,
                                    return_indices=True)
        assert torch.equal(torch.tensor(indices).reshape(ref_idx.shape), ref_idx)
    else:
        ref = F.avg_pool3d(pool_in, k, st, p, ceil_mode=geo.ceil_mode, count_include_pad=geo.count_include_pad,
                           divisor_override=geo.divisor or None)
    torch.testing.assert_close(torch.tensor(values, dtype=torch.float64).reshape(ref.shape), ref,
                               atol=1e-12, rtol=1e-12, equal_nan=True)
    # The emulated geometry is the lowering's: the kernel's constants come from the same numbers.
    source = case(name)[1].program["source"]
    assert f"constexpr int KD = {geo.kernel[0]}, KH = {geo.kernel[1]}, KW = {geo.kernel[2]};" in source
    assert f"constexpr int PD = {geo.padding[0]}, PH = {geo.padding[1]}, PW = {geo.padding[2]};" in source


# ---- constraints ------------------------------------------------------------------------------

def test_constraints_mask_what_they_should():
    spec = task_lowering("pool_max2d").spec      # fp32 256x256 -> 128x128, 3x3 stride 2 pad 1
    # The default: two outputs per thread, 16-byte loads, the tile's rows fitted (a 4x128 tile).
    assert spec.default() == {"BLOCK": 256, "ROWS": 4, "OUT_W": 2, "VEC": 4, "SMEM": 0}
    base = {k.name: k.values[0] for k in spec.knobs}                          # the always-legal fallback
    assert base == {"BLOCK": 256, "ROWS": 2, "OUT_W": 1, "VEC": 1, "SMEM": 0}   # a 2x128 tile fits a row pair
    assert spec.legal(base)
    assert "16 at most" in spec.why_illegal({**base, "ROWS": 8, "OUT_W": 4, "VEC": 8})
    assert "misaligned" in spec.why_illegal({**base, "VEC": 4})               # OUT_W 1 x stride 2
    assert spec.legal({**base, "ROWS": 4, "OUT_W": 2, "VEC": 4}) and spec.legal({**base, "VEC": 2})
    assert "idle" in spec.why_illegal({**base, "ROWS": 1})                    # 256 columns for 128 outputs
    assert "idle" in spec.why_illegal({**base, "OUT_W": 2})
    assert "static shared memory" in spec.why_illegal({"BLOCK": 1024, "ROWS": 4, "OUT_W": 4, "VEC": 1, "SMEM": 1})
    assert spec.legal({"BLOCK": 256, "ROWS": 2, "OUT_W": 1, "VEC": 2, "SMEM": 1})
    assert "not one of" in spec.why_illegal({**base, "BLOCK": 96})
    one_d = task_lowering("pool_avg1d").spec                   # a single output row per plane
    assert "idle" in one_d.why_illegal({**one_d.default(), "ROWS": 2})
    assert one_d.legal({**one_d.default(), "OUT_W": 8, "VEC": 4})     # 40 register columns
    assert "does not divide the input width" in _spec("avg1d_bf16_sub").why_illegal(   # bf16, W 19
        {**_spec("avg1d_bf16_sub").default(), "VEC": 2})
    tiny = _spec("max2d_bf16_idx_only")                           # 2x2 planes of 5x8: few blocks
    assert "cannot fill" in tiny.why_illegal({**tiny.default(), "BLOCK": 128})
    assert tiny.legal(tiny.default())
    # A long 1-D window: eight neighbouring outputs would keep 72 columns in registers.
    wide = PoolGeometry("avg", 2, "float32", 256, (1, 1, 4096), (1, 1, 512), (1, 1, 16), (1, 1, 8), (0, 0, 0),
                        (1, 1, 1), False, True, 0)
    wide_spec = schedule_spec(wide)
    assert "registers" in wide_spec.why_illegal({**wide_spec.default(), "BLOCK": 64, "OUT_W": 8})
    assert wide_spec.legal({**wide_spec.default(), "BLOCK": 64, "OUT_W": 4})


def _spec(name: str):
    return case(name)[1].spec


def test_every_task_space_has_smem_vector_and_out_w_schedules():
    for name in TASKS:
        legal = task_lowering(name).spec.enumerate()
        assert any(s["SMEM"] for s in legal), name
        assert any(s["OUT_W"] > 1 for s in legal), name
        assert any(s["VEC"] > 1 for s in legal), name
        for s in legal:
            geo = _geometry_of_task(name)
            assert span(geo, s["OUT_W"]) <= 64 or s["OUT_W"] == 1
            assert tile_cols(s) * s["ROWS"] == s["BLOCK"] * s["OUT_W"]


@lru_cache(maxsize=None)
def _geometry_of_task(name: str) -> PoolGeometry:
    graph = capture(task(name))
    anchor = next(n for n in graph.nodes if is_pool(n, graph))
    operand = graph.value(anchor.operands[0].name)
    return pool_geometry(name, anchor, tuple(operand.shape), operand.dtype)
