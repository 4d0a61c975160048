"""core.search.session: which program a run tunes (a file, the generated one, or the hand-written
one), and the clear errors for bad settings. Replay pools only: no GPU."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from core.search.session import RunConfig, RunSetupError, _program, open_run
from core.tasks import load_task
from tests.support.replay_run import TASK_PATH, record_project

TASKS = Path(__file__).resolve().parents[1] / "resources" / "tasks"
UNLOWERED = Path(__file__).resolve().parent / "data" / "unlowered" / "mode_rows.py"      # an op no generator lowers


def test_a_task_without_a_hand_written_program_gets_the_generated_one():
    task = load_task(TASKS / "act_mish.py")
    program, constraints, note = _program(RunConfig(task=task.path, project="unused"), task)
    assert "generated pointwise program" in note
    assert program.tunables and constraints        # the generator's masks come along


def test_the_generated_program_wins_over_a_hand_written_one():
    task = load_task(TASK_PATH)                      # act_gelu has resources/programs/act_gelu.json too
    program, constraints, note = _program(RunConfig(task=TASK_PATH, project="unused"), task)
    assert "generated" in note and constraints and len(program.tunables) > 1


def test_the_hand_written_program_serves_a_task_no_generator_lowers(tmp_path, monkeypatch):
    import core.search.session as session

    shutil.copy(session.PROGRAMS / "act_gelu.json", tmp_path / "mode_rows.json")     # any valid program file,
    shutil.copy(session.PROGRAMS / "act_gelu.cu", tmp_path / "act_gelu.cu")           # with the source it names
    monkeypatch.setattr(session, "PROGRAMS", tmp_path)
    task = load_task(UNLOWERED)
    program, constraints, note = _program(RunConfig(task=task.path, project="unused"), task)
    assert note.endswith("mode_rows.json") and constraints == [] and program.tunables


def test_a_task_no_generator_lowers_says_which_op(tmp_path):
    task = load_task(UNLOWERED)
    with pytest.raises(RunSetupError, match="no program: .*mode") as err:
        _program(RunConfig(task=task.path, project="unused"), task)
    assert "--program" in str(err.value)


def test_a_missing_program_file_is_named(tmp_path):
    task = load_task(TASK_PATH)
    with pytest.raises(RunSetupError, match="missing.json does not exist"):
        _program(RunConfig(task=TASK_PATH, project="unused", program=tmp_path / "missing.json"), task)


@pytest.mark.parametrize("change,message", [({"policy": "greedy"}, "unknown policy 'greedy'"),
                                            ({"budget": 0}, "at least 1 evaluation"),
                                            ({"compile_ahead": -1}, "compile-ahead must be 0 \\(off\\) or more"),
                                            ({"compile_workers": 0}, "compile-workers must be at least 1")])
def test_bad_settings_are_refused_before_anything_opens(tmp_path, change, message):
    config = RunConfig(task=TASK_PATH, project=tmp_path / "p.cuagent", **change)
    with pytest.raises(RunSetupError, match=message):
        open_run(config)
    assert not (tmp_path / "p.cuagent").exists()


def test_a_project_of_another_task_is_refused_and_left_closed(tmp_path):
    record = record_project(tmp_path / "record.cuagent")
    other = TASKS / "act_mish.py"
    with pytest.raises(RunSetupError, match="belongs to task 'act_gelu'"):
        open_run(RunConfig(task=other, project=record, replay=[record]))
    # Nothing holds the file: it opens again at once, for its own task.
    setup = open_run(RunConfig(task=TASK_PATH, project=record, replay=[record]))
    assert setup.project.task_name == "act_gelu"
    setup.close()


def test_a_replayed_run_records_the_baselines_of_the_record(tmp_path):
    record = record_project(tmp_path / "record.cuagent")
    setup = open_run(RunConfig(task=TASK_PATH, project=tmp_path / "new.cuagent", replay=[record]))
    try:
        keys = setup.project.baseline_keys()
        assert keys and setup.project.baselines(keys[0]).eager.median_ms > 0
    finally:
        setup.close()


def test_a_record_of_another_program_is_flagged(tmp_path):
    from tests.support.replay_run import search_program

    record = record_project(tmp_path / "record.cuagent")
    program = tmp_path / "program.json"
    program.write_text(search_program().to_json())
    for program_file, warned in ((program, False), (None, True)):    # the record is of search_program()
        setup = open_run(RunConfig(task=TASK_PATH, project=tmp_path / f"{warned}.cuagent", program=program_file,
                                   replay=[record]))
        try:
            assert any("another program" in note for note in setup.notes) is warned, setup.notes
        finally:
            setup.close()


class _CallersPool:
    """A caller's warm evaluator stand-in: a replay answers, and closing is recorded."""

    def __init__(self, record: Path, task):
        from core.search.replay import ReplayPool

        self.replay = ReplayPool.from_files([record])
        self.task, self.closed, self.ceilings_warmed = task, False, 0
        self.gpu = {"name": "Test GPU", "capability": "9.0", "torch": "2.13"}

    def baselines(self):
        return self.replay.baselines()

    def warm_ceilings(self) -> None:
        self.ceilings_warmed += 1

    def close(self) -> None:
        self.closed = True

    def __getattr__(self, name):
        return getattr(self.replay, name)


def test_runs_on_the_callers_evaluator_leave_it_open(tmp_path):
    from core.project import Project

    record = record_project(tmp_path / "record.cuagent")
    pool = _CallersPool(record, load_task(TASK_PATH))
    for seed in (0, 1):
        path = tmp_path / f"seed{seed}.cuagent"
        setup = open_run(RunConfig(task=TASK_PATH, project=path, policy="random", budget=5, seed=seed,
                                   confirm_rounds=0), pool=pool)
        try:
            setup.optimizer.run()
        finally:
            setup.close()
        assert not pool.closed
        assert pool.ceilings_warmed == seed + 1       # at the run's start, before its first candidate
        with Project.open(path, readonly=True) as project:
            assert len([r for r in project.candidates() if r.evaluated_at]) == 5
            assert project.baseline_keys()
    other = _CallersPool(record, load_task(TASKS / "act_mish.py"))
    with pytest.raises(RunSetupError, match="not of task 'act_gelu'"):
        open_run(RunConfig(task=TASK_PATH, project=tmp_path / "x.cuagent"), pool=other)
    assert not other.closed
