"""The one timing protocol, identical for candidates and baselines (DESIGN section 4).

Per repetition, outside the timed region: copy this repetition's input set into the live input
buffers (sets alternate, so a kernel cannot replay an answer it remembers for a pointer), poison
the outputs, then flush L2 by writing a buffer twice its size; wait for all of it. Then launch
the *gate*: a spin kernel that holds every thread slot of every SM for longer than the host needs
to launch the call (measured during warm-up), so the call's launch latency stays out of the
measurement, and nothing the candidate starts on another stream can run hidden under it.
Timed region: CUDA events around the call on the current stream. Then a third event after a
device-wide synchronise: GPU time between the end event and that one, beyond the same gap measured
for our own kernel of the same length on the timed stream, is work the candidate started
somewhere the timed stream does not see (a side stream), and is reported as stray time.
Every repetition's outputs are compared with the first, judged outputs of the same input set, so
a kernel that skips work on later calls is caught: outputs of up to 4 x COMPARE_SAMPLES elements in
full, larger ones at COMPARE_SAMPLES positions drawn at random after the call returned (the call
cannot know them; work it skipped leaves the poison, or the last set's answer, and a skipped share
of 1e-4 of the elements is seen with probability 1 - e^-6.5). A full comparison of a 1.75 GiB output
cost 1.7 ms a repetition on an H100, more than the kernel it checked.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from .compare import close_mask, poison_
from .results import stray_suspicious

Outputs = Sequence[torch.Tensor]


@dataclass
class TimerSettings:
    warmup_ms: float = 25.0         # wall time of warm-up repetitions
    min_reps: int = 20
    min_total_ms: float = 25.0      # wall time of timed repetitions (copies and flushes included)
    max_reps: int = 1000
    max_seconds: float = 20.0          # wall budget for the repetitions themselves


@dataclass
class TimedRun:
    samples_ms: list[float]
    stray_ms: float
    first_outputs: list[list[torch.Tensor]]   # per input set: the outputs of its first run (judged)
    mismatched_reps: int
    uncovered_reps: int = 0     # repetitions whose launch outlasted the gate (launch time leaked in)
    gate_us: float = 0.0        # the gate's length in the timed repetitions


# Holds every thread slot of the SM it runs on until `cycles` SM clock cycles have passed. Two
# blocks of 1024 threads fill an SM of 2048 slots, so no other kernel's block can be resident.
_GATE_SOURCE = r"""
extern "C" __global__ void __launch_bounds__(1024) ca_timer_gate(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) { __nanosleep(256); }
}
"""


class _Gate:
    """The spin kernel, launched on the current torch stream; falls back to torch.cuda._sleep
    (one thread: covers launch latency but not side streams) when CuPy cannot build it."""

    def __init__(self, device: torch.device):
        p = torch.cuda.get_device_properties(device)
        threads = int(getattr(p, "max_threads_per_multi_processor", 2048))
        self.block = min(1024, threads)
        self.grid = p.multi_processor_count * max(1, threads // self.block)
        self.kernel = None
        self.kind = "sleep"
        try:
            import cupy

            self.kernel = cupy.RawKernel(_GATE_SOURCE, "ca_timer_gate")
            self.kernel.compile()
            self.kind = "gate"
            self._cupy = cupy
        except Exception:  # no CuPy or no NVRTC: the weaker spin
            self.kernel = None

    def __call__(self, cycles: int) -> None:
        if cycles <= 0:
            return
        if self.kernel is None:
            torch.cuda._sleep(cycles)
            return
        stream = self._cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        self.kernel((self.grid,), (self.block,), (np.int64(cycles),), stream=stream)


COMPARE_SAMPLES = 1 << 16


def agrees(out: torch.Tensor, first: torch.Tensor, atol: float, rtol: float,
           positions: torch.Generator | None = None) -> bool:
    """Whether a repetition's output matches the first output of its input set (see the module's
    docstring): bitwise, or within the tolerance where atomics may round differently."""
    if out.shape != first.shape or out.dtype != first.dtype:
        return False
    if out.numel() > 4 * COMPARE_SAMPLES:
        idx = torch.randint(out.numel(), (COMPARE_SAMPLES,), device=out.device, generator=positions)
        out, first = torch.take(out, idx), torch.take(first, idx)
    return torch.equal(out, first) or bool(close_mask(out, first, atol, rtol).all())


def _bucket(value: float) -> int:
    """Lengths within about 19 % of each other share a bucket (four to an octave)."""
    return math.floor(4 * math.log2(max(value, 1e-6)))


class Timer:
    def __init__(self, device: torch.device, l2_bytes: int, settings: TimerSettings | None = None):
        self.device = device
        self.settings = settings or TimerSettings()
        # At least twice the L2 size, as int32 words.
        self.flush_buf = torch.empty(max(2 * l2_bytes, 64 << 20) // 4, dtype=torch.int32, device=device)
        self.gate: _Gate | None = None
        self.cycles_per_us = 0.0        # SM clock cycles of the gate per microsecond
        self._controls: dict[tuple[int, int], tuple[float, float]] = {}   # see _stray
        self._positions: torch.Generator | None = None   # draws the compared positions; seeded from the OS

    def flush(self) -> None:
        self.flush_buf.zero_()

    def build_gate(self) -> None:
        """Compile and load the gate. Launches nothing, so a spare does it while it starts."""
        if self.gate is None:
            self.gate = _Gate(self.device)

    def calibrate(self) -> None:
        """Measure the gate's clock rate (launches kernels: only when this runner takes over)."""
        self.build_gate()
        self.cycles_per_us = self._measure_gate()

    MIN_GATE_US = 30.0     # the gate is never shorter than this
    MAX_GATE_US = 5000.0   # nor longer: a call that takes longer to launch pays its launch time

    def _measure_gate(self) -> float:
        """Cycles of the gate per microsecond, at the clocks the GPU runs now."""
        probe = 400_000
        times = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            self.gate(probe)
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        ms = sorted(times)[2]
        return probe / (ms * 1e3) if ms > 0 else 0.0

    def _gate_cycles(self, us: float) -> int:
        return int(us * self.cycles_per_us)

    def run(
        self,
        call: Callable[[], Outputs],
        live_inputs: Sequence[torch.Tensor],
        input_sets: Sequence[Sequence[torch.Tensor]],
        *,
        poison_outputs: Callable[[], None] | None = None,
        release_outputs: bool = False,
        tolerance: tuple[float, float] = (1e-4, 1e-4),
        reps: int | None = None,
        warmup: bool = True,
        stop_on_mismatch: bool = True,
        gate_us: float | None = None,
        measure_stray: bool = True,
    ) -> TimedRun:
        """Warm up, then time `call` with the protocol above. `input_sets` alternate per repetition.

        `poison_outputs` poisons the candidate's fixed output buffers before each repetition;
        with `release_outputs`, returned outputs are poisoned after use instead, so that memory
        the allocator hands back next time holds no answer. `measure_stray=False` leaves out the
        control timing that stray time is measured against (15 runs of our own kernel as long as
        the call: 33 ms at 1 ms), for runs whose stray time nobody reads; their stray_ms is 0.
        """
        s = self.settings
        n_sets = max(1, len(input_sets))
        atol, rtol = tolerance
        first: list[list[torch.Tensor] | None] = [None] * n_sets
        if not self.cycles_per_us:
            self.calibrate()
        if self._positions is None:
            self._positions = torch.Generator(device=self.device)
            self._positions.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        positions = self._positions
        fixed_gate = gate_us
        gate_us = gate_us or self.MIN_GATE_US
        launch_us: list[float] = []     # host time from the gate's launch to the call's end event

        def one(rep: int, timed: bool):
            k = rep % n_sets
            if input_sets:
                for dst, src in zip(live_inputs, input_sets[k]):
                    dst.copy_(src)
            if poison_outputs is not None:
                poison_outputs()
            self.flush()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            done = torch.cuda.Event(enable_timing=True)
            # Our own work must be finished before the candidate is called: work it starts on
            # another stream could otherwise run hidden under the copy and the flush. The gate
            # then fills the GPU while the host launches the call.
            torch.cuda.synchronize()
            t_launch = time.perf_counter()
            self.gate(self._gate_cycles(gate_us))
            start.record()
            outs = list(call())
            end.record()
            launch_us.append((time.perf_counter() - t_launch) * 1e6)
            torch.cuda.synchronize()
            done.record()
            mismatch = False
            if first[k] is None:
                first[k] = [o.clone() for o in outs]
            else:
                mismatch = len(outs) != len(first[k]) or not all(
                    agrees(o, ref, atol, rtol, positions) for o, ref in zip(outs, first[k]))
            if release_outputs:
                for o in outs:
                    poison_(o)
            torch.cuda.synchronize()
            return start, end, done, mismatch

        # Warm-up by time (the whole protocol, so the GPU is as busy as when timed): clocks
        # ramp, caches and lazy initialisation settle.
        t0 = time.perf_counter()
        warm_reps = 0
        while warmup and ((time.perf_counter() - t0) * 1e3 < s.warmup_ms or warm_reps < 3):
            st, en, _, mismatch = one(warm_reps, False)
            warm_reps += 1
            if mismatch and stop_on_mismatch:
                return TimedRun([st.elapsed_time(en)], 0.0, [f or [] for f in first], 1)
            if time.perf_counter() - t0 > s.max_seconds:
                break
        # The gate must outlast the host's launch of the call: three times the typical launch
        # time seen in warm-up (the first, cold repetitions are left out).
        if warm_reps:
            self.cycles_per_us = self._measure_gate() or self.cycles_per_us   # clocks have ramped now
        if fixed_gate is None and launch_us:
            settled = sorted(launch_us[len(launch_us) // 2:])
            gate_us = min(self.MAX_GATE_US, max(self.MIN_GATE_US, 3.0 * settled[len(settled) // 2]))
        launch_us.clear()
        if reps is None:
            # At least min_reps repetitions and at least min_total_ms of protocol wall time.
            if warm_reps:
                per_rep_ms = (time.perf_counter() - t0) * 1e3 / warm_reps
                reps = max(s.min_reps, math.ceil(s.min_total_ms / per_rep_ms))
            else:
                reps = s.min_reps
            reps = min(reps, s.max_reps)
        # Timed repetitions keep comparing with the first outputs of each set (from the warm-up),
        # so a kernel that starts skipping work at any point is caught.
        samples, strays, mismatched = [], [], 0
        t0 = time.perf_counter()
        for r in range(reps):
            st, en, dn, mismatch = one(r, True)
            samples.append(st.elapsed_time(en))
            strays.append(en.elapsed_time(dn))
            mismatched += int(mismatch)
            if mismatch and stop_on_mismatch:
                break
            if r + 1 >= s.min_reps and time.perf_counter() - t0 > s.max_seconds:
                break
        # Stray time is the end -> done gap beyond what the same protocol shows for work of the
        # same length that certainly ran on the timed stream (host latencies vary with the wait).
        uncovered = sum(us > gate_us for us in launch_us)
        stray = 0.0
        if measure_stray:
            gaps = sorted(strays)
            samples_sorted = sorted(samples)
            stray = self._stray(gaps[len(gaps) // 2], samples_sorted[len(samples_sorted) // 2], gate_us)
        return TimedRun(samples, stray, [f or [] for f in first], mismatched, uncovered, gate_us)

    CONTROL_MAX_AGE_S = 120.0    # a kept control is measured again after this long

    def _stray(self, gap_ms: float, work_ms: float, gate_us: float) -> float:
        """Stray time: the median end -> done gap beyond the control gap for work of this length.

        The control (15 runs of our own kernel as long as the call: 33 ms at 1 ms) is kept per
        length and gate, as the smallest gap measured in the last CONTROL_MAX_AGE_S seconds. The
        smallest control makes stray time largest, so a kept one never hides work; when it makes
        a run look suspicious, the control is measured again and the fresh one decides.
        """
        key = (_bucket(work_ms), _bucket(gate_us))
        now = time.monotonic()
        kept = self._controls.get(key)
        if kept is not None and now - kept[1] > self.CONTROL_MAX_AGE_S:
            kept = None
        if kept is not None:
            stray = max(0.0, gap_ms - kept[0])
            if not stray_suspicious(stray, work_ms):
                return stray
        control = self._control_gap(work_ms, gate_us)
        self._controls[key] = (control, now) if kept is None else (min(control, kept[0]), kept[1])
        return max(0.0, gap_ms - control)

    def _control_gap(self, work_ms: float, gate_us: float, reps: int = 15) -> float:
        """Median end -> done gap when the timed work is our own kernel of `work_ms` on the timed
        stream: the host-side latency a candidate's gap is compared with."""
        gaps = []
        work_cycles = self._gate_cycles(work_ms * 1e3)
        for _ in range(reps):
            self.flush()
            torch.cuda.synchronize()
            start, end, done = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            self.gate(self._gate_cycles(gate_us))
            start.record()
            self.gate(work_cycles)
            end.record()
            torch.cuda.synchronize()
            done.record()
            torch.cuda.synchronize()
            gaps.append(end.elapsed_time(done))
        gaps.sort()
        return gaps[len(gaps) // 2]
