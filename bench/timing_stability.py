"""What a shorter timed phase costs: run-to-run stability of a candidate's median, and time per
evaluation, for each setting of the timed wall time (SupervisorSettings.timed_ms).

    PYTHONPATH=. python3 bench/timing_stability.py [--timed-ms 100 25] [--repeats 5] [--tasks ...] [--out DIR]

For each task: the generated program at its default schedule and at one random legal schedule,
each evaluated --repeats times (alternating), once per setting, in a fresh evaluator. Prints one
Markdown row per task, candidate and setting: the medians' max/min (DESIGN 4's stability figure,
target <= 1.05), the median of medians, repetitions per timing and seconds per evaluation; and
per candidate the ratio of its median of medians under each setting to the first setting's.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.codegen import generate  # noqa: E402
from core.evaluation import Evaluator, SupervisorSettings  # noqa: E402
from core.search.space import ScheduleSpace  # noqa: E402
from core.tasks import load_task  # noqa: E402

TASKS = ROOT / "resources" / "tasks"
DEFAULT_TASKS = ["act_gelu", "softmax_lastdim", "norm_layernorm", "red_sum_dim1", "pool_avg2d", "scan_cumsum"]


def candidates(task):
    gen = generate(task)
    space = ScheduleSpace.from_program(gen.program, task, constraints=gen.space_constraints)
    default = space.default()
    others = [s for s in space.enumerate(cap=5000) if s != default]
    other = random.Random(task.name).choice(others) if others else default
    return [("default", gen.program.with_schedule(default)), ("random", gen.program.with_schedule(other))]


def measure(task, timed_ms: float, repeats: int) -> list[dict]:
    rows = []
    cands = candidates(task)
    medians: dict[str, list[float]] = {name: [] for name, _ in cands}
    seconds: dict[str, list[float]] = {name: [] for name, _ in cands}
    reps: dict[str, list[int]] = {name: [] for name, _ in cands}
    with Evaluator(task, settings=SupervisorSettings(timed_ms=timed_ms)) as ev:
        ev.start()
        for name, program in cands:          # compile and load first: not part of what is compared
            ev.evaluate(program, with_baselines=False)
        for _ in range(repeats):
            for name, program in cands:
                r = ev.evaluate(program, with_baselines=False)
                if not r.ok:
                    raise RuntimeError(f"{task.name} {name}: {r.status.value}: {r.reason}")
                medians[name].append(r.measurement.median_ms)
                seconds[name].append(r.eval_seconds)
                reps[name].append(r.measurement.timing.reps)
    for name, _ in cands:
        m = medians[name]
        rows.append({"task": task.name, "candidate": name, "timed_ms": timed_ms,
                     "median_us": statistics.median(m) * 1e3, "stability": max(m) / min(m),
                     "reps": statistics.median(reps[name]), "eval_s": statistics.median(seconds[name]),
                     "medians_us": [v * 1e3 for v in m]})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timed-ms", type=float, nargs="+", default=[100.0, 25.0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tasks", nargs="*", default=DEFAULT_TASKS)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    rows: list[dict] = []
    for name in args.tasks:
        task = load_task(TASKS / f"{name}.py")
        for timed_ms in args.timed_ms:
            try:
                rows += measure(task, timed_ms, args.repeats)
            except Exception as exc:   # one task's failure must not lose the others' figures
                rows.append({"task": name, "timed_ms": timed_ms, "error": f"{type(exc).__name__}: {exc}"})
                print(name, timed_ms, "FAILED", exc, flush=True)
            print(json.dumps(rows[-1]), flush=True)
    Path(args.out, "timing-stability.json").write_text(json.dumps(rows, indent=1))
    first = {(r["task"], r["candidate"]): r["median_us"] for r in rows
             if "error" not in r and r["timed_ms"] == args.timed_ms[0]}
    print("\n| task | candidate | timed ms | median us | vs first setting | stability (max/min of medians) "
          "| reps | s per eval |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['task']} | - | {r['timed_ms']:g} | {r['error'][:80]} | | | | |")
            continue
        ref = first.get((r["task"], r["candidate"]))
        ratio = f"{r['median_us'] / ref:.3f}" if ref else "-"
        print(f"| {r['task']} | {r['candidate']} | {r['timed_ms']:g} | {r['median_us']:.1f} | {ratio} "
              f"| {r['stability']:.3f} | {r['reps']:.0f} | {r['eval_s']:.3f} |")
    for t in args.timed_ms:
        ok = [r for r in rows if "error" not in r and r["timed_ms"] == t]
        if ok:
            print(f"timed_ms {t:g}: worst stability {max(r['stability'] for r in ok):.3f}, "
                  f"median s per eval {statistics.median(r['eval_s'] for r in ok):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
