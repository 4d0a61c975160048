"""Loop throughput of `cuda-agent run` on the GPU: candidates evaluated per minute (issue 4: >= 300).

    PYTHONPATH=. python3 bench/throughput.py --out DIR RUN [RUN ...]

Each RUN is TASK:POLICY:BUDGET[:COMPILE_AHEAD]: TASK is an example task's name (resources/tasks) or a
task file's path; compile-ahead is the product's default unless given. Every run is the product command,
`cuda-agent run TASK --policy POLICY --budget BUDGET [--compile-ahead N] --project DIR/NAME-POLICY-aN.cuagent`,
one after another on one GPU.
From each project: candidates evaluated, the wall time from the first proposal to the last verdict
(the evaluator's start, the baselines and, since 2026-12-08, the GPU's roofline ceilings come
before the first proposal; before, a GPU's first three runs measured the ceilings inside their first
candidate's evaluation, about 3 s), candidates per minute,
the median gap between verdicts, the median kernel time, and how many candidates found their
compile already done (compile-ahead's hits), the pauses over 0.4 s between verdicts, and, with
--fresh-compile-cache, how long NVRTC took for every compile of the run (the compile cache keeps
each one's time), so a slow run shows whether NVRTC was slow or the predictions missed. Prints a
Markdown table; writes DIR/throughput.md.

--repeat N runs the whole list N times in turn (projects NAME-rK), so a spread between runs shows
beside the difference between tasks or settings; --deadline SECONDS starts no run after that many
seconds. The table is rewritten after every run, and gives the host's load average just before it.

--compile-workers N passes `--compile-workers N` to every run. --fixed-depth runs each through
bench/fixed_depth_run.py: compile-ahead predicts exactly COMPILE_AHEAD candidates, as before the
fifteenth session. --fresh-compile-cache empties the compile cache before each run, so no run finds
another's compiles done (the baselines stay cached).
"""
from __future__ import annotations

import argparse
import json
import os
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
            "gap_s": statistics.median(gaps), "slow_gaps": [g for g in gaps if g > 0.4],
            "kernel_us": statistics.median(kernel) * 1e3 if kernel else None,
            "cached": sum(1 for r in recs if r.extra.get("compile_cached")),
            "failed": sum(1 for r in recs if r.status != "measured")}


def nvrtc_times(cache_dir: Path) -> list[float]:
    """Seconds of every compile stored in a compile cache (core/toolchain/cache.py's entries)."""
    times = []
    for meta in cache_dir.glob("*/*.json"):
        try:
            seconds = json.loads(meta.read_text()).get("compile_seconds")
        except (OSError, ValueError):
            continue
        if isinstance(seconds, (int, float)):
            times.append(float(seconds))
    return times


def run_environment(out: Path, fresh: bool) -> dict[str, str]:
    """The environment of one `cuda-agent run`. With `fresh`, cuda-agent's compile cache is emptied and
    the run gets an empty CUDA driver compute cache of its own (CUDA_CACHE_PATH under `out`): NVRTC 12.9+
    keeps its output there too (~/.nv/ComputeCache by default), and it outlives ours, so a repeat run
    would compile 1-3 s variants in 0.03 s (docs/performance.md, eighteenth session)."""
    env = dict(os.environ)
    if fresh:
        shutil.rmtree(default_cache_dir(), ignore_errors=True)
        driver_cache = out / ".driver-cache"
        shutil.rmtree(driver_cache, ignore_errors=True)
        env["CUDA_CACHE_PATH"] = str(driver_cache)
    return env


def _nvrtc(times: list[float]) -> str:
    if not times:
        return "-"
    ordered = sorted(times)
    return f"{len(ordered)}: {statistics.median(ordered):.2f} / {ordered[int(0.9 * (len(ordered) - 1))]:.2f}"


def _task_path(task: str) -> Path:
    return Path(task) if task.endswith(".py") else ROOT / "resources" / "tasks" / f"{task}.py"


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
    ap.add_argument("--repeat", type=int, default=1, metavar="N", help="run the list N times in turn")
    ap.add_argument("--deadline", type=float, default=float("inf"), metavar="SECONDS",
                    help="start no run after this many seconds")
    args = ap.parse_args()
    missing = [spec for spec in args.runs if not _task_path(spec.split(":")[0]).is_file()]
    if missing:
        print(f"no such task: {', '.join(missing)} (an example task's name in resources/tasks, or a task file)")
        return 2
    label = ("fixed" if args.fixed_depth else "") + (f"w{args.compile_workers}" if args.compile_workers else "")
    args.out.mkdir(parents=True, exist_ok=True)
    lines = ["| task | policy | compile-ahead | candidates | failed | seconds | per minute | median gap s | "
             "median kernel us | compile already done | gaps > 0.4 s (s) | NVRTC compiles: n: median / p90 s | "
             "load before | wall incl. start s | median evaluation s (check / judge / time) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    began = time.monotonic()
    for round_, spec in ((r, spec) for r in range(args.repeat) for spec in args.runs):
        if time.monotonic() - began >= args.deadline:
            print(f"deadline: {spec} (round {round_ + 1}) and later runs not started", flush=True)
            break
        task, policy, budget, *rest = spec.split(":")
        ahead = int(rest[0]) if rest else RunConfig.__dataclass_fields__["compile_ahead"].default
        path = _task_path(task)
        task = path.stem
        repeat = f"-r{round_ + 1}" if args.repeat > 1 else ""
        project = args.out / f"{task}-{policy}-a{ahead}{label}{repeat}.cuagent"
        project.unlink(missing_ok=True)
        entry = [str(ROOT / "bench" / "fixed_depth_run.py")] if args.fixed_depth else ["-m", "core.cli"]
        cmd = [sys.executable, *entry, "run", str(path.resolve()),
               "--policy", policy, "--budget", budget, "--compile-ahead", str(ahead), "--project", str(project)]
        if args.compile_workers:
            cmd += ["--compile-workers", str(args.compile_workers)]
        env = run_environment(args.out, fresh=args.fresh_compile_cache)
        load = os.getloadavg()[0]
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
        wall = time.monotonic() - start
        (args.out / f"{project.stem}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0 or not project.is_file():
            print(f"{spec}: exit {proc.returncode}\n{proc.stderr[-2000:]}", flush=True)
            continue
        s = summarise(project)
        slow = s.get("slow_gaps", [])
        nvrtc = _nvrtc(nvrtc_times(default_cache_dir())) if args.fresh_compile_cache else "-"
        row = (f"| {task} | {policy} | {ahead}{' ' + label if label else ''} | {s['candidates']} | {s.get('failed', '-')} | "
               f"{s.get('seconds', 0):.1f} | {s.get('per_min') or 0:.0f} | {s.get('gap_s', 0):.3f} | "
               f"{s.get('kernel_us') or 0:.1f} | {s.get('cached', '-')} | {len(slow)} ({sum(slow):.1f}) | {nvrtc} | "
               f"{load:.1f} | {wall:.1f} | {_phases(s)} |")
        lines.append(row)
        print(row, flush=True)
        (args.out / "throughput.md").write_text("\n".join(lines) + "\n")     # kept if a later run is cut off
    table = "\n".join(lines) + "\n"
    (args.out / "throughput.md").write_text(table)
    print("\n" + table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
