"""What the policy remembers of the workloads it has seen: their near-best schedules.

A schedule that is fast on one task is often fast on a similar one (the same generator, the
same dtype, sizes of the same order). The memory holds, for every recorded task it was built
from, a descriptor (core/search/features.py: the task's sizes and dtype and the program's knob
names, the same vector the state starts with) and the schedules that ran within 97 % of that
record's best. For a new task it turns them into **votes**: for each knob and value, the
similarity-weighted share of remembered near-best schedules that use that value. The votes join
each edit's features (features.action_vector), and they rank whole schedules (ranked_schedules) for
the loop's "jump" action (optimizer.py). The PPO scores edits and the jump alike and learned, in
training, how far to trust them: nothing here chooses what is evaluated.

Besides what the shipped weights remember, a user's own runs can be remembered in a memory file
(`user_memory_path()`: $CUDA_AGENT_MEMORY, else ~/.cuda-agent/memory.json): with RunConfig.memory
(off by default; core/search/session.py) a run measured on a GPU is added when it ends, and a later
run's PPO recalls it. Benchmarks and training never read it, so their figures do not depend on a
machine's history.

Similarity is exp(-|d_task - d_entry|^2 / SIMILARITY_SCALE). The scale was chosen on the training
records alone (leave one task out, docs/search.md, "Memory"): with it, a task of another dtype
weighs about e^-10 of one of the same dtype, and sizes a few times apart weigh almost the same.
"""
from __future__ import annotations

import heapq
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

FORMAT = "cuda-agent-memory/1"
SIMILARITY_SCALE = 0.2
NEAR_BEST = 0.97          # a schedule within this fraction of the record's best counts as near-best
MAX_SCHEDULES = 64        # near-best schedules kept per entry (the fastest)
MIN_MEASURED = 8          # a run with fewer correct schedules is not remembered: its "near-best" says little
VOTE_FLOOR = 1e-3         # a value no remembered schedule uses still scores log(VOTE_FLOOR), not -inf

Votes = dict[tuple[str, int], float]


@dataclass
class MemoryEntry:
    task: str
    descriptor: list[float]
    knobs: dict[str, list[int]]
    schedules: list[dict[str, int]]          # near-best schedules, fastest first

    def share(self, knob: str, value: int) -> float:
        """The fraction of this entry's near-best schedules that set knob to value."""
        if not self.schedules:
            return 0.0
        return sum(1 for s in self.schedules if s.get(knob) == value) / len(self.schedules)


@dataclass
class ScheduleMemory:
    entries: list[MemoryEntry] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def tasks(self) -> list[str]:
        return [e.task for e in self.entries]

    def add(self, entry: MemoryEntry) -> None:
        """A later entry of the same task replaces the earlier one."""
        self.entries = [e for e in self.entries if e.task != entry.task] + [entry]

    def merged(self, other: "ScheduleMemory") -> "ScheduleMemory":
        """This memory with `other`'s entries added (they replace entries of the same task)."""
        out = ScheduleMemory(list(self.entries))
        for entry in other.entries:
            out.add(entry)
        return out

    def votes(self, descriptor: list[float], knobs: Mapping[str, Iterable[int]],
              exclude: Iterable[str] = ()) -> Votes:
        """(knob, value) -> the similarity-weighted share of remembered near-best schedules with that
        value, over the entries that have the knob (entries of `exclude`d tasks are left out). A
        knob no entry has gets no votes at all (absent keys, not zeros)."""
        skip = set(exclude)
        weights = [(e, _similarity(descriptor, e.descriptor)) for e in self.entries if e.task not in skip]
        out: Votes = {}
        for knob, values in knobs.items():
            having = [(e, w) for e, w in weights if knob in e.knobs and w > 0.0]
            total = sum(w for _, w in having)
            if total <= 0.0:
                continue
            for value in values:
                out[(knob, int(value))] = sum(w * e.share(knob, int(value)) for e, w in having) / total
        return out

    # ---- building ------------------------------------------------------------------------------

    @classmethod
    def from_records(cls, paths: Iterable[str | Path]) -> "ScheduleMemory":
        memory = cls()
        for path in paths:
            entry = entry_from_record(path)
            if entry is not None:
                memory.add(entry)
        return memory

    # ---- storage (inside a PPO weights file) ------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "entries": [{"task": e.task, "descriptor": e.descriptor, "knobs": e.knobs,
                                               "schedules": e.schedules} for e in self.entries]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ScheduleMemory":
        if data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} memory (format {data.get('format')!r})")
        return cls([MemoryEntry(str(e["task"]), [float(x) for x in e["descriptor"]],
                                {k: [int(v) for v in vs] for k, vs in e["knobs"].items()},
                                [{k: int(v) for k, v in s.items()} for s in e["schedules"]])
                    for e in data.get("entries", [])])


def vote_score(votes: Votes, schedule: Mapping[str, int]) -> float:
    """Mean over the schedule's voted knobs of log(vote + VOTE_FLOOR): how much the memory likes a
    whole schedule (0 when no knob is voted on). Ranks schedules as the product of the knobs' votes."""
    logs = [math.log(votes[(k, int(v))] + VOTE_FLOOR) for k, v in schedule.items() if (k, int(v)) in votes]
    return sum(logs) / len(logs) if logs else 0.0


def ranked_schedules(votes: Votes, knobs: Mapping[str, Iterable[int]], fixed: Mapping[str, int],
                     limit: int = 4096) -> Iterator[dict[str, int]]:
    """Schedules in decreasing vote_score, best first, at most `limit` (legality is the caller's):
    knobs with votes take their values in every combination; knobs without keep `fixed`'s value."""
    voted = {k: sorted((int(v) for v in vs), key=lambda v: -votes[(k, v)])
             for k, vs in knobs.items() if all((k, int(v)) in votes for v in vs)}
    names = sorted(voted)
    if not names:
        return
    logs = [[math.log(votes[(k, v)] + VOTE_FLOOR) for v in voted[k]] for k in names]
    start = (0,) * len(names)
    heap = [(-sum(col[0] for col in logs), start)]
    seen = {start}
    produced = 0
    while heap and produced < limit:
        negative, index = heapq.heappop(heap)
        yield {**fixed, **{k: voted[k][i] for k, i in zip(names, index)}}
        produced += 1
        for j in range(len(names)):          # the next value of one knob: every combination once
            if index[j] + 1 < len(voted[names[j]]):
                nxt = index[:j] + (index[j] + 1,) + index[j + 1:]
                if nxt not in seen:
                    seen.add(nxt)
                    heapq.heappush(heap, (negative + logs[j][index[j]] - logs[j][index[j] + 1], nxt))


def user_memory_path() -> Path:
    """Where a user's runs are remembered: $CUDA_AGENT_MEMORY, else ~/.cuda-agent/memory.json."""
    return Path(os.environ.get("CUDA_AGENT_MEMORY") or Path.home() / ".cuda-agent" / "memory.json")


def load_memory(path: str | Path) -> ScheduleMemory:
    """The memory stored in a file; an empty one when there is no file yet. A file that is not a
    memory raises ValueError (it is not overwritten by the next run)."""
    path = Path(path)
    if not path.is_file():
        return ScheduleMemory()
    try:
        return ScheduleMemory.from_json(json.loads(path.read_text()))
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a cuda-agent memory file ({exc})") from None


def save_memory(memory: ScheduleMemory, path: str | Path) -> None:
    """Written to a temporary file and renamed, so a crash never leaves half a memory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(memory.to_json()))
    os.replace(tmp, path)


def remember(project_path: str | Path, memory_path: str | Path) -> MemoryEntry | None:
    """Add a finished run's near-best schedules to the memory file; None (nothing written) when the
    project measured fewer than MIN_MEASURED distinct correct schedules."""
    entry = entry_from_record(project_path, min_measured=MIN_MEASURED)
    if entry is None:
        return None
    memory = load_memory(memory_path)
    memory.add(entry)
    save_memory(memory, memory_path)
    return entry


def _similarity(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):          # descriptors of another feature layout: not comparable
        return 0.0
    return math.exp(-sum((x - y) ** 2 for x, y in zip(a, b)) / SIMILARITY_SCALE)


def descriptor(task: Any, space: Any) -> list[float]:
    """What similarity is measured on: the task's and the program's part of the state vector."""
    from .features import program_features, task_features

    return task_features(task) + program_features(space)


def measured_schedules(path: str | Path) -> tuple[Any, Any, dict[tuple, float]] | None:
    """(task, program, times) of a recorded project: its first candidate's program (the space a
    search of the record walks) and, per distinct schedule over that program's knobs (a sorted
    tuple of (knob, value)) measured correctly, its fastest median, in the record's order; None
    when the record does not start with a program."""
    from core.program import KernelProgram
    from core.project import Project

    with Project.open(path, readonly=True) as project:
        task = project.load_task()
        first = next(project.candidates(limit=1), None)
        if first is None or first.kind != "program":
            return None
        program = KernelProgram.from_json(first.program)
        times: dict[tuple, float] = {}
        for rec in project.candidates(status="measured"):
            if rec.kind != "program" or rec.median_ms is None or any(k not in rec.schedule for k in program.tunables):
                continue
            key = tuple(sorted((k, int(rec.schedule[k])) for k in program.tunables))
            times[key] = min(times.get(key, math.inf), rec.median_ms)
    return task, program, times


def entry_from_record(path: str | Path, min_measured: int = 1) -> MemoryEntry | None:
    """The near-best schedules of one recorded project (over the knobs of its first candidate's
    program, the space a search of it walks), or None when it measured fewer than `min_measured`
    distinct schedules correctly."""
    from .space import ScheduleSpace

    measured = measured_schedules(path)
    if measured is None:
        return None
    task, program, times = measured
    if not times or len(times) < min_measured:
        return None
    best = min(times.values())
    near = sorted((t, key) for key, t in times.items() if t <= best / NEAR_BEST)[:MAX_SCHEDULES]
    space = ScheduleSpace.from_program(program, task)
    return MemoryEntry(task.name, descriptor(task, space), {k: [int(v) for v in vs] for k, vs in program.tunables.items()},
                       [dict(key) for _, key in near])
