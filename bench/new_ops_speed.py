"""How fast are the generated kernels of the ops code generation took on 2026-12-07 (upsampling, the
selection family), against eager PyTorch, torch.compile and the memory floor, on realistic sizes.
One process, one GPU: each case's program (default schedule, and the best of SAMPLED random legal
schedules: a small search) is checked against eager first (bench/codegen_direct_gpu.py's
comparison), then every contender is timed the same way: CUDA events around one call, after a
write of twice the L2 (DESIGN section 4's flush), median of REPS. The floor is the bytes the op must
move (its inputs once, its outputs once) over this GPU's copy bandwidth, measured here by a
device-to-device copy of 1 GiB (median of 10).

    PYTHONPATH=. python3 bench/new_ops_speed.py [--reps 30] [--sampled 6] [--no-compile] [-k NAME]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
from tests.test_codegen_cases import HEADER  # noqa: E402


def _task(body: str, inputs: str) -> str:
    return HEADER + f"""
class Model(nn.Module):
    def forward(self, x):
        return {body}

def get_inputs():
    return [{inputs}]

def get_init_inputs():
    return []
"""


CASES = {
    "bilinear_x2": _task("F.interpolate(x, scale_factor=2, mode='bilinear', align_corners=False)",
                         "torch.randn(16, 64, 128, 128)"),
    "bilinear_x2_fp16": _task("F.interpolate(x, scale_factor=2, mode='bilinear')", "torch.randn(16, 64, 128, 128).half()"),
    "bicubic_x2": _task("F.interpolate(x, scale_factor=2, mode='bicubic', align_corners=True)",
                        "torch.randn(8, 32, 128, 128)"),
    "trilinear_x2": _task("F.interpolate(x, scale_factor=2, mode='trilinear')", "torch.randn(4, 16, 32, 64, 64)"),
    "nearest_exact_x1.5": _task("F.interpolate(x, scale_factor=1.5, mode='nearest-exact')", "torch.randn(16, 64, 128, 128)"),
    "sort_rows_1024": _task("torch.sort(x, dim=-1)", "torch.randn(4096, 1024)"),
    "argsort_dim1_strided": _task("torch.argsort(x, dim=1)", "torch.randn(64, 512, 32)"),
    "topk16_rows_4096": _task("torch.topk(x, 16, dim=-1)", "torch.randn(4096, 4096)"),
    "topk1_rows_1000": _task("torch.topk(x, 1, dim=-1)", "torch.randn(16384, 1000)"),
    "topk8_rows_16384": _task("torch.topk(x, 8, dim=-1)", "torch.randn(1024, 16384)"),
    "median_rows_255": _task("torch.median(x, dim=-1)", "torch.randn(8192, 255)"),
    "kthvalue_rows_64": _task("torch.kthvalue(x, 10, dim=-1)", "torch.randn(65536, 64)"),
    "sort_rows_65536": _task("torch.sort(x, dim=-1)", "torch.randn(64, 65536)"),
    "median_whole_4m": _task("torch.median(x)", "torch.randn(2048, 2048)"),
    "kthvalue_rows_100k": _task("torch.kthvalue(x, 500, dim=-1)", "torch.randn(64, 100000)"),
    "topk5_rows_200k": _task("torch.topk(x, 5, dim=-1)", "torch.randn(32, 200000)"),
    "topk10_row_1m": _task("torch.topk(x, 10, dim=-1)", "torch.randn(4, 1 << 20)"),
    "scatter_one_hot": _task("torch.zeros_like(x).scatter(1, torch.argmax(x, 1, keepdim=True), 1.0)",
                             "torch.randn(8192, 1000)"),
    "fold_3x3_64": _task("F.fold(x, (64, 64), 3, padding=1)", "torch.randn(8, 16 * 9, 64 * 64)"),
}


def _flush_buffer() -> torch.Tensor:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda")


def time_call(fn, reps: int, flush: torch.Tensor) -> float:
    """Median microseconds of one call after an L2 flush (kernel_times.timed_us), after a warm-up."""
    from kernel_times import timed_us      # bench/ is the script's own folder on sys.path

    fn()
    torch.cuda.synchronize()
    return timed_us(fn, flush, reps)


def copy_bandwidth() -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read + write), median of 10."""
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return 2 * src.numel() * 4 / statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--sampled", type=int, default=6)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("-k", action="append", default=[])
    args = ap.parse_args()

    from codegen_direct_gpu import Launcher, _compare      # bench/ is the script's own folder on sys.path
    from core.codegen import generate
    from core.program import TensorInfo
    from core.tasks import load_task_from_source
    from core.tasks.task import dtype_tolerance

    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    flush = _flush_buffer()
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()} ({arch}), copy bandwidth {bw / 1e9:.0f} GB/s, reps {args.reps}, "
          f"default + {args.sampled} sampled schedules")
    print("| case | bytes moved | floor us | eager us | torch.compile us | ours default us | ours best us "
          "| best schedule | eager / ours | compile / ours | floor / ours |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, source in CASES.items():
        if args.k and not any(k in name for k in args.k):
            continue
        t0 = time.perf_counter()
        task = load_task_from_source(source, name)
        model = task.make_model(0, "cuda")
        inputs = task.make_inputs(1, "cuda")
        with torch.no_grad():
            want = model(*inputs)
        want = list(want) if isinstance(want, (tuple, list)) else [want]
        moved = sum(x.numel() * x.element_size() for x in inputs) + sum(w.numel() * w.element_size() for w in want)
        floor = moved / bw * 1e6
        env = {n: TensorInfo(tuple(v.shape), str(v.dtype).removeprefix("torch.")) for n, v in zip(task.input_names, inputs)}
        tensors = dict(zip(task.input_names, inputs))
        gen = generate(task)
        results = []
        for schedule in [gen.spec.default()] + gen.spec.sample(random.Random(name), args.sampled):
            run = Launcher(gen.program.with_schedule(schedule), env, tensors, arch)
            outs = run()
            torch.cuda.synchronize()
            problems = [p for k, (o, w) in enumerate(zip(outs, want))
                        if (p := _compare(f"output {k}", o, w, dtype_tolerance(str(w.dtype).removeprefix("torch."))))]
            if problems:
                print(f"<!-- {name} {schedule}: WRONG {problems[0][:300]} -->")
                continue
            results.append((time_call(run, args.reps, flush), schedule))
            del run
        eager = time_call(lambda: model(*inputs), args.reps, flush)
        compiled_us = float("nan")
        if not args.no_compile:
            try:
                compiled = torch.compile(model)
                with torch.no_grad():
                    compiled(*inputs)
                compiled_us = time_call(lambda: compiled(*inputs), args.reps, flush)
            except Exception as exc:          # an op Inductor does not take: say so in the table
                print(f"<!-- {name}: torch.compile failed: {str(exc)[:200]} -->")
        if not results:
            print(f"| {name} | {moved / 2**20:.0f} MiB | {floor:.1f} | {eager:.1f} | {compiled_us:.1f} | wrong | wrong | | | | |")
            continue
        default_us = results[0][0] if results[0][1] == gen.spec.default() else float("nan")
        best_us, best = min(results, key=lambda r: r[0])
        knobs = ", ".join(f"{k.split('_', 1)[-1] if k.startswith('G') else k}={v}" for k, v in best.items())
        print(f"| {name} | {moved / 2**20:.0f} MiB | {floor:.1f} | {eager:.1f} | {compiled_us:.1f} | {default_us:.1f} | "
              f"{best_us:.1f} | {knobs} | {eager / best_us:.2f}x | {compiled_us / best_us:.2f}x | {floor / best_us:.0%} |",
              flush=True)
        print(f"<!-- {name}: {time.perf_counter() - t0:.0f} s -->", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
