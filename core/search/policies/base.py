"""The Policy interface: pick an action index among the unmasked ones, learn from transitions."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SearchState:
    """What a policy sees before choosing an edit."""

    schedule: dict[str, int]
    features: list[float]
    step: int = 0                      # edit index within the episode
    last_status: str | None = None
    last_ms: float | None = None


@dataclass
class Transition:
    """One evaluated edit."""

    state: SearchState
    action: int
    reward: float
    next_state: SearchState
    done: bool                         # the episode ended with this edit
    info: dict[str, Any] = field(default_factory=dict)


class Policy:
    name = "policy"

    def propose(self, state: SearchState, mask: list[bool], rng: random.Random) -> int:
        """An action index i with mask[i] True. Callers guarantee at least one is True."""
        raise NotImplementedError

    def observe(self, transition: Transition) -> None:
        pass

    def update(self) -> dict[str, float] | None:
        """Learn from what was observed; metrics when it learned, None when it did not."""
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def allowed(mask: list[bool]) -> list[int]:
    indices = [i for i, ok in enumerate(mask) if ok]
    if not indices:
        raise ValueError("every action is masked; nothing can be proposed")
    return indices


def make_policy(name: str, space: Any, n_features: int, seed: int = 0, **kwargs: Any) -> Policy:
    """A policy by name ("random", "evolution" or "ppo") for a ScheduleSpace and feature size."""
    if name == "random":
        from .random import RandomPolicy
        return RandomPolicy()
    if name == "evolution":
        from .evolution import EvolutionPolicy
        return EvolutionPolicy(actions=space.actions, **kwargs)
    if name == "ppo":
        from .ppo import PPOPolicy
        return PPOPolicy(n_features, len(space.actions), seed=seed, **kwargs)
    raise ValueError(f"unknown policy '{name}'; choose random, evolution or ppo")
