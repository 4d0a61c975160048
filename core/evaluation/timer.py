"""The one timing protocol, identical for candidates and baselines (DESIGN section 4).

Per repetition, outside the timed region: copy this repetition's input set into the live input
buffers (sets alternate, so a kernel cannot replay an answer it remembers for a pointer), poison
the outputs, then flush L2 by writing a buffer twice its size; wait for all of it, then spin
30 us on the GPU so that the call's launch latency stays out of the measurement. Timed region:
CUDA events around the call on the current stream. Then a third event after a device-wide synchronise: GPU time
between the end event and that one, beyond the calibrated latency, is work the candidate started
somewhere the timed stream does not see (a side stream), and is reported as stray time.
Every repetition's outputs are compared with the first, judged outputs of the same input set, so
a kernel that skips work on later calls is caught.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .compare import close_mask, poison_

Outputs = Sequence[torch.Tensor]


@dataclass
class TimerSettings:
    warmup_ms: float = 25.0         # wall time of warm-up repetitions
    min_reps: int = 20
    min_total_ms: float = 100.0     # wall time of timed repetitions (copies and flushes included)
    max_reps: int = 1000
    max_seconds: float = 20.0          # wall budget for the repetitions themselves


@dataclass
class TimedRun:
    samples_ms: list[float]
    stray_ms: float
    first_outputs: list[list[torch.Tensor]]   # per input set: the outputs of its first run (judged)
    mismatched_reps: int


class Timer:
    def __init__(self, device: torch.device, l2_bytes: int, settings: TimerSettings | None = None):
        self.device = device
        self.settings = settings or TimerSettings()
        # At least twice the L2 size, as int32 words.
        self.flush_buf = torch.empty(max(2 * l2_bytes, 64 << 20) // 4, dtype=torch.int32, device=device)
        self.sync_latency_ms = 0.0
        self.lead_cycles = 0            # GPU clock cycles of the spin before each timed call

    def flush(self) -> None:
        self.flush_buf.zero_()

    def calibrate(self) -> float:
        """GPU-side latency of 'end event -> device sync -> next event' with no work in flight."""
        ends, dones = [], []
        for _ in range(30):
            self.flush()
            e, d = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e.record()
            torch.cuda.synchronize()
            d.record()
            torch.cuda.synchronize()
            ends.append(e)
            dones.append(d)
        gaps = sorted(e.elapsed_time(d) for e, d in zip(ends, dones))
        self.sync_latency_ms = gaps[len(gaps) // 2]
        self.lead_cycles = self._cycles_for(self.LEAD_US)
        return self.sync_latency_ms

    LEAD_US = 30.0   # longer than the host needs to launch a call; the most a side stream can hide

    @staticmethod
    def _cycles_for(us: float) -> int:
        """Cycles of torch.cuda._sleep that last about `us` microseconds on this GPU (0: no spin)."""
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is None:
            return 0
        probe = 200_000
        times = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            sleep(probe)
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        ms = sorted(times)[2]
        return int(probe * (us / 1e3) / ms) if ms > 0 else 0

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
    ) -> TimedRun:
        """Warm up, then time `call` with the protocol above. `input_sets` alternate per repetition.

        `poison_outputs` poisons the candidate's fixed output buffers before each repetition;
        with `release_outputs`, returned outputs are poisoned after use instead, so that memory
        the allocator hands back next time holds no answer.
        """
        s = self.settings
        n_sets = max(1, len(input_sets))
        atol, rtol = tolerance
        first: list[list[torch.Tensor] | None] = [None] * n_sets

        def one(rep: int, timed: bool):
            k = rep % n_sets
            if input_sets:
                for dst, src in zip(live_inputs, input_sets[k]):
                    dst.copy_(src)
            if poison_outputs is not None:
                poison_outputs()
            self.flush()
            # Our own work must be finished before the candidate is called: work it starts on
            # another stream could otherwise run hidden under the copy and the flush. A short
            # spin on our stream then keeps the call's launch latency out of the timed region,
            # and bounds what a side stream could hide to that spin.
            torch.cuda.synchronize()
            if self.lead_cycles:
                torch.cuda._sleep(self.lead_cycles)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            done = torch.cuda.Event(enable_timing=True)
            start.record()
            outs = list(call())
            end.record()
            torch.cuda.synchronize()
            done.record()
            mismatch = False
            if first[k] is None:
                first[k] = [o.clone() for o in outs]
            else:
                for o, ref in zip(outs, first[k]):
                    # Bitwise equality is the common case and costs one read; kernels with
                    # atomics may differ in rounding, so fall back to the tolerance.
                    if not torch.equal(o, ref) and not bool(close_mask(o, ref, atol, rtol).all()):
                        mismatch = True
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
            strays.append(max(0.0, en.elapsed_time(dn) - self.sync_latency_ms))
            mismatched += int(mismatch)
            if mismatch and stop_on_mismatch:
                break
            if r + 1 >= s.min_reps and time.perf_counter() - t0 > s.max_seconds:
                break
        strays.sort()
        return TimedRun(samples, strays[len(strays) // 2], [f or [] for f in first], mismatched)
