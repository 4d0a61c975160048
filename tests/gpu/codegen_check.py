"""Shared by the codegen GPU tests: a generated program through the evaluator at some schedules."""
from __future__ import annotations

from core.evaluation import Evaluator, Status


def failures_at(task, gen, schedules: list[dict]) -> list[str]:
    """One line per schedule the evaluator did not measure (wrong, crashed, rejected...)."""
    failures = []
    with Evaluator(task) as ev:
        for schedule in schedules:
            result = ev.evaluate(gen.program.with_schedule(schedule), with_baselines=False)
            if result.status is not Status.MEASURED:
                failures.append(f"{schedule}: {result.status.value}: {result.reason}")
    return failures
