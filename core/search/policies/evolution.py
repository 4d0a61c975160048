"""A small evolutionary baseline expressed through single-knob edits.

Keeps a population of the best schedules seen (fitness = -median time; failures never enter).
Each proposal picks a target by tournament and moves one knob of the current schedule toward
it; with probability `mutation`, or when already at the target, it makes a random edit.
"""
from __future__ import annotations

import random
from typing import Any

from .base import Policy, SearchState, Transition, allowed


class EvolutionPolicy(Policy):
    name = "evolution"

    def __init__(self, population: int = 8, tournament: int = 3, mutation: float = 0.3,
                 actions: list[Any] | None = None):
        self.population_size = population
        self.tournament = tournament
        self.mutation = mutation
        self.actions = actions             # space.actions, for moving toward a target schedule
        self.population: list[tuple[float, dict[str, int]]] = []

    def propose(self, state: SearchState, mask: list[bool], rng: random.Random) -> int:
        choices = allowed(mask)
        if self.population and self.actions is not None and rng.random() >= self.mutation:
            contestants = rng.sample(self.population, min(self.tournament, len(self.population)))
            _, target = max(contestants, key=lambda p: p[0])
            toward = [i for i in choices
                      if target.get(self.actions[i].knob) == self.actions[i].value
                      and state.schedule.get(self.actions[i].knob) != self.actions[i].value]
            if toward:
                return rng.choice(toward)
        return rng.choice(choices)

    def observe(self, transition: Transition) -> None:
        nxt = transition.next_state
        if nxt.last_status != "measured" or nxt.last_ms is None:
            return
        if any(s == nxt.schedule for _, s in self.population):
            return
        self.population.append((-nxt.last_ms, dict(nxt.schedule)))
        self.population.sort(key=lambda p: -p[0])
        del self.population[self.population_size:]

    def state_dict(self) -> dict[str, Any]:
        return {"population": [[f, s] for f, s in self.population]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.population = [(float(f), dict(s)) for f, s in state.get("population", [])]
