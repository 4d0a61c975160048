"""Transposed convolutions phase by phase against the unsplit form (every tap, zeros multiplied), on a
GPU, in one run: each task's default schedule and the same with PREFETCH flipped, both forms, against eager and
torch.compile (bench/sweep.py's sweep_task). Prints one row per program and schedule.

    PYTHONPATH=. python3 bench/tconv_phases.py --out DIR [--tasks PATH ...] [--deadline S]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.mma_speed import print_row  # noqa: E402
from bench.sweep import sweep_task  # noqa: E402
from core.codegen import generate, lower_matmul  # noqa: E402
from core.evaluation import SupervisorSettings  # noqa: E402
from core.tasks import load_task  # noqa: E402

TASKS = [ROOT / "resources" / "tasks" / "conv_transpose2d.py", ROOT / "bench" / "tasks" / "conv_transpose3d_kb.py"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tasks", nargs="*", default=[str(t) for t in TASKS])
    ap.add_argument("--deadline", type=float, default=240.0)
    args = ap.parse_args()
    out = Path(args.out)
    (out / "projects").mkdir(parents=True, exist_ok=True)
    stop_at = time.monotonic() + args.deadline
    rows = []
    for path in args.tasks:
        task = load_task(path)
        for split in (True, False):
            if time.monotonic() > stop_at:
                print(f"{task.name} split={split}: not run (deadline)", flush=True)
                continue
            lower_matmul.SPLIT_PHASES = split
            gen = generate(task)
            default = dict(gen.program.schedule)
            known = [{k: (1 - v if k.endswith("PREFETCH") else v) for k, v in default.items()}]   # PREFETCH flipped
            row = sweep_task(task, gen, 2, out / "projects", SupervisorSettings(), stop_at, known)
            row["split_phases"] = split
            rows.append(row)
            (out / "tconv_phases.json").write_text(json.dumps(rows, indent=1, default=str))
            print_row(f"{task.name} {'phases split' if split else 'unsplit (zeros multiplied)'}", row)
            print(f"  ({gen.notes[0][-120:]})", flush=True)
    lower_matmul.SPLIT_PHASES = True


if __name__ == "__main__":
    main()
