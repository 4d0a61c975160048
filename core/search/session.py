"""Set up a search run from plain settings: the one path `cuda-agent run` and the app share.

`open_run(RunConfig(...))` loads the task and the program, opens or creates the project, builds
the pool (recorded projects to replay, or the GPU evaluator) and the policy, and returns a
RunSetup holding the Optimizer. Every problem is a RunSetupError with one clear paragraph and the
CLI's exit code; nothing is left open when setup fails.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .policies.base import POLICY_NAMES as POLICIES  # no torch: cheap at import

PROGRAMS = Path(__file__).resolve().parents[2] / "resources" / "programs"
EXIT_BAD_INPUT, EXIT_UNAVAILABLE = 2, 3     # same codes as core/cli.py


class RunSetupError(Exception):
    def __init__(self, message: str, code: int = EXIT_BAD_INPUT):
        super().__init__(message)
        self.code = code


@dataclass
class RunConfig:
    task: str | Path
    project: str | Path
    program: str | Path | None = None      # default: the generated program, else resources/programs/TASK.json
    policy: str = "ppo"
    budget: int = 100                       # evaluations
    seconds: float | None = None            # wall-time budget
    episode: int = 8
    seed: int = 0
    replay: list[str | Path] = field(default_factory=list)   # recorded projects: no GPU needed
    skip_unrecorded: bool = False
    device: int = 0
    weights: str | Path | None = None       # PPO weights to start from (default: the shipped pretrained ones)
    compile_ahead: int = 6                  # predicted next candidates compiled while the GPU measures (0: off;
                                            # up to 4x as many when compiles are slow)
    compile_workers: int | None = None      # NVRTC processes (None: evaluator.default_compile_workers)
    confirm_rounds: int = 20                # the best re-measured interleaved with eager at the end (0: off)
    # ppo also recalls the user's remembered runs, and a run measured on a GPU is remembered when it
    # ends (core/search/memory.py; the file is memory.user_memory_path()). Off by default: in a replay
    # of a user's sequence of tasks it helped some and hurt others (docs/search.md, "Memory").
    memory: bool = False
    # True: the first candidate is the default schedule; False (the default): for ppo, the schedule its
    # memory ranks highest for the task.
    from_default: bool = False


@dataclass
class RunSetup:
    optimizer: Any
    project: Any
    pool: Any
    replaying: bool
    notes: list[str] = field(default_factory=list)
    remember_to: Path | None = None      # the memory file this run is added to when it closes
    remembered: str | None = None        # what closing did with the memory, for the user (None: nothing)
    owns_pool: bool = True               # False: the caller gave the pool and closes it

    def close(self) -> None:
        """Close the pool (stops evaluator processes) unless the caller owns it, and the project;
        then remember the run."""
        close = getattr(self.pool, "close", None) if self.owns_pool else None
        try:
            if close:
                close()
        finally:
            self.project.close()
        if self.remember_to is not None:
            self._remember(self.remember_to)

    def _remember(self, memory_path: Path) -> None:
        from core.project import ProjectError

        from .memory import MIN_MEASURED, remember

        try:
            entry = remember(self.project.path, memory_path)
        except (OSError, ValueError, ProjectError) as exc:
            self.remembered = f"warning: this run was not remembered in {memory_path}: {exc}"
            return
        self.remembered = (f"remembered {len(entry.schedules)} near-best schedules of {entry.task} in {memory_path}"
                           if entry else f"not remembered: fewer than {MIN_MEASURED} correct schedules measured")


def _policy_note(config: RunConfig, policy: Any) -> str:
    if config.policy == "ppo-untrained":
        return "PPO starts from untrained weights"
    if config.policy != "ppo":
        return f"policy: {config.policy}"
    trained_on = getattr(policy, "trained_on", [])
    if not trained_on:
        return "PPO starts untrained (no pretrained weights are installed)"
    source = config.weights or "the shipped pretrained weights"
    remembered = len(getattr(policy, "memory", []) or [])
    memory = f", remembering the near-best schedules of {remembered}" if remembered else ""
    first = ("; its first candidate is the schedule that memory ranks highest where it has votes for this task "
             "(--from-default: the default)") if remembered and not config.from_default else ""
    return (f"PPO starts from {source} (trained on {len(trained_on)} recorded tasks{memory}); "
            f"it keeps learning in this run{first}")


def default_program(task_name: str) -> Path:
    return PROGRAMS / f"{task_name}.json"


def open_run(config: RunConfig, observers: list[Callable[[Any], None]] | None = None,
             starting: Callable[[str], None] | None = None, pool: Any | None = None) -> RunSetup:
    """Everything the run needs; `starting(text)` is told about slow steps (evaluator start-up).

    `pool`: a started Evaluator of this task that the caller owns and closes (several runs on one
    warm evaluator, e.g. policies and seeds compared back to back); None starts one (or replays)."""
    from core.project import Project, ProjectError
    from core.tasks import TaskError, load_task

    from .features import feature_size
    from .optimizer import Budget, Optimizer
    from .policies import make_policy
    from .replay import ReplayPool
    from .space import ScheduleSpace

    if config.policy not in POLICIES:
        raise RunSetupError(f"unknown policy '{config.policy}': choose one of {', '.join(POLICIES)}")
    if config.budget < 1:
        raise RunSetupError(f"the budget must be at least 1 evaluation, not {config.budget}")
    if config.compile_ahead < 0:
        raise RunSetupError(f"compile-ahead must be 0 (off) or more candidates, not {config.compile_ahead}")
    if config.compile_workers is not None and config.compile_workers < 1:
        raise RunSetupError(f"compile-workers must be at least 1, not {config.compile_workers}")
    if config.confirm_rounds < 0:
        raise RunSetupError(f"confirm-rounds must be 0 (off) or more rounds, not {config.confirm_rounds}")
    try:
        task = load_task(config.task)
    except TaskError as exc:
        raise RunSetupError(f"task error: {exc}") from None
    program, constraints, program_note = _program(config, task)
    try:
        path = Path(config.project)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        project = Project.open(path) if path.exists() else Project.create(path, task)
    except (ProjectError, OSError) as exc:
        raise RunSetupError(f"project error: {exc}") from None
    setup = RunSetup(None, project, None, bool(config.replay), owns_pool=pool is None)
    try:                        # on any failure, close what was opened (setup.close skips a missing pool)
        if project.task_hash != task.hash:
            raise RunSetupError(f"project error: {config.project} belongs to task '{project.task_name}' with "
                                f"different source than {config.task}; use another project file.")
        if pool is None:
            setup.pool, setup.notes = _pool(config, task, project, starting)
        else:
            setup.pool = _adopt(pool, task, project)
        setup.notes.insert(0, program_note)
        space = ScheduleSpace.from_program(program, task, constraints=constraints)
        if isinstance(setup.pool, ReplayPool) and \
                program.with_schedule(space.default()).content_hash() not in setup.pool:
            setup.notes.append("warning: the record does not hold this program's default schedule; it was "
                               "probably made from another program (another file, or an older code generator), "
                               "so most candidates will be answered 'not in the replay record'")
        try:
            policy = make_policy(config.policy, space, feature_size(space, task, project.hardware), seed=config.seed,
                                 weights=config.weights)
        except (OSError, ValueError) as exc:
            raise RunSetupError(f"policy error: {exc}") from None
        setup.notes.append(_policy_note(config, policy))
        if config.memory:
            _recall(config, policy, setup)
        setup.optimizer = Optimizer(task, program, setup.pool, project, policy, Budget(config.budget, config.seconds),
                                    observers=observers or [], episode_length=config.episode, seed=config.seed,
                                    space=space, unrecorded="skip" if config.skip_unrecorded else "penalise",
                                    compile_ahead=config.compile_ahead, confirm_rounds=config.confirm_rounds,
                                    memory_start=not config.from_default)
    except BaseException:
        setup.close()
        raise
    return setup


def _recall(config: RunConfig, policy: Any, setup: RunSetup) -> None:
    """The user's remembered runs join the pretrained PPO's memory; a run on a GPU will be added."""
    from .memory import load_memory, user_memory_path

    path = user_memory_path()
    if not setup.replaying:
        setup.remember_to = path
    if config.policy != "ppo" or not hasattr(policy, "recall"):
        return              # untrained PPO and the other policies have no memory to add to
    try:
        own = load_memory(path)
    except (OSError, ValueError) as exc:
        setup.notes.append(f"warning: your remembered runs are not used: {exc}")
        setup.remember_to = None        # and not overwritten
        return
    if len(own):
        policy.recall = own
        setup.notes.append(f"memory: recalling {len(own)} of your earlier runs ({path})")


def _program(config: RunConfig, task: Any) -> tuple[Any, list[Any], str]:
    """The program to tune and its schedule constraints: the file given, else what the code
    generators make of the task's reference, else the hand-written resources/programs/TASK.json.
    The generated program comes first: its schedule space is wider than the hand-written ones'
    few schedules, and on the H200 its best beat theirs (docs/performance.md)."""
    from core.codegen import CodegenError, generate
    from core.program import KernelProgram, ProgramError

    if not config.program:
        try:
            gen = generate(task)
            return gen.program, gen.space_constraints, f"tuning the generated {gen.family} program for {task.name}"
        except CodegenError as exc:
            if not default_program(task.name).exists():
                raise RunSetupError(f"no program: {exc} (Give a program file with --program.)") from None
    program_path = Path(config.program) if config.program else default_program(task.name)
    if not program_path.exists():
        raise RunSetupError(f"no program: {program_path} does not exist; give a program file (a "
                            f"cuda-agent/program@1 JSON with tunables) for task {task.name}.")
    try:
        program = KernelProgram.load(program_path)
    except (ProgramError, OSError) as exc:
        raise RunSetupError(f"program error: {exc}") from None
    if not program.tunables:
        raise RunSetupError(f"nothing to search: {program_path} declares no tunables.")
    return program, [], f"tuning the program {program_path}"


def _adopt(pool: Any, task: Any, project: Any) -> Any:
    """A started evaluator (the caller's or _pool's), checked to be of this task; the project gets
    its GPU and baselines, and the GPU's roofline ceilings are read or measured now rather than
    inside the first candidate's evaluation."""
    from core.evaluation.gpuinfo import gpu_key

    if getattr(pool, "task", None) is None or pool.task.hash != task.hash:
        raise RunSetupError(f"the evaluator given is not of task '{task.name}'")
    project.set_hardware(pool.gpu)
    # Stored with the record, so a replay of this project reports speedups over eager and compile.
    project.set_baselines(gpu_key(pool.gpu), pool.baselines())
    if hasattr(pool, "warm_ceilings"):      # a caller's stand-in may have none
        pool.warm_ceilings()
    return pool


def _pool(config: RunConfig, task: Any, project: Any, starting: Callable[[str], None] | None) -> tuple[Any, list[str]]:
    from core.project import ProjectError

    from .replay import ReplayPool

    if config.replay:
        try:
            pool = ReplayPool.from_files(config.replay)
        except ProjectError as exc:
            raise RunSetupError(f"replay error: {exc}") from None
        if project.hardware is None and pool.hardware is not None:
            project.set_hardware(pool.hardware)     # the GPU the record was measured on
        if pool.baselines_key and not project.baseline_keys():
            project.set_baselines(pool.baselines_key, pool.baselines())   # speedups in this project too
        names = ", ".join(str(p) for p in config.replay)
        return pool, [f"replaying {len(pool)} recorded verdicts from {names} (no GPU used)"]
    from core.evaluation import Evaluator
    from core.evaluation.evaluator import default_compile_workers
    from core.evaluation.probe import probe_gpus

    probe = probe_gpus()
    if not probe.can_run:
        raise RunSetupError(f"cannot measure here: {probe.reason}. Replay a recorded project instead "
                            "(--replay FILE, or Replay in the app's run settings).", EXIT_UNAVAILABLE)
    if starting:
        starting("starting the evaluator, measuring baselines and the GPU's ceilings...")
    ev = Evaluator(task, config.device,
                   compile_workers=config.compile_workers or default_compile_workers(config.compile_ahead))
    try:
        _adopt(ev.start(), task, project)
    except BaseException:
        ev.close()
        raise
    return ev, []
