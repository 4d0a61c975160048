"""The Policy interface: pick an action index among the unmasked ones, learn from transitions."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The PPO weights shipped with the product (trained by `cuda-agent train`; docs/search.md says on what).
PRETRAINED_PPO = Path(__file__).resolve().parents[3] / "resources" / "policies" / "ppo.json"
POLICY_NAMES = ("ppo", "ppo-untrained", "random", "evolution")


@dataclass
class SearchState:
    """What a policy sees before choosing an edit."""

    schedule: dict[str, int]
    features: list[float]
    step: int = 0                      # edit index within the episode
    last_status: str | None = None
    last_ms: float | None = None
    actions: list[list[float]] | None = None   # one feature vector per entry of space.actions


@dataclass
class Transition:
    """One chosen action: an evaluated edit, or one part of a move that is not evaluated yet."""

    state: SearchState
    action: int
    reward: float
    next_state: SearchState
    done: bool                         # the episode ended with this edit
    info: dict[str, Any] = field(default_factory=dict)
    evaluated: bool = True             # False: an edit of a move still being composed (no time passed, reward 0)


class Policy:
    name = "policy"
    # Edits one move may hold before it is evaluated. 1: every edit is evaluated. More: the mask
    # gets one more entry, "evaluate now" (index len(space.actions)), and the policy composes up
    # to this many edits of different knobs before the move is measured (docs/search.md, "Moves").
    max_edits = 1

    def propose(self, state: SearchState, mask: list[bool], rng: random.Random) -> int:
        """An action index i with mask[i] True. Callers guarantee at least one is True."""
        raise NotImplementedError

    def preview(self, state: SearchState, mask: list[bool], rng: random.Random) -> int:
        """What propose would choose with this rng, remembering nothing: the loop compiles the likely
        next candidate while the GPU measures the current one. Policies whose propose has side effects
        override this."""
        return self.propose(state, mask, rng)

    def votes(self, task: Any, space: Any) -> dict[tuple[str, int], float] | None:
        """What the policy remembers of similar workloads, per (knob, value) of this task's space
        (core/search/memory.py); None for a policy with no memory. The loop asks once per run, passes
        the votes in every edit's features and, when there are any, offers the "jump" action to the
        schedule they rank highest (docs/search.md, "Memory")."""
        return None

    def observe(self, transition: Transition) -> None:
        pass

    def end_episode(self) -> None:
        """The episode ended, whatever the reason (its last edit, a budget, nothing left to propose):
        what was observed since must not be credited with what the next episode earns."""

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


def make_policy(name: str, space: Any = None, n_features: int | None = None, seed: int = 0,
                weights: str | Path | None = None, **kwargs: Any) -> Policy:
    """A policy by name for a ScheduleSpace: "random", "evolution", "ppo" (the shipped pretrained
    weights, or `weights`, when there are any) or "ppo-untrained" (fresh weights)."""
    if name == "random":
        from .random import RandomPolicy
        return RandomPolicy()
    if name == "evolution":
        from .evolution import EvolutionPolicy
        return EvolutionPolicy(actions=space.actions if space is not None else None, **kwargs)
    if name in ("ppo", "ppo-untrained"):
        from ..features import ACTION_SIZE, STATE_SIZE
        from .ppo import PPOPolicy, load_weights

        path = Path(weights) if weights is not None else PRETRAINED_PPO if name == "ppo" else None
        if path is not None and path.is_file():
            policy = load_weights(path, seed=seed, config=kwargs.get("config"))
        elif weights is not None:
            raise FileNotFoundError(f"policy weights '{weights}' do not exist")
        else:
            policy = PPOPolicy(STATE_SIZE, ACTION_SIZE, seed=seed, **kwargs)
        policy.name = "ppo"        # one checkpoint line in a project, whichever weights it started from
        return policy
    raise ValueError(f"unknown policy '{name}'; choose one of {', '.join(POLICY_NAMES)}")
