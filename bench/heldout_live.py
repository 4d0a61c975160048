"""Compare policies' live runs (projects written by bench/gpu_heldout.sh) on the tasks they share.

    PYTHONPATH=. python3 bench/heldout_live.py RUNS_DIR ... [--record DIR ...] [--target 0.97]

RUNS_DIR holds one folder per policy with one TASK.cuagent per task (`cuda-agent bench --projects`,
or one seed's folder of bench/live_seeds.py); several RUNS_DIRs are several runs of each policy.
For each task: the best time known (the best of every run here and of the recorded projects given
with --record, e.g. a sweep of the same task), then per policy the evaluations until a candidate ran
within --target of it (budget + 1 when none did; with several runs, their median and each), the
best it found, and its candidates per minute (first proposal to last verdict). Prints a Markdown
table, the medians per policy over every run, and the ratios ppo / random and untrained / ppo.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.project import Project  # noqa: E402


def _times(path: Path) -> tuple[list[float | None], float | None]:
    """Median times of the counted candidates in evaluation order (None: not measured), and the
    candidates per minute from the first proposal to the last verdict."""
    with Project.open(path, readonly=True) as project:
        recs = [r for r in project.candidates() if r.extra.get("counted", True) and r.evaluated_at]
    recs.sort(key=lambda r: r.id)
    times = [r.median_ms if r.status == "measured" else None for r in recs]
    if len(recs) < 2:
        return times, None
    start = datetime.fromisoformat(recs[0].created_at)
    end = datetime.fromisoformat(recs[-1].evaluated_at)
    seconds = (end - start).total_seconds()
    return times, (len(recs) / seconds * 60 if seconds > 0 else None)


def _record_best(dirs: list[Path], task: str) -> float | None:
    best = None
    for d in dirs:
        path = d / f"{task}.cuagent"
        if path.is_file():
            times, _ = _times(path)
            ok = [t for t in times if t is not None]
            if ok and (best is None or min(ok) < best):
                best = min(ok)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--record", nargs="*", type=Path, default=[])
    ap.add_argument("--target", type=float, default=0.97)
    args = ap.parse_args()
    # task -> policy -> one project per RUNS_DIR (a seed of `bench/live_seeds.py`, or one bench call)
    runs: dict[str, dict[str, list[Path]]] = {}
    for d in args.runs:
        for path in sorted(d.glob("*/*.cuagent")):
            runs.setdefault(path.stem, {}).setdefault(path.parent.name, []).append(path)
    policies = sorted({p for per in runs.values() for p in per})
    lines = ["| task | best known us | " + " | ".join(f"{p}: evals to target | {p}: best us | {p}: per min"
                                                     for p in policies) + " |",
             "|---|---|" + "---|---|---|" * len(policies)]
    reached: dict[str, list[int]] = {p: [] for p in policies}
    rates: dict[str, list[float]] = {p: [] for p in policies}
    for task in sorted(runs):
        series = {p: [_times(path) for path in paths] for p, paths in runs[task].items()}
        bests = [min(t for t in times if t is not None)
                 for per in series.values() for times, _ in per if any(t is not None for t in times)]
        rec = _record_best(args.record, task)
        known = min(bests + ([rec] if rec is not None else []), default=None)
        if known is None:
            continue
        cells = []
        for p in policies:
            counts, task_rates, ok = [], [], []
            for times, rate in series.get(p, []):
                if not times:
                    continue
                counts.append(next((i + 1 for i, t in enumerate(times) if t is not None and known / t >= args.target),
                                   len(times) + 1))
                if rate:
                    task_rates.append(rate)
                ok += [t for t in times if t is not None]
            if not counts:
                cells.append("- | - | -")
                continue
            reached[p] += counts
            rates[p] += task_rates
            shown = str(counts[0]) if len(counts) == 1 else \
                f"{statistics.median(counts):g} ({', '.join(map(str, counts))})"
            best = f"{min(ok) * 1e3:.1f}" if ok else "-"
            rate = f"{statistics.median(task_rates):.0f}" if task_rates else "-"
            cells.append(f"{shown} | {best} | {rate}")
        lines.append(f"| {task} | {known * 1e3:.1f} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    print()
    medians = {}
    for p in policies:
        if reached[p]:
            medians[p] = statistics.median(reached[p])
            print(f"{p}: median evaluations to {args.target:.0%} of the best known {medians[p]:g} "
                  f"over {len(reached[p])} runs; median {statistics.median(rates[p]) if rates[p] else 0:.0f} "
                  "candidates per minute")
    if "ppo" in medians and "random" in medians and medians["random"]:
        print(f"ppo / random: {medians['ppo'] / medians['random']:.0%}")
    if "ppo" in medians and "ppo-untrained" in medians and medians["ppo"]:
        print(f"ppo-untrained / ppo: {medians['ppo-untrained'] / medians['ppo']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
