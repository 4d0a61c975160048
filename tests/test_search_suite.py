"""`cuda-agent bench SUITE` (core/search/suite.py and its CLI) on replays of made-up records, no GPU.

TEST DATA, NOT MEASUREMENTS: the records below hold invented times for every schedule of the
hand-written act_gelu and softmax_lastdim programs (TIMES) and of the generated program of a small
row sum (ROW_SUM).
"""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from core.cli import main
from core.codegen import generate
from core.evaluation.evaluator import Baselines
from core.evaluation.results import Measurement, Timing
from core.program import KernelProgram
from core.project import CandidateRecord, Project
from core.search.events import CandidateEvaluated
from core.search.space import ScheduleSpace
from core.search.suite import Bench, BenchConfig, BenchReport, TaskFinished, TaskRow, _short, markdown
from core.tasks import load_task, load_task_from_source

ROOT = Path(__file__).resolve().parents[1]
TASKS, PROGRAMS = ROOT / "resources" / "tasks", ROOT / "resources" / "programs"
UNLOWERED = ROOT / "tests" / "data" / "unlowered" / "mode_rows.py"      # an op no generator lowers
GPU = {"name": "Made-up GPU (test data)", "capability": "9.0", "torch": "test"}
# task -> (eager ms, torch.compile ms, roofline floor ms, {BLOCK: ms or None for a compile error})
TIMES = {"act_gelu": (1.0, 0.8, 0.4, {256: 0.5, 128: 0.6, 512: None}),
         "softmax_lastdim": (0.5, 0.4, 0.1, {512: 0.25, 256: 0.2, 1024: 0.4})}
BROKEN = "import torch\n\ndef get_inputs(:\n    return []\n"
ROW_SUM = """# family: reduction
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=1)


def get_inputs():
    return [torch.randn(128, 512)]


def get_init_inputs():
    return []
"""


def _ms_timing(ms: float) -> Timing:
    return Timing(ms, ms * 0.98, ms * 1.05, ms * 0.99, ms * 1.01, 20)


def write_record(path: Path, task, program, space: ScheduleSpace, eager: float, compiled: float, floor: float,
                 made_up_ms) -> Path:
    """A project with a made-up verdict for every legal schedule (made_up_ms(schedule) None: a compile error)."""
    records = []
    for schedule in space.enumerate():
        rec = CandidateRecord.from_program(program.with_schedule(schedule), origin="test-data (made up)")
        ms = made_up_ms(schedule)
        if ms is None:
            rec.status, rec.reason = "compile_error", "made-up failure for tests"
        else:
            m = Measurement(_ms_timing(ms), eager_ms=eager, compile_ms=compiled, speedup_eager=eager / ms,
                            speedup_compile=compiled / ms, floor_ms=floor, roofline_fraction=floor / ms)
            rec.status, rec.measurement = "measured", dataclasses.asdict(m)
        records.append(rec)
    with Project.create(path, task, GPU) as project:
        project.set_baselines("test-gpu", Baselines(eager=_ms_timing(eager), compile=_ms_timing(compiled),
                                                    task_hash=task.hash, gpu=GPU["name"]))
        project.add_candidates(records)
    return path


def make_record(name: str, path: Path) -> Path:
    """Made-up verdicts for every schedule of the hand-written resources/programs/NAME.json."""
    task = load_task(TASKS / f"{name}.py")
    program = KernelProgram.load(PROGRAMS / f"{name}.json")
    eager, compiled, floor, times = TIMES[name]
    return write_record(path, task, program, ScheduleSpace.from_program(program, task), eager, compiled, floor,
                        lambda s: times[s["BLOCK"]])


def make_generated_record(path: Path) -> Path:
    """Made-up verdicts for every legal schedule of the program the code generators make for ROW_SUM."""
    task = load_task_from_source(ROW_SUM, "row_sum")
    gen = generate(task)
    space = ScheduleSpace.from_program(gen.program, task, constraints=gen.space_constraints)
    return write_record(path, task, gen.program, space, 0.03, 0.02, 0.005,      # any time that varies by schedule
                        lambda s: 0.01 + 0.0001 * sum(v % 97 for v in s.values()))


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("records")
    for name in TIMES:
        make_record(name, folder / f"{name}.cuagent")
    make_generated_record(folder / "row_sum.cuagent")
    # A record named like a suite task but made from other source: it must not answer for it.
    other = load_task_from_source((TASKS / "act_silu_bf16.py").read_text() + "\n# edited\n", "act_silu_bf16")
    Project.create(folder / "act_silu_bf16-old.cuagent", other).close()
    return folder


@pytest.fixture
def suite(tmp_path) -> Path:
    """Three tasks with records (one generated), one with none, one no generator lowers, one malformed."""
    folder = tmp_path / "suite"
    folder.mkdir()
    for name in ("act_gelu", "softmax_lastdim", "act_silu_bf16"):
        shutil.copy(TASKS / f"{name}.py", folder)
    shutil.copy(UNLOWERED, folder)
    (folder / "broken.py").write_text(BROKEN)
    (folder / "row_sum.py").write_text(ROW_SUM)
    return folder


def rows_by_task(report: BenchReport) -> dict[str, TaskRow]:
    return {r.task: r for r in report.rows}


def bench(suite: Path, records: Path, projects: Path, budget: int, observer=None, **kw) -> Bench:
    # The records of act_gelu and softmax_lastdim are of their hand-written programs: tune those.
    return Bench(BenchConfig(suite=suite, projects=projects, policy="random", budget=budget, replay=[records],
                             programs=PROGRAMS, **kw), observer=observer)


def test_bench_lists_every_task_and_resumes_its_projects(suite, records, tmp_path):
    projects = tmp_path / "projects"
    report = bench(suite, records, projects, budget=2).run()
    assert [r.task for r in report.rows] == ["act_gelu", "act_silu_bf16", "broken", "mode_rows", "row_sum",
                                             "softmax_lastdim"]
    rows = rows_by_task(report)
    for name in (*TIMES, "row_sum"):
        assert rows[name].status == "ok" and rows[name].evaluated == 2 and not rows[name].resumed
        assert rows[name].gpu == GPU["name"] and rows[name].family in ("activation", "softmax", "reduction")
    generated = rows["row_sum"]                    # tuned as `run` would: the code generators' program
    assert "; generated " in generated.note and generated.correct == 2 and generated.best_ms is not None
    assert generated.speedup_eager == pytest.approx(0.03 / generated.best_ms)
    assert rows["act_silu_bf16"].status == "no record"
    assert "other source" in rows["act_silu_bf16"].note and "act_silu_bf16-old.cuagent" in rows["act_silu_bf16"].detail
    assert rows["mode_rows"].status == "no lowering" and rows["mode_rows"].note.startswith("mode")
    assert rows["broken"].status == "load error" and "syntax error at line 3" in rows["broken"].note
    assert rows["broken"].family is None and report.failed == [rows["broken"]]
    assert sorted(p.name for p in projects.iterdir()) == ["act_gelu.cuagent", "row_sum.cuagent",
                                                          "softmax_lastdim.cuagent"]

    # Again on the same projects: each continues (a new run), and the three-schedule spaces run out.
    rows = rows_by_task(bench(suite, records, projects, budget=2).run())
    gelu, softmax = rows["act_gelu"], rows["softmax_lastdim"]
    assert gelu.resumed and gelu.evaluated == 3 and gelu.correct == 2 and gelu.this_run == 1
    assert "resumed project, +1 evaluations" in gelu.note
    assert (gelu.best_ms, gelu.eager_ms, gelu.compile_ms) == pytest.approx((0.5, 1.0, 0.8))
    assert (gelu.speedup_eager, gelu.speedup_compile, gelu.floor_fraction) == pytest.approx((2.0, 1.6, 0.8))
    assert softmax.evaluated == softmax.correct == 3 and softmax.best_ms == pytest.approx(0.2)
    with Project.open(projects / "act_gelu.cuagent", readonly=True) as p:
        assert len(p.runs()) == 2 and all(r.clean for r in p.runs()) and p.count(status="queued") == 0


def test_cli_writes_the_table_with_a_geomean_row(suite, records, tmp_path, capsys):
    out = tmp_path / "results" / "h200.md"
    code = main(["bench", str(suite), "--replay", str(records), "--budget", "3", "--policy", "random",
                 "--programs", str(PROGRAMS),
                 "--out", str(out), "--tasks", "act_gelu", "softmax_lastdim", "act_silu_bf16", "mode_rows"])
    assert code == 0                                         # no task failed to load or run
    text = out.read_text()
    assert text in capsys.readouterr().out
    assert (tmp_path / "results" / "h200-projects" / "act_gelu.cuagent").is_file()     # next to --out
    assert "GPU: Made-up GPU (test data) (replayed)" in text and "policy: random" in text
    assert "`cuda-agent bench " in text and "--budget 3" in text and "Replayed:" in text
    lines = text.splitlines()
    assert ("| act_gelu | activation | 3 | 2 | 0.5000 | 1.000 | 0.8000 | 2.00x | 1.60x | 80 % | "
            "ok: budget spent; program file |") in lines
    assert ("| softmax_lastdim | softmax | 3 | 3 | 0.2000 | 0.5000 | 0.4000 | 2.50x | 2.00x | 50 % | "
            "ok: budget spent; program file |") in lines
    assert "| act_silu_bf16 | activation | - | - | - | - | - | - | - | - | no record: the records of this name " \
           "were made from other source |" in lines
    assert any(line.startswith("| mode_rows | mode | - |") and "no lowering: mode.default" in line
               for line in lines)
    # geomeans: sqrt(2.0 * 2.5), sqrt(1.6 * 2.0), sqrt(0.8 * 0.5)
    assert "| geomean | | | | | | | 2.24x | 1.79x | 63 % | over 2 tasks |" in lines
    assert "broken" not in text


def test_cli_exit_codes(suite, records, tmp_path, capsys):
    assert main(["bench", str(suite), "--replay", str(records), "--tasks", "nope", "--out",
                 str(tmp_path / "t.md")]) == 2
    assert "no such task" in capsys.readouterr().err
    assert main(["bench", str(tmp_path / "missing"), "--replay", str(records)]) == 2
    assert main(["bench", str(suite), "--replay", str(tmp_path / "none.cuagent")]) == 2
    assert "none.cuagent does not exist" in capsys.readouterr().err
    out = tmp_path / "t.md"          # a malformed task is listed and makes the exit status 1
    assert main(["bench", str(suite), "--replay", str(records), "--tasks", "broken", "--out", str(out)]) == 1
    assert "| broken | - | - |" in out.read_text() and "Details:" in out.read_text()


def test_without_replay_and_without_a_gpu_the_bench_refuses(suite, tmp_path, capsys):
    from core.evaluation.probe import probe_gpus

    if probe_gpus().can_run:
        pytest.skip("this machine has a GPU")
    assert main(["bench", str(suite), "--out", str(tmp_path / "t.md")]) == 3
    assert "cannot measure here" in capsys.readouterr().err
    assert not (tmp_path / "t.md").exists()


def test_stop_ends_the_suite_after_the_task_in_flight(suite, records, tmp_path):
    def observer(event):
        if isinstance(event, TaskFinished) and event.row.task == "act_gelu":
            b.stop()

    b = bench(suite, records, tmp_path / "p", budget=2, observer=observer)
    report = b.run()
    rows = rows_by_task(report)
    assert rows["act_gelu"].status == "ok" and rows["act_gelu"].evaluated == 2
    assert all(rows[n].status == "not run" for n in ("act_silu_bf16", "broken", "row_sum", "softmax_lastdim",
                                                     "mode_rows"))
    assert report.interrupted and "Interrupted (Ctrl-C): 5 of 6 tasks not run." in markdown(report)


def test_stop_now_ends_the_task_in_flight_after_its_candidate(suite, records, tmp_path):
    def observer(event):
        if isinstance(event, CandidateEvaluated):
            b.stop(now=True)

    b = bench(suite, records, tmp_path / "p", budget=3, observer=observer, tasks=["softmax_lastdim", "act_gelu"])
    rows = rows_by_task(b.run())
    assert rows["act_gelu"].status == "stopped" and rows["act_gelu"].evaluated == 1
    assert rows["softmax_lastdim"].status == "not run"
    with Project.open(tmp_path / "p" / "act_gelu.cuagent", readonly=True) as p:
        assert [r.clean for r in p.runs()] == [True]


def test_markdown_on_known_numbers():
    rows = [TaskRow("a", "ok", "budget spent", family="act", evaluated=10, correct=8, best_ms=0.25, eager_ms=1.0,
                    compile_ms=0.5, floor_fraction=0.9),
            TaskRow("b", "ok", "space exhausted", evaluated=4, correct=4, best_ms=2.0, eager_ms=4.0,
                    floor_fraction=0.4),
            TaskRow("c|d", "no lowering", "mm.default", detail="Task 'c|d': no code generator lowers 'mm.default'.")]
    report = BenchReport("suite", rows, "ppo", 10, 60.0, "cuda-agent bench suite", "2026-12-01 10:00 UTC",
                         replay=False, projects="bench-projects")
    text = markdown(report)
    lines = text.splitlines()
    assert lines[2] == ("2026-12-01 10:00 UTC · GPU: unknown · policy: ppo · budget: 10 evaluations or 60 s per "
                        "task · `cuda-agent bench suite`")
    assert "| a | act | 10 | 8 | 0.2500 | 1.000 | 0.5000 | 4.00x | 2.00x | 90 % | ok: budget spent |" in lines
    assert "| b | - | 4 | 4 | 2.000 | 4.000 | - | 2.00x | - | 40 % | ok: space exhausted |" in lines
    assert "| c\\|d | - | - | - | - | - | - | - | - | - | no lowering: mm.default |" in lines
    # vs eager: sqrt(4 * 2) = 2.83; vs compile: a only; floor: sqrt(0.9 * 0.4) = 0.6
    assert ("| geomean | | | | | | | 2.83x | 2.00x | 60 % | vs eager over 2 tasks, vs compile over 1, "
            "floor over 2 |") in lines
    assert "- c|d: Task 'c|d': no code generator lowers 'mm.default'." in lines
    assert "Replayed" not in text and "Interrupted" not in text
    assert "interleaved" not in text                 # no best was re-measured (a replay, or confirm off)
    rows[1].interleaved_speedup = 1.9
    lines = markdown(report).splitlines()
    assert "- b: 1.90x eager" in lines and not any(line.startswith("- a: ") for line in lines)


def test_short_reasons():
    assert _short("Task file '/x/b.py' has a syntax error at line 3, column 17: invalid syntax. More.") == \
        "syntax error at line 3, column 17: invalid syntax"
    assert _short("project error: /p/a.cuagent belongs to task 'a' with other source; use another.") == \
        "project error: /p/a.cuagent belongs to task 'a' with other source; use another"
    assert len(_short("the run failed: " + "x" * 200)) == 80
