"""The local pool spreads candidates over GPUs (fake workers stand in for the GPU processes)."""
from __future__ import annotations

import threading
import time

import pytest

from core.evaluation import protocol as P
from core.evaluation.pool import LocalPool
from core.evaluation.results import Status
from core.evaluation.supervisor import SupervisorSettings
from tests.support.fake_workers import fake_judge_main, fake_runner_main


def make_pool(devices):
    s = SupervisorSettings(check_timeout_s=5.0, time_timeout_s=5.0, startup_timeout_s=60)
    return LocalPool("task", "source", devices, s, runner_target=fake_runner_main, judge_target=fake_judge_main)


def test_two_gpus_evaluate_side_by_side():
    pool = make_pool([0, 1])
    try:
        assert [s.device_index for s in pool.supervisors] == [0, 1]
        results: dict[int, tuple[int, Status]] = {}

        def work(i: int) -> None:
            with pool.acquire() as sup:
                out = sup.evaluate(P.ProgramArtifact({"behaviour": "slow"}, b"", f"slow{i}"))
                results[i] = (sup.device_index, out.status)

        t0 = time.monotonic()
        threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        assert {d for d, _ in results.values()} == {0, 1}
        assert all(status is Status.MEASURED for _, status in results.values())
        # each evaluation sleeps 1 s in check and 1 s in timing: 2 s side by side, 4 s in turn
        assert elapsed < 3.5, f"the two slow evaluations did not overlap ({elapsed:.2f} s)"
    finally:
        pool.close()


def test_one_gpu_serialises_evaluations():
    pool = make_pool([0])
    try:
        order = []

        def work(i: int) -> None:
            with pool.acquire() as sup:
                order.append(("start", i))
                sup.evaluate(P.ProgramArtifact({"behaviour": "slow"}, b"", f"s{i}"))
                order.append(("end", i))

        threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [kind for kind, _ in order] == ["start", "end", "start", "end"]
    finally:
        pool.close()


def test_empty_device_list_is_refused():
    with pytest.raises(ValueError, match="at least one GPU"):
        LocalPool("task", "source", [])
