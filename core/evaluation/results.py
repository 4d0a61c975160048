"""Plain data that leaves the evaluator: statuses, measurements, results."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    """Final state of one evaluated candidate (DESIGN section 3)."""

    MEASURED = "measured"
    COMPILE_ERROR = "compile_error"
    WRONG = "wrong"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    REJECTED = "rejected"


@dataclass
class Timing:
    """Robust summary of repeated timings, in milliseconds."""

    median_ms: float
    min_ms: float
    max_ms: float
    q1_ms: float
    q3_ms: float
    reps: int

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return (self.q3_ms - self.q1_ms) / self.median_ms if self.median_ms > 0 else 0.0

    @classmethod
    def from_samples(cls, samples_ms: list[float]) -> "Timing":
        if not samples_ms:
            raise ValueError("no timing samples")
        s = sorted(samples_ms)
        n = len(s)

        def quantile(q: float) -> float:
            pos = q * (n - 1)
            lo = int(pos)
            hi = min(lo + 1, n - 1)
            return s[lo] + (s[hi] - s[lo]) * (pos - lo)

        return cls(quantile(0.5), s[0], s[-1], quantile(0.25), quantile(0.75), n)


@dataclass
class KernelStats:
    """Resources of one compiled kernel, read from the loaded cubin and ptxas."""

    name: str
    registers: int
    static_shared_bytes: int
    dynamic_shared_bytes: int
    local_bytes: int
    spill_stores: int | None = None
    spill_loads: int | None = None
    block_threads: int = 0
    occupancy: float | None = None


@dataclass
class Measurement:
    """What the timer and the roofline say about a correct candidate."""

    timing: Timing
    eager_ms: float | None = None
    compile_ms: float | None = None
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    min_bytes: int = 0
    flops: int = 0
    gbps: float | None = None
    tflops: float | None = None
    floor_ms: float | None = None
    roofline_fraction: float | None = None   # floor / measured time; 1.0 = at the floor
    below_floor: bool = False                # faster than the floor: flagged, re-verified
    kernels: list[KernelStats] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return self.timing.median_ms


@dataclass
class EvalResult:
    """The verdict on one candidate. `reason` says why when it is not measured."""

    status: Status
    reason: str = ""
    measurement: Measurement | None = None
    compile_log: str = ""
    compile_seconds: float = 0.0
    compile_cached: bool = False
    eval_seconds: float = 0.0
    candidate_hash: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status is Status.MEASURED

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d


def stray_suspicious(stray_ms: float, median_ms: float) -> bool:
    """Work outside the timed stream: more than 10 us and more than a fifth of the median time."""
    return stray_ms > max(0.01, 0.2 * median_ms)
