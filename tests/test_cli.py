"""The headless CLI on a machine without a GPU: clear errors, compile-only evaluation, doctor."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from core import cli

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "resources" / "tasks" / "act_gelu.py"
PROGRAM = ROOT / "resources" / "programs" / "act_gelu.json"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "core.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_doctor_exits_zero_and_says_what_works():
    done = run_cli("doctor")
    assert done.returncode == 0, done.stderr
    assert "What works here" in done.stdout
    assert "compile checks" in done.stdout


def test_missing_task_file_is_a_clear_error():
    done = run_cli("evaluate", "no/such/task.py", str(PROGRAM))
    assert done.returncode == cli.EXIT_BAD_INPUT
    assert "task error" in done.stderr and "no/such/task.py" in done.stderr
    assert "Traceback" not in done.stderr


def test_malformed_program_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "cuda-agent/program@1", "source": "x", "buffers": [],
                                       "outputs": ["y"], "launches": "nope"}))
    done = run_cli("evaluate", str(TASK), str(bad))
    assert done.returncode == cli.EXIT_BAD_INPUT
    assert "program error" in done.stderr and "launches" in done.stderr
    assert "Traceback" not in done.stderr


def test_evaluate_without_gpu_compiles_and_says_it_did_not_run():
    from tests.conftest import gpu_unavailable_reason

    if gpu_unavailable_reason() is None:
        pytest.skip("this machine has a GPU: evaluate runs for real (see tests/gpu)")
    done = run_cli("evaluate", str(TASK), str(PROGRAM))
    assert done.returncode == cli.EXIT_UNAVAILABLE, done.stdout + done.stderr
    assert "no GPU run" in done.stdout and "compiled for sm_90" in done.stdout
    assert "gelu_f32" in done.stdout and "registers" in done.stdout


def test_evaluate_without_gpu_reports_compile_errors(tmp_path):
    from tests.conftest import gpu_unavailable_reason

    if gpu_unavailable_reason() is None:
        pytest.skip("this machine has a GPU")
    program = json.loads(PROGRAM.read_text())
    program.pop("source_file")
    program["source"] = 'extern "C" __global__ void gelu_f32(const float* x, float* y, long long n) {\n  y[0] = undefined_name;\n}\n'
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(program))
    done = run_cli("evaluate", str(TASK), str(path))
    assert done.returncode == cli.EXIT_REJECTED
    assert "line 2" in done.stdout and "undefined_name" in done.stdout


def test_parser_knows_the_commands():
    parser = cli.build_parser()
    args = parser.parse_args(["evaluate", "t.py", "p.json", "--device", "1", "--no-baselines"])
    assert args.command == "evaluate" and args.device == 1 and args.no_baselines
    args = parser.parse_args(["baseline", "t.py", "--refresh"])
    assert args.refresh


def _project_with_one_measured_candidate(path):
    from core.evaluation.results import EvalResult, Measurement, Status, Timing
    from core.program import load_solution
    from core.project import CandidateRecord, Project
    from core.tasks import load_task

    with Project.create(path, load_task(TASK), hardware={"name": "NVIDIA H200"}) as project:
        cid = project.add_candidate(CandidateRecord.from_program(load_solution(PROGRAM)))
        # A recorded verdict, as the evaluator stores it (the numbers are the test's, not a measurement).
        m = Measurement(timing=Timing.from_samples([0.1, 0.11, 0.12]), eager_ms=0.13, speedup_eager=1.18,
                        floor_ms=0.09, roofline_fraction=0.82)
        project.record_result(cid, EvalResult(Status.MEASURED, measurement=m), reward=1.0)
    return cid


def test_export_writes_the_files_and_refuses_to_overwrite(tmp_path):
    project = tmp_path / "run.cuagent"
    cid = _project_with_one_measured_candidate(project)
    out = tmp_path / "export"
    done = run_cli("export", str(project), "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    names = {p.name for p in out.iterdir()}
    assert {"REPORT.md", "act_gelu.cu", "act_gelu_modelnew.py", "act_gelu_loader.py"} <= names, names
    cu = (out / "act_gelu.cu").read_text()
    assert "PYBIND11_MODULE" in cu and "gelu_f32" in cu and "NVIDIA H200" in cu
    again = run_cli("export", str(project), "--candidate", str(cid), "--out", str(out))
    assert again.returncode == cli.EXIT_BAD_INPUT and "export error" in again.stderr
    assert run_cli("export", str(project), "--candidate", str(cid), "--out", str(out), "--force").returncode == 0


def test_export_of_a_missing_candidate_or_a_bad_file_is_a_clear_error(tmp_path):
    project = tmp_path / "run.cuagent"
    _project_with_one_measured_candidate(project)
    done = run_cli("export", str(project), "--candidate", "999", "--out", str(tmp_path / "o"))
    assert done.returncode == cli.EXIT_BAD_INPUT and "no candidate 999" in done.stderr
    junk = tmp_path / "junk.cuagent"
    junk.write_text("not a database")
    done = run_cli("export", str(junk), "--out", str(tmp_path / "o2"))
    assert done.returncode == cli.EXIT_BAD_INPUT and "Traceback" not in done.stderr


def test_export_check_builds_the_cu_with_nvcc(tmp_path):
    from core.project.export import build_check
    from core.toolchain import find_nvcc

    project = tmp_path / "run.cuagent"
    _project_with_one_measured_candidate(project)
    done = run_cli("export", str(project), "--out", str(tmp_path / "export"), "--check")
    if find_nvcc() is None:
        assert done.returncode == 0 and "build check not made" in done.stderr
        return
    probe = build_check(tmp_path / "export" / "act_gelu.cu")
    if probe.built is None:
        pytest.skip(probe.message)
    assert done.returncode == 0 and "build check: nvcc built it for sm_90" in done.stdout, done.stdout + done.stderr
    broken = tmp_path / "broken.cu"
    broken.write_text((tmp_path / "export" / "act_gelu.cu").read_text().replace("ca::check_cuda(", "ca::check_cudaa(", 1))
    check = build_check(broken)
    assert check.built is False and "check_cudaa" in check.message
