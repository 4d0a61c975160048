"""`cuda-agent run` and `cuda-agent bench-search` (wired into core/cli.py by build_parser).

    cuda-agent run TASK --budget N --policy ppo|random|evolution --project FILE [--program P.json]
                   [--replay FILE ...] [--seconds S] [--episode K] [--seed N] [--device I]

With --replay the evaluations are answered from recorded project files (no GPU needed);
otherwise the Evaluator measures on GPU --device. Ctrl-C stops cleanly after the step in flight.
"""
from __future__ import annotations

import argparse
import threading
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)
EXIT_OK, EXIT_REJECTED, EXIT_BAD_INPUT, EXIT_UNAVAILABLE = 0, 1, 2, 3   # same codes as core/cli.py


def add_run_parser(sub: Any) -> None:
    """Add the `run` subcommand to core/cli.py's subparsers."""
    p = sub.add_parser("run", help="search kernel schedules with a policy (replay or GPU)")
    p.add_argument("task", help="KernelBench-format task file")
    p.add_argument("--project", required=True, help="project file (.cuagent); created when missing")
    p.add_argument("--program", help="program JSON to tune (default: resources/programs/TASK.json)")
    p.add_argument("--policy", choices=("ppo", "random", "evolution"), default="ppo")
    p.add_argument("--budget", type=int, default=100, help="evaluations (default 100)")
    p.add_argument("--seconds", type=float, help="wall-time budget in seconds")
    p.add_argument("--episode", type=int, default=8, help="edits per episode (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replay", action="append", default=[], metavar="FILE",
                   help="answer evaluations from this recorded project (repeatable); no GPU needed")
    p.add_argument("--skip-unrecorded", action="store_true",
                   help="with --replay: do not count or penalise candidates missing from the record")
    p.add_argument("--device", type=int, default=0, help="GPU index when not replaying")
    p.set_defaults(func=cmd_run)


def add_bench_search_parser(sub: Any) -> None:
    p = sub.add_parser("bench-search", help="compare search policies on recorded projects (replay, no GPU)")
    p.add_argument("records", nargs="+", help="recorded projects (.cuagent) to replay")
    p.add_argument("--policies", nargs="+", default=["ppo", "evolution"], choices=("ppo", "random", "evolution"),
                   help="policies to compare with random search (default: ppo evolution)")
    p.add_argument("--seeds", type=int, default=5, help="trials per policy and record (default 5)")
    p.add_argument("--budget", type=int, default=100, help="evaluations per trial (default 100)")
    p.add_argument("--out", help="also write the Markdown table to this file")
    p.set_defaults(func=cmd_bench_search)


def cmd_bench_search(args: argparse.Namespace) -> int:
    from pathlib import Path

    from core.project import ProjectError

    from .benchmark import compare, markdown

    missing = [r for r in args.records if not Path(r).is_file()]
    if missing:
        return _fail(f"[red]no such project:[/red] {', '.join(missing)}")
    if args.seeds < 1 or args.budget < 1:
        return _fail("[red]--seeds and --budget must be at least 1[/red]")
    policies = list(dict.fromkeys(["random", *args.policies]))
    total = len(args.records) * len(policies) * args.seeds
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        bar = progress.add_task("trials", total=total)
        try:
            trials = compare(args.records, args.policies, args.seeds, args.budget,
                             progress=lambda t: progress.update(bar, advance=1, description=f"{t.task} {t.policy}"))
        except (ProjectError, ValueError) as exc:
            return _fail(f"[red]bench-search:[/red] {exc}")
    table = markdown(trials, args.budget)
    console.print(table, soft_wrap=True, markup=False)
    if args.out:
        Path(args.out).write_text(table)
    return EXIT_OK


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> int:
    err.print(message)
    return code


def cmd_run(args: argparse.Namespace) -> int:
    from .session import RunConfig, RunSetupError, open_run

    config = RunConfig(task=args.task, project=args.project, program=args.program, policy=args.policy,
                       budget=args.budget, seconds=args.seconds, episode=args.episode, seed=args.seed,
                       replay=list(args.replay), skip_unrecorded=args.skip_unrecorded, device=args.device)
    status = console.status("starting the evaluator and measuring baselines...")

    def starting(text: str) -> None:
        status.update(text)
        status.start()

    try:
        setup = open_run(config, starting=starting)
    except RunSetupError as exc:
        head, _, rest = str(exc).partition(": ")
        return _fail(f"[red]{head}:[/red] {rest}" if rest else f"[red]{exc}[/red]", exc.code)
    finally:
        status.stop()
    for note in setup.notes:
        console.print(note)
    try:
        return _run(setup.optimizer, args)
    finally:
        setup.close()


def _run(opt: Any, args: argparse.Namespace) -> int:
    from .events import CandidateEvaluated, NewBest, PolicyUpdated, RunError

    summary: list[Any] = []
    failure: list[BaseException] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        bar = progress.add_task(f"{args.policy} on {opt.task.name}", total=args.budget)

        def observer(event: Any) -> None:
            if isinstance(event, CandidateEvaluated):
                progress.update(bar, completed=event.evaluations)
            elif isinstance(event, NewBest):
                progress.console.print(f"new best #{event.candidate_id}: {event.median_ms:.4f} ms"
                                       + (f" ({event.speedup_eager:.2f}x eager)" if event.speedup_eager else ""))
            elif isinstance(event, PolicyUpdated):
                progress.console.print(f"[dim]policy update {event.updates}: "
                                       + ", ".join(f"{k}={v:.3g}" for k, v in event.metrics.items()) + "[/dim]")
            elif isinstance(event, RunError):
                progress.console.print(f"[red]run error:[/red] {event.message}")

        opt.observers.append(observer)

        def target() -> None:
            try:
                summary.append(opt.run())
            except BaseException as exc:   # reported below; the project already recorded an unclean stop
                failure.append(exc)

        thread = threading.Thread(target=target, name="optimizer")
        thread.start()
        try:
            while thread.is_alive():
                thread.join(0.2)
        except KeyboardInterrupt:
            progress.console.print("stopping after the candidate in flight...")
            opt.stop()
            thread.join()
    if failure:
        return _fail(f"[red]the run failed:[/red] {type(failure[0]).__name__}: {failure[0]}", EXIT_REJECTED)
    s = summary[0]
    console.print(f"run {s.run_id} finished ({s.reason}): {s.evaluations} evaluations, "
                  + ", ".join(f"{k} {v}" for k, v in s.counts.items()))
    table = Table(title="fastest candidates", header_style="bold")
    for col in ("id", "branch", "schedule", "median", "vs eager", "origin"):
        table.add_column(col)
    for rec in opt.project.best(5):
        speedup = (rec.measurement or {}).get("speedup_eager")
        table.add_row(str(rec.id), str(rec.branch_id), " ".join(f"{k}={v}" for k, v in rec.schedule.items()),
                      f"{rec.median_ms:.4f} ms", f"{speedup:.2f}x" if speedup else "-", rec.origin)
    console.print(table)
    return EXIT_OK
