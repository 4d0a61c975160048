"""The matmul family's kernels against eager and torch.compile on a GPU: each task's default schedule,
then fixed variants (tensor cores or not, PREFETCH, tiles), every one checked and timed by the
evaluator (bench/sweep.py's sweep_task). Prints one row per schedule and writes OUT/mma_speed.json.

    PYTHONPATH=. python3 bench/mma_speed.py --out DIR [--tasks NAME ...] [--deadline S] [--variants N] [--sampled N]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sweep import sweep_task  # noqa: E402
from core.codegen import generate  # noqa: E402
from core.evaluation import SupervisorSettings  # noqa: E402
from core.tasks import load_task  # noqa: E402

TASKS = ["mm_bf16_rect", "conv_depthwise2d", "mm_square", "fused_swiglu_bf16", "mm_fp16", "fused_linear_gelu_scale",
         "conv_2d", "conv_transpose2d"]
# Overrides of every product group's knobs (BM, BN, BK, TM, TN, PREFETCH, GROUP_M[, MMA, STAGES]).
MMA_TILE = {"MMA": 1, "BM": 128, "BN": 128, "BK": 32, "TM": 4, "TN": 4, "PREFETCH": 0, "STAGES": 0, "GROUP_M": 1}
# The register-staged tile (the default before the cp.async ring), then the ring with the tiles walked
# GROUP_M row tiles at a time, deeper, and with BK = 64. (The twenty-second session's PREFETCH, BK = 16
# and smaller-tile variants of MMA_TILE, and this session's other ring variants, are in
# docs/performance.md.)
HALF_VARIANTS = [
    MMA_TILE,
    {**MMA_TILE, "STAGES": 3, "GROUP_M": 8},
    {**MMA_TILE, "STAGES": 4, "GROUP_M": 8},
    {**MMA_TILE, "STAGES": 3, "BK": 64},
    {**MMA_TILE, "STAGES": 3, "BK": 64, "GROUP_M": 8},
]
# The SIMT kernel: its fragments read one element at a time (SVEC=1, the default before 2026-12-06), with
# and without PREFETCH, then vector reads (SVEC=4, the default now) with other slices and tiles. (The
# twenty-second and twenty-third sessions' GROUP_M and PREFETCH variants are in docs/performance.md.)
FLOAT_VARIANTS = [
    {"SVEC": 1},
    {"SVEC": 1, "PREFETCH": 0},
    {"PREFETCH": 0},
    {"BK": 16},
    {"GROUP_M": 8},
    {"BM": 128, "BN": 64, "TM": 8, "TN": 4},
    {"BM": 64, "BN": 64, "BK": 16, "TM": 4, "TN": 4},
]
# OCC=1 (registers held to two 256-thread blocks an SM), with both fragment reads.
OCC_VARIANTS = [{"OCC": 1}, {"SVEC": 1}, {"SVEC": 1, "OCC": 1}]


def variants(default: dict, overrides: list[dict]) -> list[dict]:
    """The default with each override applied to every group's knobs (G<i>_NAME or NAME)."""
    out = []
    for o in overrides:
        s = dict(default)
        for key in s:
            name = key.split("_", 1)[1] if key.startswith("G") and "_" in key and key[1].isdigit() else key
            if name in o:
                s[key] = o[name]
        if s != default and s not in out:
            out.append(s)
    return out


def short(schedule: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in schedule.items() if not k.startswith("G1_"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tasks", nargs="*", default=TASKS)
    ap.add_argument("--deadline", type=float, default=480.0)
    ap.add_argument("--variants", type=int, default=None, help="only the first N fixed variants of each task")
    ap.add_argument("--occ", action="store_true", help="the OCC variants instead of the fixed ones")
    ap.add_argument("--sampled", type=int, default=6,
                    help="random legal schedules for a task with no product knobs (the pool family's depthwise convs)")
    args = ap.parse_args()
    out = Path(args.out)
    (out / "projects").mkdir(parents=True, exist_ok=True)
    stop_at = time.monotonic() + args.deadline
    rows = []
    for name in args.tasks:
        if time.monotonic() > stop_at:
            print(f"{name}: not run (deadline)", flush=True)
            continue
        task = load_task(ROOT / "resources" / "tasks" / f"{name}.py")
        gen = generate(task)
        default = gen.program.schedule
        half = any(k.endswith("MMA") for k in default)
        fixed = OCC_VARIANTS if args.occ else HALF_VARIANTS if half else FLOAT_VARIANTS
        known = variants(default, fixed)[:args.variants]
        evals = 1 + (len(known) or args.sampled)
        row = sweep_task(task, gen, evals, out / "projects", SupervisorSettings(), stop_at, known)
        rows.append(row)
        (out / "mma_speed.json").write_text(json.dumps(rows, indent=1, default=str))
        print_row(name, row)


def print_row(title: str, row: dict) -> None:
    """A sweep_task row: its baselines, then one line per schedule measured or failed."""
    eager, comp = row.get("eager_ms"), row.get("compile_ms")
    us = lambda ms: "-" if ms is None else f"{ms * 1e3:.1f} us"       # None: not measured (deadline)
    print(f"\n{title}: eager {us(eager)}, compile {us(comp)}, floor {us(row.get('floor_ms'))}", flush=True)
    for m in row.get("measured", []):
        vs = lambda base: f"{base / m['ms']:.2f}x" if base else "-"
        print(f"  {m['ms'] * 1e3:10.1f} us  vs eager {vs(eager):>6}  vs compile {vs(comp):>6}  {short(m['schedule'])}",
              flush=True)
    for f in row.get("failures", []):
        print(f"  FAILED {f['status']}: {f['reason'][:300]}  {short(f['schedule'])}", flush=True)


if __name__ == "__main__":
    main()
