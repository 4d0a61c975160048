"""`cuda-agent bench SUITE`: tune every task of a folder as `cuda-agent run` would, and summarise.

Each task (the folder's *.py files, sorted by name) is loaded, given the program `run` would tune
(resources/programs/TASK.json, else what the code generators make of the reference) and run
through session.open_run with the same settings, one project file per task (PROJECTS/TASK.cuagent;
an existing one is continued as `run` continues it). A task that fails to load, that no generator
lowers, that has no replay record, or whose run fails gets a row that says why; the suite goes on.
`stop()` ends the suite after the task in flight, `stop(now=True)` also ends that task after its
candidate in flight. `markdown(report)` renders the table. No rich and no Qt here: the CLI renders.
"""
from __future__ import annotations

import math
import re
import shlex
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .session import EXIT_BAD_INPUT, EXIT_UNAVAILABLE, POLICIES

# Row statuses. "ok" and "stopped" rows ran; the others say why a task has no figures.
OK, STOPPED, NO_LOWERING, NO_RECORD, LOAD_ERROR, ERROR, NOT_RUN, PENDING = (
    "ok", "stopped", "no lowering", "no record", "load error", "error", "not run", "pending")
FAILED = (LOAD_ERROR, ERROR)        # statuses that make `cuda-agent bench` exit 1
FINISH_TEXT = {"evaluations": "budget spent", "seconds": "time limit", "exhausted": "space exhausted",
               "stopped": "stopped (Ctrl-C)"}
NOTE_LIMIT = 80                     # characters of a reason shown in the table; more of it goes below the table
DETAIL_LIMIT = 300


class BenchError(Exception):
    """A problem with the suite as a whole (folder, names, records, no GPU); `code` is the CLI's exit code."""

    def __init__(self, message: str, code: int = EXIT_BAD_INPUT):
        super().__init__(message)
        self.code = code


@dataclass
class BenchConfig:
    suite: str | Path
    projects: str | Path                     # one TASK.cuagent per task
    policy: str = "ppo"
    budget: int = 100                        # evaluations per task
    seconds: float | None = None             # wall time per task
    episode: int = 8
    seed: int = 0
    replay: list[str | Path] = field(default_factory=list)   # recorded projects or folders of them
    skip_unrecorded: bool = False
    device: int = 0
    tasks: list[str] = field(default_factory=list)           # task names to run (default: all)
    weights: str | Path | None = None        # PPO weights (default: the shipped pretrained ones)
    programs: str | Path | None = None       # folder of TASK.json program files tuned instead of generating

    def command_line(self, out: str | Path | None = None) -> str:
        """The command that repeats this bench, every setting spelled out."""
        words = ["cuda-agent", "bench", str(self.suite), "--policy", self.policy, "--budget", str(self.budget)]
        if self.weights is not None:
            words += ["--weights", str(self.weights)]
        if self.programs is not None:
            words += ["--programs", str(self.programs)]
        if self.seconds is not None:
            words += ["--seconds", f"{self.seconds:g}"]
        words += ["--episode", str(self.episode), "--seed", str(self.seed), "--projects", str(self.projects)]
        if self.tasks:
            words += ["--tasks", *self.tasks]
        if self.replay:
            words += ["--replay", *(str(r) for r in self.replay)]
            if self.skip_unrecorded:
                words.append("--skip-unrecorded")
        else:
            words += ["--device", str(self.device)]
        if out is not None:
            words += ["--out", str(out)]
        return shlex.join(words)


@dataclass
class TaskRow:
    task: str
    status: str = PENDING
    note: str = ""                  # short, for the table
    detail: str = ""                # the full message, listed under the table when the note cuts it
    family: str | None = None       # the task file's "# family:" header
    program: str | None = None      # "hand-written program" or "generated <family>"
    evaluated: int | None = None    # candidates with a verdict in the project (replay misses left out)
    correct: int | None = None
    best_ms: float | None = None
    eager_ms: float | None = None
    compile_ms: float | None = None
    floor_fraction: float | None = None   # roofline floor / best time of the best candidate (1 = at the floor)
    below_floor: bool = False
    interleaved_speedup: float | None = None   # the best re-measured interleaved with eager, after the run
    misses: int = 0                 # replayed candidates the records never measured
    this_run: int | None = None     # evaluations by this bench (and a killed run it continued)
    resumed: bool = False           # the project existed before
    gpu: str | None = None
    project: str | None = None
    seconds: float | None = None

    @property
    def speedup_eager(self) -> float | None:
        return self.eager_ms / self.best_ms if self.eager_ms and self.best_ms else None

    @property
    def speedup_compile(self) -> float | None:
        return self.compile_ms / self.best_ms if self.compile_ms and self.best_ms else None

    @property
    def ran(self) -> bool:
        return self.status in (OK, STOPPED)


@dataclass
class BenchReport:
    suite: str
    rows: list[TaskRow]
    policy: str
    budget: int
    seconds: float | None
    command: str
    date: str
    replay: bool
    projects: str
    interrupted: bool = False

    @property
    def gpus(self) -> list[str]:
        return list(dict.fromkeys(r.gpu for r in self.rows if r.gpu))

    @property
    def done(self) -> int:
        return sum(r.status != PENDING for r in self.rows)

    @property
    def failed(self) -> list[TaskRow]:
        return [r for r in self.rows if r.status in FAILED]

    def geomean(self, column: str) -> tuple[float | None, int]:
        """(geometric mean, number of tasks) of speedup_eager, speedup_compile or floor_fraction over
        the tasks that have it."""
        values = [v for v in (getattr(r, column) for r in self.rows) if v is not None and v > 0]
        if not values:
            return None, 0
        return math.exp(sum(math.log(v) for v in values) / len(values)), len(values)


# ---- events for the CLI (the optimiser's own events are passed through as well) ------------------

@dataclass(frozen=True)
class TaskStarted:
    index: int
    total: int
    task: str


@dataclass(frozen=True)
class TaskNote:
    task: str
    text: str          # a slow step, e.g. starting the evaluator and measuring baselines


@dataclass(frozen=True)
class TaskFinished:
    index: int
    total: int
    row: TaskRow


# ---- replay records --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Record:
    path: Path
    task_name: str
    task_hash: str


def find_records(paths: list[str | Path]) -> list[Record]:
    """Recorded projects named directly or found in folders (*.cuagent). Unreadable ones are errors."""
    from core.project import Project, ProjectError

    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.cuagent"))
            if not found:
                raise BenchError(f"replay error: the folder {p} holds no recorded project (*.cuagent).")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise BenchError(f"replay error: {p} does not exist; give recorded project files (.cuagent) or "
                             "folders of them.")
    records = []
    for f in dict.fromkeys(files):
        try:
            with Project.open(f, readonly=True) as project:
                records.append(Record(f, project.task_name, project.task_hash))
        except ProjectError as exc:
            raise BenchError(f"replay error: {exc}") from None
    return records


# ---- the bench ---------------------------------------------------------------------------------------

class Bench:
    """Runs a suite; `run()` blocks (call it on a worker thread), `stop()` from any thread."""

    def __init__(self, config: BenchConfig, observer: Callable[[Any], None] | None = None,
                 command: str | None = None):
        self.config = config
        self.observer = observer
        self.command = command or config.command_line()
        self.date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        self.files: list[Path] = []
        self.records: list[Record] = []
        self.rows: list[TaskRow] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stop_now = False
        self._optimizer: Any = None
        self._planned = False

    # ---- control -----------------------------------------------------------------------------------

    def stop(self, now: bool = False) -> None:
        """Start no further task; with now=True also stop the task in flight after its candidate in flight."""
        self._stop.set()
        with self._lock:
            if now:
                self._stop_now = True
                if self._optimizer is not None:
                    self._optimizer.stop()

    # ---- checks before anything runs ------------------------------------------------------------

    def plan(self) -> list[Path]:
        """Check the settings, the folder, the names and the records; returns the task files to run.
        Raises BenchError (nothing was written)."""
        c = self.config
        if c.policy not in POLICIES:
            raise BenchError(f"unknown policy '{c.policy}': choose one of {', '.join(POLICIES)}")
        if c.budget < 1:
            raise BenchError(f"--budget must be at least 1 evaluation per task, not {c.budget}")
        if c.seconds is not None and c.seconds <= 0:
            raise BenchError(f"--seconds must be more than 0, not {c.seconds:g}")
        if c.episode < 1:
            raise BenchError(f"--episode must be at least 1 edit, not {c.episode}")
        suite = Path(c.suite)
        if not suite.is_dir():
            raise BenchError(f"no suite: {suite} is not a folder; give a folder of KernelBench-format task "
                             "files (*.py).")
        files = sorted(suite.glob("*.py"), key=lambda p: p.name)       # the order core.tasks.scan_suite uses
        if not files:
            raise BenchError(f"no suite: the folder {suite} contains no .py task files.")
        if c.tasks:
            wanted = list(dict.fromkeys(n.removesuffix(".py") for n in c.tasks))
            have = {f.stem: f for f in files}
            unknown = [n for n in wanted if n not in have]
            if unknown:
                names = ", ".join(sorted(have))
                raise BenchError(f"no such task in {suite}: {', '.join(unknown)}. It has: "
                                 f"{names if len(names) <= 400 else names[:400] + '...'}")
            files = [f for f in files if f.stem in wanted]
        projects = Path(c.projects)
        if projects.exists() and not projects.is_dir():
            raise BenchError(f"--projects {projects} is a file; it must be a folder (one TASK.cuagent per task).")
        if c.replay:
            self.records = find_records(c.replay)
        else:
            self._check_gpu()
        try:
            projects.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BenchError(f"--projects {projects} cannot be created: {exc.strerror or exc}") from None
        self.files = files
        self.rows = [TaskRow(f.stem) for f in files]
        self._planned = True
        return files

    def _check_gpu(self) -> None:
        from core.evaluation.probe import probe_gpus

        probe = probe_gpus()
        if not probe.can_run:
            raise BenchError(f"cannot measure here: {probe.reason}. Replay recorded projects instead "
                             "(--replay RECORD ...).", EXIT_UNAVAILABLE)
        if self.config.device >= len(probe.gpus):
            raise BenchError(f"there is no GPU {self.config.device}: this machine has {len(probe.gpus)}.")

    # ---- running ------------------------------------------------------------------------------------

    def report(self) -> BenchReport:
        """The table so far (rows not reached yet are "pending")."""
        c = self.config
        rows = [_copy(r) for r in self.rows]
        cut = self._stop.is_set() and any(r.status in (NOT_RUN, STOPPED) for r in rows)
        return BenchReport(str(c.suite), rows, c.policy, c.budget, c.seconds, self.command, self.date,
                           bool(c.replay), str(c.projects), interrupted=cut)

    def run(self) -> BenchReport:
        if not self._planned:
            self.plan()
        total = len(self.files)
        for i, (path, row) in enumerate(zip(self.files, self.rows)):
            if self._stop.is_set():
                row.status, row.note = NOT_RUN, "interrupted"
                continue
            self._emit(TaskStarted(i, total, path.stem))
            started = time.monotonic()
            try:
                self._run_task(path, row)
            except Exception as exc:       # a bug must cost one row, not the suite
                row.status, row.note, row.detail = ERROR, _short(_exc_text(exc)), _exc_text(exc)
            row.seconds = time.monotonic() - started
            self._emit(TaskFinished(i, total, row))
        return self.report()

    def _emit(self, event: Any) -> None:
        if self.observer is not None:
            self.observer(event)

    def _run_task(self, path: Path, row: TaskRow) -> None:
        from core.tasks import TaskError, load_task

        from .session import RunConfig, RunSetupError, default_program, open_run

        try:
            task = load_task(path)
        except TaskError as exc:
            return _fail(row, LOAD_ERROR, str(exc))
        row.family = task.family
        # As `run` chooses: a program file given (here: in --programs), else the generated program,
        # else the hand-written resources/programs/TASK.json.
        program_file = Path(self.config.programs) / f"{task.name}.json" if self.config.programs else None
        if program_file is not None and program_file.exists():
            row.program = "program file"
        else:
            program_file = None
            # open_run generates it again; asked here so that "no lowering" is told apart from other errors.
            from core.codegen import CodegenError, generate

            try:
                row.program = f"generated {generate(task).family}"
            except CodegenError as exc:
                if default_program(task.name).exists():
                    row.program = "hand-written program"
                else:
                    row.status, row.note, row.detail = NO_LOWERING, _lowering_note(exc), str(exc)
                    return None
        records: list[Path] = []
        if self.config.replay:
            records = [r.path for r in self.records if r.task_hash == task.hash]
            if not records:
                others = [str(r.path) for r in self.records if r.task_name == task.name]
                row.status = NO_RECORD
                if others:
                    row.note = "the records of this name were made from other source"
                    row.detail = (f"{', '.join(others)} recorded a task named {task.name} whose source differs "
                                  f"from {path}; a replay only answers for identical source.")
                return None
        project = Path(self.config.projects) / f"{task.name}.cuagent"
        row.project, row.resumed = str(project), project.exists()
        if any(_same_file(project, r) for r in records):
            return _fail(row, ERROR, f"project error: {project} is also a replay record of this task; choose "
                                     "another --projects folder.")
        c = self.config
        config = RunConfig(task=path, project=project, program=program_file, policy=c.policy, budget=c.budget,
                           seconds=c.seconds, episode=c.episode, seed=c.seed, replay=list(records),
                           skip_unrecorded=c.skip_unrecorded, device=c.device, weights=c.weights,
                           memory=False)     # a benchmark must not depend on this machine's earlier runs
        try:
            setup = open_run(config, observers=[self._emit],
                             starting=lambda text: self._emit(TaskNote(task.name, text)))
        except RunSetupError as exc:
            return _fail(row, ERROR, str(exc))
        try:
            with self._lock:
                if self._stop_now:
                    row.status, row.note = NOT_RUN, "interrupted"
                    return None
                self._optimizer = setup.optimizer
            try:
                summary = setup.optimizer.run()
            except Exception as exc:        # the project recorded an unclean stop; show what it holds
                _fail(row, ERROR, f"the run failed: {_exc_text(exc)}")
            else:
                row.status = STOPPED if summary.reason == "stopped" else OK
                row.this_run = summary.evaluations
                row.note = FINISH_TEXT.get(summary.reason, summary.reason)
            finally:
                with self._lock:
                    self._optimizer = None
            _fill(row, setup.project)
        finally:
            setup.close()
        return None


# ---- figures from a project ------------------------------------------------------------------------

def _fill(row: TaskRow, project: Any) -> None:
    """Counts, best time, baselines and roofline position from the task's project (all its runs)."""
    from core.evaluation.gpuinfo import gpu_key
    from core.project.records import FINAL_STATUSES

    from .replay import NOT_RECORDED

    counts = project.counts_by_status()
    row.misses = sum(1 for r in project.candidates(status="rejected") if r.reason == NOT_RECORDED)
    row.evaluated = sum(counts.get(s, 0) for s in FINAL_STATUSES) - row.misses
    row.correct = counts.get("measured", 0)
    best = project.best(1)
    m = (best[0].measurement or {}) if best else {}
    if best:
        row.best_ms = best[0].median_ms
        row.interleaved_speedup = (best[0].extra.get("interleaved") or {}).get("speedup_eager")
        row.floor_fraction = m.get("roofline_fraction")
        row.below_floor = bool(m.get("below_floor"))
    hardware = project.hardware or {}
    keys = project.baseline_keys()
    key = gpu_key(hardware) if hardware and gpu_key(hardware) in keys else (keys[0] if keys else None)
    baselines = project.baselines(key) if key else None
    if baselines is not None:
        row.eager_ms = baselines.eager.median_ms if baselines.eager else None
        row.compile_ms = baselines.compile.median_ms if baselines.compile else None
    row.eager_ms = row.eager_ms or m.get("eager_ms")
    row.compile_ms = row.compile_ms or m.get("compile_ms")
    row.gpu = hardware.get("name") or (baselines.gpu if baselines is not None and baselines.gpu else None)
    notes = [row.note] if row.note else []
    if row.program:
        notes.append(row.program)
    if row.resumed and row.this_run is not None:
        notes.append(f"resumed project, +{row.this_run} evaluations")
    if row.misses:
        notes.append(f"{row.misses} not in the record")
    if row.correct == 0:
        notes.append("no correct candidate")
    if row.below_floor:
        notes.append("best is below the roofline floor (re-verified)")
    if baselines is not None and baselines.compile is None and baselines.compile_error:
        notes.append("torch.compile failed")
        row.detail = row.detail or f"torch.compile baseline: {baselines.compile_error}"
    row.note = "; ".join(notes)


def _copy(row: TaskRow) -> TaskRow:
    return TaskRow(**{k: getattr(row, k) for k in row.__dataclass_fields__})


def _fail(row: TaskRow, status: str, message: str) -> None:
    row.status, row.note, row.detail = status, _short(message), message


def _exc_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and a.samefile(b)
    except OSError:
        return False


_WHERE = re.compile(r"^(?:Task file '[^']*'|Task '[^']*'(?: \(given as source text\))?):? (?:has an? |is )?")
_HEAD = re.compile(r"([a-z][a-z ]{0,30}): (.*)", re.S)     # "task error: ...", "the run failed: ..."


def _short(message: str, limit: int = NOTE_LIMIT) -> str:
    """The first sentence of a message, without the task file it names (the row names the task)."""
    m = _HEAD.match(message)
    head, rest = (m.group(1), m.group(2)) if m else ("", message)
    text = _WHERE.sub("", " ".join(rest.split()))
    end = re.search(r"\.(?:\s|$)", text)
    text = text[:end.start()] if end else text
    text = f"{head}: {text}" if head else text
    return _cut(text, limit)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


def _lowering_note(exc: Exception) -> str:
    """The op no generator lowers, e.g. "convolution.default" or "mm.default (also permute.default)"."""
    named = re.search(r"lowers '([^']+)'", str(exc))
    ops = list(dict.fromkeys(getattr(exc, "ops", []) or []))
    first = named.group(1) if named else (ops[0] if ops else None)
    if first is None:
        return _short(str(exc))
    others = [op for op in ops if op != first]
    return _short(first + (f" (also {', '.join(others)})" if others else ""))


# ---- the Markdown table ----------------------------------------------------------------------------

COLUMNS = ("task", "family", "evaluated", "correct", "best (ms)", "eager (ms)", "torch.compile (ms)", "vs eager",
           "vs compile", "floor / best", "status")


def _ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.4f}" if ms < 1 else f"{ms:.3f}" if ms < 100 else f"{ms:.1f}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f} %"


def _cell(text: Any) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _tasks(n: int) -> str:
    return f"{n} task" if n == 1 else f"{n} tasks"


def _count(v: int | None) -> str:
    return "-" if v is None else str(v)


def markdown(report: BenchReport) -> str:
    """The bench's Markdown: a title, one header line, the table with a geomean row, notes."""
    gpu = ", ".join(report.gpus) or ("unknown (the records name none)" if report.replay else "unknown")
    if report.replay:
        gpu += " (replayed)"
    budget = f"{report.budget} evaluations" + (f" or {report.seconds:g} s" if report.seconds else "") + " per task"
    lines = [f"# cuda-agent bench: {_cell(report.suite)}", "",
             f"{report.date} · GPU: {gpu} · policy: {report.policy} · budget: {budget} · `{report.command}`", ""]
    pending = sum(r.status == PENDING for r in report.rows)
    if pending:
        lines += [f"In progress: {report.done} of {len(report.rows)} tasks done.", ""]
    elif report.interrupted:
        skipped = sum(r.status == NOT_RUN for r in report.rows)
        stopped = sum(r.status == STOPPED for r in report.rows)
        lines += [f"Interrupted (Ctrl-C): {skipped} of {len(report.rows)} tasks not run"
                  + (f", {stopped} stopped before its budget" if stopped else "") + ".", ""]
    if report.replay:
        lines += ["Replayed: every time below was measured when the records were made, not by this command.", ""]
    lines.append("| " + " | ".join(COLUMNS) + " |")
    lines.append("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|")
    for r in report.rows:
        status = r.status + (f": {r.note}" if r.note else "")
        cells = [r.task, r.family or "-", _count(r.evaluated), _count(r.correct), _ms(r.best_ms), _ms(r.eager_ms),
                 _ms(r.compile_ms), _x(r.speedup_eager), _x(r.speedup_compile), _pct(r.floor_fraction), status]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    (ge, ne), (gc, nc), (gf, nf) = (report.geomean(c) for c in ("speedup_eager", "speedup_compile",
                                                                "floor_fraction"))
    over = (f"over {_tasks(ne)}" if ne == nc == nf else
            f"vs eager over {_tasks(ne)}, vs compile over {nc}, floor over {nf}")
    lines.append(f"| geomean | | | | | | | {_x(ge)} | {_x(gc)} | {_pct(gf)} | {over} |")
    lines += ["", "best: the fastest correct candidate in the task's project (earlier runs included); vs eager and "
                  "vs compile: baseline time / best; floor / best: the roofline floor / best time (100 % = at the "
                  f"floor). Projects: {_cell(report.projects)} (one TASK.cuagent per task; `cuda-agent inspect` "
                  "opens one)."]
    confirmed = [r for r in report.rows if r.interleaved_speedup]
    if confirmed:
        lines += ["", "Each best re-measured after its run, interleaved with eager in one window (no drift "
                      "between the baseline's measurement and the best's):", ""]
        lines += [f"- {r.task}: {_x(r.interleaved_speedup)} eager" for r in confirmed]
    details = [r for r in report.rows if r.detail and r.detail != r.note]
    if details:
        lines += ["", "Details:", ""]
        lines += [f"- {r.task}: {_cut(' '.join(r.detail.split()), DETAIL_LIMIT)}" for r in details]
    return "\n".join(lines) + "\n"
