"""GPU test of the RL issue: a short real run of the optimiser on example tasks, through the same
open_run as `cuda-agent run` (GPU evaluator, PPO; act_gelu tunes its hand-written program of three
schedules, given as --program would, the others their generated programs), then a replay of the
run's own project that answers every candidate from the record.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from core.project import Project
from core.search.session import RunConfig, open_run

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "resources" / "tasks"
PROGRAMS = {"act_gelu": ROOT / "resources" / "programs" / "act_gelu.json"}     # else generated
BUDGET = 12


@pytest.mark.parametrize("name", ["act_gelu", "act_mish", "red_var_dim1"])
def test_a_short_real_run(name, tmp_path, tmp_cache, own_memory_file):
    project_path = tmp_path / f"{name}.cuagent"
    setup = open_run(RunConfig(task=TASKS / f"{name}.py", project=project_path, policy="ppo", budget=BUDGET,
                               program=PROGRAMS.get(name), seed=1, memory=True))
    legal = len(list(setup.optimizer.space.enumerate()))
    try:
        summary = setup.optimizer.run()
    finally:
        setup.close()
    # a space smaller than the budget ends as soon as every schedule is known
    expected = (BUDGET, "evaluations") if legal >= BUDGET else (legal, "exhausted")
    assert (summary.evaluations, summary.reason) == expected, (summary, legal)
    with Project.open(project_path, readonly=True) as project:
        counts = project.counts_by_status()
        assert counts.get("measured", 0) >= expected[0] // 2, counts        # generated schedules are legal
        assert not counts.get("wrong") and not counts.get("crashed"), counts
        best = project.best(1)[0]
        first = next(project.candidates(limit=1))
        assert best.median_ms <= first.median_ms              # the first candidate: the default or the memory's pick
        assert project.baseline_keys()                                  # eager and compile were stored
        eager = project.baselines(project.baseline_keys()[0]).eager.median_ms
        # the best was re-measured interleaved with eager after the run, and agrees with its record
        interleaved = best.extra["interleaved"]
        assert not interleaved["reason"] and interleaved["rounds"] == RunConfig.confirm_rounds, interleaved
        assert 0.8 < interleaved["median_ms"] / best.median_ms < 1.25, (interleaved, best.median_ms)
        assert 0.8 < interleaved["eager_ms"] / eager < 1.25, (interleaved, eager)
        print(f"\n{name}: {counts}, default {first.median_ms * 1e3:.1f} us, best {best.median_ms * 1e3:.1f} us, "
              f"eager {eager * 1e3:.1f} us; interleaved: best {interleaved['median_ms'] * 1e3:.1f} us, "
              f"eager {interleaved['eager_ms'] * 1e3:.1f} us")

    # With memory on, a GPU run is remembered in the memory file (here the test's own) when it has
    # enough schedules.
    from core.search.memory import MIN_MEASURED, load_memory

    if counts.get("measured", 0) >= MIN_MEASURED:
        assert setup.remembered.startswith("remembered"), setup.remembered
        assert load_memory(own_memory_file).tasks == [name]
    else:
        assert setup.remembered.startswith("not remembered"), setup.remembered

    # The run's own record answers a replay of the same search: no GPU work, no misses.
    replay = open_run(RunConfig(task=TASKS / f"{name}.py", project=tmp_path / "replay.cuagent", policy="random",
                                program=PROGRAMS.get(name), budget=4, replay=[project_path], skip_unrecorded=True,
                                seed=2))
    try:
        replay.optimizer.run()
        assert replay.pool.baselines() is not None
    finally:
        replay.close()
