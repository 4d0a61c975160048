"""How well the memory's votes alone rank a task's schedules (no policy; CPU only).

    PYTHONPATH=. python scripts/memory_ranking.py RECORDS_DIR [--scales 0.05 0.2 1]

With `cuda-agent train`'s split of the records: each task's measured schedules are ranked by
memory.vote_score under the votes of the training tasks (for a training task, of the other
training tasks only), and the script prints where the first schedule within 97 % of the record's
best comes in that ranking. The mean log rank over the training tasks is what chose
memory.SIMILARITY_SCALE (docs/search.md, "Memory"); the held-out ranks are printed beside it.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from core.search import memory as memory_module
from core.search.memory import ScheduleMemory, entry_from_record, measured_schedules, vote_score
from core.search.training import describe_records, split_records


def measured_times(path: Path) -> dict[tuple, float]:
    measured = measured_schedules(path)
    return measured[2] if measured is not None else {}


def first_hit_rank(memory: ScheduleMemory, entry, times: dict[tuple, float], exclude: set[str]) -> int:
    votes = memory.votes(entry.descriptor, entry.knobs, exclude=exclude)
    best = min(times.values())
    ranked = sorted(times, key=lambda key: -vote_score(votes, dict(key)))
    return next(i + 1 for i, key in enumerate(ranked) if times[key] <= best / memory_module.NEAR_BEST)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("records")
    ap.add_argument("--scales", nargs="+", type=float, default=[memory_module.SIMILARITY_SCALE])
    args = ap.parse_args()
    training, held = split_records(describe_records(sorted(Path(args.records).glob("*.cuagent"))))
    entries = {r.task: entry_from_record(r.path) for r in training + held}
    times = {r.task: measured_times(r.path) for r in training + held}
    memory = ScheduleMemory([entries[r.task] for r in training])
    for scale in args.scales:
        memory_module.SIMILARITY_SCALE = scale
        train_ranks = [first_hit_rank(memory, entries[r.task], times[r.task], {r.task}) for r in training]
        held_ranks = [first_hit_rank(memory, entries[r.task], times[r.task], set()) for r in held]
        mean_log = sum(math.log(r) for r in train_ranks) / len(train_ranks)
        print(f"scale {scale:g}: training mean log rank {mean_log:.3f} (ranks {train_ranks}); "
              f"held out ({', '.join(r.task for r in held)}): {held_ranks}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
