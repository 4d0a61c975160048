"""The machine code of a generated schedule, on the CPU machine: registers, spills and the SASS
instruction mix of each kernel, for reading what a change did before spending device time on it.

    PYTHONPATH=. python bench/sass_mix.py softmax_dim1_fp16 'pool_avg2d:OUT_W=4,VEC=2' --keep DIR

Each argument is a bench/kernel_times.py spec (TASK or TASK:KNOB=V,...). `nvcc -cubin -arch=sm_90`
builds the generated source with the schedule's -D options (nvcc 13.0 here, not the NVRTC the
evaluator uses: counts can differ a little from the GPU's build) and `cuobjdump -sass` lists it.
cuobjdump is not part of this machine's toolkit: it comes from the `nvidia-cuda-cuobjdump` wheel
(pip download it, unzip, point $CUOBJDUMP at nvidia/cu13/bin/cuobjdump). --keep writes each
schedule's .cu and .sass there.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def mix(sass: str) -> dict[str, collections.Counter]:
    """Mnemonic counts (without modifiers) of each kernel in cuobjdump -sass output."""
    kernels = {}
    for part in re.split(r"\n\s*Function : ", sass)[1:]:
        name = part.split("\n", 1)[0].strip()
        kernels[name] = collections.Counter(INSTRUCTION.findall(part))
    return kernels


SMS = 132     # an H200's SMs


def wave_lines(spec: str, program, ptxas: str) -> list[str]:
    """Each launch of the schedule on the task's shapes: a grid that is just over a whole number
    of waves leaves most SMs idle at its end (a memory-bound kernel loses up to that share)."""
    from bench.kernel_times import parse
    from core.search.space import env_from_task
    from core.tasks import load_task
    from core.toolchain.resources import max_active_blocks, parse_ptxas_verbose
    task = load_task(ROOT / "resources" / "tasks" / f"{parse(spec)[0]}.py")
    plan = program.resolve(env_from_task(task))
    resources = parse_ptxas_verbose(ptxas)
    lines = []
    for launch in plan.launches:
        r = resources[launch.kernel]
        threads = launch.block[0] * launch.block[1] * launch.block[2]
        blocks = launch.grid[0] * launch.grid[1] * launch.grid[2]
        smem = r.shared_bytes + launch.shared_bytes
        per_sm = max_active_blocks(r.registers, smem, threads, "sm_90", r.barriers)
        waves = blocks / (SMS * per_sm) if per_sm else float("inf")
        lines.append(f"{launch.kernel}: grid {blocks} x {threads} threads, {r.registers} registers, "
                     f"{smem} B smem: {per_sm} blocks/SM, {waves:.2f} waves")
    return lines


def main() -> int:
    from bench.kernel_times import scheduled

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+", help="TASK or TASK:KNOB=V,KNOB=V")
    ap.add_argument("--keep", type=Path, help="folder for each schedule's .cu and .sass")
    ap.add_argument("--top", type=int, default=16, help="mnemonics listed per kernel")
    ap.add_argument("--waves", action="store_true",
                    help="per launch instead of the mix: grid, registers, blocks per SM and waves on an H200")
    args = ap.parse_args()
    cuobjdump = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not cuobjdump or not shutil.which("nvcc"):
        print("needs nvcc on PATH and cuobjdump ($CUOBJDUMP; see this script's docstring)", file=sys.stderr)
        return 2
    work = args.keep or Path(tempfile.mkdtemp(prefix="sass-mix-"))
    work.mkdir(parents=True, exist_ok=True)
    for spec in args.specs:
        _, schedule, program, why = scheduled(spec)
        if why:
            print(f"{spec}: illegal schedule: {why}")
            continue
        stem = re.sub(r"[^A-Za-z0-9_]+", "_", spec)
        cu, cubin = work / f"{stem}.cu", work / f"{stem}.cubin"
        cu.write_text(program.source)
        built = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-O3", "-Xptxas", "-v", *program.compile_options(),
                                "-o", str(cubin), str(cu)], capture_output=True, text=True)
        if built.returncode:
            print(f"{spec}: nvcc failed:\n{built.stderr[-2000:]}")
            continue
        sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True).stdout
        (work / f"{stem}.sass").write_text(sass)
        resources = re.findall(r"Used \d+ registers[^\n]*|\d+ bytes spill stores, \d+ bytes spill loads", built.stderr)
        print(f"## {spec}  schedule {schedule}\n   {'; '.join(resources)}")
        if args.waves:
            for line in wave_lines(spec, program, built.stderr):
                print("   " + line)
            continue
        for kernel, counts in mix(sass).items():
            top = " ".join(f"{k}:{v}" for k, v in counts.most_common(args.top))
            print(f"   {kernel}: {sum(counts.values())} instructions: {top}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
