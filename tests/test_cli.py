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
