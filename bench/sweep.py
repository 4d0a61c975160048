"""Sweep the generated programs' schedules on a GPU: correctness of every sampled schedule, and the
figures of the generators' issue (eager, torch.compile, default schedule, best of the sweep, floor).

    PYTHONPATH=. python3 bench/sweep.py [--tasks NAME ...] [--evals 24 | --record-all MAX] [--shard 0/2]
                                        [--known FILE [--neighbours]] [--deadline S] [--out DIR]

For each example task the code generators accept: start an evaluator, measure the baselines,
evaluate the default schedule and then legal schedules drawn at random (at most --evals in all;
the whole space when it is smaller; with --record-all, every legal schedule of the spaces of at most
MAX schedules: dense records for `cuda-agent train`), and record every verdict in a project file
(OUT/projects/TASK.cuagent), so the sweep can be replayed and used to train policies. Writes
OUT/sweep.json after each task and OUT/sweep.md at the end; stops starting tasks once --deadline
seconds have passed since it started, so a run ends inside the device's time limit with what it measured.
With --known FILE (JSON: {task: {"schedule": {...}, "also": [...]}}, e.g. the best schedules of earlier
sweeps), each task's known schedules are evaluated right after the default, before any random one:
`--evals 2` times again exactly the default and the earlier best (knobs the file lacks keep their
default value). With --neighbours, the legal schedules one knob away from the first known one (or the
default) come next: a local search before the random draws.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.codegen import CodegenError, generate  # noqa: E402
from core.evaluation import Evaluator, SupervisorSettings  # noqa: E402
from core.evaluation.gpuinfo import gpu_key  # noqa: E402
from core.project import CandidateRecord, Project  # noqa: E402
from core.search.space import ScheduleSpace  # noqa: E402
from core.tasks import load_task  # noqa: E402

TASKS = ROOT / "resources" / "tasks"


def log(*a) -> None:
    print(*a, flush=True)


def first_schedules(space: ScheduleSpace, known: dict | list[dict] | None = None,
                    neighbours: bool = False) -> list[dict]:
    """The default, then the known schedule or schedules (those legal; knobs they lack keep their
    default), with `neighbours` then the legal schedules that differ from the first known one (or
    from the default) in one knob: a local search around the best point known before any random draw."""
    default = space.default()
    first = [default]
    for point in ([known] if isinstance(known, dict) else known or []):
        wanted = {**default, **{k: v for k, v in point.items() if k in default}}
        if wanted not in first and space.legal(wanted):
            first.append(wanted)
    if neighbours:
        centre = first[1] if len(first) > 1 else default
        for knob in space.knobs:
            for value in knob.values:
                near = {**centre, knob.name: value}
                if near not in first and space.legal(near):
                    first.append(near)
    return first


def pick_schedules(space: ScheduleSpace, evals: int, seed: str,
                   known: dict | list[dict] | None = None, neighbours: bool = False) -> tuple[list[dict], int | None]:
    """first_schedules, then distinct legal schedules at random; and the number of legal ones (None
    when the first ones are all that is asked: listing a multi-kernel space takes minutes)."""
    first = first_schedules(space, known, neighbours)
    if evals <= len(first):
        return first[:max(1, evals)], None
    legal = list(space.enumerate(cap=100_000))
    rest = [s for s in legal if s not in first]
    random.Random(seed).shuffle(rest)
    return (first + rest)[:max(1, evals)], len(legal)


def _known_points(entry: dict) -> list[dict]:
    """A --known entry's schedules: "schedule" (an earlier best) first, then any "also" points."""
    return ([entry["schedule"]] if entry.get("schedule") else []) + list(entry.get("also", []))


def sweep_task(task, gen, evals: int, projects: Path, settings: SupervisorSettings, stop_at: float,
               known: dict | list[dict] | None = None, neighbours: bool = False) -> dict:
    """Evaluate the task's schedules; at the monotonic time `stop_at` stop evaluating and keep what
    was measured (the row says "truncated")."""
    space = ScheduleSpace.from_program(gen.program, task, constraints=gen.space_constraints)
    schedules, n_legal = pick_schedules(space, evals, task.name, known, neighbours)
    row: dict = {"task": task.name, "family": gen.family, "legal_schedules": n_legal, "failures": [],
                 "kernels": len(gen.program.launches)}
    t0 = time.perf_counter()
    path = projects / f"{task.name}.cuagent"
    path.unlink(missing_ok=True)
    candidates = [gen.program.with_schedule(s) for s in schedules]
    with Evaluator(task, settings=settings) as ev, Project.create(path, task) as project, \
            ThreadPoolExecutor(4) as compiles:
        ev.start()
        project.set_hardware(ev.gpu)
        for candidate in candidates:   # NVRTC on the CPU pool while the GPU measures the baselines
            compiles.submit(ev.prepare, candidate)
        b = ev.baselines()
        project.set_baselines(gpu_key(ev.gpu), b)
        row["startup_and_baselines_s"] = time.perf_counter() - t0
        row["eager_ms"] = b.eager.median_ms if b.eager else None
        row["compile_ms"] = b.compile.median_ms if b.compile else None
        row["compile_error"] = b.compile_error
        best = None
        row["evaluated"] = 0
        n_known, n_first = (len(first_schedules(space, known, n)) for n in (False, neighbours))
        for i, (schedule, candidate) in enumerate(zip(schedules, candidates)):
            if time.monotonic() > stop_at:
                row["truncated"] = True
                compiles.shutdown(wait=False, cancel_futures=True)
                break
            row["evaluated"] = i + 1
            origin = "default" if i == 0 else "known" if i < n_known else \
                "neighbour" if i < n_first else "random"
            rec = CandidateRecord.from_program(candidate, origin=f"sweep:{origin}")
            project.add_candidate(rec)
            result = ev.evaluate(candidate)
            project.record_result(rec.id, result)
            if not result.ok:
                row["failures"].append({"schedule": schedule, "status": result.status.value,
                                        "reason": result.reason[:400]})
                continue
            m = result.measurement
            row.setdefault("measured", []).append({"schedule": schedule, "ms": m.median_ms})
            if i == 0:
                row["default_ms"] = m.median_ms
            if best is None or m.median_ms < best.median_ms:
                best, row["best_schedule"] = m, schedule
        row["seconds"] = time.perf_counter() - t0
        if best is not None:
            row.update(best_ms=best.median_ms, floor_ms=best.floor_ms, best_fraction=best.roofline_fraction,
                       best_gbps=best.gbps)
            rivals = [t for t in (row["eager_ms"], row["compile_ms"]) if t]
            row["vs_best_baseline"] = min(rivals) / best.median_ms if rivals else None
            row["target_met"] = bool((best.roofline_fraction or 0) >= 0.90 or (row["vs_best_baseline"] or 0) >= 1.05)
    return row


def _mean(values: list[float], default: float) -> float:
    return sum(values) / len(values) if values else default


def _whole_spaces(todo: list, largest: int, results: dict) -> list:
    """The tasks whose whole space has at most `largest` legal schedules; the others are listed."""
    kept = []
    for task, gen, n_legal in todo:
        if n_legal > largest:
            log(f"{task.name}: {n_legal} legal schedules, more than {largest}: not recorded whole")
            results.setdefault("too_large", []).append(task.name)
        else:
            kept.append((task, gen, n_legal))
    return kept


def _shard(todo: list, shard: int, shards: int) -> list:
    """Shards of about equal cost (a task costs its start and baselines plus its evaluations):
    the largest task goes to the least loaded shard first. Each shard runs its tasks smallest
    first, so a deadline leaves out the fewest tasks."""
    load = [0.0] * shards
    mine = []
    for item in sorted(todo, key=lambda t: (-t[2], t[0].name)):
        i = min(range(shards), key=lambda k: (load[k], k))
        load[i] += 60 + item[2]          # a task's start is worth about 60 evaluations
        if i == shard:
            mine.append(item)
    return sorted(mine, key=lambda t: (t[2], t[0].name))


def us(ms) -> str:
    return "-" if ms is None else f"{ms * 1e3:.1f}"


def markdown(results: dict) -> str:
    lines = [f"GPU: {results.get('gpu', '?')}  |  {results['date']}  |  `{results['command']}`", "",
             "| task | kernels | legal | evaluated | failed | eager us | compile us | default us | best us | "
             "floor us | best / floor | vs better baseline | target |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    fractions = []
    for r in results["tasks"]:
        if "error" in r:
            lines.append(f"| {r['task']} | | | | | | | | | | | | error: {r['error'][:80]} |")
            continue
        frac = r.get("best_fraction")
        if frac:
            fractions.append(frac)
        vs = r.get("vs_best_baseline")
        lines.append(f"| {r['task']} | {r['kernels']} | {r['legal_schedules'] or '-'} | {r['evaluated']} | "
                     f"{len(r['failures'])} | {us(r.get('eager_ms'))} | {us(r.get('compile_ms'))} | "
                     f"{us(r.get('default_ms'))} | {us(r.get('best_ms'))} | {us(r.get('floor_ms'))} | "
                     f"{'-' if frac is None else f'{frac * 100:.0f} %'} | {'-' if vs is None else f'{vs:.2f}x'} | "
                     f"{'met' if r.get('target_met') else 'not met'} |")
    if fractions:
        geo = math.exp(sum(math.log(f) for f in fractions) / len(fractions))
        lines += ["", f"Geomean of best / floor over {len(fractions)} tasks: **{geo * 100:.0f} %**"]
    failed = [(r["task"], f) for r in results["tasks"] for f in r.get("failures", [])]
    if failed:
        lines += ["", "Failures:"]
        lines += [f"- {t}: {f['status']} at {f['schedule']}: {f['reason'][:200]}" for t, f in failed]
    if results.get("skipped"):
        lines += ["", "Not generated: " + ", ".join(f"{n}" for n, _ in results["skipped"])]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="*", help="task names or task files (default: every example the generators accept)")
    ap.add_argument("--evals", type=int, default=24, help="evaluations per task, default schedule included")
    ap.add_argument("--record-all", type=int, metavar="MAX", default=0,
                    help="a training record instead of the issue's sweep: every legal schedule of each task "
                         "whose space has at most MAX of them (larger spaces are skipped and listed)")
    ap.add_argument("--shard", default="0/1", help="I/N: this run takes every N-th task from the I-th")
    ap.add_argument("--deadline", type=float, default=540.0, help="start no task after this many seconds")
    ap.add_argument("--timed-ms", type=float, default=SupervisorSettings.timed_ms,
                    help="wall time of each timing's repetitions (at least 20 are run)")
    ap.add_argument("--known", type=Path, help="JSON {task: {\"schedule\": {...}, \"also\": [{...}, ...]}}: "
                                               "evaluated right after the default, in that order")
    ap.add_argument("--neighbours", action="store_true",
                    help="after the known schedule (or the default), every legal one differing from it in one knob")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    known = json.loads(args.known.read_text()) if args.known else {}
    started = time.monotonic()   # the deadline counts the generators' time too
    if not 1 <= args.evals <= 200:
        ap.error("--evals must be 1 to 200 (the issue allows a sweep of at most 200 evaluations)")
    if args.record_all < 0:
        ap.error("--record-all takes the largest space to record whole, a positive number")
    shard, shards = (int(v) for v in args.shard.split("/"))
    out = Path(args.out)
    projects = out / "projects"
    projects.mkdir(parents=True, exist_ok=True)
    names = args.tasks or sorted(p.stem for p in TASKS.glob("*.py"))
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "tasks": [], "skipped": [],
                     "command": "bench/sweep.py " + " ".join(sys.argv[1:])}
    todo = []
    for name in names:
        task = load_task(Path(name) if name.endswith(".py") else TASKS / f"{name}.py")
        try:
            gen = generate(task)
            space = ScheduleSpace.from_program(gen.program, task, constraints=gen.space_constraints)
            # Counting a space lists it (minutes for the multi-kernel ones): only to plan --record-all.
            todo.append((task, gen, sum(1 for _ in space.enumerate(cap=100_000)) if args.record_all else None))
        except CodegenError as exc:
            results["skipped"].append((name, str(exc)[:300]))
    if args.record_all:
        todo = _whole_spaces(todo, args.record_all, results)
    todo = _shard(todo, shard, shards) if args.record_all else todo[shard::shards]
    log(f"{len(todo)} tasks to sweep, {len(results['skipped'])} not generated")
    settings = SupervisorSettings(timed_ms=args.timed_ms)
    stop_at = started + args.deadline
    per_task_s, per_eval_s = [], []    # what the finished tasks cost: the estimate for the next one
    for task, gen, n_legal in todo:
        evals = n_legal if args.record_all else args.evals
        estimate = _mean(per_task_s, 20.0) + evals * _mean(per_eval_s, 0.3)
        if time.monotonic() + estimate > stop_at:
            log(f"deadline: {task.name} not started (about {estimate:.0f} s, "
                f"{stop_at - time.monotonic():.0f} s left)")
            results.setdefault("not_started", []).append(task.name)
            continue
        try:
            row = sweep_task(task, gen, evals, projects, settings, stop_at,
                             _known_points(known.get(task.name) or {}), args.neighbours)
            per_task_s.append(row["startup_and_baselines_s"])
            if row["evaluated"]:
                per_eval_s.append((row["seconds"] - row["startup_and_baselines_s"]) / row["evaluated"])
            results["gpu"] = results.get("gpu") or _gpu_name()
        except Exception as exc:   # one task's failure must not lose the others' figures
            row = {"task": task.name, "error": f"{type(exc).__name__}: {exc}"}
        results["tasks"].append(row)
        log(json.dumps({k: v for k, v in row.items() if k != "failures"}, default=str),
            f"failures: {len(row.get('failures', []))}")
        for f in row.get("failures", [])[:3]:
            log("   ", f["status"], f["schedule"], f["reason"][:300])
        (out / "sweep.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "sweep.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "sweep.md").write_text(markdown(results))
    with tarfile.open(out / "sweep-projects.tar.gz", "w:gz") as tar:
        tar.add(projects, arcname="projects")
    log(markdown(results))
    return 0


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"


if __name__ == "__main__":
    sys.exit(main())
