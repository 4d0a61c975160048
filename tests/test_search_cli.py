"""`cuda-agent run` through core/search/cli.py, on a replay of made-up test data."""
from __future__ import annotations

import argparse

from core.project import Project
from core.search.cli import EXIT_BAD_INPUT, EXIT_OK, add_run_parser
from tests.support.replay_run import TASK_PATH, record_project, search_program


def parse(argv):
    ap = argparse.ArgumentParser()
    add_run_parser(ap.add_subparsers())
    return ap.parse_args(argv)


def test_run_with_replay(tmp_path, capsys):
    record = record_project(tmp_path / "record.cuagent")
    program = tmp_path / "prog.json"
    program.write_text(search_program().to_json())
    project = tmp_path / "p.cuagent"
    for policy, budget in (("ppo", 9), ("evolution", 3)):
        args = parse(["run", str(TASK_PATH), "--project", str(project), "--program", str(program),
                      "--replay", str(record), "--budget", str(budget), "--policy", policy])
        assert args.func(args) == EXIT_OK
    out = capsys.readouterr().out
    assert "fastest candidates" in out and "run 2 finished" in out
    with Project.open(project, readonly=True) as p:
        assert p.count() == 12 and p.count(status="queued") == 0
        assert len(p.runs()) == 2 and all(r.clean for r in p.runs())


def test_run_reports_a_missing_program(tmp_path, capsys):
    args = parse(["run", str(TASK_PATH), "--project", str(tmp_path / "p.cuagent"),
                  "--program", str(tmp_path / "missing.json"), "--replay", "x"])
    assert args.func(args) == EXIT_BAD_INPUT
    assert "missing.json does not exist" in capsys.readouterr().err


def test_the_final_table_shows_both_speed_ups_and_the_floor(tmp_path):
    from rich.console import Console

    from core.project import CandidateRecord
    from core.search.cli import best_table

    measured = CandidateRecord(id=7, origin="ppo:set VEC=4", schedule={"BLOCK": 256, "VEC": 4},
                               measurement={"timing": {"median_ms": 0.125}, "speedup_eager": 2.5,
                                            "speedup_compile": 1.25, "roofline_fraction": 0.93})
    no_baselines = CandidateRecord(id=8, origin="user", schedule={"BLOCK": 128},
                                   measurement={"timing": {"median_ms": 0.25}})
    console = Console(record=True, width=200)
    console.print(best_table([measured, no_baselines]))
    text = console.export_text()
    for cell in ("vs eager", "vs compile", "of floor", "0.1250 ms", "2.50x", "1.25x", "93%", "BLOCK=256 VEC=4"):
        assert cell in text, cell
    row = next(line for line in text.splitlines() if "0.2500 ms" in line)
    assert row.count(" - ") >= 3                         # no baselines, no floor: dashes, not zeros


def test_run_refuses_negative_confirm_rounds(tmp_path, capsys):
    args = parse(["run", str(TASK_PATH), "--project", str(tmp_path / "p.cuagent"), "--replay", "x",
                  "--confirm-rounds", "-1"])
    assert args.func(args) == EXIT_BAD_INPUT
    assert "confirm-rounds must be 0" in capsys.readouterr().err
