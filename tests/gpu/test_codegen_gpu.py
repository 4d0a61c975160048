"""Issue 3's GPU test: every example task the generators accept is correct on the H200 at its
default schedule and at a random sample of legal schedules (checked by the evaluator)."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from core.codegen import CodegenError, generate
from core.tasks import scan_suite
from tests.gpu.codegen_check import failures_at

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SAMPLED = 4


def _generated():
    out = []
    for task in scan_suite(ROOT / "resources" / "tasks").tasks:
        try:
            out.append((task, generate(task)))
        except CodegenError:
            continue
    return out


CASES = _generated()


@pytest.mark.parametrize("task,gen", CASES, ids=[t.name for t, _ in CASES])
def test_generated_program_is_correct_at_default_and_sampled_schedules(task, gen):
    schedules = [gen.spec.default()] + gen.spec.sample(random.Random(task.name), SAMPLED)
    failures = failures_at(task, gen, schedules)
    assert not failures, "\n".join(failures)
