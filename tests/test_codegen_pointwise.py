"""Pointwise and row-reduction families: which tasks generate() accepts, plans resolve with the task's shapes, the
generated source compiles with NVRTC for sm_80 and sm_90 under the default and sampled legal
schedules, and the constraints mask what they should. No GPU: the CUDA is compiled, not run."""
from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import pytest

from core.codegen import CodegenError, generate
from core.program import KernelProgram, LaunchLimits
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
    assert program.tunables == gen.spec.tunables() and program.schedule == gen.spec.default()
    plan = program.resolve(env_from_task(task))
    got = [(b.shape, b.dtype) for b in plan.buffers if b.name in plan.outputs]
    assert got == [(s.shape, s.dtype) for s in task.output_specs]
    assert gen.spec.legal(gen.spec.default())


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
    """The default plus 20 sampled legal schedules for example tasks (5 for synthetic ones)."""
    gen = generated(name)
    count = SAMPLED if name not in SYNTHETIC else 5
    return [gen.spec.default()] + gen.spec.sample(random.Random(name), count)


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