"""Features for learned policies, the same size for every task, program and schedule space.

A policy trained on some tasks must run on a task it has never seen, whose program has other
knobs. So nothing here is indexed by a knob's position or by a task's name:

- the **state** vector describes the task (sizes and dtypes of its tensors), the program (how
  many kernels; a bag of its knob-name tokens, hashed), the GPU, how far the current schedule
  is from the default, the step in the episode, and the last measurement;
- each **action** (set one knob to one value) gets its own vector: its knob's name tokens
  (hashed), which fusion group the knob belongs to, the new and the current value (log2 and
  position in the knob's list), the direction and size of the move, whether it returns to the
  default. A policy scores every action from (state, action) with the same weights, so the
  number of actions may differ from task to task.
- a policy with a memory of the workloads it has seen (core/search/memory.py) adds, to each
  edit, how strongly similar tasks' near-best schedules vote for the new and the current value,
  and it has one more action, **jump** (jump_vector), to the schedule the memory ranks highest;
- a policy that composes several edits into one move (docs/search.md, "Moves") also scores
  **evaluate now**, whose vector is all zeros but its own flag; the state then says how many
  edits the move holds so far.
"""
from __future__ import annotations

import math
import re
import zlib
from typing import Any, Mapping

from .space import Knob, ScheduleSpace

DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "other")
FAILURES = ("measured", "compile_error", "wrong", "crashed", "timeout", "rejected", "none")
TOKEN_BUCKETS = 16           # knob-name tokens hashed into this many slots
_GROUP = re.compile(r"^G(\d+)_(.+)$")


def _one_hot(value: str, names: tuple[str, ...]) -> list[float]:
    value = value if value in names else names[-1]
    return [1.0 if n == value else 0.0 for n in names]


def _log2(x: float) -> float:
    return math.log2(max(float(x), 1.0))


def knob_parts(name: str) -> tuple[int | None, str]:
    """(fusion group index or None, the knob's own name): "G1_BLOCK" -> (1, "BLOCK")."""
    m = _GROUP.match(name)
    return (int(m.group(1)), m.group(2)) if m else (None, name)


def _tokens(name: str) -> list[float]:
    """The knob's own name split at "_", each token hashed into TOKEN_BUCKETS (stable across runs)."""
    out = [0.0] * TOKEN_BUCKETS
    for token in knob_parts(name)[1].lower().split("_"):
        if token:
            out[zlib.crc32(token.encode()) % TOKEN_BUCKETS] = 1.0
    return out


# ---- the state ------------------------------------------------------------------------------------

def task_features(task: Any) -> list[float]:
    """Sizes of what the task reads and writes (log2), its largest input's rank and dtype."""
    inputs = [s for s in getattr(task, "input_specs", []) if s is not None]
    params = list(getattr(task, "param_specs", {}).values())
    outputs = list(getattr(task, "output_specs", []))
    largest = max(inputs, key=lambda s: s.numel, default=None)

    def nbytes(specs: list[Any]) -> float:
        return float(sum(s.numel * s.itemsize for s in specs))

    return ([_log2(nbytes(inputs)) / 32.0, _log2(nbytes(params)) / 32.0, _log2(nbytes(outputs)) / 32.0,
             _log2(largest.numel if largest else 1) / 32.0,
             _log2(largest.shape[-1] if largest is not None and largest.shape else 1) / 20.0,
             (len(largest.shape) if largest is not None else 0) / 8.0, len(inputs) / 4.0, len(outputs) / 4.0]
            + _one_hot(largest.dtype if largest is not None else "other", DTYPES))


def program_features(space: ScheduleSpace) -> list[float]:
    """Kernels per launch plan, knobs, groups, and which knob names it has (a bag of hashed tokens)."""
    groups = {knob_parts(k.name)[0] for k in space.knobs}
    launches = len(getattr(space.program, "launches", []) or [])
    bag = [0.0] * TOKEN_BUCKETS
    for knob in space.knobs:
        bag = [max(a, b) for a, b in zip(bag, _tokens(knob.name))]
    return [launches / 4.0, len(space.knobs) / 16.0, len(groups) / 4.0] + bag


def gpu_features(gpu: Mapping[str, Any] | None) -> list[float]:
    """SM count, memory bandwidth and shared memory per block, scaled to about 1 on an H200."""
    gpu = gpu or {}
    return [float(gpu.get("sms", 132)) / 132.0, float(gpu.get("bandwidth_gbs", 4800.0)) / 4800.0,
            float(gpu.get("shared_per_block_optin", 227 * 1024)) / (227 * 1024)]


def schedule_summary(space: ScheduleSpace, schedule: Mapping[str, int]) -> list[float]:
    """Fraction of knobs away from the default, and the mean position of the values in their lists."""
    if not space.knobs:
        return [0.0, 0.0]
    default = space.default()
    moved = sum(schedule.get(k.name) != default.get(k.name) for k in space.knobs)
    return [moved / len(space.knobs), sum(_position(k, schedule.get(k.name)) for k in space.knobs) / len(space.knobs)]


def measurement_features(status: str | None, measurement: Mapping[str, Any] | None,
                         eager_ms: float | None) -> list[float]:
    """log(eager/time), roofline fraction, occupancy, registers/255, spills>0, failure kind one-hot."""
    m = measurement or {}
    median = (m.get("timing") or {}).get("median_ms")
    ratio = math.log(eager_ms / median) if median and eager_ms else 0.0
    kernels = m.get("kernels") or []
    occupancy = max((k.get("occupancy") or 0.0 for k in kernels), default=0.0)
    registers = max((k.get("registers") or 0 for k in kernels), default=0) / 255.0
    spills = 1.0 if any((k.get("spill_stores") or 0) + (k.get("spill_loads") or 0) for k in kernels) else 0.0
    return ([ratio, float(m.get("roofline_fraction") or 0.0), float(occupancy), registers, spills]
            + _one_hot(status or "none", FAILURES))


def state_vector(space: ScheduleSpace, task: Any, gpu: Mapping[str, Any] | None, schedule: Mapping[str, int],
                 status: str | None, measurement: Mapping[str, Any] | None, eager_ms: float | None,
                 step: int = 0, episode_length: int = 8, edits: int = 0) -> list[float]:
    """`schedule` is the move's schedule so far; the measurement is of where the move started, and
    `edits` is how many edits the move holds (0 until a policy composes several)."""
    return (task_features(task) + program_features(space) + gpu_features(gpu) + schedule_summary(space, schedule)
            + [step / max(episode_length, 1), edits / 4.0] + measurement_features(status, measurement, eager_ms))


def feature_size(space: ScheduleSpace | None = None, task: Any = None, gpu: Mapping[str, Any] | None = None) -> int:
    """The state vector's length: the same for every task and space (the arguments are accepted for
    callers written against per-space sizes)."""
    return STATE_SIZE


# ---- the actions ----------------------------------------------------------------------------------

def _position(knob: Knob, value: Any) -> float:
    """Where a value sits in its knob's list sorted by size: 0 = smallest, 1 = largest."""
    ordered = sorted(knob.values)
    if value not in ordered or len(ordered) < 2:
        return 0.0
    return ordered.index(value) / (len(ordered) - 1)


def action_vector(knob: Knob, value: int, current: int | None, default: int | None, group: int | None,
                  groups: int, votes: Mapping[tuple[str, int], float] | None = None) -> list[float]:
    """`votes`: what the policy's memory says of each (knob, value) on this task (core/search/memory.py);
    a knob it has no votes for gets zeros and the "voted" flag off."""
    new_pos, cur_pos = _position(knob, value), _position(knob, current)
    move = _log2(value + 1) - _log2((current if current is not None else value) + 1)
    voted = votes is not None and (knob.name, value) in votes
    vote_new = votes[(knob.name, value)] if voted else 0.0
    vote_cur = votes.get((knob.name, current), 0.0) if voted and current is not None else 0.0
    return (_tokens(knob.name)
            + [0.0 if group is None else 1.0, 0.0 if group is None else group / max(groups - 1, 1),
               _log2(value + 1) / 12.0, _log2((current or 0) + 1) / 12.0, new_pos, cur_pos, new_pos - cur_pos,
               max(-1.0, min(1.0, move / 4.0)), 1.0 if value == default else 0.0,
               1.0 if current == default else 0.0, 1.0 if len(knob.values) == 2 else 0.0,
               _log2(len(knob.values)) / 4.0,
               1.0 if voted else 0.0, vote_new, vote_cur, vote_new - vote_cur, 0.0, 0.0])


def evaluate_vector() -> list[float]:
    """The "evaluate now" action of a move: no knob, only its own flag (the last entry)."""
    return [0.0] * (ACTION_SIZE - 1) + [1.0]


def jump_vector(space: ScheduleSpace, schedule: Mapping[str, int], target: Mapping[str, int],
                votes: Mapping[tuple[str, int], float], depth: int) -> list[float]:
    """The "jump" action (a policy with a memory; docs/search.md, "Memory"): evaluate `target`, the
    schedule the memory ranks highest among those not known yet, `depth` places down its ranking.
    Its vector: the fraction of knobs it changes, the memory's score (core/search/memory.py,
    vote_score, scaled) of the target and of the current schedule and their difference, and its flag."""
    from .memory import VOTE_FLOOR, vote_score

    scale = -math.log(VOTE_FLOOR)          # vote_score's range is [log(VOTE_FLOOR), log(1 + VOTE_FLOOR)]
    new, current = vote_score(votes, target) / scale, vote_score(votes, schedule) / scale
    changed = sum(target.get(k.name) != schedule.get(k.name) for k in space.knobs) / max(len(space.knobs), 1)
    out = [0.0] * ACTION_SIZE
    out[TOKEN_BUCKETS + 7] = changed                      # where an edit has its move's size
    out[-7] = min(depth, 64) / 64.0                        # where an edit has the knob's value count
    out[-6:-1] = [1.0, new, current, new - current, 1.0]  # voted, the scores, their difference, "jump"
    return out


def action_features(space: ScheduleSpace, schedule: Mapping[str, int], evaluate: bool = False,
                    votes: Mapping[tuple[str, int], float] | None = None) -> list[list[float]]:
    """One vector per entry of space.actions, for the edit from `schedule`; with `evaluate`, the
    "evaluate now" action's vector after them; `votes` from the policy's memory, if it has one."""
    default = space.default()
    groups = len({knob_parts(k.name)[0] for k in space.knobs})
    knobs = {k.name: k for k in space.knobs}
    vectors = [action_vector(knobs[a.knob], a.value, schedule.get(a.knob), default.get(a.knob),
                             knob_parts(a.knob)[0], groups, votes) for a in space.actions]
    return vectors + [evaluate_vector()] if evaluate else vectors


def _sizes() -> tuple[int, int]:
    space = ScheduleSpace([Knob("BLOCK", (1, 2))])
    return len(state_vector(space, None, None, {}, None, None, None)), len(action_features(space, {})[0])


STATE_SIZE, ACTION_SIZE = _sizes()
