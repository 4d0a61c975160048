"""Generated programs against PyTorch's own CUDA kernels, every case in one process, where the
evaluator (tests/gpu/test_codegen_cases_gpu.py) starts a judge and a runner process per case (about
50 s a case on an H100). For each case: generate(), then at the default and
SAMPLED random legal schedules compile with NVRTC for this GPU, launch with CuPy on outputs poisoned
with NaN / a bit pattern, and compare with eager PyTorch on the GPU on the same inputs: integer and
bool outputs exactly (indices included), floating ones within the task dtype's tolerance of the
evaluator (core.tasks.dtype_tolerance). Not a replacement for the evaluator's checks (no float64
reference, no fresh inputs, no hostile-kernel checks): a check of the generated CUDA's arithmetic.

    PYTHONPATH=. python3 bench/codegen_direct_gpu.py [-k SUBSTRING ...] [--sampled N] [--out FILE]

Cases: tests/gpu/test_codegen_cases_gpu.py's SOURCES (its -k matches case names, as pytest's does
for one substring). Prints one line per case and a summary; exit 1 when any case failed.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
import traceback

import torch


def _compare(name: str, got: torch.Tensor, want: torch.Tensor, tolerance: tuple[float, float]) -> str | None:
    if got.shape != want.shape and got.numel() == want.numel():
        got = got.reshape(want.shape)
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{name}: {got.dtype}{list(got.shape)} where eager gives {want.dtype}{list(want.shape)}"
    if not want.is_floating_point():
        bad = (got != want).nonzero()
        return None if len(bad) == 0 else \
            f"{name}: {len(bad)} of {want.numel()} differ, first at {bad[0].tolist()}: {got[tuple(bad[0])].item()} " \
            f"vs {want[tuple(bad[0])].item()}"
    atol, rtol = tolerance
    g, w = got.double(), want.double()
    close = torch.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    if bool(close.all()):
        return None
    bad = (~close).nonzero()
    at = tuple(bad[0].tolist())
    return f"{name}: {len(bad)} of {want.numel()} outside atol {atol:g} rtol {rtol:g}, first at {list(at)}: " \
           f"{g[at].item():.6g} vs {w[at].item():.6g}"


class Launcher:
    """A generated program compiled for this GPU and bound to fixed tensors: call() launches it."""

    def __init__(self, program, env: dict, tensors: dict, arch: str):
        import cupy
        import numpy as np

        from core.evaluation.runner import opt_in_shared
        from core.program import LaunchLimits, ScalarArg, TensorArg
        from core.toolchain import compile_cuda

        built = compile_cuda(program.source, arch=arch, options=program.compile_options())
        if not built.ok:
            raise RuntimeError(built.error_summary())
        self.module = cupy.cuda.function.Module()
        self.module.load(built.cubin)
        plan = program.resolve(env, LaunchLimits(max_shared_bytes=227 * 1024, max_buffer_bytes=1 << 40))
        self.buffers = {b.name: (torch.zeros if b.zeroed else torch.empty)(b.shape, dtype=getattr(torch, b.dtype),
                                                                          device="cuda") for b in plan.buffers}
        every = {**tensors, **self.buffers}
        np_types = {"int32": np.int32, "int64": np.int64, "uint32": np.uint32, "uint64": np.uint64,
                    "float32": np.float32, "float64": np.float64}
        self.launches = []
        for launch in plan.launches:
            f = self.module.get_function(launch.kernel)
            opt_in_shared(f, launch.shared_bytes)      # as the runner does
            args = tuple(np.uint64(every[a.name].data_ptr()) if isinstance(a, TensorArg) else np_types[a.ctype](a.value)
                         for a in launch.args if isinstance(a, (TensorArg, ScalarArg)))
            self.launches.append((f, launch.grid, launch.block, args, launch.shared_bytes))
        self.outputs = [self.buffers[o] for o in plan.outputs]
        self.zeroed = {b.name for b in plan.buffers if b.zeroed}
        self.stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    def __call__(self):
        for f, grid, block, args, shared in self.launches:
            f(grid, block, args, shared_mem=shared, stream=self.stream)
        return self.outputs


def check_case(name: str, source: str, sampled: int, arch: str) -> list[str]:
    from core.codegen import generate
    from core.program import TensorInfo
    from core.tasks import load_task_from_source
    from core.tasks.task import dtype_tolerance

    task = load_task_from_source(source, name)
    gen = generate(task)
    model = task.make_model(0, "cuda")
    inputs = task.make_inputs(1, "cuda")
    with torch.no_grad():
        want = model(*inputs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    env, tensors = {}, {}
    for n, v in [*zip(task.input_names, inputs), *model.state_dict().items()]:
        if isinstance(v, torch.Tensor):
            tensors[n] = v.contiguous()
            env[n] = TensorInfo(tuple(v.shape), str(v.dtype).removeprefix("torch."))
        else:
            env[n] = v
    failures = []
    schedules = [gen.spec.default()] + gen.spec.sample(random.Random(name), sampled)
    for schedule in schedules:
        try:
            run = Launcher(gen.program.with_schedule(schedule), env, tensors, arch)
        except RuntimeError as exc:
            failures.append(f"{schedule}: NVRTC: {exc}")
            continue
        for buf_name, buf in run.buffers.items():       # poisoned, so an unwritten element shows
            if buf_name not in run.zeroed:
                buf.fill_(float("nan") if buf.is_floating_point() else True if buf.dtype == torch.bool else -7)
        outs = run()
        torch.cuda.synchronize()
        for k, (got, w) in enumerate(zip(outs, want)):
            problem = _compare(f"output {k}", got, w, dtype_tolerance(str(w.dtype).removeprefix("torch.")))
            if problem:
                failures.append(f"{schedule}: {problem}")
    return failures


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", action="append", default=[], help="case names containing this (any of them)")
    ap.add_argument("--sampled", type=int, default=3, help="random legal schedules besides the default")
    args = ap.parse_args()
    sys.path.insert(0, ".")
    from tests.gpu.test_codegen_cases_gpu import SOURCES

    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    names = [n for n in sorted(SOURCES) if not args.k or any(k in n for k in args.k)]
    print(f"{torch.cuda.get_device_name()} ({arch}): {len(names)} cases, default + {args.sampled} sampled schedules")
    failed = 0
    start = time.perf_counter()
    for name in names:
        t0 = time.perf_counter()
        try:
            problems = check_case(name, SOURCES[name], args.sampled, arch)
        except Exception:
            problems = ["crashed: " + traceback.format_exc(limit=4).strip().replace("\n", " | ")]
        failed += bool(problems)
        print(f"{'FAIL' if problems else 'ok  '} {name} ({time.perf_counter() - t0:.1f} s)")
        for p in problems[:4]:
            print(f"     {p[:600]}")
    print(f"{len(names) - failed} passed, {failed} failed in {time.perf_counter() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
