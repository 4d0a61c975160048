"""Reward for one evaluated edit (DESIGN section 5; formula and constants in docs/search.md)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RewardConfig:
    failure: dict[str, float] = field(default_factory=lambda: {
        "compile_error": -1.0, "wrong": -1.0, "crashed": -1.0, "timeout": -1.0, "rejected": -0.5})
    failure_default: float = -1.0
    milestone_margin: float = 0.05    # "beats X by 5 %": t <= t_X / (1 + margin)
    beat_eager_bonus: float = 1.0
    beat_compile_bonus: float = 2.0
    shaping_clip: float = 2.0         # |log(t_prev/t_new)| is clipped to this
    # Training on a record only (`cuda-agent train --target-bonus`): the time that counts as "found"
    # (the record's best / 0.97) and what reaching it pays, once per episode. None/0 in a live run,
    # where the best time is not known.
    target_ms: float | None = None
    target_bonus: float = 0.0


@dataclass
class RewardTracker:
    """Per-episode state: the milestones reached (each pays once per episode)."""

    config: RewardConfig = field(default_factory=RewardConfig)
    beat_eager: bool = False
    beat_compile: bool = False
    beat_target: bool = False

    def start_from(self, median_ms: float | None, eager_ms: float | None, compile_ms: float | None) -> None:
        """The episode starts at a candidate of this time: milestones it already passed pay nothing
        (episodes after the first start from the best found, often past both)."""
        m = 1 + self.config.milestone_margin
        if median_ms is not None and median_ms > 0:
            self.beat_eager = self.beat_eager or bool(eager_ms and median_ms * m <= eager_ms)
            self.beat_compile = self.beat_compile or bool(compile_ms and median_ms * m <= compile_ms)
            self.beat_target = self.beat_target or bool(self.config.target_ms and median_ms <= self.config.target_ms)

    def reward(self, status: str, median_ms: float | None, prev_ms: float | None,
               eager_ms: float | None, compile_ms: float | None) -> float:
        c = self.config
        if status != "measured" or median_ms is None or median_ms <= 0:
            return c.failure.get(status, c.failure_default)
        r = 0.0
        if prev_ms is not None and prev_ms > 0:
            r += max(-c.shaping_clip, min(c.shaping_clip, math.log(prev_ms / median_ms)))
        if not self.beat_eager and eager_ms and median_ms * (1 + c.milestone_margin) <= eager_ms:
            self.beat_eager = True
            r += c.beat_eager_bonus
        if not self.beat_compile and compile_ms and median_ms * (1 + c.milestone_margin) <= compile_ms:
            self.beat_compile = True
            r += c.beat_compile_bonus
        if not self.beat_target and c.target_bonus and c.target_ms and median_ms <= c.target_ms:
            self.beat_target = True
            r += c.target_bonus
        return r
