"""Policies behind one interface (base.Policy): random, evolutionary, masked PPO."""
from .base import Policy, SearchState, Transition, make_policy

__all__ = ["Policy", "SearchState", "Transition", "make_policy"]
