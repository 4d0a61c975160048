"""Does NVRTC compile the same source faster the second time, in a fresh process? (no GPU needed)

    PYTHONPATH=. python3 bench/nvrtc_repeat.py [TASK.py] [--rounds 3]

The seventeenth and eighteenth sessions' throughput runs (docs/performance.md) saw NVRTC take 1-3 s
for the unrolled variants of bench/tasks/pw_trig_chain_1ms.py in the first run on a fresh machine
and 0.02-0.03 s for the same sources in later runs, each with an empty compile cache of our own.
This compiles a few schedules of the task's generated program, each in a new process (as a compile
worker would), several rounds in a row, and prints NVRTC's time per compile. It then prints what
could cache compiles outside cuda-agent (environment variables and cache folders). Last, it compiles
them with the CUDA driver's compute cache in an empty folder (CUDA_CACHE_PATH), twice, and with that
cache disabled (CUDA_CACHE_DISABLE=1). NVRTC 12.9+ caches there when a driver is installed; the H200
host's answer is in docs/performance.md, eighteenth session.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEDULES = [{"ITEMS": 4, "VEC": 4, "BLOCK": 512, "GRID": 1024}, {"ITEMS": 4, "VEC": 2, "BLOCK": 128, "GRID": 16384},
             {"ITEMS": 2, "VEC": 4, "BLOCK": 1024, "GRID": 0}]

CHILD = r"""
import json, sys, time
from core.toolchain.nvrtc import compile_cuda, nvrtc_version
source, options = json.loads(sys.stdin.read())
start = time.perf_counter()
result = compile_cuda(source, arch="sm_90", options=options)
print(json.dumps({"ok": result.ok, "seconds": time.perf_counter() - start, "nvrtc": nvrtc_version()}))
"""


def compile_in_child(source: str, options: list[str], env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps([source, options]), text=True,
                          capture_output=True, cwd=ROOT, env=env)
    if proc.returncode != 0:
        return {"ok": False, "seconds": float("nan"), "error": proc.stderr.strip()[-300:]}
    return json.loads(proc.stdout)


def compile_round(program, env: dict[str, str]) -> tuple[str, str | None]:
    """Each of SCHEDULES compiled in a new process: ("s, s, s", NVRTC's version)."""
    times, version = [], None
    for schedule in SCHEDULES:
        p = program.with_schedule({k: v for k, v in schedule.items() if k in program.tunables})
        out = compile_in_child(p.source, p.compile_options(), env)
        version = out.get("nvrtc", version)
        times.append(f"{out['seconds']:.2f}" + ("" if out["ok"] else f" (failed: {out.get('error', '')})"))
    return ", ".join(times), version


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("task", nargs="?", default=str(ROOT / "bench" / "tasks" / "pw_trig_chain_1ms.py"))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from core.codegen import generate
    from core.tasks.loader import load_task

    program = generate(load_task(args.task)).program
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    print(f"NVRTC time per compile, s (each in a new process), {Path(args.task).stem}:", flush=True)
    for rnd in range(1, args.rounds + 1):
        times, version = compile_round(program, env)
        print(f"  round {rnd}: {times}  (nvrtc {version})", flush=True)
    print("environment:", {k: v for k, v in os.environ.items() if "CACHE" in k or k.startswith(("CUDA_", "NVRTC"))})
    for folder in (Path.home() / ".nv", Path.home() / ".cache", Path("/tmp")):
        try:
            print(f"{folder}:", sorted(p.name for p in folder.iterdir())[:30])
        except OSError as exc:
            print(f"{folder}: {exc}")
    # NVRTC 12.9+ keeps compiled cubins in the CUDA driver's compute cache (CUDA_CACHE_PATH, default
    # ~/.nv/ComputeCache) when a driver is present: a fresh folder should bring the first times back.
    with tempfile.TemporaryDirectory() as folder:
        print(f"  CUDA_CACHE_PATH=<empty folder>: {compile_round(program, {**env, 'CUDA_CACHE_PATH': folder})[0]}", flush=True)
        print(f"  CUDA_CACHE_PATH=<the same folder again>: {compile_round(program, {**env, 'CUDA_CACHE_PATH': folder})[0]}",
              flush=True)
        print("  that folder now holds", sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file()), "bytes")
    print(f"  CUDA_CACHE_DISABLE=1: {compile_round(program, {**env, 'CUDA_CACHE_DISABLE': '1'})[0]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
