"""The action space: knobs of a program's schedule, single-knob edits, legality and masks."""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

Schedule = dict[str, int]
# A constraint returns None when the schedule is fine, or a reason why it is not.
Constraint = Callable[[Mapping[str, int]], "str | None"]


@dataclass(frozen=True)
class Knob:
    """One tunable and the values it may take (in declared order; the first is the default)."""

    name: str
    values: tuple[int, ...]
    doc: str = ""


def first_violation(knobs: list[Knob], constraints: list[Constraint], schedule: Mapping[str, int]) -> str | None:
    """Why `schedule` is illegal by its knobs' value lists and the constraints, or None."""
    for knob in knobs:
        if schedule.get(knob.name) not in knob.values:
            return f"{knob.name}={schedule.get(knob.name)} is not one of {list(knob.values)}"
    for constraint in constraints:
        reason = constraint(schedule)
        if reason:
            return reason
    return None


@dataclass(frozen=True)
class Action:
    """Set one knob to one value."""

    knob: str
    value: int

    def label(self) -> str:
        return f"set {self.knob}={self.value}"


def env_from_task(task: Any) -> dict[str, Any]:
    """Expression names for program.resolve from a task's specs (as BoundProgram does on the GPU)."""
    from core.program import TensorInfo

    env: dict[str, Any] = {}
    for name, spec, value in zip(task.input_names, task.input_specs, _scalar_inputs(task)):
        env[name] = TensorInfo(tuple(spec.shape), spec.dtype) if spec is not None else value
    for name, spec in task.param_specs.items():
        env[name] = TensorInfo(tuple(spec.shape), spec.dtype)
    return env


def _scalar_inputs(task: Any) -> list[Any]:
    """Python scalar inputs need their values; tensors do not (None placeholders)."""
    if all(spec is not None for spec in task.input_specs):
        return [None] * len(task.input_specs)
    inputs = task.make_inputs(seed=0, device="cpu")
    return [None if spec is not None else value for spec, value in zip(task.input_specs, inputs)]


class ScheduleSpace:
    """Knobs, the flat action list over them, and legality of schedules (cached per schedule)."""

    def __init__(self, knobs: list[Knob], constraints: list[Constraint] | None = None,
                 program: Any = None, env: Mapping[str, Any] | None = None, limits: Any = None):
        self.knobs = list(knobs)
        self.constraints = list(constraints or [])
        self.program = program
        self.env = dict(env) if env is not None else None
        self.limits = limits
        self.actions: list[Action] = [Action(k.name, v) for k in self.knobs for v in k.values]
        self._legal: dict[tuple, str | None] = {}
        self._masks: dict[tuple, tuple[bool, ...]] = {}

    @classmethod
    def from_program(cls, program: Any, task: Any = None, constraints: list[Constraint] | None = None,
                     limits: Any = None) -> "ScheduleSpace":
        """Knobs from program.tunables; with a task, a schedule is legal only if the plan resolves."""
        knobs = [Knob(name, tuple(int(v) for v in values)) for name, values in sorted(program.tunables.items())]
        env = env_from_task(task) if task is not None else None
        return cls(knobs, constraints, program, env, limits)

    @staticmethod
    def key(schedule: Mapping[str, int]) -> tuple:
        return tuple(sorted((k, int(v)) for k, v in schedule.items()))

    def default(self) -> Schedule:
        if self.program is not None:
            return {k.name: int(self.program.schedule.get(k.name, k.values[0])) for k in self.knobs}
        return {k.name: k.values[0] for k in self.knobs}

    def why_illegal(self, schedule: Mapping[str, int]) -> str | None:
        """None when legal, else the first reason found."""
        key = self.key(schedule)
        if key not in self._legal:
            self._legal[key] = self._check(schedule)
        return self._legal[key]

    def legal(self, schedule: Mapping[str, int]) -> bool:
        return self.why_illegal(schedule) is None

    def _check(self, schedule: Mapping[str, int]) -> str | None:
        reason = first_violation(self.knobs, self.constraints, schedule)
        if reason:
            return reason
        if self.program is not None and self.env is not None:
            from core.program import LaunchLimits, ProgramError

            try:
                self.program.with_schedule(dict(schedule)).resolve(self.env, self.limits or LaunchLimits())
            except ProgramError as exc:
                return str(exc)
        return None

    def apply(self, schedule: Mapping[str, int], action_index: int) -> Schedule:
        action = self.actions[action_index]
        return {**schedule, action.knob: action.value}

    def mask(self, schedule: Mapping[str, int]) -> list[bool]:
        """True = allowed. An action is masked when it changes nothing or leads to an illegal schedule."""
        key = self.key(schedule)
        if key not in self._masks:     # the search asks again for every schedule near the ones it knows
            self._masks[key] = tuple(schedule.get(a.knob) != a.value and self.legal({**schedule, a.knob: a.value})
                                     for a in self.actions)
        return list(self._masks[key])

    def enumerate(self, cap: int = 10_000) -> Iterator[Schedule]:
        """Legal schedules in knob order, at most `cap` of them."""
        names = [k.name for k in self.knobs]
        product = itertools.product(*(k.values for k in self.knobs))
        legal = (s for s in (dict(zip(names, values)) for values in product) if self.legal(s))
        return itertools.islice(legal, cap)

    def sample(self, rng: random.Random, tries: int = 1000) -> Schedule:
        """A uniformly drawn legal schedule (rejection sampling); the default if none is found."""
        for _ in range(tries):
            s = {k.name: rng.choice(k.values) for k in self.knobs}
            if self.legal(s):
                return s
        return self.default()
