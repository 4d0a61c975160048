"""Policies behind one interface (base.Policy): random, evolutionary, masked PPO."""
from .base import POLICY_NAMES, PRETRAINED_PPO, Policy, SearchState, Transition, make_policy

__all__ = ["POLICY_NAMES", "PRETRAINED_PPO", "Policy", "SearchState", "Transition", "make_policy"]
