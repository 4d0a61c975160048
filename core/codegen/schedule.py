"""Schedule spaces of generated programs: knobs, a default, and constraints the search can plug in.

A constraint is `(schedule) -> None | reason`, the signature of core.search.space.Constraint.
`ScheduleSpec.constraints` goes straight into `ScheduleSpace.from_program(program, task,
constraints=spec.constraints)`; the spec can also enumerate, sample and check on its own.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Iterator, Mapping

from core.search.space import Constraint, Knob, Schedule, first_violation


@dataclass
class ScheduleSpec:
    knobs: list[Knob]
    constraints: list[Constraint] = field(default_factory=list)
    defaults: dict[str, int] = field(default_factory=dict)   # the program's default, where not the first value

    def tunables(self) -> dict[str, list[int]]:
        return {k.name: list(k.values) for k in self.knobs}

    def default(self) -> Schedule:
        return {k.name: self.defaults.get(k.name, k.values[0]) for k in self.knobs}

    def why_illegal(self, schedule: Mapping[str, int]) -> str | None:
        return first_violation(self.knobs, self.constraints, schedule)

    def legal(self, schedule: Mapping[str, int]) -> bool:
        return self.why_illegal(schedule) is None

    def all_schedules(self) -> Iterator[Schedule]:
        names = [k.name for k in self.knobs]
        for values in itertools.product(*(k.values for k in self.knobs)):
            yield dict(zip(names, values))

    def enumerate(self) -> list[Schedule]:
        """Every legal schedule (the pointwise space has at most a few hundred)."""
        return [s for s in self.all_schedules() if self.legal(s)]

    def sample(self, rng: random.Random, count: int) -> list[Schedule]:
        """Up to `count` distinct legal schedules drawn uniformly."""
        legal = self.enumerate()
        return rng.sample(legal, min(count, len(legal)))
