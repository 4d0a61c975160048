"""Stands in for the optimiser loop in project-file tests: realistic candidates, written one by one.

    python -m tests.support.project_writer PROJECT COUNT [--delay SECONDS]

Opens an existing project, starts a run, and for each candidate adds it queued, records its
verdict, and only then prints its id (flushed): a printed id is a committed, evaluated candidate.
Prints "run N" first and "done" after a clean stop.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import random
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from core.evaluation.results import KernelStats, Measurement, Timing
from core.program import KernelProgram
from core.project import CandidateRecord, Project

PROGRAMS = Path(__file__).resolve().parents[2] / "resources" / "programs"


@lru_cache(maxsize=1)
def program_variants() -> list[KernelProgram]:
    """Every schedule of every example program (each knob over its declared values)."""
    variants = []
    for path in sorted(PROGRAMS.glob("*.json")):
        base = KernelProgram.load(path)
        names = sorted(base.tunables)
        for values in itertools.product(*(base.tunables[n] for n in names)):
            variants.append(base.with_schedule(dict(zip(names, values))))
    return variants


def _measurement(rng: random.Random, program: KernelProgram) -> Measurement:
    median = rng.uniform(0.02, 2.0)
    samples = sorted(median * rng.uniform(0.97, 1.06) for _ in range(25))
    eager, compiled = median * rng.uniform(0.8, 3.0), median * rng.uniform(0.7, 2.0)
    floor = median * rng.uniform(0.3, 0.95)
    block = int(program.schedule.get("BLOCK", 256))
    kernels = [KernelStats(name=k, registers=rng.randint(16, 96), static_shared_bytes=rng.choice([0, 1024, 4096]),
                           dynamic_shared_bytes=0, local_bytes=0, spill_stores=0, spill_loads=0,
                           block_threads=block, occupancy=rng.uniform(0.3, 1.0)) for k in program.kernel_names()]
    return Measurement(
        timing=Timing.from_samples(samples), eager_ms=eager, compile_ms=compiled, speedup_eager=eager / median,
        speedup_compile=compiled / median, min_bytes=rng.randint(1 << 20, 1 << 30), flops=rng.randint(0, 1 << 32),
        gbps=rng.uniform(500, 4000), tflops=rng.uniform(0.1, 50), floor_ms=floor, roofline_fraction=floor / median,
        below_floor=False, kernels=kernels,
        notes=["time re-measured interleaved with the baselines before it was accepted as a new best",
               f"checked on 3 fresh input sets and 2 scaled variants; max relative error {rng.uniform(0, 1e-5):.2e}"])


def make_records(count: int, seed: int = 0, branch_ids: tuple[int, ...] = (1,)) -> Iterator[CandidateRecord]:
    """Evaluated candidates with real programs and Measurement-shaped results (~1 KB each)."""
    rng = random.Random(seed)
    variants = program_variants()
    outcomes = ["measured"] * 12 + ["wrong"] * 3 + ["compile_error"] * 3 + ["crashed", "timeout", "rejected"]
    for i in range(count):
        program = rng.choice(variants)
        rec = CandidateRecord.from_program(program, branch_id=branch_ids[i % len(branch_ids)],
                                           origin=f"ppo:set BLOCK={program.schedule.get('BLOCK', '-')}")
        rec.status = rng.choice(outcomes)
        if rec.status == "measured":
            m = _measurement(rng, program)
            rec.measurement = dataclasses.asdict(m)
            rec.reward = math.log(m.speedup_eager) + (1.0 if m.speedup_compile > 1.05 else 0.0)
        else:
            rec.reason = {"wrong": "output 0 differs: max abs error 3.1e-02 at [17, 4] (atol 1e-04, rtol 1e-04)",
                          "compile_error": "line 12: error: identifier \"BLOCKK\" is undefined",
                          "crashed": "CUDA error: an illegal memory access was encountered",
                          "timeout": "the check took longer than 30 s; the process was killed",
                          "rejected": "calls PyTorch: aten::add.Tensor ran during the launch plan"}[rec.status]
            rec.reward = -1.0
            if rec.status == "compile_error":
                rec.extra = {"compile_log": "kernel.cu(12): error: identifier \"BLOCKK\" is undefined\n"}
        rec.evaluated_at = rec.created_at = f"2026-11-30T10:{(i // 60) % 60:02d}:{i % 60:02d}.000+00:00"
        yield rec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("project")
    parser.add_argument("count", type=int)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    project = Project.open(args.project)
    run = project.run_started(meta={"policy": "test-writer"})
    print(f"run {run.id}", flush=True)
    parent = None
    for rec in make_records(args.count, args.seed):
        queued = dataclasses.replace(rec, status="queued", reason="", measurement=None, reward=None,
                                     evaluated_at=None, extra={}, parent_id=parent)
        cid = project.add_candidate(queued)            # proposed: committed
        project.update_candidate(cid, status=rec.status, reason=rec.reason, measurement=rec.measurement,
                                 reward=rec.reward, extra=rec.extra)   # evaluated: committed
        print(cid, flush=True)
        parent = cid
        if args.delay:
            time.sleep(args.delay)
    project.run_stopped()
    project.close()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
