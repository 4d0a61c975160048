"""Loop throughput of `cuda-agent run` on the GPU: candidates evaluated per minute (issue 4: >= 300).

    PYTHONPATH=. python3 bench/throughput.py --out DIR RUN [RUN ...]

Each RUN is TASK:POLICY:BUDGET[:COMPILE_AHEAD]: TASK is an example task's name (resources/tasks) or a
task file's path; compile-ahead is the product's default unless given. Every run is the product command,
`cuda-agent run TASK --policy POLICY --budget BUDGET [--compile-ahead N] --project DIR/NAME-POLICY-aN.cuagent`,
one after another on one GPU.
From each project: candidates evaluated, the wall time from the first proposal to the last verdict
(the evaluator's start and the baselines come before the first proposal), candidates per minute,
the median gap between verdicts, the median kernel time, and how many candidates found their
compile already done (compile-ahead's hits). Prints a Markdown table; writes DIR/throughput.md.

--compile-workers N passes `--compile-workers N` to every run. --fixed-depth runs each through
bench/fixed_depth_run.py: compile-ahead predicts exactly COMPILE_AHEAD candidates, as before the
fifteenth session. --fresh-compile-cache empties the compile cache before each run, so no run finds
another's compiles done (the baselines stay cached).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.project import Project  # noqa: E402
from core.search.session import RunConfig  # noqa: E402
from core.toolchain.cache import default_cache_dir  # noqa: E402


def summarise(path: Path) -> dict:
    with Project.open(path, readonly=True) as project:
        recs = [r for r in project.candidates() if r.evaluated_at and r.extra.get("counted", True)]
    recs.sort(key=lambda r: r.id)
    if len(recs) < 2:
        return {"candidates": len(recs)}
    done = [datetime.fromisoformat(r.evaluated_at) for r in recs]
    seconds = (done[-1] - datetime.fromisoformat(recs[0].created_at)).total_seconds()
    gaps = [(b - a).total_seconds() for a, b in zip(done, done[1:])]
    kernel = [r.median_ms for r in recs if r.status == "measured" and r.median_ms]
    # Where an evaluation's time goes: the evaluator's own phases (core/evaluation/supervisor.py).
    phases = [r.extra.get("details", {}).get("seconds") or {} for r in recs if r.status == "measured"]
    split = {k: statistics.median(p.get(k, 0.0) for p in phases) if phases else None for k in ("check", "judge", "time")}
    evals = [r.extra["eval_seconds"] for r in recs if r.status == "measured" and r.extra.get("eval_seconds")]
    return {"eval_s": statistics.median(evals) if evals else None, **split,
            "candidates": len(recs), "seconds": seconds, "per_min": len(recs) / seconds * 60 if seconds else None,
            "gap_s": statistics.median(gaps), "kernel_us": statistics.median(kernel) * 1e3 if kernel else None,
            "cached": sum(1 for r in recs if r.extra.get("compile_cached")),
            "failed": sum(1 for r in recs if r.status != "measured")}


def _phases(s: dict) -> str:
    if s.get("eval_s") is None:
        return "-"
    return f"{s['eval_s']:.3f} ({s.get('check') or 0:.3f} / {s.get('judge') or 0:.3f} / {s.get('time') or 0:.3f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="TASK:POLICY:BUDGET[:AHEAD]")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--compile-workers", type=int, default=None, metavar="N")
    ap.add_argument("--fixed-depth", action="store_true", help="predict exactly COMPILE_AHEAD (before 2026-12-05)")
    ap.add_argument("--fresh-compile-cache", action="store_true", help="empty the compile cache before each run")
    args = ap.parse_args()
    label = ("fixed" if args.fixed_depth else "") + (f"w{args.compile_workers}" if args.compile_workers else "")
    args.out.mkdir(parents=True, exist_ok=True)
    lines = ["| task | policy | compile-ahead | candidates | failed | seconds | per minute | median gap s | "
             "median kernel us | compile already done | wall incl. start s | median evaluation s (check / judge / time) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for spec in args.runs:
        task, policy, budget, *rest = spec.split(":")
        ahead = int(rest[0]) if rest else RunConfig.__dataclass_fields__["compile_ahead"].default
        path = Path(task) if task.endswith(".py") else ROOT / "resources" / "tasks" / f"{task}.py"
        task = path.stem
        project = args.out / f"{task}-{policy}-a{ahead}{label}.cuagent"
        project.unlink(missing_ok=True)
        entry = [str(ROOT / "bench" / "fixed_depth_run.py")] if args.fixed_depth else ["-m", "core.cli"]
        cmd = [sys.executable, *entry, "run", str(path.resolve()),
               "--policy", policy, "--budget", budget, "--compile-ahead", str(ahead), "--project", str(project)]
        if args.compile_workers:
            cmd += ["--compile-workers", str(args.compile_workers)]
        if args.fresh_compile_cache:
            shutil.rmtree(default_cache_dir(), ignore_errors=True)
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.monotonic() - start
        (args.out / f"{project.stem}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0 or not project.is_file():
            print(f"{spec}: exit {proc.returncode}\n{proc.stderr[-2000:]}", flush=True)
            continue
        s = summarise(project)
        row = (f"| {task} | {policy} | {ahead}{' ' + label if label else ''} | {s['candidates']} | {s.get('failed', '-')} | "
               f"{s.get('seconds', 0):.1f} | {s.get('per_min') or 0:.0f} | {s.get('gap_s', 0):.3f} | "
               f"{s.get('kernel_us') or 0:.1f} | {s.get('cached', '-')} | {wall:.1f} | {_phases(s)} |")
        lines.append(row)
        print(row, flush=True)
    table = "\n".join(lines) + "\n"
    (args.out / "throughput.md").write_text(table)
    print("\n" + table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
