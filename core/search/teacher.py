"""A teacher for training on whole-space records: the move a policy should make, known from the record.

A record that measured (nearly) every schedule of a task's space knows, at any point of a search,
which reachable schedule is fastest. `RecordTeacher.label(state, mask)` names the first action
toward it: the fastest recorded schedule that is new to the search and that the move in progress
can still reach, with its remaining edits, by editing knobs the mask still allows; or "evaluate
now" when the schedule composed so far is that one. `cuda-agent train --imitate W` adds the
cross-entropy of the PPO actor against these labels, weighted by W, to PPO's own loss (DAgger
style: the states are the ones the policy itself visits, so it learns to recover from its own
choices). The reward, the PPO update and everything at run time stay as they were: the teacher
only exists while training on records.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from .policies.base import SearchState


class RecordTeacher:
    def __init__(self, record: str | Path, space: Any, max_edits: int):
        from core.project import Project

        self.space = space
        self.max_edits = max_edits
        with Project.open(record, readonly=True) as project:
            measured = [(c.median_ms, dict(c.schedule)) for c in project.candidates(status="measured")
                        if c.median_ms is not None and c.schedule]
        # Fastest first, one entry per schedule: the first reachable one is the answer.
        seen: set[tuple] = set()
        self.ranked: list[dict[str, int]] = []
        for _, schedule in sorted(measured, key=lambda t: t[0]):
            key = space.key(schedule)
            if key not in seen:
                seen.add(key)
                self.ranked.append(schedule)
        self.index = {(a.knob, a.value): i for i, a in enumerate(space.actions)}
        self.is_new: Callable[[dict[str, int]], bool] = lambda schedule: True

    def label(self, state: SearchState, mask: list[bool]) -> int | None:
        """The action the record says is best here, or None when no recorded schedule is in reach."""
        current = state.schedule
        evaluate_now = len(self.space.actions)
        left = self.max_edits - state.edits          # edits this move may still make
        can_evaluate = len(mask) > evaluate_now and mask[evaluate_now]
        for target in self.ranked:
            differ = [k for k, v in target.items() if current.get(k) != v]
            if not differ:
                if can_evaluate:
                    return evaluate_now
                continue
            if len(differ) > left or not self.is_new(target):
                continue
            for knob in differ:
                i = self.index.get((knob, target[knob]))
                if i is not None and mask[i]:
                    return i
        return None
