"""Masked PPO over any schedule space: a small actor-critic, GAE, the clipped objective.

The actor scores each action from (state, action features) with shared weights
(core/search/features.py), so one network serves every task and program whatever its knobs:
this is what lets a policy trained on some tasks be shipped and fine-tuned on another.

propose() samples from the softmax of the scores with masked actions at -inf and remembers the
state, action features, mask, log-probability and value; observe() attaches the reward;
update() runs a few epochs of the clipped PPO loss over everything gathered since the last
update, then forgets it (on-policy).

Trained weights come with a memory (core/search/memory.py): the near-best schedules of the tasks
they were trained on. votes() turns it into per-action features for a new task, so what the
policy has seen informs its first moves there; the weights learned how far to trust it.
"""
from __future__ import annotations

import base64
import io
import json
import math
import random
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..memory import ScheduleMemory, descriptor
from .base import Policy, SearchState, Transition, allowed

FORMAT = "cuda-agent-ppo/5"       # checkpoints of other network layouts cannot load here


@dataclass
class PPOConfig:
    hidden: int = 64
    lr: float = 3e-3
    gamma: float = 0.5             # short horizon: an edit is judged by what it and the next few earn
                                   # (0.9 learned unstably on replays; docs/performance.md)
    lam: float = 0.95
    clip: float = 0.2
    epochs: int = 10               # a run gives few samples: more passes over each (tuned on replays, docs/search.md)
    minibatch: int = 16
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    max_grad_norm: float = 0.5
    min_batch: int = 16            # update() waits until this many transitions are gathered
    max_edits: int = 3             # edits of different knobs one move may hold before it is evaluated
    temperature: float = 1.0       # the actor's scores are divided by this (below 1: sharper choices), when
                                   # choosing and in the updates alike, so the run stays on-policy


class ActorCritic(nn.Module):
    """Each action is embedded from its features; the mean embedding over the space's actions
    (they carry the current value of every knob) joins the state, so the critic and the scorer
    see the whole current schedule whatever its knobs. score(action) = MLP([h, embedding]);
    value = linear(h)."""

    def __init__(self, state_size: int, action_size: int, hidden: int):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(action_size, hidden), nn.Tanh())
        self.body = nn.Sequential(nn.Linear(state_size + hidden, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                                  nn.Tanh())
        self.scorer = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.critic = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor,
                present: torch.Tensor | None = None, temperature: float = 1.0
                ) -> tuple[torch.distributions.Categorical, torch.Tensor]:
        """x [B, S], actions [B, N, A], mask [B, N] (True = allowed), present [B, N] (False = padding)."""
        e = self.embed(actions)
        weight = (present if present is not None else torch.ones_like(mask)).unsqueeze(-1).float()
        context = (e * weight).sum(1) / weight.sum(1).clamp_min(1.0)
        h = self.body(torch.cat([x, context], dim=-1))
        pairs = torch.cat([h.unsqueeze(1).expand(-1, actions.shape[1], -1), e], dim=-1)
        logits = (self.scorer(pairs).squeeze(-1) / temperature).masked_fill(~mask, float("-inf"))
        return torch.distributions.Categorical(logits=logits), self.critic(h).squeeze(-1)


def gumbel_max(probs: list[float], mask: list[bool], rng: random.Random) -> int:
    """A draw from `probs` over the allowed actions: argmax of log p + Gumbel noise, one uniform per
    action from the caller's rng (runs reproduce independent of torch's global state). Unlike one
    uniform through the cumulative sum, the same noise picks the same action when the probabilities
    move a little, so compile-ahead's previews, made before the time being measured is known, agree
    more often with the draw the loop makes once it is."""
    best, best_score = None, -math.inf
    for i, (p, ok) in enumerate(zip(probs, mask)):
        u = rng.random()                    # drawn for every action, so the rng advances the same way
        if ok and p > 0.0:
            score = math.log(p) - math.log(-math.log(max(u, 1e-300)))
            if score > best_score:
                best, best_score = i, score
    # Every allowed probability rounded to zero: the likeliest allowed action, never a masked one.
    return best if best is not None else max(allowed(mask), key=lambda i: probs[i])


def gae(rewards: list[float], values: list[float], dones: list[bool], gamma: float, lam: float,
        last_value: float = 0.0, timed: list[bool] | None = None) -> tuple[list[float], list[float]]:
    """Advantages and returns; a done step does not bootstrap from the next value. A step that is
    not `timed` (an edit of a move not evaluated yet: no evaluation was spent) passes the next
    step's value and advantage back undiscounted, so a move's edits share what the move earns."""
    adv = [0.0] * len(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        next_value = last_value if t == len(rewards) - 1 else values[t + 1]
        live = 0.0 if dones[t] else 1.0
        g, l = (gamma, lam) if timed is None or timed[t] else (1.0, 1.0)
        delta = rewards[t] + g * next_value * live - values[t]
        running = delta + g * l * live * running
        adv[t] = running
    return adv, [a + v for a, v in zip(adv, values)]


class PPOPolicy(Policy):
    name = "ppo"

    def __init__(self, state_size: int, action_size: int, seed: int = 0, config: PPOConfig | None = None):
        self.config = config or PPOConfig()
        self.max_edits = self.config.max_edits
        # The networks are tiny: more threads only contend with the compile workers and evaluator
        # processes beside the loop (on the H200's 16-core host, 72 ms of loop time per step with
        # torch's default threads, 8 ms with one; docs/performance.md). This is process-wide.
        torch.set_num_threads(1)
        self.state_size, self.action_size = state_size, action_size
        torch.manual_seed(seed)
        self.net = ActorCritic(state_size, action_size, self.config.hidden)
        # The updates' minibatch order has its own generator: whatever else draws from torch's global
        # one between updates (the code generator, input makers) must not change what is learned.
        self._shuffle = torch.Generator().manual_seed(seed)
        self.optim = torch.optim.Adam(self.net.parameters(), lr=self.config.lr)
        self.updates = 0
        self.meta: dict[str, Any] = {}                   # how the weights were trained (cuda-agent train)
        self.memory = ScheduleMemory()                   # near-best schedules of the tasks seen in training
        self.memory_exclude: set[str] = set()            # training: the visited task must not vote for itself
        self.recall = ScheduleMemory()                   # the user's remembered runs (session.py); never saved
        self._pending: dict[str, Any] | None = None     # the proposal waiting for its reward
        self._buffer: list[dict[str, Any]] = []

    def _tensors(self, state: SearchState, mask: list[bool]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if state.actions is None or len(state.actions) != len(mask):
            raise ValueError(f"PPO needs one feature vector per action: the state has "
                             f"{0 if state.actions is None else len(state.actions)} for {len(mask)} actions")
        return (torch.tensor(state.features, dtype=torch.float32),
                torch.tensor(state.actions, dtype=torch.float32).reshape(len(mask), self.action_size),
                torch.tensor(mask, dtype=torch.bool))

    def votes(self, task: Any, space: Any) -> dict[tuple[str, int], float] | None:
        memory = self.memory.merged(self.recall) if len(self.recall) else self.memory
        if not len(memory) or task is None:
            return None
        knobs = {k.name: k.values for k in space.knobs}
        return memory.votes(descriptor(task, space), knobs, exclude=self.memory_exclude) or None

    def propose(self, state: SearchState, mask: list[bool], rng: random.Random) -> int:
        self._pending = self._choose(state, mask, rng)
        return self._pending["action"]

    def preview(self, state: SearchState, mask: list[bool], rng: random.Random) -> int:
        return self._choose(state, mask, rng)["action"]

    def _choose(self, state: SearchState, mask: list[bool], rng: random.Random) -> dict[str, Any]:
        allowed(mask)
        x, acts, m = self._tensors(state, mask)
        with torch.no_grad():
            dist, value = self.net(x[None], acts[None], m[None], temperature=self.config.temperature)
            probs = dist.probs[0].tolist()
            action = gumbel_max(probs, mask, rng)
            logp = float(dist.log_prob(torch.tensor([action]))[0])
        return {"x": x, "acts": acts, "mask": m, "action": action, "logp": logp, "value": float(value[0])}

    def observe(self, transition: Transition) -> None:
        step = self._pending
        self._pending = None
        if step is None or step["action"] != transition.action:
            return     # not proposed by this policy (e.g. a forced start): nothing to learn from
        step.update(reward=float(transition.reward), done=bool(transition.done), timed=transition.evaluated)
        self._buffer.append(step)

    def end_episode(self) -> None:
        if self._buffer:
            self._buffer[-1]["done"] = True     # GAE must not run on into the next episode's steps

    def update(self) -> dict[str, float] | None:
        c = self.config
        if len(self._buffer) < c.min_batch:
            return None
        batch, self._buffer = self._buffer, []
        adv, ret = gae([b["reward"] for b in batch], [b["value"] for b in batch], [b["done"] for b in batch],
                       c.gamma, c.lam, timed=[b.get("timed", True) for b in batch])
        # Spaces differ in size: pad every step's actions to the largest, padding masked.
        width = max(len(b["mask"]) for b in batch)
        x = torch.stack([b["x"] for b in batch])
        acts = torch.zeros(len(batch), width, self.action_size)
        m = torch.zeros(len(batch), width, dtype=torch.bool)
        present = torch.zeros(len(batch), width, dtype=torch.bool)
        for i, b in enumerate(batch):
            acts[i, :len(b["mask"])] = b["acts"]
            m[i, :len(b["mask"])] = b["mask"]
            present[i, :len(b["mask"])] = True
        a = torch.tensor([b["action"] for b in batch])
        old_logp = torch.tensor([b["logp"] for b in batch])
        adv_t = torch.tensor(adv, dtype=torch.float32)
        if len(batch) > 1:
            adv_t = (adv_t - adv_t.mean()) / (adv_t.std() + 1e-8)
        ret_t = torch.tensor(ret, dtype=torch.float32)
        stats = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0}
        n = 0
        for _ in range(c.epochs):
            order = torch.randperm(len(batch), generator=self._shuffle)
            for start in range(0, len(batch), c.minibatch):
                idx = order[start:start + c.minibatch]
                dist, value = self.net(x[idx], acts[idx], m[idx], present[idx], self.config.temperature)
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

    def probabilities(self, state: SearchState, mask: list[bool]) -> list[float]:
        x, acts, m = self._tensors(state, mask)
        with torch.no_grad():
            dist, _ = self.net(x[None], acts[None], m[None], temperature=self.config.temperature)
        return dist.probs[0].tolist()

    def state_dict(self) -> dict[str, Any]:
        """JSON-able (weights as base64 of torch.save), so a checkpoint never needs pickle."""
        buf = io.BytesIO()
        torch.save({"net": self.net.state_dict(), "optim": self.optim.state_dict()}, buf)
        return {"format": FORMAT, "config": asdict(self.config), "state_size": self.state_size,
                "action_size": self.action_size, "updates": self.updates, "meta": self.meta,
                "memory": self.memory.to_json(), "weights": base64.b64encode(buf.getvalue()).decode("ascii")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} checkpoint (format {state.get('format')!r})")
        if state.get("state_size") != self.state_size or state.get("action_size") != self.action_size:
            raise ValueError(f"checkpoint is for {state.get('state_size')} state and {state.get('action_size')} "
                             f"action features; this policy has {self.state_size} and {self.action_size}")
        hidden = (state.get("config") or {}).get("hidden", self.config.hidden)
        if hidden != self.config.hidden:     # the network's width comes with the weights
            self.config.hidden = hidden
            self.net = ActorCritic(self.state_size, self.action_size, hidden)
            self.optim = torch.optim.Adam(self.net.parameters(), lr=self.config.lr)
        weights = torch.load(io.BytesIO(base64.b64decode(state["weights"])), weights_only=True)
        self.net.load_state_dict(weights["net"])
        self.optim.load_state_dict(weights["optim"])
        for group in self.optim.param_groups:     # this run's learning rate, not the trainer's
            group["lr"] = self.config.lr
        self.updates = int(state.get("updates", 0))
        self.meta = dict(state.get("meta") or {})
        self.memory = ScheduleMemory.from_json(state["memory"]) if state.get("memory") else ScheduleMemory()

    @property
    def trained_on(self) -> list[str]:
        """The tasks whose records the weights were trained on (empty for fresh weights)."""
        return list(self.meta.get("trained_on") or [])

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.state_dict()))


def load_weights(path: str | Path, seed: int = 0, config: PPOConfig | None = None) -> PPOPolicy:
    """A PPOPolicy with the weights of a file written by PPOPolicy.save (e.g. by `cuda-agent train`)."""
    state = json.loads(Path(path).read_text())
    known = {f.name for f in fields(PPOConfig)}
    config = config or PPOConfig(**{k: v for k, v in (state.get("config") or {}).items() if k in known})
    policy = PPOPolicy(int(state.get("state_size", 0)), int(state.get("action_size", 0)), seed=seed, config=config)
    policy.load_state_dict(state)
    return policy


def _masked_entropy(dist: torch.distributions.Categorical, mask: torch.Tensor) -> torch.Tensor:
    """Entropy that ignores masked actions (their 0 * -inf would be nan)."""
    p = dist.probs
    logp = torch.where(mask, torch.log(p.clamp_min(1e-12)), torch.zeros_like(p))
    return -(p * logp).sum(-1)
