"""GPU test: the re-verification of a task of 1.75 GiB in and out fits in the GPU's memory.
In a module of its own, so that no other evaluator holds memory meanwhile (as in a product run)."""
from __future__ import annotations

from pathlib import Path

import pytest

from core.evaluation import Evaluator, SupervisorSettings
from core.tasks import load_task

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def test_reverification_of_a_large_task_fits_in_memory():
    """The re-verification draws 23 input sets. For a task of 1.75 GiB in and out, their float64
    references (80 GiB) must not all be kept (they were, and the judge ran out of memory)."""
    from core.codegen import generate

    task = load_task(ROOT / "bench" / "tasks" / "act_mish_1ms.py")
    ev = Evaluator(task, settings=SupervisorSettings()).start()
    try:
        artifact, failed, info = ev.prepare(generate(task).program)
        assert failed is None, failed.reason
        with ev.gpus.acquire() as sup:
            result = ev._result(sup, artifact, sup.evaluate(artifact), info, None)
            assert result.ok, result.reason
            result = ev._reverify(sup, artifact, result, info, None)   # as if it ran under the floor
        assert result.ok, result.reason
        assert any("re-verified on" in n for n in result.measurement.notes), result.measurement.notes
        print("\nre-verification seconds:", result.details.get("reverify_seconds"))
    finally:
        ev.close()
