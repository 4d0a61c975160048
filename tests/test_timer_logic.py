"""The timing protocol's bookkeeping, on a simulated GPU timeline (no GPU needed).

The simulation is a test double for torch.cuda's events and synchronise: one timed stream, one
side stream, a host clock, and a host wake-up latency that grows with how long the host waited
(the effect that made a legitimate 70 us kernel look like side-stream work on the H200). The
protocol itself (gate length, stray time, uncovered launches) is the real code in
core/evaluation/timer.py; tests/gpu/test_evaluator_gpu.py checks it on a real GPU.
"""
from __future__ import annotations

import pytest
import torch

from core.evaluation import timer as timer_mod
from core.evaluation.results import stray_suspicious
from core.evaluation.timer import Timer, TimerSettings


class SimGpu:
    """Times in milliseconds. Work on the timed stream runs in order; side-stream work cannot
    start before the gate (which fills the GPU) has ended."""

    def __init__(self, wake_latency_per_ms: float = 0.2, base_latency_ms: float = 0.004):
        self.host = 0.0
        self.tail = 0.0          # when the timed stream's queued work ends
        self.side_tail = 0.0
        self.gate_end = 0.0
        self.wake = wake_latency_per_ms
        self.base = base_latency_ms

    def launch(self, duration_ms: float, host_cost_ms: float = 0.005) -> None:
        self.host += host_cost_ms
        self.tail = max(self.tail, self.host) + duration_ms

    def launch_side(self, duration_ms: float, host_cost_ms: float = 0.005) -> None:
        self.host += host_cost_ms
        self.side_tail = max(self.side_tail, self.host, self.gate_end) + duration_ms

    def synchronize(self) -> None:
        busy_until = max(self.tail, self.side_tail)
        waited = max(0.0, busy_until - self.host)
        self.host = max(self.host, busy_until) + self.base + self.wake * waited
        self.tail = max(self.tail, self.host)

    def perf_counter(self) -> float:
        return self.host / 1e3


class SimEvent:
    sim: SimGpu

    def __init__(self, enable_timing: bool = True):
        self.t = None

    def record(self) -> None:
        self.sim.host += 0.002
        self.t = max(self.sim.tail, self.sim.host)
        self.sim.tail = self.t

    def query(self) -> bool:
        return self.sim.tail <= self.sim.host

    def elapsed_time(self, other: "SimEvent") -> float:
        return other.t - self.t


class SimGate:
    kind = "sim"

    def __init__(self, sim: SimGpu):
        self.sim = sim

    def __call__(self, cycles: int) -> None:
        if cycles > 0:
            self.sim.launch(cycles / 1000.0 / 1e3)   # 1000 cycles per us
            self.sim.gate_end = self.sim.tail


@pytest.fixture
def sim(monkeypatch):
    gpu = SimGpu()
    SimEvent.sim = gpu
    monkeypatch.setattr(timer_mod.torch.cuda, "Event", SimEvent)
    monkeypatch.setattr(timer_mod.torch.cuda, "synchronize", gpu.synchronize)
    monkeypatch.setattr(timer_mod.time, "perf_counter", gpu.perf_counter)
    return gpu


def _timer(sim: SimGpu) -> Timer:
    t = Timer(torch.device("cpu"), 1 << 20, TimerSettings(warmup_ms=5.0, min_reps=20, min_total_ms=10.0))
    t.flush = lambda: sim.launch(0.025)       # the L2 flush: 25 us of our own work
    t.gate = SimGate(sim)
    t.cycles_per_us = 1000.0
    t._measure_gate = lambda: 1000.0
    return t


def _run(t: Timer, call):
    x = torch.ones(4)
    return t.run(call, [x.clone()], [[x], [x * 2]])


def test_a_legitimate_kernel_shows_no_stray_time_even_when_waiting_costs_latency(sim):
    t = _timer(sim)
    out = torch.zeros(4)

    def call():
        sim.launch(0.070, host_cost_ms=0.040)   # a 70 us kernel that takes 40 us to launch
        return [out]

    run = _run(t, call)
    assert run.samples_ms and all(abs(s - 0.070) < 1e-9 for s in run.samples_ms)  # launch time stays out
    assert run.stray_ms < 0.002, run.stray_ms
    assert run.uncovered_reps == 0
    assert 3 * 0.040 <= run.gate_us * 1e-3 + 1e-9     # the gate is three launch times long


def test_side_stream_work_is_reported_as_stray_time(sim):
    t = _timer(sim)
    out = torch.zeros(4)

    def call():
        sim.launch_side(0.200)                   # all the work on a private stream
        return [out]

    run = _run(t, call)
    assert max(run.samples_ms) < 0.01            # the timed stream saw (almost) nothing ...
    assert run.stray_ms > 0.15, run.stray_ms     # ... and the work after it is reported


def test_a_launch_longer_than_the_fixed_gate_is_counted_as_uncovered(sim):
    t = _timer(sim)
    out = torch.zeros(4)

    def call():
        sim.launch(0.050, host_cost_ms=0.100)   # 100 us to launch, gate fixed at 30 us
        return [out]

    x = torch.ones(4)
    run = t.run(call, [x.clone()], [[x]], gate_us=30.0)
    assert run.uncovered_reps == len(run.samples_ms)
    assert min(run.samples_ms) > 0.050           # the launch time leaked into the samples


def test_runs_that_need_no_stray_time_skip_the_control_timing(sim):
    t = _timer(sim)
    out = torch.zeros(4)
    controls = []
    real = t._control_gap
    t._control_gap = lambda *a, **k: controls.append(a) or real(*a, **k)

    def call():
        sim.launch_side(0.200)                   # stray work: visible only when it is measured
        return [out]

    x = torch.ones(4)
    quick = t.run(call, [x.clone()], [[x]], reps=2, warmup=False, gate_us=30.0, measure_stray=False)
    assert not controls and quick.stray_ms == 0.0 and len(quick.samples_ms) == 2
    full = t.run(call, [x.clone()], [[x]], reps=2, warmup=False, gate_us=30.0)
    assert len(controls) == 1 and full.stray_ms > 0.15


@pytest.mark.parametrize("skipped", [1e-3, 1.0])
def test_a_large_output_that_skips_work_on_later_calls_is_caught_at_sampled_positions(sim, skipped):
    """Outputs beyond 4 x COMPARE_SAMPLES elements are compared at random positions drawn after each
    call: a kernel that leaves 0.1 % of its output unwritten (the poison stays) from its third call
    on is still caught."""
    t = _timer(sim)
    n = 8 * timer_mod.COMPARE_SAMPLES
    x = torch.rand(n)
    out = torch.empty(n)
    calls = []

    def call():
        calls.append(1)
        sim.launch(0.070)
        out.copy_(x * 3)
        if len(calls) > 2:
            out[: int(skipped * n)] = float("nan")      # work skipped on later calls
        return [out]

    run = t.run(call, [x], [[x.clone()]], poison_outputs=lambda: out.fill_(float("nan")))
    assert run.mismatched_reps == 1


def test_agrees_compares_small_outputs_in_full_and_large_ones_at_sampled_positions():
    from core.evaluation.timer import COMPARE_SAMPLES, agrees

    small = torch.rand(1000)
    changed = small.clone()
    changed[999] += 1.0
    assert agrees(small, small.clone(), 1e-4, 1e-4) and not agrees(changed, small, 1e-4, 1e-4)
    assert agrees(small + 1e-7, small, 1e-4, 1e-4)              # rounding of atomics: within tolerance
    assert not agrees(small[:999], small[:999].double(), 1e-4, 1e-4)   # another dtype
    assert not agrees(small[:10], small[:20], 1e-4, 1e-4)       # another shape
    big = torch.rand(8 * COMPARE_SAMPLES)
    half_wrong = big.clone()
    half_wrong[::2] = float("nan")
    rng = torch.Generator().manual_seed(0)
    assert agrees(big, big.clone(), 1e-4, 1e-4, rng) and not agrees(half_wrong, big, 1e-4, 1e-4, rng)
    # Non-contiguous outputs are read in their logical order.
    grid = torch.rand(512, 2048)
    assert agrees(grid.t(), grid.t().contiguous(), 1e-4, 1e-4, rng)


def _count_controls(t: Timer) -> list:
    controls = []
    real = t._control_gap
    t._control_gap = lambda *a, **k: controls.append(a) or real(*a, **k)
    return controls


def _kernel(sim: SimGpu, timed_ms: float, side_ms: float = 0.0):
    out = torch.zeros(4)

    def call():
        sim.launch(timed_ms, host_cost_ms=0.040)
        if side_ms:
            sim.launch_side(side_ms)
        return [out]
    return call


def test_the_control_gap_is_kept_for_work_of_the_same_length(sim):
    t = _timer(sim)
    controls = _count_controls(t)
    first = _run(t, _kernel(sim, 0.070))
    second = _run(t, _kernel(sim, 0.072))
    assert len(controls) == 1                          # the second run used the kept control
    assert first.stray_ms < 0.002 and second.stray_ms < 0.002
    _run(t, _kernel(sim, 0.300))
    assert len(controls) == 2                          # work of another length gets its own


def test_a_kept_control_never_hides_side_stream_work(sim):
    t = _timer(sim)
    controls = _count_controls(t)
    _run(t, _kernel(sim, 0.070))
    cheat = _run(t, _kernel(sim, 0.070, side_ms=0.200))   # same timed length, plus hidden work
    assert cheat.stray_ms > 0.12 and stray_suspicious(cheat.stray_ms, 0.070), cheat.stray_ms  # 0.2 - 0.07 overlap
    assert len(controls) == 2                  # the kept control flagged it; a fresh one confirmed


def test_a_fresh_control_decides_when_the_kept_one_flags_a_run(sim):
    t = _timer(sim)
    controls = _count_controls(t)
    _run(t, _kernel(sim, 0.070))
    for key, (_, when) in list(t._controls.items()):
        t._controls[key] = (0.0, when)             # a kept control far below this host's latency
    honest = _run(t, _kernel(sim, 0.070))
    assert len(controls) == 2 and honest.stray_ms < 0.002


def test_a_kept_control_is_measured_again_when_it_is_old(sim, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(timer_mod.time, "monotonic", lambda: clock[0])
    t = _timer(sim)
    controls = _count_controls(t)
    _run(t, _kernel(sim, 0.070))
    clock[0] += Timer.CONTROL_MAX_AGE_S / 2
    _run(t, _kernel(sim, 0.070))
    assert len(controls) == 1
    clock[0] += Timer.CONTROL_MAX_AGE_S
    _run(t, _kernel(sim, 0.070))
    assert len(controls) == 2
