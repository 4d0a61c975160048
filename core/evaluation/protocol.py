"""Messages between the supervisor and its evaluator processes (pickled over pipes).

Only small plain data travels here; tensors travel as TensorFile references (channel.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any



@dataclass(frozen=True)
class TensorFile:
    """A tensor's bytes in a file (see channel.py): enough for another process to map it."""

    path: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n



@dataclass(frozen=True)
class GpuTensorRef:
    """A copy of a tensor in a dedicated device allocation of the runner, shared by CUDA IPC.

    The runner copies each output into its own cudaMalloc block (so the handle exposes nothing
    else of its memory) and frees the blocks at its next request, after the judge has read them.
    """

    handle: bytes
    nbytes: int
    shape: tuple[int, ...]
    dtype: str


OutputRef = TensorFile | GpuTensorRef


# ---- what a candidate is, as the runner receives it -------------------------------------------

@dataclass(frozen=True)
class ProgramArtifact:
    """A compiled KernelProgram: the plan (as JSON data) and the cubin NVRTC produced."""

    program: dict[str, Any]
    cubin: bytes
    content_hash: str


@dataclass(frozen=True)
class ModelNewArtifact:
    """A KernelBench-style solution: Python source defining ModelNew. Runs in a fresh process."""

    source: str
    name: str
    content_hash: str


Artifact = ProgramArtifact | ModelNewArtifact


# ---- input sets ------------------------------------------------------------------------------

@dataclass(frozen=True)
class InputSet:
    """How to draw one set of weights and inputs: seeds the policy never saw, optional scaling."""

    label: str
    model_seed: int
    input_seed: int
    scale: float | None = None


@dataclass(frozen=True)
class Bundle:
    """Input sets for one candidate; the judge keeps the matching references to itself."""

    id: int
    check_sets: tuple[InputSet, ...]
    timing_sets: tuple[InputSet, ...]
    fingerprints: dict[str, tuple[float, ...]]
    # Timed once each, after everything else, so the candidate has never seen them: a time that
    # needs inputs seen before (answers remembered and replayed) shows here. Judged with the
    # timing sets. Drawn only to re-verify a time more than FLOOR_MARGIN under the roofline floor.
    unseen_sets: tuple[InputSet, ...] = ()
    # The judge kept every reference within its memory budget: the next bundle may be drawn while
    # this one is in use (SupervisorSettings.prepare_during_check).
    room_for_next: bool = False


# ---- requests ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class SetTask:
    name: str
    source: str
    timed_ms: float = 25.0      # TimerSettings.min_total_ms for this task's timings


@dataclass(frozen=True)
class Activate:
    """Sent to a spare runner when it takes over: calibrate the timer now."""


@dataclass(frozen=True)
class MeasureCeilings:
    """Runner: copy bandwidth and GEMM rates of this GPU (cached on disk per GPU model)."""


@dataclass(frozen=True)
class Prepare:
    """Judge: draw a fresh bundle and compute its references."""

    check_sets: int = 3
    scaled_variants: int = 2
    timing_sets: int = 2
    unseen_sets: int = 0


@dataclass(frozen=True)
class Check:
    artifact: Artifact
    bundle: Bundle
    tolerance: tuple[float, float]
    lean: bool = False     # give GPU memory back (Runner.go_lean): the judge ran short beside this runner


@dataclass(frozen=True)
class Time:
    artifact: Artifact
    bundle: Bundle
    tolerance: tuple[float, float]
    lean: bool = False     # give GPU memory back (Runner.go_lean): the judge ran short beside this runner


@dataclass(frozen=True)
class TimeBaseline:
    kind: str            # "eager" or "compile"
    bundle: Bundle
    tolerance: tuple[float, float]


@dataclass(frozen=True)
class Interleave:
    """Time a candidate and the eager baseline alternately (re-measure before accepting a best)."""

    artifact: Artifact
    bundle: Bundle
    tolerance: tuple[float, float]
    rounds: int = 30
    lean: bool = False     # give GPU memory back (Runner.go_lean): the judge ran short beside this runner


@dataclass(frozen=True)
class Judge:
    bundle_id: int
    phase: str                                   # "check" or "timing"
    outputs: tuple[tuple[OutputRef, ...], ...]   # per input set, per output
    # Device handles only from processes whose Python is ours (KernelProgram runners); a ModelNew
    # process could forge a handle's size and crash the judge, so its outputs come as files.
    allow_ipc: bool = False


@dataclass(frozen=True)
class Release:
    bundle_id: int


@dataclass(frozen=True)
class Shutdown:
    pass


# ---- replies ------------------------------------------------------------------------------------

@dataclass
class Ready:
    role: str
    pid: int
    gpu: dict[str, Any]
    seconds: float


@dataclass
class TaskReady:
    tolerance: tuple[float, float]
    notes: list[str] = field(default_factory=list)
    flops: int = 0
    reference_dtype: str = "float64"


@dataclass
class Failure:
    """The candidate (or the evaluator) failed. `status` is a results.Status value."""

    status: str
    reason: str
    fatal: bool = False            # the process is about to exit (CUDA error): start a fresh one
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckDone:
    outputs: tuple[tuple[OutputRef, ...], ...]
    fingerprints: dict[str, tuple[float, ...]]
    kernels: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class Verdict:
    ok: bool
    status: str = "measured"
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class TimeDone:
    samples_ms: list[float]
    stray_ms: float                       # median GPU time after the timed stream ended
    outputs: tuple[tuple[OutputRef, ...], ...]
    mismatched_reps: int
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    baseline_samples_ms: list[float] = field(default_factory=list)   # Interleave only
    unseen_samples_ms: list[float] = field(default_factory=list)     # one per bundle.unseen_sets
