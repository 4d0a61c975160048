"""The matmul and conv families on the GPU: the small cases of tests/test_codegen_matmul.py (tails in
M, N and K, transposed operands, batches, fp16 / bf16 / fp64, addmm's alpha and beta, epilogues;
convolutions with strides, padding, dilation and groups) through the evaluator at the default schedule
and sampled legal ones, and example tasks at their default schedule."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from core.codegen import generate, lower_matmul
from core.tasks import load_task, load_task_from_source
from tests.gpu.codegen_check import failures_at
from tests.test_codegen_matmul import CASES, MMA_CASES

pytestmark = pytest.mark.gpu

SAMPLED = 3
MMA_SAMPLED = 5
TASKS = Path(__file__).resolve().parents[2] / "resources" / "tasks"


@pytest.mark.parametrize("name", sorted(CASES))
def test_matmul_case_is_correct_on_the_gpu(name):
    task = load_task_from_source(CASES[name], name)
    gen = generate(task)
    schedules = [gen.spec.default()] + gen.spec.sample(random.Random(name), SAMPLED)
    failures = failures_at(task, gen, schedules)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", ["mm_odd_shapes", "mm_bf16_rect", "fused_linear_gelu_scale", "conv_2d",
                                  "fused_conv_relu_maxpool"])
def test_example_product_is_correct_at_its_default_schedule(name):
    task = load_task(TASKS / f"{name}.py")
    gen = generate(task)
    failures = failures_at(task, gen, [gen.spec.default()])
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", MMA_CASES)
def test_tensor_core_schedules_are_correct_on_the_gpu(name, monkeypatch):
    """MMA=1 (mma.sync) at the default and sampled tensor-core schedules: the fragment layout the
    CPU emulation assumes is the one the GPU has."""
    monkeypatch.setattr(lower_matmul, "MMA_BY_DEFAULT", True)
    task = load_task_from_source(CASES[name], name)
    gen = generate(task)
    mma = [s for s in gen.spec.sample(random.Random(name), 400) if any(v for k, v in s.items() if k.endswith("MMA"))]
    schedules = [gen.spec.default()] + mma[:MMA_SAMPLED]
    assert all(v for s in schedules for k, v in s.items() if k.endswith("MMA")), schedules
    failures = failures_at(task, gen, schedules)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", MMA_CASES)
def test_cp_async_ring_schedules_are_correct_on_the_gpu(name, monkeypatch):
    """MMA=1 with STAGES > 0 (cp.async into a ring, ldmatrix.trans where rows are contiguous) at sampled
    schedules: the copies' zero fill, the commit groups' waits and the transposed fragments as the
    CPU emulation assumes them."""
    monkeypatch.setattr(lower_matmul, "MMA_BY_DEFAULT", True)
    task = load_task_from_source(CASES[name], name)
    gen = generate(task)
    ring = [s for s in gen.spec.sample(random.Random(name + " ring"), 1000)
            if all(v for k, v in s.items() if k.endswith("STAGES"))]
    assert ring, name
    failures = failures_at(task, gen, ring[:MMA_SAMPLED])
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", ["mm_fp16", "fused_swiglu_bf16"])
def test_example_half_product_is_correct_with_tensor_cores(name, monkeypatch):
    monkeypatch.setattr(lower_matmul, "MMA_BY_DEFAULT", True)
    task = load_task(TASKS / f"{name}.py")
    gen = generate(task)
    assert all(v for k, v in gen.spec.default().items() if k.endswith("MMA"))
    failures = failures_at(task, gen, [gen.spec.default()])
    assert not failures, "\n".join(failures)
