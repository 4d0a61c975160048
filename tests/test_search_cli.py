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
