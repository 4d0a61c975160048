"""Spread evaluations over every visible GPU and compare with one GPU.

    PYTHONPATH=. python bench/pool_check.py [--n 8]
"""
from __future__ import annotations

import argparse
import collections
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.evaluation import Evaluator  # noqa: E402
from core.evaluation.pool import visible_devices  # noqa: E402
from core.program import load_solution  # noqa: E402
from core.tasks import load_task  # noqa: E402


def run(devices: list[int], n: int) -> tuple[float, collections.Counter, list[str]]:
    task = load_task(ROOT / "resources" / "tasks" / "act_gelu.py")
    program = load_solution(ROOT / "resources" / "programs" / "act_gelu.json")
    with Evaluator(task, devices) as ev:
        ev.start()
        ev.evaluate(program, with_baselines=False)        # compile once, load the module on one GPU
        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(devices)) as ex:
            results = list(ex.map(lambda _: ev.evaluate(program, with_baselines=False), range(n)))
        wall = time.perf_counter() - t0
    used = collections.Counter(r.details.get("device") for r in results)
    statuses = [r.status.value for r in results]
    return wall, used, statuses


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8)
    args = ap.parse_args()
    devices = visible_devices()
    print(f"visible GPUs: {devices}")
    one = run(devices[:1], args.n)
    print(f"1 GPU : {args.n} evaluations in {one[0]:.2f} s, per device {dict(one[1])}, {set(one[2])}")
    if len(devices) > 1:
        many = run(devices, args.n)
        print(f"{len(devices)} GPUs: {args.n} evaluations in {many[0]:.2f} s, per device {dict(many[1])}, {set(many[2])}")
        print(f"speed-up {one[0] / many[0]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
