"""Time each kernel of a generated program on its own, after an L2 flush, for finding where a
multi-kernel task's time goes (the evaluator times the whole program only).

    PYTHONPATH=. python bench/kernel_times.py loss_cross_entropy 'loss_cross_entropy:G1_BLOCK=1024' ...

Each argument is TASK (its default schedule) or TASK:KNOB=V,KNOB=V (the default with those knobs
changed). `--options` adds NVRTC options (for example `-use_fast_math`) and `--replace OLD=>NEW` edits the
generated source before it compiles: what-if experiments that say how much of a kernel's time an
instruction mix costs; their outputs are checked like any other. Prints per kernel: grid, block, median us of REPS launches each after a write of twice the
L2 (DESIGN section 4's flush), and the whole program timed the same way, against the task's
roofline floor (core.evaluation.roofline: the evaluator's floor, from this GPU's cached ceilings). The
outputs are checked against the reference first (torch.allclose at the task's tolerance); a
schedule whose output is wrong is reported, not timed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from core.codegen import generate  # noqa: E402
from core.evaluation.gpuinfo import describe_gpu, gpu_key  # noqa: E402
from core.evaluation.protocol import ProgramArtifact  # noqa: E402
from core.evaluation.roofline import Ceilings, compute_dtype, floor_ms, get_ceilings, minimum_bytes  # noqa: E402
from core.evaluation.runner import BoundProgram, LoadedProgram  # noqa: E402
from core.tasks import load_task  # noqa: E402
from core.toolchain import compile_cuda  # noqa: E402

TASKS = ROOT / "resources" / "tasks"


def parse(arg: str) -> tuple[str, dict[str, int]]:
    name, _, knobs = arg.partition(":")
    changes = {}
    for item in filter(None, knobs.split(",")):
        k, _, v = item.partition("=")
        changes[k.strip()] = int(v)
    return name, changes


def timed_us(fn, flush: torch.Tensor, reps: int) -> float:
    times = []
    for _ in range(reps):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def edited(source: str, replacements: list[str]) -> str:
    """The source with each 'OLD=>NEW' replacement made; an OLD that is not there is an error."""
    for item in replacements:
        old, sep, new = item.partition("=>")
        if not sep or old not in source:
            raise ValueError(f"--replace {item!r}: {'no =>' if not sep else 'OLD not in the source'}")
        source = source.replace(old, new)
    return source


def scheduled(arg: str) -> tuple[Any, dict[str, int], Any, str | None]:
    """(task, schedule, the generated program at that schedule, why the schedule is illegal or None)
    for a TASK or TASK:KNOB=V,... spec."""
    name, changes = parse(arg)
    task = load_task(TASKS / f"{name}.py")
    gp = generate(task)
    schedule = {**gp.spec.default(), **changes}
    why = gp.spec.why_illegal(schedule)
    return task, schedule, (None if why else gp.program.with_schedule(schedule)), why


def run_one(arg: str, dev: torch.device, gpu: dict, flush: torch.Tensor, ceilings: Ceilings, reps: int,
            options: list[str] = (), replacements: list[str] = ()) -> None:
    task, schedule, program, why = scheduled(arg)
    if why:
        print(f"\n## {arg}: illegal schedule: {why}")
        return
    if replacements:
        program.source = edited(program.source, list(replacements))
    result = compile_cuda(program.source, arch=gpu["arch"], options=[*program.compile_options(), *options])
    if not result.ok:
        print(f"\n## {arg}: compile failed: {result.error_summary()}")
        return
    runner = SimpleNamespace(task=task, device=dev, gpu=gpu)
    artifact = ProgramArtifact(program=program.to_dict(), cubin=result.cubin, content_hash=str(hash(arg)))
    loaded = LoadedProgram(artifact, runner)
    model = task.make_model(0, dev)
    inputs = task.make_inputs(0, dev)
    bound = BoundProgram(loaded, model, inputs)
    outs = [o.clone() for o in bound.launch_all()]
    with torch.no_grad():
        ref = model(*inputs)
    ref = list(ref) if isinstance(ref, (tuple, list)) else [ref]
    atol, rtol = task.tolerance()
    for o, r in zip(outs, ref):
        if not torch.allclose(o.float(), r.float().reshape(o.shape), atol=atol, rtol=rtol, equal_nan=True):
            print(f"\n## {arg}: WRONG output (max abs err {(o.float() - r.float().reshape(o.shape)).abs().max():.3g})")
            return
    import cupy

    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    floor = floor_ms(minimum_bytes(task), task.flops or 0, compute_dtype(task), ceilings) * 1e3
    print(f"\n## {arg}  schedule {schedule}")
    print("| kernel | grid | block | smem | us |\n|---|---|---|---|---|")
    total_parts = 0.0
    for launch, (f, grid, block, args, shared) in zip(loaded.last_plan.launches, bound.launches):
        us = timed_us(lambda: f(grid, block, args, shared_mem=shared, stream=stream), flush, reps)
        total_parts += us
        print(f"| {launch.kernel} | {grid} | {block} | {shared} | {us:.1f} |")
    whole = timed_us(bound.launch_all, flush, reps)
    eager = timed_us(lambda: model(*inputs), flush, reps)
    line = f"whole program {whole:.1f} us (sum of parts {total_parts:.1f}); eager {eager:.1f} us"
    if floor:
        line += f"; floor {floor:.1f} us -> {floor / whole:.0%} of floor"
    print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+", help="TASK or TASK:KNOB=V,KNOB=V")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--options", nargs="*", default=[], help="extra NVRTC options, e.g. -use_fast_math")
    ap.add_argument("--replace", nargs="*", default=[], metavar="OLD=>NEW", help="source edits (what-if)")
    args = ap.parse_args()
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    gpu = describe_gpu(dev)
    flush = torch.empty(2 * gpu["l2_bytes"] // 4, dtype=torch.float32, device=dev)
    ceilings = get_ceilings(dev, gpu["name"], gpu_key(gpu))
    print(f"GPU {gpu['name']}, copy {ceilings.copy_gbps:.0f} GB/s")
    for spec in args.specs:
        try:
            run_one(spec, dev, gpu, flush, ceilings, args.reps, args.options, args.replace)
        except Exception as exc:                       # one bad spec does not end the table
            print(f"\n## {spec}: failed: {type(exc).__name__}: {exc}")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
