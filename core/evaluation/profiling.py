"""Opt-in cProfile of the evaluator's own processes, for finding where an evaluation's time goes.

Set CUDA_AGENT_PROFILE=DIR and every runner and judge process writes DIR/<role>-<pid>.prof
(pstats format; every 20 requests and whenever the process is about to exit). The GPU work shows
up inside the calls that synchronize, so cumulative times are wall times of each phase.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "CUDA_AGENT_PROFILE"


class RequestProfiler:
    """Profiles the handling of each request; a no-op unless CUDA_AGENT_PROFILE is set."""

    def __init__(self, role: str, every: int = 20):
        folder = os.environ.get(ENV)
        self.path = Path(folder) / f"{role}-{os.getpid()}.prof" if folder else None
        self.every = every
        self.count = 0
        self.profile = None
        if self.path is not None:
            import cProfile

            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.profile = cProfile.Profile()

    def __enter__(self) -> "RequestProfiler":
        if self.profile is not None:
            self.profile.enable()
        return self

    def __exit__(self, *exc) -> None:
        if self.profile is None:
            return
        self.profile.disable()
        self.count += 1
        if self.count % self.every == 0:
            self.dump()

    def dump(self) -> None:
        if self.profile is not None:
            self.profile.dump_stats(str(self.path))
