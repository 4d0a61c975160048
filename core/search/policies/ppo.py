"""Masked PPO: a small actor-critic MLP, generalised advantage estimation, clipped objective.

propose() samples from softmax(logits) with masked actions at -inf and remembers the state,
mask, log-probability and value; observe() attaches the reward; update() runs a few epochs of
the clipped PPO loss over everything gathered since the last update, then forgets it (on-policy).
"""
from __future__ import annotations

import base64
import io
import random
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from .base import Policy, SearchState, Transition, allowed


@dataclass
class PPOConfig:
    hidden: int = 64
    lr: float = 3e-3
    gamma: float = 0.9
    lam: float = 0.95
    clip: float = 0.2
    epochs: int = 4
    minibatch: int = 64
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    max_grad_norm: float = 0.5
    min_batch: int = 16            # update() waits until this many transitions are gathered


class ActorCritic(nn.Module):
    def __init__(self, n_features: int, n_actions: int, hidden: int):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n_features, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.actor = nn.Linear(hidden, n_actions)
        self.critic = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.distributions.Categorical, torch.Tensor]:
        h = self.body(x)
        logits = self.actor(h).masked_fill(~mask, float("-inf"))
        return torch.distributions.Categorical(logits=logits), self.critic(h).squeeze(-1)


def gae(rewards: list[float], values: list[float], dones: list[bool], gamma: float, lam: float,
        last_value: float = 0.0) -> tuple[list[float], list[float]]:
    """Advantages and returns; a done step does not bootstrap from the next value."""
    adv = [0.0] * len(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        next_value = last_value if t == len(rewards) - 1 else values[t + 1]
        live = 0.0 if dones[t] else 1.0
        delta = rewards[t] + gamma * next_value * live - values[t]
        running = delta + gamma * lam * live * running
        adv[t] = running
    return adv, [a + v for a, v in zip(adv, values)]


class PPOPolicy(Policy):
    name = "ppo"

    def __init__(self, n_features: int, n_actions: int, seed: int = 0, config: PPOConfig | None = None):
        self.config = config or PPOConfig()
        self.n_features, self.n_actions = n_features, n_actions
        torch.manual_seed(seed)
        self.net = ActorCritic(n_features, n_actions, self.config.hidden)
        self.optim = torch.optim.Adam(self.net.parameters(), lr=self.config.lr)
        self.updates = 0
        self._pending: dict[str, Any] | None = None     # the proposal waiting for its reward
        self._buffer: list[dict[str, Any]] = []

    def _tensors(self, features: list[float], mask: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(features, dtype=torch.float32), torch.tensor(mask, dtype=torch.bool)

    def propose(self, state: SearchState, mask: list[bool], rng: random.Random) -> int:
        allowed(mask)
        x, m = self._tensors(state.features, mask)
        with torch.no_grad():
            dist, value = self.net(x, m)
            # Sample with the caller's rng so runs are reproducible independent of torch's global state.
            probs = dist.probs.tolist()
            action = rng.choices(range(self.n_actions), weights=probs)[0]
            if not mask[action]:          # zero-probability pick by float rounding: never allowed
                action = max(allowed(mask), key=lambda i: probs[i])
            logp = float(dist.log_prob(torch.tensor(action)))
        self._pending = {"x": x, "mask": m, "action": action, "logp": logp, "value": float(value)}
        return action

    def observe(self, transition: Transition) -> None:
        step = self._pending
        self._pending = None
        if step is None or step["action"] != transition.action:
            return     # not proposed by this policy (e.g. a forced start): nothing to learn from
        step.update(reward=float(transition.reward), done=bool(transition.done))
        self._buffer.append(step)

    def update(self) -> dict[str, float] | None:
        c = self.config
        if len(self._buffer) < c.min_batch:
            return None
        batch, self._buffer = self._buffer, []
        adv, ret = gae([b["reward"] for b in batch], [b["value"] for b in batch], [b["done"] for b in batch],
                       c.gamma, c.lam)
        x = torch.stack([b["x"] for b in batch])
        m = torch.stack([b["mask"] for b in batch])
        a = torch.tensor([b["action"] for b in batch])
        old_logp = torch.tensor([b["logp"] for b in batch])
        adv_t = torch.tensor(adv, dtype=torch.float32)
        if len(batch) > 1:
            adv_t = (adv_t - adv_t.mean()) / (adv_t.std() + 1e-8)
        ret_t = torch.tensor(ret, dtype=torch.float32)
        stats = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0}
        n = 0
        for _ in range(c.epochs):
            order = torch.randperm(len(batch))
            for start in range(0, len(batch), c.minibatch):
                idx = order[start:start + c.minibatch]
                dist, value = self.net(x[idx], m[idx])
                ratio = torch.exp(dist.log_prob(a[idx]) - old_logp[idx])
                clipped = torch.clamp(ratio, 1 - c.clip, 1 + c.clip)
                policy_loss = -torch.min(ratio * adv_t[idx], clipped * adv_t[idx]).mean()
                value_loss = (ret_t[idx] - value).pow(2).mean()
                entropy = _masked_entropy(dist, m[idx]).mean()
                loss = policy_loss + c.value_coef * value_loss - c.entropy_coef * entropy
                self.optim.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(self.net.parameters(), c.max_grad_norm)
                self.optim.step()
                stats["policy_loss"] += float(policy_loss.detach())
                stats["value_loss"] += float(value_loss.detach())
                stats["entropy"] += float(entropy.detach())
                n += 1
        self.updates += 1
        return {k: v / n for k, v in stats.items()} | {"transitions": float(len(batch))}

    def probabilities(self, features: list[float], mask: list[bool]) -> list[float]:
        with torch.no_grad():
            dist, _ = self.net(*self._tensors(features, mask))
        return dist.probs.tolist()

    def state_dict(self) -> dict[str, Any]:
        """JSON-able (weights as base64 of torch.save), so a checkpoint never needs pickle."""
        buf = io.BytesIO()
        torch.save({"net": self.net.state_dict(), "optim": self.optim.state_dict()}, buf)
        return {"config": asdict(self.config), "n_features": self.n_features, "n_actions": self.n_actions,
                "updates": self.updates, "weights": base64.b64encode(buf.getvalue()).decode("ascii")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("n_features") != self.n_features or state.get("n_actions") != self.n_actions:
            raise ValueError(f"checkpoint is for {state.get('n_features')} features and {state.get('n_actions')} "
                             f"actions; this policy has {self.n_features} and {self.n_actions}")
        weights = torch.load(io.BytesIO(base64.b64decode(state["weights"])), weights_only=True)
        self.net.load_state_dict(weights["net"])
        self.optim.load_state_dict(weights["optim"])
        self.updates = int(state.get("updates", 0))


def _masked_entropy(dist: torch.distributions.Categorical, mask: torch.Tensor) -> torch.Tensor:
    """Entropy that ignores masked actions (their 0 * -inf would be nan)."""
    p = dist.probs
    logp = torch.where(mask, torch.log(p.clamp_min(1e-12)), torch.zeros_like(p))
    return -(p * logp).sum(-1)
