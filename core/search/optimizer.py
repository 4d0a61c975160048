"""The optimiser loop: propose an edit -> record it queued -> evaluate -> reward -> learn.

Control (thread-safe, from any thread while run() blocks in another):
- pause(): returns at once. The step in flight (if any) completes and is recorded; no new
  candidate is proposed until resume(). wait_paused() blocks until the loop is parked.
- resume(): proposing continues where it stopped (same episode, same counters).
- stop(): the step in flight completes; run() then records the end of the run and returns.
- fork(candidate_id): adds a branch at once; the loop's next episode starts from that
  candidate's schedule on the new branch (the current episode ends at the next step boundary).
Every candidate is committed as queued before it is evaluated and its verdict is committed
before the next one is proposed, so a kill loses at most the one in flight (left "queued").
"""
from __future__ import annotations

import json
import math
import random
import statistics
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from core.project import CandidateRecord

from .events import (BestConfirmed, CandidateEvaluated, CandidateProposed, Finished, Forked, NewBest, Paused, PolicyUpdated,
                     Resumed, RunError, RunStarted)
from .features import ACTION_SIZE, action_features, jump_vector, state_vector
from .memory import ranked_schedules
from .policies.base import Policy, SearchState, Transition
from .replay import NOT_RECORDED
from .reward import RewardConfig, RewardTracker
from .space import ScheduleSpace

EXHAUSTION_CHECK_LIMIT = 4096   # knob-value combinations up to which the optimizer lists the space
# Compile-ahead looks further than compile_ahead candidates when compiles are slow compared with
# evaluations, up to this many times compile_ahead.
AHEAD_MAX_FACTOR = 4
FINAL = ("measured", "compile_error", "wrong", "crashed", "timeout", "rejected")


@dataclass(frozen=True)
class Budget:
    evaluations: int | None = None     # candidates evaluated (duplicates answered from the record do not count)
    seconds: float | None = None       # wall time of this run() call


@dataclass
class RunSummary:
    run_id: int
    reason: str
    evaluations: int
    steps: int
    best_candidate_id: int | None
    best_ms: float | None
    counts: dict[str, int] = field(default_factory=dict)


@dataclass
class _Start:
    branch_id: int
    candidate_id: int | None
    schedule: dict[str, int]


class Optimizer:
    def __init__(self, task: Any, program: Any, pool: Any, project: Any, policy: Policy,
                 budget: Budget = Budget(evaluations=100), observers: Iterable[Any] = (), *,
                 episode_length: int = 8, update_every: int = 16, seed: int = 0,
                 reward: RewardConfig | None = None, unrecorded: str = "penalise",
                 space: ScheduleSpace | None = None, gpu: dict[str, Any] | None = None,
                 max_idle_episodes: int = 50, resume: bool = True, compile_ahead: int = 0,
                 confirm_rounds: int = 0, start: dict[str, int] | None = None, memory_start: bool = True):
        if unrecorded not in ("penalise", "skip", "mask"):
            raise ValueError("unrecorded must be 'penalise', 'skip' or 'mask'")
        self.task, self.program, self.pool, self.project, self.policy = task, program, pool, project, policy
        self.budget = budget
        self.observers = list(observers)
        self.episode_length = episode_length
        self.update_every = update_every
        self.rng = random.Random(seed)
        self.reward_config = reward or RewardConfig()
        # A replay pool's answer to a schedule it never measured: "penalise" (a rejection, counted),
        # "skip" (not counted, not learned from) or "mask" (never proposed: training on a record).
        self.unrecorded = unrecorded
        self.space = space or ScheduleSpace.from_program(program, task)
        self.gpu = gpu or (project.hardware if project is not None else None)
        self.max_idle_episodes = max_idle_episodes     # episodes in a row with nothing new to evaluate -> "exhausted"
        self.resume_unfinished = resume
        # Compile pipelining: while the GPU measures a candidate, the loop predicts up to
        # `compile_ahead` candidates the policy is likely to propose next and compiles them on CPU
        # workers through pool.prepare (the Evaluator's compile step, which fills the compile cache
        # and joins a compile already in flight), so the next evaluation finds its cubin ready.
        # When a compile takes longer than that many evaluations, it looks further (_ahead_depth).
        self.compile_ahead = compile_ahead if hasattr(pool, "prepare") else 0
        self._compile_seconds: deque[float] = deque(maxlen=32)    # recent compiles that ran (not cached)
        self._gpu_seconds: deque[float] = deque(maxlen=32)        # recent evaluations less their compile
        # After the last candidate, the best is re-measured in `confirm_rounds` rounds interleaved
        # with eager (pools that can: the GPU evaluator); 0: not.
        self.confirm_rounds = confirm_rounds if hasattr(pool, "remeasure") else 0
        # Where the first episode starts (measured first, like the default it replaces); None: the
        # default schedule. Training uses it to start visits from other recorded schedules.
        self.start = dict(start) if start is not None else None
        # Without `start`, a policy with a memory starts from the schedule its memory ranks highest
        # (its first jump, taken before anything is measured) instead of the default.
        self.memory_start = memory_start
        self._compiler: ThreadPoolExecutor | None = None
        self._measurer: ThreadPoolExecutor | None = None
        self._ahead: dict[str, Future] = {}
        self._ahead_candidates: dict[str, Any] = {}   # hash -> the candidate being compiled ahead
        self._prepared: set[str] = set()
        self._assumed_known: set[str] = set()       # while predicting: the candidates predicted before

        self._run_gate = threading.Event()       # set = proposing allowed
        self._run_gate.set()
        self._parked = threading.Event()         # set while the loop waits in pause
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pending_fork: _Start | None = None

        self.evaluations = 0
        self.steps = 0
        self.best_id: int | None = None
        self.best_ms: float | None = None
        self._by_hash: dict[str, CandidateRecord] = {}
        self._hashes: dict[tuple, str] = {}             # schedule key -> program hash
        self._unanswered: set[str] = set()              # hashes a replay pool could not answer
        # Correct candidates per branch, (median, id, schedule): where later episodes start.
        self._measured: dict[int, list[tuple[float, int, dict[str, int]]]] = {}
        self._explored: set[tuple] = set()              # schedule keys with no new neighbour left
        self._legal_hashes: list[str] | None = None    # every legal schedule's hash, small spaces only
        self._eager_ms: float | None = None
        self._compile_ms: float | None = None
        self._votes: dict | None = None       # the policy's memory of similar tasks (after any checkpoint loads)
        self._votes_asked = False
        self._jump_ranking: list[dict[str, int]] = []     # legal schedules in the memory's order, so far
        self._jump_source: Iterator[dict[str, int]] | None = None
        self._jump_known = 0          # the ranking's first entries that have a verdict for good (skipped)

    # ---- control -------------------------------------------------------------------------------

    def pause(self) -> None:
        self._run_gate.clear()

    def resume(self) -> None:
        self._run_gate.set()

    def stop(self) -> None:
        self._stop.set()
        self._run_gate.set()     # a paused loop must wake up to finish

    def wait_paused(self, timeout: float | None = None) -> bool:
        return self._parked.wait(timeout)

    @property
    def paused(self) -> bool:
        return not self._run_gate.is_set()

    def fork(self, candidate_id: int, name: str | None = None) -> Any:
        """A new branch starting from a recorded candidate; returns the Branch."""
        rec = self.project.candidate(candidate_id)
        if rec is None:
            raise KeyError(f"{self.project.path} has no candidate {candidate_id}")
        if rec.kind != "program":
            raise ValueError(f"candidate {candidate_id} is a ModelNew solution; only programs have a schedule")
        schedule = {k.name: int(rec.schedule.get(k.name, k.values[0])) for k in self.space.knobs}
        name = name or f"fork-{candidate_id}-{len(self.project.branches()) + 1}"
        branch = self.project.add_branch(name, parent_candidate_id=candidate_id)
        with self._lock:
            self._pending_fork = _Start(branch.id, candidate_id, schedule)
        return branch

    # ---- events ----------------------------------------------------------------------------------

    def _emit(self, event: Any) -> None:
        for observer in self.observers:
            observer(event)

    # ---- the loop --------------------------------------------------------------------------------

    def run(self) -> RunSummary:
        resumes = self._unfinished_run() if self.resume_unfinished else None
        run = self.project.run_started(meta={"policy": self.policy.name, "task": self.task.name,
                                             "budget": {"evaluations": self.budget.evaluations,
                                                        "seconds": self.budget.seconds}}, resumes=resumes)
        self.run_id = run.id
        self._load_history(resumes)
        self._emit(RunStarted(run.id, self.policy.name, self.task.name, self.budget.evaluations,
                              self.budget.seconds, resumes, self._eager_ms, self._compile_ms))
        reason = "error"
        try:
            self._finish_interrupted(resumes)
            reason = self._loop()
        except Exception as exc:
            self._emit(RunError(f"{type(exc).__name__}: {exc}"))
            self.project.run_stopped(clean=False)
            raise
        finally:
            self._close_compiler()
        self._confirm_best()
        self.project.run_stopped(clean=True)
        self._emit(Finished(reason, self.evaluations, self.best_id, self.best_ms))
        return RunSummary(run.id, reason, self.evaluations, self.steps, self.best_id, self.best_ms,
                          self.project.counts_by_status())

    def _confirm_best(self) -> None:
        """Re-measure the best program interleaved with eager; the numbers go into its record's
        extra["interleaved"] and a BestConfirmed event. Its recorded time and the rewards stay."""
        if self.confirm_rounds <= 0 or self.best_id is None:
            return
        rec = self.project.candidate(self.best_id)
        if rec is None or rec.kind != "program" or not rec.program:
            return
        from core.program import KernelProgram

        try:
            out = self.pool.remeasure(KernelProgram.from_json(rec.program), rounds=self.confirm_rounds)
        except Exception as exc:     # the run's results stand without it
            out = None
            reason = f"{type(exc).__name__}: {exc}"
        if isinstance(out, tuple):
            cand, eager = out
            event = BestConfirmed(rec.id, self.confirm_rounds, cand.median_ms, eager.median_ms)
        else:
            reason = reason if out is None else f"{out.status.value}: {out.reason}"
            event = BestConfirmed(rec.id, self.confirm_rounds, None, None, reason)
        extra = dict(rec.extra)
        extra["interleaved"] = {"rounds": event.rounds, "median_ms": event.median_ms, "eager_ms": event.eager_ms,
                                "speedup_eager": event.speedup_eager, "reason": event.reason}
        self.project.update_candidate(rec.id, extra=extra)
        self._emit(event)

    def _unfinished_run(self) -> int | None:
        from core.project import run_may_be_live

        dead = [r for r in self.project.unfinished_runs() if not run_may_be_live(r)]
        return dead[-1].id if dead else None

    def _load_history(self, resumes: int | None) -> None:
        """Known verdicts (for duplicates), the best so far, counters of the run being resumed,
        the baselines and the policy's latest checkpoint."""
        chain = self._run_chain(resumes)
        for rec in self.project.candidates(status=FINAL):
            if rec.kind != "program" or rec.reason == NOT_RECORDED:
                continue
            self._by_hash.setdefault(rec.candidate_hash, rec)
            self._add_measured(rec.branch_id, rec)
            if rec.extra.get("run") in chain and rec.extra.get("counted", True):
                self.evaluations += 1
        best = self.project.best(1)
        if best:
            self.best_id, self.best_ms = best[0].id, best[0].median_ms
        baselines = self.pool.baselines()
        if baselines is not None:
            self._eager_ms = baselines.eager.median_ms if baselines.eager else None
            self._compile_ms = baselines.compile.median_ms if baselines.compile else None
        ckpt = self.project.latest_checkpoint(self.policy.name)
        if ckpt is not None:
            try:
                self.policy.load_state_dict(json.loads(ckpt.blob.decode()))
            except (ValueError, KeyError, TypeError):
                pass     # a checkpoint for another task's action space: start fresh

    def _finish_interrupted(self, resumes: int | None) -> None:
        """Evaluate the candidates a killed run left queued (at most the one it had in flight)."""
        from core.program import KernelProgram

        chain = self._run_chain(resumes)
        for rec in list(self.project.candidates(status=("queued", "compiled"))):
            if rec.kind != "program" or rec.extra.get("run") not in chain:
                continue
            result = self.pool.evaluate(KernelProgram.from_json(rec.program))
            self.evaluations += 1
            median = result.measurement.median_ms if result.ok and result.measurement else None
            r = RewardTracker(self.reward_config).reward(result.status.value, median, None, self._eager_ms,
                                                         self._compile_ms)
            self.project.record_result(rec.id, result, reward=r)
            rec = self.project.candidate(rec.id)
            self._by_hash.setdefault(rec.candidate_hash, rec)
            self._emit(CandidateEvaluated(rec.id, rec.branch_id, rec.status, rec.reason, median, r,
                                          self.evaluations))
            self._note_best(rec)

    def _run_chain(self, resumes: int | None) -> set[int]:
        runs = {r.id: r for r in self.project.runs()}
        chain: set[int] = set()
        while resumes is not None and resumes not in chain:
            chain.add(resumes)
            resumes = runs[resumes].resumed_from if resumes in runs else None
        return chain

    def _budget_reason(self, started: float) -> str | None:
        if self._stop.is_set():
            return "stopped"
        if self.budget.evaluations is not None and self.evaluations >= self.budget.evaluations:
            return "evaluations"
        if self.budget.seconds is not None and time.monotonic() - started >= self.budget.seconds:
            return "seconds"
        return None

    def _gate(self) -> None:
        """Park here while paused."""
        if not self._run_gate.is_set():
            self._emit(Paused(self.evaluations))
            self._parked.set()
            self._run_gate.wait()
            self._parked.clear()
            if not self._stop.is_set():
                self._emit(Resumed(self.evaluations))

    def _loop(self) -> str:
        started = time.monotonic()
        # A branch's first start: its fallback.
        first = _Start(1, None, self._first_schedule())
        start = first
        idle = 0
        while True:
            with self._lock:
                if self._pending_fork is not None:
                    start, self._pending_fork = self._pending_fork, None
                    first = start
                    root = self.project.candidate(start.candidate_id)
                    if root is not None:
                        self._add_measured(start.branch_id, root)
                    self._emit(Forked(start.branch_id, self.project.branch(start.branch_id).name,
                                      start.candidate_id))
            outcome = self._episode(start, started)
            self.policy.end_episode()
            if outcome in ("stopped", "evaluations", "seconds"):
                return outcome
            idle = idle + 1 if outcome == "idle" else 0
            if idle >= self.max_idle_episodes or self._space_exhausted():
                return "exhausted"
            if outcome != "forked":
                start = self._next_start(first.branch_id) or first

    def _first_schedule(self) -> dict[str, int]:
        """Where the main branch starts: `start`; else the memory's highest-ranked legal schedule
        (memory_start, a policy with votes for this task) that a replay can answer (a replay skips the
        others, as it skips any proposal it cannot answer); else the default."""
        if self.start is not None:
            return dict(self.start)
        if self.memory_start and self._policy_votes():
            index = 0
            while (top := self._jump_target(index)) is not None:
                if self.unrecorded == "penalise" or self._hash(top) in self.pool:
                    return dict(top)
                index += 1
        return self.space.default()

    def _next_start(self, branch_id: int, remember: bool = True) -> _Start | None:
        """The fastest correct candidate of the branch that still has a new neighbour: episodes
        after the first continue from the best found instead of walking again from the default.
        A prediction passes remember=False: what it assumes known must not mark a start explored."""
        for median, candidate_id, schedule in sorted(self._measured.get(branch_id, []), key=lambda m: m[:2]):
            key = self.space.key(schedule)
            if key in self._explored:
                continue
            if any(self._proposable(schedule)):
                return _Start(branch_id, candidate_id, dict(schedule))
            if remember:
                self._explored.add(key)
        return None

    def _add_measured(self, branch_id: int, rec: CandidateRecord) -> None:
        if rec.status == "measured" and rec.median_ms is not None and rec.kind == "program":
            schedule = {k.name: int(rec.schedule.get(k.name, k.values[0])) for k in self.space.knobs}
            self._measured.setdefault(branch_id, []).append((rec.median_ms, rec.id, schedule))

    def _is_new(self, schedule: dict[str, int]) -> bool:
        """No verdict yet (a known schedule would cost a step and teach nothing), and in training
        one the record answers."""
        h = self._hash(schedule)
        return (h not in self._by_hash and h not in self._unanswered and h not in self._assumed_known
                and (self.unrecorded != "mask" or h in self.pool))

    def _proposable(self, schedule: dict[str, int], edited: frozenset[str] = frozenset(),
                    last: bool = True) -> list[bool]:
        """The mask of the next edit from `schedule`: legal edits to new schedules. Within a move that
        holds edits of the knobs `edited` so far: only the other knobs, and, when the move may take
        another edit (`last` False), also to a known schedule one edit away from a new one, so a
        move never ends where nothing new is."""
        mask = self.space.mask(schedule)
        for i, ok in enumerate(mask):
            knob = self.space.actions[i].knob
            if ok and knob in edited:
                mask[i] = False
            elif ok:
                nxt = self.space.apply(schedule, i)
                mask[i] = self._is_new(nxt) or (not last and any(self._proposable(nxt, edited | {knob})))
        return mask

    def _state(self, schedule: dict[str, int], step: int, status: str | None, measurement: dict | None,
               median: float | None, edits: int = 0) -> SearchState:
        features = state_vector(self.space, self.task, self.gpu, schedule, status, measurement, self._eager_ms,
                                step, self.episode_length, edits)
        self._policy_votes()
        actions = action_features(self.space, schedule, evaluate=self.policy.max_edits > 1, votes=self._votes)
        if self._votes:
            jump = self._jump(schedule)
            actions.append(jump_vector(self.space, schedule, jump[0], self._votes, jump[1]) if jump
                           else [0.0] * ACTION_SIZE)
        return SearchState(dict(schedule), features, step, status, median, actions)

    def _policy_votes(self) -> dict | None:
        """The policy's memory of similar tasks, asked once (after any checkpoint loads)."""
        if not self._votes_asked:
            votes = getattr(self.policy, "votes", None)      # plug-in policies need not have a memory
            self._votes, self._votes_asked = (votes(self.task, self.space) if votes else None), True
        return self._votes

    def _jump_index(self) -> int | None:
        """The "jump" action's index (after the edits and "evaluate now"), for a policy with votes."""
        if not self._votes:
            return None
        return len(self.space.actions) + (1 if self.policy.max_edits > 1 else 0)

    def _jump(self, schedule: dict[str, int]) -> tuple[dict[str, int], int] | None:
        """(the new legal schedule the memory ranks highest, its place in that ranking), or None when
        the ranking has nothing new left (it is cut at memory.ranked_schedules' limit)."""
        index = self._jump_known
        while True:
            target = self._jump_target(index)
            if target is None:
                return None
            if target != schedule and self._is_new(target):
                return target, index
            h = self._hash(target)
            if index == self._jump_known and (h in self._by_hash or h in self._unanswered):
                self._jump_known += 1     # predictions' assumptions are not for good; verdicts are
            index += 1

    def _jump_target(self, index: int) -> dict[str, int] | None:
        """The index-th legal schedule in the memory's ranking, or None past its end."""
        if self._jump_source is None:
            self._jump_source = ranked_schedules(self._votes or {}, {k.name: k.values for k in self.space.knobs},
                                                 self.space.default())
        while index >= len(self._jump_ranking):
            nxt = next(self._jump_source, None)
            if nxt is None:
                return None
            if self.space.legal(nxt):
                self._jump_ranking.append(nxt)
        return self._jump_ranking[index]

    def _propose(self, state: SearchState, mask: list[bool]) -> int:
        action = self.policy.propose(state, mask, self.rng)
        if not mask[action]:
            raise RuntimeError(f"policy {self.policy.name} chose masked action {action}")
        return action

    def _move(self, schedule: dict[str, int], state: SearchState, last: tuple[str | None, dict | None, float | None],
              step: int, preview: random.Random | None = None
              ) -> tuple[dict[str, int], list[int], SearchState, int] | None:
        """The policy's next move from `schedule`: (the schedule to evaluate, its edits, the state and
        action of its last choice, which the caller rewards once the move is measured), or None when
        no new schedule is in reach. With max_edits > 1 the policy composes edits of different knobs
        until it picks "evaluate now" or the move is full; each edit but the last is observed at once,
        with no reward and no evaluation spent (Transition.evaluated False). With a `preview` rng the
        move is only predicted: policy.preview draws from that rng and nothing is observed."""
        def choose(state: SearchState, mask: list[bool]) -> int:
            return self.policy.preview(state, mask, preview) if preview is not None else self._propose(state, mask)

        jump_index = self._jump_index()
        jump = self._jump(schedule) if jump_index is not None else None
        if self.policy.max_edits <= 1:
            mask = self._proposable(schedule) + ([jump is not None] if jump_index is not None else [])
            if not any(mask):
                return None
            action = choose(state, mask)
            if action == jump_index:
                return jump[0], [], state, action
            return self.space.apply(schedule, action), [action], state, action
        evaluate_now = len(self.space.actions)
        pending, edits = dict(schedule), []
        while True:
            full = len(edits) + 1 >= self.policy.max_edits
            mask = self._proposable(pending, frozenset(self.space.actions[i].knob for i in edits), full)
            mask.append(bool(edits) and self._is_new(pending))
            if jump_index is not None:
                mask.append(not edits and jump is not None)     # a jump is a whole move by itself
            if not any(mask):
                return None       # only before the first edit: every edit of a move keeps something new in reach
            action = choose(state, mask)
            if action == evaluate_now:
                return pending, edits, state, action
            if action == jump_index:
                return jump[0], [], state, action
            pending = self.space.apply(pending, action)
            edits.append(action)
            if full:
                return pending, edits, state, action
            next_state = self._state(pending, step, *last, edits=len(edits))
            if preview is None:
                self.policy.observe(Transition(state, action, 0.0, next_state, False, {"move": len(edits)},
                                               evaluated=False))
            state = next_state

    def _predict(self, schedule: dict[str, int], step: int, last: tuple[str | None, dict | None, float | None],
                 measuring: dict[str, int] | None = None, limit: int | None = None,
                 branch_id: int | None = None) -> list[dict[str, int]]:
        """The next `limit` (default compile_ahead) schedules the policy will most likely evaluate from
        `schedule`, if the candidate being measured (`measuring`, default `schedule`) and each one
        predicted after it are correct and as fast as `last` says: moves drawn in a row with a copy of
        the loop's rng, counting the predicted ones as known. For a policy whose choice does not
        depend on times these are the very draws the loop will make, up to the end of the episode.
        With `branch_id`, a prediction that reaches the episode's end goes on into the next one, from
        where that one will start if no predicted candidate becomes the branch's best (_loop's pick):
        a compile that takes longer than a few evaluations then starts in time for it."""
        rng = random.Random()
        rng.setstate(self.rng.getstate())
        out: list[dict[str, int]] = []
        self._assumed_known = {self._hash(schedule), self._hash(measuring or schedule)}
        try:
            depth = limit or self._ahead_depth()
            while len(out) < depth:
                if step >= self.episode_length:
                    start = self._next_start(branch_id, remember=False) if branch_id is not None else None
                    if start is None:
                        break
                    schedule, step, last, branch_id = start.schedule, 0, self._measured_as(start.candidate_id), None
                move = self._move(schedule, self._state(schedule, step, *last), last, step, preview=rng)
                if move is None:
                    break
                schedule, step = move[0], step + 1
                out.append(schedule)
                self._assumed_known.add(self._hash(schedule))
        finally:
            self._assumed_known = set()
        return out

    def _ahead_depth(self) -> int:
        """Candidates to predict: compile_ahead, or enough that a slow compile started now (the 90th
        percentile of recent ones: the slow ones are those waited for, and a mean hides them when
        a few variants compile several times longer than the rest) ends before the loop reaches its
        candidate, at the median pace of evaluations; at most AHEAD_MAX_FACTOR times compile_ahead."""
        if len(self._compile_seconds) < 3 or len(self._gpu_seconds) < 3:
            return self.compile_ahead
        compile_s = statistics.quantiles(self._compile_seconds, n=10, method="inclusive")[-1]
        gpu_s = max(statistics.median(self._gpu_seconds), 1e-3)
        return max(self.compile_ahead, min(self.compile_ahead * AHEAD_MAX_FACTOR, math.ceil(compile_s / gpu_s) + 1))

    def _note_durations(self, status: Any, info: dict[str, Any], eval_seconds: float | None = None) -> None:
        """Remember how long a compile that ran took and, for a correct candidate, how long its
        evaluation took besides that compile (what _ahead_depth weighs)."""
        compiled = not info.get("compile_cached", True) and info.get("compile_seconds", 0.0) > 0
        if compiled:
            self._compile_seconds.append(float(info["compile_seconds"]))
        if eval_seconds and getattr(status, "value", status) == "measured":
            gpu = eval_seconds - (float(info["compile_seconds"]) if compiled else 0.0)
            if gpu > 0:
                self._gpu_seconds.append(gpu)

    def _measured_as(self, candidate_id: int | None) -> tuple[str | None, dict | None, float | None]:
        """What an episode starting from this recorded candidate reports as its last measurement:
        _episode's first state, and a prediction's into that episode, so the two see the same."""
        rec = self.project.candidate(candidate_id) if candidate_id is not None else None
        if rec is None:
            return ("measured", None, None)
        return (rec.status, rec.measurement, rec.median_ms if rec.status == "measured" else None)

    def _predict_restart(self, branch_id: int, measuring: dict[str, int],
                         last: tuple[str | None, dict | None, float | None]) -> list[dict[str, int]]:
        """At an episode's last edit: the next episode's first move, from where that episode will most
        likely start (the branch's best measured candidate with a new neighbour, as _loop picks it),
        and from the candidate being measured, should it become the best; then the moves after the
        first from the likelier start, as deep as any other prediction (a shorter list here would
        withdraw the compiles queued for them one evaluation earlier)."""
        best = self._next_start(branch_id)
        out: list[dict[str, int]] = []
        # From the candidate being measured only if it turns out correct and the best: as fast as `last`.
        guess = ("measured", last[1], last[2])
        starts = ([(best.schedule, self._measured_as(best.candidate_id))] if best else []) + [(measuring, guess)]
        for start, start_last in starts:
            for schedule in self._predict(start, 0, start_last, measuring, limit=1):
                if schedule not in out:
                    out.append(schedule)
        for schedule in self._predict(measuring, self.episode_length, last, branch_id=branch_id):
            if schedule not in out:
                out.append(schedule)
        return out

    def _episode(self, start: _Start, started: float) -> str:
        """One episode of edits; returns a budget reason, "forked", "idle" (nothing new) or "done"."""
        schedule, parent_id, branch_id = dict(start.schedule), start.candidate_id, start.branch_id
        if parent_id is None:
            # The start schedule is measured first (once), so the first edit has a time to beat.
            self._gate()
            reason = self._budget_reason(started)
            if reason:
                return reason
            # A start that is not the default says how it differs and notes the default, so a replay of
            # this project knows it.
            default = self.space.default()
            label = "start" if schedule == default else "start: " + ", ".join(
                f"{k}={v}" for k, v in schedule.items() if default.get(k) != v)
            result, rec, _ = self._evaluate(self.program.with_schedule(schedule), branch_id, None, label, -1,
                                            ahead=lambda: self._predict(schedule, 0, ("measured", None, None),
                                                                        branch_id=branch_id),
                                            extra={"default": default} if schedule != default else None)
            if result is not None:
                # Not an action, so no policy learns from it; stored like an edit with no time before it.
                r0 = RewardTracker(self.reward_config).reward(rec.status, rec.median_ms, None, self._eager_ms,
                                                              self._compile_ms)
                self.project.record_result(rec.id, result, reward=r0)
                self._emit(CandidateEvaluated(rec.id, branch_id, rec.status, rec.reason, rec.median_ms, r0,
                                              self.evaluations))
                self._note_best(rec)
            if rec.status != "measured" and self.start is None and schedule != default:
                # The memory's pick failed (or was not recorded): start from the default instead, as a
                # run without a memory does, rather than edit a schedule that has no time to beat.
                return self._episode(_Start(branch_id, None, default), started)
            parent_id = rec.id
        last = self._measured_as(parent_id)
        prev_ms = last[2]
        tracker = RewardTracker(self.reward_config)
        tracker.start_from(prev_ms, self._eager_ms, self._compile_ms)
        state = self._state(schedule, 0, *last)
        new = 0
        for step in range(self.episode_length):
            self._gate()
            reason = self._budget_reason(started)
            if reason:
                return reason
            if self._pending_fork is not None:
                return "forked"
            move = self._move(schedule, state, last, step)
            if move is None:
                break
            next_schedule, edits, state, action = move
            candidate = self.program.with_schedule(next_schedule)
            label = (" + ".join(self.space.actions[i].label() for i in edits) if edits else
                     "memory: " + ", ".join(f"{k}={v}" for k, v in next_schedule.items() if schedule.get(k) != v))
            if step + 1 < self.episode_length:
                guess = ("measured", last[1], prev_ms)
                ahead = lambda: self._predict(next_schedule, step + 1, guess, branch_id=branch_id)  # noqa: E731
            else:
                ahead = lambda: self._predict_restart(branch_id, next_schedule, last)  # noqa: E731
            result, rec, counted = self._evaluate(candidate, branch_id, parent_id, label, step, ahead)
            new += counted
            median = rec.median_ms if rec.status == "measured" else None
            r = tracker.reward(rec.status, median, prev_ms, self._eager_ms, self._compile_ms)
            if rec.reward is None and result is not None:
                self.project.record_result(rec.id, result, reward=r)
            self._emit(CandidateEvaluated(rec.id, branch_id, rec.status, rec.reason, median, r, self.evaluations,
                                          from_record=result is None))
            self._note_best(rec)
            done = step == self.episode_length - 1
            if median is not None:         # a correct edit moves the episode; a failed one is undone
                schedule, parent_id, prev_ms = next_schedule, rec.id, median
            last = (rec.status, rec.measurement, median)      # what the next move's states report
            next_state = self._state(schedule, step + 1, *last)
            if counted or rec.reason != NOT_RECORDED:
                self.policy.observe(Transition(state, action, r, next_state, done, {"candidate_id": rec.id}))
                self.steps += 1
                if self.steps % self.update_every == 0:
                    self._learn()
            state = next_state
        return "done" if new else "idle"

    def _space_exhausted(self) -> bool:
        """Every legal schedule is already known, so no episode can find anything new (checked for
        spaces small enough to list; larger ones end after max_idle_episodes idle episodes)."""
        if self._legal_hashes is None:
            size = math.prod(len(k.values) for k in self.space.knobs)
            self._legal_hashes = ([self._hash(s) for s in self.space.enumerate(size)]
                                  if size <= EXHAUSTION_CHECK_LIMIT else [])
        return (bool(self._legal_hashes) and len(self._by_hash) >= len(self._legal_hashes)
                and all(h in self._by_hash for h in self._legal_hashes))

    def _hash(self, schedule: dict[str, int]) -> str:
        """The program's content hash at `schedule`, computed once per schedule (masking a record asks
        for every neighbour's hash at every step)."""
        key = self.space.key(schedule)
        h = self._hashes.get(key)
        if h is None:
            h = self._hashes[key] = self.program.content_hash(schedule)
        return h

    def _note_best(self, rec: CandidateRecord) -> None:
        median = rec.median_ms if rec.status == "measured" else None
        if median is not None and (self.best_ms is None or median < self.best_ms):
            self.best_id, self.best_ms = rec.id, median
            self._emit(NewBest(rec.id, median, (rec.measurement or {}).get("speedup_eager")))

    def _evaluate(self, candidate: Any, branch_id: int, parent_id: int | None, label: str, step: int,
                  ahead: Callable[[], list[dict[str, int]]] | None = None,
                  extra: dict[str, Any] | None = None) -> tuple[Any, CandidateRecord, bool]:
        """(EvalResult or None when answered from the record, the record, counted as an evaluation).
        A fresh candidate is committed as queued, evaluated, and its verdict committed. `ahead`
        predicts the next candidates, which are compiled while this one is measured."""
        h = candidate.content_hash()
        known = self._by_hash.get(h)
        if known is not None:
            return None, known, False
        rec = CandidateRecord.from_program(candidate, branch_id=branch_id, parent_id=parent_id,
                                           origin=f"{self.policy.name}:{label}")
        rec.extra = {"run": self.run_id, "step": step, **(extra or {})}
        self.project.add_candidate(rec)
        self._emit(CandidateProposed(rec.id, branch_id, parent_id, label, dict(candidate.schedule), step))
        result = self._measure(candidate, ahead)
        counted = not (result.reason == NOT_RECORDED and self.unrecorded != "penalise")
        if counted:
            self.evaluations += 1
        else:
            rec.extra["counted"] = False
            self.project.update_candidate(rec.id, extra=rec.extra)
        self.project.record_result(rec.id, result)        # reward is filled in right after
        rec = self.project.candidate(rec.id)
        if result.reason != NOT_RECORDED:
            self._by_hash[h] = rec
            self._add_measured(branch_id, rec)
        else:
            self._unanswered.add(h)
        return result, rec, counted

    def _measure(self, candidate: Any, ahead: Callable[[], list[dict[str, int]]] | None) -> Any:
        """pool.evaluate(candidate). With compile-ahead on, the GPU measures in a helper thread while
        this one predicts the next candidates and queues their compiles."""
        if self.compile_ahead <= 0 or ahead is None:
            return self.pool.evaluate(candidate)
        if self._measurer is None:
            self._measurer = ThreadPoolExecutor(1, thread_name_prefix="measure")
        measuring = self._measurer.submit(self.pool.evaluate, candidate)
        try:
            self._compile_ahead(ahead())
        except Exception:
            pass     # a prediction must never cost the measurement
        result = measuring.result()
        self._note_durations(getattr(result, "status", None),
                             {"compile_cached": getattr(result, "compile_cached", True),
                              "compile_seconds": getattr(result, "compile_seconds", 0.0)},
                             getattr(result, "eval_seconds", None))
        return result

    def _compile_ahead(self, schedules: list[dict[str, int]]) -> None:
        if self._compiler is None:
            self._compiler = ThreadPoolExecutor(max(1, self.compile_ahead * AHEAD_MAX_FACTOR),
                                                thread_name_prefix="compile-ahead")
        wanted = {self._hash(schedule): schedule for schedule in schedules}
        for h, future in list(self._ahead.items()):
            if h in wanted:
                continue
            # Predicted earlier, no longer: cancel it if not started here, or withdraw its compile
            # if it still waits in the compile queue, so it does not hold a worker.
            if future.cancel() or self._withdraw(self._ahead_candidates.get(h)):
                self._prepared.discard(h)
                del self._ahead[h]
        for h, schedule in wanted.items():
            if h in self._by_hash or h in self._prepared:
                continue
            self._prepared.add(h)
            candidate = self.program.with_schedule(schedule)
            self._ahead_candidates[h] = candidate
            self._ahead[h] = self._compiler.submit(self._prepare_quietly, candidate)
        self._ahead = {h: f for h, f in self._ahead.items() if not f.done()}
        self._ahead_candidates = {h: c for h, c in self._ahead_candidates.items() if h in self._ahead}

    def _withdraw(self, candidate: Any) -> bool:
        withdraw = getattr(self.pool, "withdraw", None)
        if candidate is None or withdraw is None:
            return False
        try:
            return bool(withdraw(candidate))
        except Exception:
            return False

    def _prepare_quietly(self, candidate: Any) -> None:
        try:
            prepared = self.pool.prepare(candidate, speculative=True)
        except Exception:
            return     # the real evaluation reports any problem with this candidate
        # The Evaluator answers (artifact, failure, info); info says how long the compile took.
        if isinstance(prepared, tuple) and len(prepared) == 3 and isinstance(prepared[2], dict):
            self._note_durations(None, prepared[2])

    def _close_compiler(self) -> None:
        if self._compiler is not None:
            self._compiler.shutdown(wait=False, cancel_futures=True)
            self._compiler = None
        if self._measurer is not None:
            self._measurer.shutdown(wait=True)
            self._measurer = None

    def _learn(self) -> None:
        metrics = self.policy.update()
        if metrics is None:
            return
        state = self.policy.state_dict()
        ckpt = self.project.save_checkpoint(self.policy.name, json.dumps(state).encode(),
                                            meta={"run": self.run_id, "steps": self.steps, **metrics})
        self._emit(PolicyUpdated(self.policy.name, getattr(self.policy, "updates", 0), metrics, ckpt.id))
