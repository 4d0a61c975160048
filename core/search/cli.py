"""`cuda-agent run`, `cuda-agent bench` and `cuda-agent bench-search` (wired into core/cli.py by build_parser).

    cuda-agent run TASK --budget N --policy ppo|random|evolution --project FILE [--program P.json]
                   [--replay FILE ...] [--seconds S] [--episode K] [--seed N] [--device I]
    cuda-agent bench SUITE_DIR [--budget N] [--seconds S] [--policy P] [--projects DIR] [--replay RECORD ...]
                     [--tasks NAME ...] [--out TABLE.md]

With --replay the evaluations are answered from recorded project files (no GPU needed);
otherwise the Evaluator measures on GPU --device. Ctrl-C stops cleanly after the step in flight
(`bench`: after the task in flight; a second Ctrl-C also stops that task after its candidate).
"""
from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .session import RunConfig

console = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)
EXIT_OK, EXIT_REJECTED, EXIT_BAD_INPUT, EXIT_UNAVAILABLE = 0, 1, 2, 3   # same codes as core/cli.py


def add_run_parser(sub: Any) -> None:
    """Add the `run` subcommand to core/cli.py's subparsers."""
    p = sub.add_parser("run", help="search kernel schedules with a policy (replay or GPU)")
    p.add_argument("task", help="KernelBench-format task file")
    p.add_argument("--project", required=True, help="project file (.cuagent); created when missing")
    p.add_argument("--program", help="program JSON to tune (default: resources/programs/TASK.json)")
    from .session import POLICIES

    p.add_argument("--policy", choices=POLICIES, default="ppo",
                   help="ppo starts from the shipped pretrained weights (or --weights) and keeps learning; "
                        "ppo-untrained from fresh weights")
    p.add_argument("--weights", metavar="FILE", help="PPO weights written by `cuda-agent train`")
    p.add_argument("--memory", action="store_true",
                   help="ppo also recalls your earlier GPU runs, and this run is remembered when it ends "
                        "(the memory file: $CUDA_AGENT_MEMORY, else ~/.cuda-agent/memory.json; off by default)")
    p.add_argument("--from-default", action="store_true",
                   help="ppo starts from the generator's default schedule, not from the one the memory of its "
                        "weights ranks highest for this task")
    p.add_argument("--budget", type=int, default=100, help="evaluations (default 100)")
    p.add_argument("--seconds", type=float, help="wall-time budget in seconds")
    p.add_argument("--episode", type=int, default=8, help="edits per episode (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replay", action="append", default=[], metavar="FILE",
                   help="answer evaluations from this recorded project (repeatable); no GPU needed")
    p.add_argument("--skip-unrecorded", action="store_true",
                   help="with --replay: do not count or penalise candidates missing from the record")
    p.add_argument("--device", type=int, default=0, help="GPU index when not replaying")
    p.add_argument("--compile-ahead", type=int, default=RunConfig.compile_ahead, metavar="N",
                   help=f"candidates predicted and compiled while the GPU measures (default {RunConfig.compile_ahead}; "
                        "0: off); up to 4x as many when compiles take longer than N evaluations")
    p.add_argument("--compile-workers", type=int, default=None, metavar="N",
                   help="NVRTC compile processes (default: all cores but six on hosts of 12 or more, "
                        "fewer on small ones)")
    p.add_argument("--confirm-rounds", type=int, default=RunConfig.confirm_rounds, metavar="N",
                   help="after the last candidate, re-measure the best in N rounds interleaved with eager "
                        f"(default {RunConfig.confirm_rounds}; 0: off; GPU runs only)")
    p.set_defaults(func=cmd_run)


def add_bench_search_parser(sub: Any) -> None:
    p = sub.add_parser("bench-search", help="compare search policies on recorded projects (replay, no GPU)")
    p.add_argument("records", nargs="+", help="recorded projects (.cuagent) to replay")
    from .session import POLICIES

    p.add_argument("--policies", nargs="+", default=["ppo", "evolution"], choices=POLICIES,
                   help="policies to compare with random search (default: ppo evolution)")
    p.add_argument("--weights", metavar="FILE",
                   help="PPO weights for 'ppo' (default: the shipped pretrained ones, when installed)")
    p.add_argument("--seeds", type=int, default=5, help="trials per policy and record (default 5)")
    p.add_argument("--budget", type=int, default=100, help="evaluations per trial (default 100)")
    p.add_argument("--out", help="also write the Markdown table to this file")
    p.add_argument("--from-default", action="store_true",
                   help="start ppo from the default schedule, not from the one its memory ranks highest")
    p.set_defaults(func=cmd_bench_search)


BENCH_HELP = """Tune every task of a folder as `cuda-agent run` would (no --program: the task's hand-written
program in resources/programs/, else the generated one), one project file per task, and write a
Markdown table: candidates evaluated, correct, best time, eager and torch.compile times, speedups,
fraction of the roofline floor, and a geomean row. A task that fails to load, that no generator
lowers, or that has no replay record is listed with the reason; the suite goes on. An existing
project is continued as `run` continues it (a new run with a fresh budget, or the unfinished run a
kill left). Ctrl-C ends the suite after the task in flight and writes the table of what finished;
a second Ctrl-C also stops that task after its candidate in flight. Exit status: 0, 1 when a task
failed to load or its run failed, 2 bad input, 3 no GPU (replay needs none), 130 after Ctrl-C."""


def add_bench_parser(sub: Any) -> None:
    """Add the `bench` subcommand (once: a second call is ignored)."""
    if "bench" in getattr(sub, "choices", {}):
        return
    from .session import POLICIES

    p = sub.add_parser("bench", help="tune every task of a folder and write a Markdown table (replay or GPU)",
                       description=BENCH_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
                       usage="cuda-agent bench SUITE_DIR [--budget N] [--seconds S] [--policy P] [--projects DIR]\n"
                             "                        [--replay RECORD ...] [--tasks NAME ...] [--out TABLE.md] "
                             "[more options below]")
    p.add_argument("suite", metavar="SUITE_DIR", help="folder of KernelBench-format task files (*.py)")
    p.add_argument("--budget", type=int, default=100, help="evaluations per task (default 100)")
    p.add_argument("--seconds", type=float, help="wall-time budget per task, in seconds")
    p.add_argument("--policy", choices=POLICIES, default="ppo")
    p.add_argument("--weights", metavar="FILE", help="PPO weights written by `cuda-agent train`")
    p.add_argument("--episode", type=int, default=8, help="edits per episode (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--projects", metavar="DIR",
                   help="folder of the project files, one TASK.cuagent per task (default: OUT-projects next to "
                        "--out, e.g. ./bench-projects)")
    p.add_argument("--replay", nargs="+", action="extend", default=[], metavar="RECORD",
                   help="answer evaluations from these recorded projects (files or folders of *.cuagent); each "
                        "task replays the records of its own source and is listed as 'no record' without one; "
                        "no GPU needed")
    p.add_argument("--skip-unrecorded", action="store_true",
                   help="with --replay: do not count or penalise candidates missing from the record")
    p.add_argument("--device", type=int, default=0, help="GPU index when not replaying")
    p.add_argument("--programs", metavar="DIR",
                   help="folder of program files (TASK.json) to tune instead of the generated programs; a task "
                        "without one is generated as usual")
    p.add_argument("--tasks", nargs="+", action="extend", metavar="NAME",
                   help="only these tasks (file names without .py)")
    p.add_argument("--out", default="bench.md", metavar="TABLE.md",
                   help="Markdown file to write (default bench.md; rewritten after each task)")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from .suite import Bench, BenchConfig, BenchError, markdown

    out = Path(args.out)
    if out.is_dir():
        return _fail(f"[red]--out {out} is a folder;[/red] give the Markdown file to write, e.g. {out / 'bench.md'}")
    projects = Path(args.projects) if args.projects else out.parent / f"{out.stem}-projects"
    config = BenchConfig(suite=args.suite, projects=projects, policy=args.policy, budget=args.budget,
                         seconds=args.seconds, episode=args.episode, seed=args.seed, replay=list(args.replay),
                         skip_unrecorded=args.skip_unrecorded, device=args.device, tasks=list(args.tasks or []),
                         weights=args.weights, programs=args.programs)
    display = _BenchDisplay(args.budget)
    bench = Bench(config, observer=display.observe, command=config.command_line(out))
    try:
        with console.status("checking the suite" + ("" if args.replay else " and looking for GPUs") + "..."):
            files = bench.plan()
            out.parent.mkdir(parents=True, exist_ok=True)
    except BenchError as exc:
        head, sep, rest = str(exc).partition(": ")
        return _fail(f"[red]{head}:[/red] {rest}" if sep else f"[red]{exc}[/red]", exc.code)
    except OSError as exc:
        return _fail(f"[red]cannot write {out}:[/red] {exc.strerror or exc}")
    console.print(f"{len(files)} tasks from {args.suite}; projects in {projects}; table to {out}"
                  + (" (replay: no GPU used)" if args.replay else ""), soft_wrap=True, markup=False)
    write_error: list[str] = []

    def write_table() -> None:     # after each task, so a crash or kill leaves the table of what finished
        try:
            out.write_text(markdown(bench.report()))
        except OSError as exc:
            write_error[:] = [f"{exc.strerror or exc}"]

    display.finished = write_table
    result: list[Any] = []
    failure: list[BaseException] = []
    done = threading.Event()

    def target() -> None:     # evaluator workers ignore SIGINT (supervisor): Ctrl-C reaches only us
        try:
            result.append(bench.run())
        except BaseException as exc:
            failure.append(exc)
        finally:
            done.set()

    interrupted = False
    with display.progress(len(files)):
        thread = threading.Thread(target=target, name="bench", daemon=True)
        thread.start()
        try:
            _wait(done)
        except KeyboardInterrupt:
            interrupted = True
            display.say("Ctrl-C: finishing the task in flight, then writing the table (Ctrl-C again to stop "
                        "that task after its candidate in flight)")
            bench.stop()
            try:
                _wait(done)
            except KeyboardInterrupt:
                display.say("stopping the task in flight after its candidate in flight...")
                bench.stop(now=True)
                _wait(done)      # a third Ctrl-C leaves at once (main() reports "interrupted")
    thread.join()
    if failure:
        return _fail(f"[red]bench failed:[/red] {type(failure[0]).__name__}: {failure[0]}", EXIT_REJECTED)
    report = result[0]
    console.print(markdown(report), soft_wrap=True, markup=False, emoji=False)
    write_table()
    if write_error:
        return _fail(f"[red]cannot write {out}:[/red] {write_error[0]}")
    console.print(f"wrote {out}", soft_wrap=True, markup=False)
    if interrupted:
        return 130
    return EXIT_REJECTED if report.failed else EXIT_OK


def _wait(done: threading.Event) -> None:
    """Wait for a worker thread to say it is done. Not Thread.join: a Ctrl-C that interrupts join() can
    leave the thread marked as stopped while it still runs (Python 3.11 and 3.12, bpo-45274's fix)."""
    while not done.is_set():
        time.sleep(0.1)


class _BenchDisplay:
    """Progress of a bench: a bar across tasks and one for the task in flight (evaluations of its budget),
    and one line per finished task. No live display when the console is not a terminal."""

    def __init__(self, budget: int):
        self.budget = budget
        self.finished: Any = None
        self._progress: Progress | None = None
        self._suite: Any = None
        self._task: Any = None
        self._name = ""

    def progress(self, total: int) -> Progress:
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), console=console, disable=not console.is_terminal)
        self._suite = self._progress.add_task("tasks", total=total)
        self._task = self._progress.add_task("", total=self.budget, visible=False)
        return self._progress

    def say(self, text: str) -> None:
        target = self._progress.console if self._progress else console
        target.print(text, markup=False, highlight=False, emoji=False, soft_wrap=True)

    def observe(self, event: Any) -> None:
        from .events import CandidateEvaluated, NewBest
        from .suite import TaskFinished, TaskNote, TaskStarted

        p = self._progress
        if p is None:
            return
        if isinstance(event, TaskStarted):
            self._name = event.task
            p.update(self._suite, description=f"task {event.index + 1}/{event.total}")
            p.reset(self._task, total=self.budget, description=event.task, visible=True)
        elif isinstance(event, TaskNote):
            p.update(self._task, description=f"{event.task}: {event.text}")
        elif isinstance(event, CandidateEvaluated):
            p.update(self._task, completed=min(event.evaluations, self.budget))
        elif isinstance(event, NewBest):
            p.update(self._task, description=f"{self._name}: best {event.median_ms:.4f} ms"
                     + (f" ({event.speedup_eager:.2f}x eager)" if event.speedup_eager else ""))
        elif isinstance(event, TaskFinished):
            p.update(self._suite, advance=1)
            p.update(self._task, visible=False)
            self.say(_row_line(event.row))
            if self.finished:
                self.finished()


def _row_line(row: Any) -> str:
    """One line per finished task, for the log."""
    text = f"{row.task}: {row.status}"
    if row.best_ms is not None:
        text += f", best {row.best_ms:.4f} ms"
        if row.speedup_eager:
            text += f" ({row.speedup_eager:.2f}x eager)"
    if row.evaluated is not None:
        text += f", {row.evaluated} evaluated, {row.correct} correct"
    if row.note:
        text += f" - {row.note}"
    if row.seconds is not None:
        text += f" [{row.seconds:.0f} s]"
    return text


def cmd_bench_search(args: argparse.Namespace) -> int:
    from pathlib import Path

    from core.project import ProjectError

    from .benchmark import BLIND, compare, markdown

    missing = [r for r in args.records if not Path(r).is_file()]
    if missing:
        return _fail(f"[red]no such project:[/red] {', '.join(missing)}")
    if args.weights and not Path(args.weights).is_file():
        return _fail(f"[red]no such weights file:[/red] {args.weights}")
    if args.seeds < 1 or args.budget < 1:
        return _fail("[red]--seeds and --budget must be at least 1[/red]")
    policies = list(dict.fromkeys(["random", BLIND, *args.policies]))     # what compare() runs, in its order
    total = len(args.records) * len(policies) * args.seeds
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        bar = progress.add_task("trials", total=total)
        try:
            trials = compare(args.records, args.policies, args.seeds, args.budget,
                             progress=lambda t: progress.update(bar, advance=1, description=f"{t.task} {t.policy}"),
                             weights=args.weights, memory_start=not args.from_default)
        except (ProjectError, ValueError) as exc:
            return _fail(f"[red]bench-search:[/red] {exc}")
    table = markdown(trials, args.budget, _trained_on(args.weights) if "ppo" in args.policies else ())
    console.print(table, soft_wrap=True, markup=False)
    if args.out:
        Path(args.out).write_text(table)
    return EXIT_OK


def _trained_on(weights: str | None) -> list[str]:
    """The tasks the PPO weights (given, else the shipped ones) were trained on."""
    import json

    from .policies import PRETRAINED_PPO

    path = Path(weights) if weights else PRETRAINED_PPO
    try:
        return list((json.loads(path.read_text()).get("meta") or {}).get("trained_on") or [])
    except (OSError, ValueError):
        return []


TRAIN_HELP = """Train the PPO policy on recorded projects (replay: no GPU). The records are split by task:
within each family, in name order, every --hold-out-th task (the 2nd, 5th, ...) is held out. The
policy trains on the rest for --rounds rounds (each round runs the optimiser once on every training
record, proposing only schedules the record answers, for --budget evaluations), the weights go to
--out with the names of both sets, and the held-out records are then compared by `bench-search`'s
measure: evaluations to 97 % of the record's best time for ppo (these weights), ppo-untrained and
random search, --seeds trials each."""


def add_train_parser(sub: Any) -> None:
    from .policies import PRETRAINED_PPO

    p = sub.add_parser("train", help="train the PPO policy from recorded projects (replay, no GPU)",
                       description=TRAIN_HELP)
    p.add_argument("records", nargs="+", metavar="RECORD",
                   help="recorded projects (.cuagent), or folders of them")
    p.add_argument("--out", default=str(PRETRAINED_PPO),
                   help=f"weights file to write (default: the shipped one, {PRETRAINED_PPO})")
    p.add_argument("--rounds", type=int, default=30, help="passes over the training records (default 30)")
    p.add_argument("--budget", type=int, default=40, help="evaluations per record and round (default 40)")
    p.add_argument("--hold-out", type=int, default=3, metavar="K",
                   help="hold out every K-th task of each family (default 3; 0 = train on all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=5, help="held-out trials per policy and record (default 5)")
    p.add_argument("--eval-budget", type=int, default=100, help="evaluations per held-out trial (default 100)")
    p.add_argument("--report", metavar="FILE.md", help="also write the held-out table to this file")
    p.add_argument("--random-starts", type=float, default=0.0, metavar="F",
                   help="fraction of visits that start from a random measured schedule of the record instead "
                        "of the default (default 0)")
    p.add_argument("--target-bonus", type=float, default=0.0, metavar="B",
                   help="reward for reaching 97 %% of the record's best, once per episode (default 0)")
    p.add_argument("--no-memory", action="store_true",
                   help="ship no memory of the training records' near-best schedules with the weights (the "
                        "policy then has no votes and no jump action; docs/search.md, \"Memory\")")
    p.add_argument("--temperature", type=float, default=1.0, metavar="T",
                   help="the temperature written into the weights for their use (PPOConfig.temperature; "
                        "training itself runs at 1; default 1)")
    p.set_defaults(func=cmd_train)


def _record_files(paths: list[str]) -> tuple[list[Path], list[str]]:
    found, missing = [], []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found += sorted(path.glob("*.cuagent"))
        elif path.is_file():
            found.append(path)
        else:
            missing.append(raw)
    return found, missing


def cmd_train(args: argparse.Namespace) -> int:
    from core.project import ProjectError

    from .benchmark import compare, default_misses, markdown, overall
    from .training import describe_records, split_records, train

    files, missing = _record_files(args.records)
    if missing:
        return _fail(f"[red]no such project or folder:[/red] {', '.join(missing)}")
    if min(args.rounds, args.budget, args.seeds, args.eval_budget) < 1 or args.hold_out < 0:
        return _fail("[red]--rounds, --budget, --seeds and --eval-budget must be at least 1, --hold-out at least 0[/red]")
    if not 0.0 <= args.random_starts <= 1.0 or args.target_bonus < 0 or args.temperature <= 0:
        return _fail("[red]--random-starts must be within 0..1, --target-bonus at least 0, --temperature above 0[/red]")
    try:
        records = describe_records(files)
    except ProjectError as exc:
        return _fail(f"[red]train:[/red] {exc}")
    if not records:
        return _fail("[red]train:[/red] none of these projects has a measured candidate to learn from")
    training, held = split_records(records, args.hold_out)
    if not training:
        return _fail("[red]train:[/red] every record is held out; give more records or a larger --hold-out")
    console.print(f"{len(records)} records: training on {len(training)} "
                  f"({', '.join(r.task for r in training)}); held out {len(held)} "
                  f"({', '.join(r.task for r in held) or 'none'})", soft_wrap=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=not console.is_terminal) as progress:
        bar = progress.add_task("training", total=args.rounds * len(training))
        episodes: list[Any] = []

        def step(episode: Any) -> None:
            reached = "-" if episode.to_target is None else str(episode.to_target)
            progress.update(bar, advance=1, description=f"round {episode.round + 1}: {episode.task} ({reached})")
            episodes.append(episode)
            if not console.is_terminal and len(episodes) % len(training) == 0:    # a log: one line per round
                console.print(f"round {len(episodes) // len(training)} of {args.rounds} done")

        policy, report = train(training, rounds=args.rounds, budget=args.budget, seed=args.seed, progress=step,
                               random_starts=args.random_starts, target_bonus=args.target_bonus,
                               memory=not args.no_memory)
    medians = report.round_medians(args.budget)
    console.print(f"median evaluations to 97 % of the best, per round: {' '.join(f'{m:g}' for m in medians)} "
                  f"({report.updates} policy updates)", soft_wrap=True)
    policy.meta["held_out"] = [r.task for r in held]
    policy.config.temperature = args.temperature      # for the weights' use; training ran at 1
    out = Path(args.out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        policy.save(out)
    except OSError as exc:
        return _fail(f"[red]cannot write {out}:[/red] {exc.strerror or exc}")
    console.print(f"weights written to {out}", soft_wrap=True)
    if not held:
        return EXIT_OK
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=not console.is_terminal) as progress:
        per_record = 4 * args.seeds         # random, blind sampling, ppo, ppo-untrained
        bar = progress.add_task("held-out trials", total=len(held) * per_record)
        done: list[Any] = []

        def trial_done(t: Any) -> None:
            progress.update(bar, advance=1, description=f"{t.task} {t.policy}")
            done.append(t)
            if not console.is_terminal and len(done) % per_record == 0:    # a log: one line per record
                console.print(f"held-out record {len(done) // per_record} of {len(held)} done ({t.task})")

        trials = compare([r.path for r in held], ["ppo", "ppo-untrained"], args.seeds, args.eval_budget,
                         progress=trial_done, weights=out)
    table = markdown(trials, args.eval_budget)
    console.print(table, soft_wrap=True, markup=False)
    if args.report:
        Path(args.report).write_text(table)
    misses = default_misses(trials)
    subsets = [("median over tasks and seeds", trials)]
    if misses and len(misses) < len(trials):
        subsets.append((f"the {len({t.record for t in misses})} tasks whose default misses the target", misses))
    for label, subset in subsets:
        if subset:
            medians = overall(subset, args.eval_budget)
            console.print(f"held out, {label}: " + ", ".join(f"{p} {m:g}" for p, m in medians.items())
                          + " evaluations to 97 % of the best")
    return EXIT_OK


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> int:
    err.print(message)
    return code


def cmd_run(args: argparse.Namespace) -> int:
    from .session import RunConfig, RunSetupError, open_run

    config = RunConfig(task=args.task, project=args.project, program=args.program, policy=args.policy,
                       budget=args.budget, seconds=args.seconds, episode=args.episode, seed=args.seed,
                       replay=list(args.replay), skip_unrecorded=args.skip_unrecorded, device=args.device,
                       weights=args.weights, compile_ahead=args.compile_ahead,
                       compile_workers=args.compile_workers, confirm_rounds=args.confirm_rounds,
                       memory=args.memory, from_default=args.from_default)
    status = console.status("starting the evaluator, measuring baselines and the GPU's ceilings...")

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
        if setup.remembered:
            console.print(setup.remembered, soft_wrap=True)


def _run(opt: Any, args: argparse.Namespace) -> int:
    from .events import BestConfirmed, CandidateEvaluated, NewBest, PolicyUpdated, RunError

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
            elif isinstance(event, BestConfirmed):
                confirmed.append(event)

        confirmed: list[Any] = []
        opt.observers.append(observer)

        done = threading.Event()

        def target() -> None:
            try:
                summary.append(opt.run())
            except BaseException as exc:   # reported below; the project already recorded an unclean stop
                failure.append(exc)
            finally:
                done.set()

        thread = threading.Thread(target=target, name="optimizer")
        thread.start()
        try:
            _wait(done)
        except KeyboardInterrupt:
            progress.console.print("stopping after the candidate in flight...")
            opt.stop()
            _wait(done)
        thread.join()
    if failure:
        return _fail(f"[red]the run failed:[/red] {type(failure[0]).__name__}: {failure[0]}", EXIT_REJECTED)
    s = summary[0]
    console.print(f"run {s.run_id} finished ({s.reason}): {s.evaluations} evaluations, "
                  + ", ".join(f"{k} {v}" for k, v in s.counts.items()))
    console.print(best_table(opt.project.best(5)))
    for event in confirmed:
        if event.reason:
            console.print(f"best #{event.candidate_id} could not be re-measured against eager: {event.reason}")
        else:
            console.print(f"best #{event.candidate_id} re-measured in {event.rounds} rounds interleaved with eager: "
                          f"{event.median_ms:.4f} ms against {event.eager_ms:.4f} ms, "
                          f"{event.speedup_eager:.2f}x eager")
    return EXIT_OK


def best_table(records: list[Any]) -> Any:
    """The final table of a run: time, speed-ups over both baselines, and the roofline floor's share."""
    def ratio(value: Any, fmt: str) -> str:
        return fmt.format(value) if isinstance(value, (int, float)) else "-"

    table = Table(title="fastest candidates", header_style="bold")
    for col in ("id", "branch", "schedule", "median", "vs eager", "vs compile", "of floor", "origin"):
        table.add_column(col)
    for rec in records:
        m = rec.measurement or {}
        table.add_row(str(rec.id), str(rec.branch_id), " ".join(f"{k}={v}" for k, v in rec.schedule.items()),
                      f"{rec.median_ms:.4f} ms", ratio(m.get("speedup_eager"), "{:.2f}x"),
                      ratio(m.get("speedup_compile"), "{:.2f}x"), ratio(m.get("roofline_fraction"), "{:.0%}"),
                      rec.origin)
    return table
