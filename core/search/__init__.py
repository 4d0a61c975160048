"""Search over kernel schedules: action space, reward, replay pool, policies and the optimiser loop.

See docs/search.md.
"""
from .events import (CandidateEvaluated, CandidateProposed, Event, Finished, Forked, NewBest, Paused,
                     PolicyUpdated, Resumed, RunError, RunStarted)
from .replay import ReplayPool
from .reward import RewardConfig, RewardTracker
from .space import Action, Knob, ScheduleSpace, env_from_task

__all__ = ["Action", "CandidateEvaluated", "CandidateProposed", "Event", "Finished", "Forked", "Knob", "NewBest",
           "Paused", "PolicyUpdated", "ReplayPool", "Resumed", "RewardConfig", "RewardTracker", "RunError",
           "RunStarted", "ScheduleSpace", "env_from_task"]
