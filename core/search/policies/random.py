"""Uniform choice among unmasked actions: the baseline every learner must beat."""
from __future__ import annotations

import random

from .base import Policy, SearchState, allowed


class RandomPolicy(Policy):
    name = "random"

    def propose(self, state: SearchState, mask: list[bool], rng: random.Random) -> int:
        return rng.choice(allowed(mask))
