"""Live runs of several policies and seeds per task, all on one warm evaluator per task.

    PYTHONPATH=. python3 bench/live_seeds.py --out DIR --tasks NAME ... [--policies ppo ppo-untrained random]
        [--seeds 1 2 3] [--budget 30] [--deadline SECONDS] [--weights FILE] [--with-compile-baseline]

For each task (resources/tasks/NAME.py): one Evaluator, started once, then per seed one run of each
policy, back to back so the policies of a seed meet the same GPU state. The policies' order turns by
one from task to task and seed to seed (the first run of a task compiles on cold caches, which made
the first policy's candidates a minute look 2-3 times lower, 2026-12-07). Each run is a normal
`cuda-agent run` (session.open_run on the warm evaluator, no final confirmation rounds) writing
DIR/seedS/POLICY/NAME.cuagent, so `bench/heldout_live.py DIR/seed*` reads them. A run costs its
evaluations only: `cuda-agent bench` starts an evaluator per run, which took about 20 of a run's
30 s in the fourteenth session. The torch.compile baseline is skipped unless asked for (the
evaluation counts do not use it; eager is measured, as every new best is checked against it).

DIR/runs.tsv gets task, seed, policy, exit (0 = ran), seconds, evaluations, best ms. No task and no
seed round starts after --deadline seconds from the start; what finished is kept.
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.evaluation import Evaluator  # noqa: E402
from core.evaluation.evaluator import default_compile_workers  # noqa: E402
from core.search.session import RunConfig, open_run  # noqa: E402
from core.tasks import load_task  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tasks", nargs="+", required=True)
    ap.add_argument("--policies", nargs="+", default=["ppo", "ppo-untrained", "random"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--deadline", type=float, default=float("inf"), help="seconds from the start")
    ap.add_argument("--weights", default=None)
    ap.add_argument("--with-compile-baseline", action="store_true")
    args = ap.parse_args()
    missing = [name for name in args.tasks if not (ROOT / "resources" / "tasks" / f"{name}.py").is_file()]
    if missing:
        print(f"no such example task: {', '.join(missing)} (names of resources/tasks/*.py)")
        return 2
    t_start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    tsv = args.out / "runs.tsv"
    if not tsv.exists():
        tsv.write_text("task\tseed\tpolicy\texit\tseconds\tevaluations\tbest_ms\n")

    def late() -> bool:
        return time.monotonic() - t_start >= args.deadline

    for task_index, name in enumerate(args.tasks):
        if late():
            print(f"deadline: {name} and later tasks not started", flush=True)
            break
        path = ROOT / "resources" / "tasks" / f"{name}.py"
        task = load_task(path)
        t0 = time.monotonic()
        ev = Evaluator(task, 0, compile_workers=default_compile_workers())
        try:
            ev.start()
            base = ev.baselines(with_compile=args.with_compile_baseline)
            eager = f"{base.eager.median_ms * 1e3:.1f} us" if base.eager else f"failed ({base.eager_error})"
            print(f"{name}: evaluator up in {time.monotonic() - t0:.0f} s, eager {eager}", flush=True)
            for seed_index, seed in enumerate(args.seeds):
                if late():
                    print(f"deadline: {name} seed {seed} and later not started", flush=True)
                    break
                for policy in _rotated(args.policies, task_index + seed_index):
                    _one_run(ev, path, name, seed, policy, args, tsv)
        finally:
            ev.close()
    print(f"done in {time.monotonic() - t_start:.0f} s", flush=True)
    return 0


def _rotated(policies: list[str], k: int) -> list[str]:
    """The policies, starting with the k-th: the first run of a task meets its compile caches cold,
    so which policy comes first turns from task to task and seed to seed."""
    k %= max(1, len(policies))
    return policies[k:] + policies[:k]


def _one_run(ev: Evaluator, path: Path, name: str, seed: int, policy: str, args: argparse.Namespace,
             tsv: Path) -> None:
    project = args.out / f"seed{seed}" / policy / f"{name}.cuagent"
    project.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    status, evaluations, best = 0, 0, None
    try:
        setup = open_run(RunConfig(task=path, project=project, policy=policy, budget=args.budget, seed=seed,
                                   weights=args.weights, confirm_rounds=0), pool=ev)
        try:
            summary = setup.optimizer.run()
            evaluations = summary.evaluations
            best = summary.best_ms
        finally:
            setup.close()
    except Exception:
        status = 1
        traceback.print_exc()
    seconds = time.monotonic() - t0
    best_text = f"{best:.5f}" if best is not None else "-"
    with tsv.open("a") as f:
        f.write(f"{name}\t{seed}\t{policy}\t{status}\t{seconds:.1f}\t{evaluations}\t{best_text}\n")
    print(f"  {name} seed {seed} {policy}: {evaluations} evaluations in {seconds:.1f} s, best {best_text} ms"
          + (" FAILED" if status else ""), flush=True)


if __name__ == "__main__":
    sys.exit(main())
