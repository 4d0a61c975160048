"""GPU tests of the export (issue 5): for the example programs, the exported NAME.cu builds with
torch.utils.cpp_extension.load and matches the reference; the ModelNew file passes a
KernelBench-style check (5 fresh random inputs, atol = rtol = 1e-2, weights copied from Model)
and is timed against the reference Model.

All builds (5 x load() of NAME.cu, 5 x ModelNew's load_inline) run in parallel threads, each in a
build directory of its own under a temporary TORCH_EXTENSIONS_DIR. Run with -s to see the table.
"""
from __future__ import annotations

import importlib.util
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from core.program import KernelProgram
from core.project.export import export_candidate
from core.tasks import load_task, load_task_from_source
from tests.test_export import MULTI_PROGRAM, MULTI_TASK

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "resources" / "tasks"
PROGRAMS = ROOT / "resources" / "programs"
NAMES = ["act_gelu", "softmax_lastdim", "red_sum_dim1", "norm_layernorm", "act_silu_bf16"]
# "multi" (tests/test_export.py): Python-number inputs, two outputs (one 0-d), a 2-D grid, a
# dynamic shared memory opt-in above 48 KiB, a float64 argument, a ternary tensor argument.
CASES = [*NAMES, "multi"]
KERNELBENCH_TOLERANCE = 1e-2  # KernelBench's atol and rtol
TIMINGS: dict[str, tuple[float, float]] = {}
LOADER_RUNS: dict = {}


def _import(path: Path):
    spec = importlib.util.spec_from_file_location(f"export_test_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _use_real_cuda_home() -> None:
    """torch guesses CUDA_HOME as the grandparent of `which nvcc`; where nvcc is a wrapper script
    (/usr/local/bin/nvcc -> /usr/local/cuda-13.0/bin/nvcc) that is /usr/local, which has no
    libcudart to link. Ask nvcc for its real toolkit root and tell torch."""
    import torch.utils.cpp_extension as cpp_extension

    home = cpp_extension.CUDA_HOME
    if home and (Path(home) / "include" / "cuda_runtime.h").is_file():
        return
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found: torch.utils.cpp_extension cannot build the export")
    dry = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                         capture_output=True, text=True, timeout=60)
    match = re.search(r"^#\$ TOP=(.+)$", dry.stdout + dry.stderr, re.MULTILINE)
    if match:
        root = os.path.normpath(match.group(1).strip())
        cpp_extension.CUDA_HOME = root
        os.environ["CUDA_HOME"] = root


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """name -> (program, task, extension built from NAME.cu, imported ModelNew module with its extension built)."""
    from torch.utils.cpp_extension import is_ninja_available, load

    if not is_ninja_available():
        pytest.skip("torch.utils.cpp_extension needs ninja to build extensions: pip install ninja")
    _use_real_cuda_home()
    root = tmp_path_factory.mktemp("export_gpu")
    previous = os.environ.get("TORCH_EXTENSIONS_DIR")
    os.environ["TORCH_EXTENSIONS_DIR"] = str(root / "torch_extensions")  # fresh builds, nothing left behind
    try:
        exports = {}
        for name in CASES:
            if name == "multi":
                program, task = KernelProgram.from_json(MULTI_PROGRAM), load_task_from_source(MULTI_TASK, "multi_task")
            else:
                program, task = KernelProgram.load(PROGRAMS / f"{name}.json"), load_task(TASKS / f"{name}.py")
            result = export_candidate(program, task, root / name, {"candidate_id": 0, "gpu": "test"}, name=name)
            exports[name] = (program, task, result)

        def build_cu(name: str):
            cu = exports[name][2].cu
            build_dir = root / f"build_{name}"
            build_dir.mkdir()
            return load(name=f"{name}_cu", sources=[str(cu)], build_directory=str(build_dir))

        def build_modelnew(name: str):
            module = _import(exports[name][2].modelnew)
            module._ca_extension()  # load_inline, once; ModelNew(...) reuses it
            return module

        def run_loader(name: str) -> subprocess.CompletedProcess:
            # The loader snippet, run as a user would: a fresh interpreter in the export folder.
            loader = exports[name][2].loader
            return subprocess.run([sys.executable, loader.name], cwd=loader.parent, env=dict(os.environ),
                                  capture_output=True, text=True, timeout=500)

        with ThreadPoolExecutor(max_workers=2 * len(CASES) + 1) as pool:
            cu_jobs = {n: pool.submit(build_cu, n) for n in CASES}
            modelnew_jobs = {n: pool.submit(build_modelnew, n) for n in CASES}
            LOADER_RUNS["norm_layernorm"] = pool.submit(run_loader, "norm_layernorm")
            yield {n: (*exports[n][:2], cu_jobs[n].result(), modelnew_jobs[n].result()) for n in CASES}
    finally:
        if previous is None:
            os.environ.pop("TORCH_EXTENSIONS_DIR", None)
        else:
            os.environ["TORCH_EXTENSIONS_DIR"] = previous


def _weights(model) -> list:
    return list(model.state_dict().values())  # the launcher takes them in state_dict order


@pytest.mark.parametrize("name", CASES)
def test_exported_cu_matches_the_reference(built, name):
    import torch

    program, task, ext, _ = built[name]
    atol, rtol = task.tolerance()
    for seed in (1, 2):
        model = task.make_model(seed, "cuda")
        inputs = task.make_inputs(seed + 100, "cuda")
        with torch.no_grad():
            expected = model(*inputs)
        outputs = ext.forward(*inputs, *_weights(model))
        expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
        assert len(outputs) == len(expected) == len(program.outputs)
        for got, want in zip(outputs, expected):
            assert got.shape == want.shape and got.dtype == want.dtype and got.device == want.device
            assert torch.allclose(got, want, atol=atol, rtol=rtol), (
                f"{name}: max abs error {(got.float() - want.float()).abs().max().item():.3g}")


def test_loader_snippet_runs_and_matches(built):
    done = LOADER_RUNS["norm_layernorm"].result()
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "outputs match the reference: [(16384, 4096)]" in done.stdout


def test_launcher_checks_its_arguments_and_uses_the_current_stream(built):
    import torch

    _, task, ext, _ = built["act_gelu"]
    x = torch.randn(1001, 1003, device="cuda")  # another shape, 1004003 elements: the vector loop and its tail
    torch.testing.assert_close(ext.forward(x)[0], torch.nn.functional.gelu(x), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ext.forward(x.t())[0], torch.nn.functional.gelu(x.t()), atol=1e-4, rtol=1e-4)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y = ext.forward(x)[0]
    stream.synchronize()
    torch.testing.assert_close(y, torch.nn.functional.gelu(x), atol=1e-4, rtol=1e-4)
    with pytest.raises(RuntimeError, match="input 'x' must be a CUDA tensor"):
        ext.forward(x.cpu())
    with pytest.raises(RuntimeError, match="input 'x' must have dtype float32, but has float64"):
        ext.forward(x.double())
    with pytest.raises(RuntimeError, match="must have 2 dimension"):
        ext.forward(x.reshape(-1))
    with pytest.raises(RuntimeError, match=r"buffers\[0\]\.shape\[0\] = 'x\.shape\[0\]': evaluates to 0; every buffer"):
        ext.forward(torch.empty(0, 5, device="cuda"))

    _, task, ext, _ = built["norm_layernorm"]
    model = task.make_model(0, "cuda")
    weight, bias = _weights(model)
    with pytest.raises(RuntimeError, match=r"weight 'norm.weight' \(argument norm_weight\) must have dtype float32"):
        ext.forward(x, weight.half(), bias)


def _median_ms(fn, reps: int = 30) -> float:
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


@pytest.mark.parametrize("name", CASES)
def test_modelnew_passes_a_kernelbench_style_check(built, name):
    import torch

    _, task, _, module = built[name]
    init = list(task.init_inputs)
    torch.manual_seed(42)
    model = module.Model(*init).cuda()
    torch.manual_seed(42)
    model_new = module.ModelNew(*init).cuda()
    model_new.load_state_dict(model.state_dict())
    seeds = random.Random(42).sample(range(1, 2**31), 5)  # 5 fresh random inputs, as KernelBench does
    with torch.no_grad():
        for seed in seeds:
            inputs = task.make_inputs(seed, "cuda")
            expected, got = model(*inputs), model_new(*inputs)
            assert type(got) is type(expected)  # a tensor for a tensor, a tuple for a tuple
            pairs = zip(got, expected) if isinstance(expected, tuple) else [(got, expected)]
            for g, e in pairs:
                assert g.shape == e.shape and g.dtype == e.dtype
                assert torch.allclose(g, e, atol=KERNELBENCH_TOLERANCE, rtol=KERNELBENCH_TOLERANCE), (
                    f"{name}: seed {seed}: max abs error {(g.float() - e.float()).abs().max().item():.3g}")
        if name not in NAMES:
            return  # timing a 64 x 8 toy says nothing
        inputs = task.make_inputs(seeds[0], "cuda")
        reference_ms = _median_ms(lambda: model(*inputs))
        modelnew_ms = _median_ms(lambda: model_new(*inputs))
    TIMINGS[name] = (reference_ms, modelnew_ms)
    print(f"\n{name}: reference {reference_ms:.4f} ms, ModelNew {modelnew_ms:.4f} ms, "
          f"speedup {reference_ms / modelnew_ms:.2f}x")
    # A gross slowdown means the export does extra work per call (a rebuild, a copy...).
    assert modelnew_ms < 3 * reference_ms


def test_print_timing_table():
    if not TIMINGS:
        pytest.skip("no ModelNew was timed")
    lines = ["", f"{'task':<18}{'reference ms':>14}{'ModelNew ms':>14}{'speedup':>10}"]
    for name, (ref, new) in TIMINGS.items():
        lines.append(f"{name:<18}{ref:>14.4f}{new:>14.4f}{ref / new:>9.2f}x")
    print("\n".join(lines))
