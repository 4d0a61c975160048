"""CPU tests of how the runner answers a request that runs out of GPU memory: served once more
lean, and only then blamed on the candidate (or on the evaluator, when its own copies did not fit);
outputs that find no room on the GPU go to the judge through files."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from core.evaluation.channel import IpcExporter, is_out_of_memory, read_output, write_output
from core.evaluation.protocol import TensorFile
from core.evaluation.runner import CandidateFailure, CandidateOutOfMemory, Runner, serve
from core.evaluation.results import Status


class _NoProfiler:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


class _Exporter(IpcExporter):
    """The real pooling, over a fake allocator (the real one is CuPy's cudaMalloc / cudaFree)."""

    def __init__(self, pool_bytes: int = 0, room: int | None = None):
        super().__init__(pool_bytes)
        self.room = room                 # device bytes the fake GPU has; None: unlimited
        self.live: dict[int, int] = {}   # pointer -> bytes allocated
        self.next_ptr, self.mallocs, self.frees = 1 << 20, 0, 0

    def _malloc(self, nbytes: int) -> int:
        if self.room is not None and sum(self.live.values()) + nbytes > self.room:
            raise RuntimeError("cudaErrorMemoryAllocation: out of memory")
        ptr, self.next_ptr = self.next_ptr, self.next_ptr + nbytes
        self.live[ptr] = nbytes
        self.mallocs += 1
        return ptr

    def _free(self, ptr: int) -> None:
        del self.live[ptr]
        self.frees += 1


def _runner() -> Runner:
    """A Runner with no GPU behind it: enough for serve() and go_lean()."""
    runner = Runner.__new__(Runner)
    runner.emptied = 0

    def empty_cache() -> None:
        runner.emptied += 1

    runner.torch = SimpleNamespace(OutOfMemoryError=torch.OutOfMemoryError,
                                   cuda=SimpleNamespace(synchronize=lambda: None, empty_cache=empty_cache))
    runner.exporter = _Exporter()
    runner.lean = False
    return runner


def _failing(times: int, exc: BaseException):
    calls = []

    def handler(msg):
        calls.append(msg)
        if len(calls) <= times:
            raise exc
        return ("reply", msg)

    return handler, calls


@pytest.mark.parametrize("exc", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.50 GiB"),
                                 CandidateOutOfMemory("buffer 'out' (3.5 GiB) does not fit")])
def test_a_request_that_runs_out_of_memory_once_is_served_again_lean(exc):
    runner = _runner()
    handler, calls = _failing(1, exc)
    assert serve(runner, _NoProfiler(), handler, "msg") == ("reply", "msg")
    assert len(calls) == 2
    assert runner.lean and runner.exporter.files_only
    assert runner.emptied == 2             # once going lean, once after the lean request


def test_a_lean_runner_empties_the_cache_after_every_request_and_does_not_retry():
    runner = _runner()
    runner.go_lean()
    handler, calls = _failing(0, None)
    serve(runner, _NoProfiler(), handler, 1)
    serve(runner, _NoProfiler(), handler, 2)
    assert runner.emptied == 3
    handler, calls = _failing(5, CandidateOutOfMemory("x"))
    with pytest.raises(CandidateOutOfMemory):
        serve(runner, _NoProfiler(), handler, 3)
    assert len(calls) == 1


@pytest.mark.parametrize("exc", [torch.OutOfMemoryError("CUDA out of memory"), CandidateOutOfMemory("x")])
def test_a_second_shortage_is_raised_to_the_caller(exc):
    runner = _runner()
    handler, calls = _failing(2, exc)
    with pytest.raises(type(exc)):
        serve(runner, _NoProfiler(), handler, "msg")
    assert len(calls) == 2


def test_other_failures_are_not_retried_and_leave_the_runner_as_it_was():
    runner = _runner()
    handler, calls = _failing(1, CandidateFailure(Status.WRONG, "wrong"))
    with pytest.raises(CandidateFailure):
        serve(runner, _NoProfiler(), handler, "msg")
    assert len(calls) == 1 and not runner.lean and runner.emptied == 0


def test_candidate_out_of_memory_is_a_rejection_named_oversized_allocation():
    exc = CandidateOutOfMemory("ModelNew.forward: OutOfMemoryError")
    assert exc.status is Status.REJECTED and exc.reason.startswith("oversized allocation: ModelNew.forward")
    assert isinstance(exc, CandidateFailure)


def test_blocks_that_held_the_pool_back_are_freed_and_the_request_served_again_before_going_lean():
    runner = _runner()
    runner.exporter = _Exporter(pool_bytes=100)
    runner.exporter.take_block(60)
    handler, calls = _failing(1, torch.OutOfMemoryError("CUDA out of memory"))
    assert serve(runner, _NoProfiler(), handler, "msg") == ("reply", "msg")
    assert len(calls) == 2 and not runner.lean          # freeing the kept block was enough
    assert runner.exporter.live == {} and runner.exporter.pool_bytes == 0    # none kept for this task again


# ---- handing outputs over ----------------------------------------------------------------------

def test_hand_over_blocks_are_kept_for_the_next_requests_within_the_budget():
    ex = _Exporter(pool_bytes=250)
    first = [ex.take_block(100) for _ in range(3)]
    ex.release()                                   # the next request: two kept, one over the budget freed
    assert ex.pooled_bytes == 200 and ex.frees == 1
    again = [ex.take_block(100) for _ in range(2)]
    assert set(again) <= set(first) and ex.mallocs == 3    # the kept blocks, no new allocation
    other = ex.take_block(40)                      # another size never gets a kept block of 100 bytes
    assert other not in first and ex.mallocs == 4
    ex.release()
    assert ex.pooled_bytes == 240 and len(ex.live) == 3
    assert ex.trim() == 240 and ex.live == {} and ex.pool == {}


def test_kept_blocks_make_room_when_a_new_block_does_not_fit_and_a_lean_exporter_keeps_none():
    ex = _Exporter(pool_bytes=1000, room=300)
    for _ in range(2):
        ex.take_block(100)
    ex.release()
    ptr = ex.take_block(250)                       # does not fit beside the two kept blocks: they go
    assert ex.pool == {} and ex.live == {ptr: 250}
    ex.files_only = True
    ex.release()
    assert ex.live == {} and ex.pooled_bytes == 0
    ex = _Exporter(pool_bytes=1000, room=50)
    with pytest.raises(RuntimeError, match="out of memory"):
        ex.take_block(60)                          # nothing kept to free: the shortage is raised
    assert ex.blocks == []



class _RaisingExporter(IpcExporter):
    def __init__(self, exc: BaseException):
        super().__init__()
        self.exc, self.calls = exc, 0

    def export(self, tensor):
        self.calls += 1
        raise self.exc


def test_an_output_with_no_room_on_the_gpu_goes_through_a_file_and_ipc_stays_on(tmp_path):
    exporter = _RaisingExporter(RuntimeError("cudaErrorMemoryAllocation: out of memory"))
    out = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    ref = write_output(tmp_path, exporter, out, "t0o0")
    assert isinstance(ref, TensorFile) and exporter.broken is None
    assert torch.equal(read_output(ref, "cpu"), out)
    write_output(tmp_path, exporter, out, "t1o0")
    assert exporter.calls == 2             # the next output tries IPC again


def test_an_ipc_failure_of_another_kind_turns_ipc_off(tmp_path):
    exporter = _RaisingExporter(RuntimeError("cudaErrorNotSupported: operation not supported"))
    write_output(tmp_path, exporter, torch.ones(3), "a")
    write_output(tmp_path, exporter, torch.ones(3), "b")
    assert exporter.broken and exporter.calls == 1


def test_a_lean_exporter_uses_files_only(tmp_path):
    exporter = _RaisingExporter(AssertionError("export must not be called"))
    exporter.files_only = True
    assert isinstance(write_output(tmp_path, exporter, torch.ones(3), "a"), TensorFile)
    assert exporter.calls == 0


@pytest.mark.parametrize("exc, expected", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), True),
    (RuntimeError("cudaErrorMemoryAllocation: out of memory"), True),
    (RuntimeError("CUDA_ERROR_OUT_OF_MEMORY"), True),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
    (ValueError("bad shape"), False),
])
def test_is_out_of_memory(exc, expected):
    assert is_out_of_memory(exc) is expected
