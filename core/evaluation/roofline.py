"""Ceilings of a GPU (measured at its first few evaluator starts, cached) and the roofline floor of a task.

floor = max(minimum bytes / copy bandwidth, counted FLOPs / GEMM rate for the task's dtype).
The minimum bytes read every input and weight once and write every output once.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# 2: warmed up by time. 3: copy bandwidth is the fastest of several copy kernels, not torch's copy_ alone,
# and every ceiling is timed without the host's launch time.
# Ceilings cached by an older version are measured again.
CEILINGS_VERSION = 3


def cache_root() -> Path:
    return Path(os.environ.get("CUDA_AGENT_CACHE", Path.home() / ".cache" / "cuda-agent"))


@dataclass
class Ceilings:
    copy_gbps: float                                 # device-to-device copy, bytes read + written (fastest copy kernel)
    gemm_tflops: dict[str, float] = field(default_factory=dict)   # per dtype, TF32 off for fp32
    gpu: str = ""
    measured_at: str = ""
    samples: int = 1                                 # measurements folded in (each value their maximum)
    copy_kernel: str = ""                            # the copy kernel that set copy_gbps

    def merged(self, other: "Ceilings") -> "Ceilings":
        """Each ceiling the larger of the two: work from another process sharing the GPU only ever
        lowers a measured rate."""
        gemm = {k: max(v, other.gemm_tflops.get(k, 0.0)) for k, v in self.gemm_tflops.items()}
        gemm.update({k: v for k, v in other.gemm_tflops.items() if k not in gemm})
        faster = self if self.copy_gbps >= other.copy_gbps else other
        return Ceilings(faster.copy_gbps, gemm, self.gpu or other.gpu, other.measured_at,
                        self.samples + other.samples, faster.copy_kernel)

    def to_json(self) -> str:
        return json.dumps({"version": CEILINGS_VERSION, **asdict(self)}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Ceilings":
        d = json.loads(text)
        if d.pop("version", None) != CEILINGS_VERSION:
            raise ValueError("old ceilings format")
        return cls(**d)


def ceilings_path(gpu_key: str) -> Path:
    return cache_root() / "ceilings" / f"{gpu_key}.json"


def load_ceilings(gpu_key: str) -> Ceilings | None:
    try:
        return Ceilings.from_json(ceilings_path(gpu_key).read_text())
    except (OSError, ValueError, TypeError, KeyError):
        return None


def save_json_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


# Warm-up before each ceiling's timed repetitions, by time as for candidates (DESIGN section 4). Three
# calls (about 1.5 ms of copies) may leave a fresh machine's first probe on clocks still ramping up:
# the suspected cause of a copy probe that read 4.6 % low (docs/performance.md, 2026-12-02).
WARMUP_S = 0.2
SPIN_CYCLES = 400_000        # about 0.2 ms at 2 GHz: longer than any launch from Python


def warm_up(fn: Any, seconds: float, sync: Any, clock: Any = time.perf_counter, min_calls: int = 3) -> int:
    """Call fn until `seconds` of wall time (sync()ed) have passed, and at least min_calls times;
    returns the number of calls."""
    start, calls = clock(), 0
    while calls < min_calls or clock() - start < seconds:
        fn()
        calls += 1
        if calls >= min_calls:
            sync()
    return calls


# Copy kernels the bandwidth ceiling is the fastest of, beside torch's copy_: one float4 a thread
# (what fast pointwise kernels do), four in flight a thread, and a grid-stride loop. torch's copy_
# timed with its launch inside the events read 3,007 GB/s on an H100 where torch.compile's and our own
# pointwise kernels moved bytes at 3.04 TB/s, so good schedules ran "faster than the floor" and were
# re-verified (a 1 ms memory-bound search: 6-10 of 60); timed behind a spin, the float4 kernel read
# 3,043-3,045 GB/s and none was (docs/performance.md, 2026-12-07).
_COPY_SOURCE = r"""
extern "C" __global__ void ca_copy_v1(const float4* __restrict__ src, float4* __restrict__ dst, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}
extern "C" __global__ void ca_copy_v4(const float4* __restrict__ src, float4* __restrict__ dst, long long n) {
  long long i = ((long long)blockIdx.x * blockDim.x) * 4 + threadIdx.x;
  float4 v[4];
  #pragma unroll
  for (int k = 0; k < 4; ++k) { long long j = i + (long long)k * blockDim.x; if (j < n) v[k] = src[j]; }
  #pragma unroll
  for (int k = 0; k < 4; ++k) { long long j = i + (long long)k * blockDim.x; if (j < n) dst[j] = v[k]; }
}
extern "C" __global__ void ca_copy_stride(const float4* __restrict__ src, float4* __restrict__ dst, long long n) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = src[i];
}
"""


def copy_kernels(src: Any, dst: Any) -> dict[str, Any]:
    """Callables that copy src to dst (contiguous float32 CUDA tensors, length a multiple of 4): torch's
    copy_ and, where CuPy can build them, the kernels above on the current torch stream."""
    import torch

    kernels: dict[str, Any] = {"torch copy_": lambda: dst.copy_(src)}
    try:
        import cupy
        import numpy as np

        module = cupy.RawModule(code=_COPY_SOURCE)
        n4 = src.numel() // 4
        sms = torch.cuda.get_device_properties(src.device).multi_processor_count
        threads = 256
        shapes = {"ca_copy_v1": -(-n4 // threads), "ca_copy_v4": -(-n4 // (4 * threads)), "ca_copy_stride": 8 * sms}

        def launcher(name: str, blocks: int):
            fn = module.get_function(name)

            def run() -> None:
                stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
                fn((blocks,), (threads,), (src.data_ptr(), dst.data_ptr(), np.int64(n4)), stream=stream)
            return run

        for name, blocks in shapes.items():
            kernels[name] = launcher(name, blocks)
    except Exception:   # no CuPy or no NVRTC: torch's copy alone
        pass
    return kernels


def measure_ceilings(device: Any, gpu_name: str) -> Ceilings:
    """Measure copy bandwidth and GEMM rates on `device` (a few seconds). Needs CUDA."""
    import torch

    def timed(fn, reps: int) -> float:
        warm_up(fn, WARMUP_S, torch.cuda.synchronize)
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            # A spin queued first keeps the GPU busy while the host launches the call, so the events
            # hold the kernel alone, as the timer's gate does for candidates. Without it the host's
            # launch time counted: 1.3 % of a 1 GiB copy on an H100, and CuPy's launches (tens of
            # microseconds from Python) lost to torch's copy_ (2026-12-07).
            torch.cuda._sleep(SPIN_CYCLES)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        times.sort()
        return times[len(times) // 2] / 1e3

    n = 1 << 28                                  # 1 GiB of float32: far beyond L2
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    copy_gbps, copy_kernel = 0.0, ""
    for name, fn in copy_kernels(src, dst).items():
        dst.zero_()
        gbps = 2 * n * 4 / timed(fn, 20) / 1e9
        # A copy that did not copy must not set the ceiling.
        if torch.equal(dst, src) and gbps > copy_gbps:
            copy_gbps, copy_kernel = gbps, name
    del src, dst
    gemm: dict[str, float] = {}
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for dtype, size in ((torch.float32, 4096), (torch.float16, 8192), (torch.bfloat16, 8192),
                            (torch.float64, 4096)):
            a = torch.randn(size, size, device=device, dtype=dtype)
            b = torch.randn(size, size, device=device, dtype=dtype)
            s = timed(lambda: a @ b, 10)
            gemm[str(dtype).removeprefix("torch.")] = 2 * size**3 / s / 1e12
            del a, b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    torch.cuda.empty_cache()
    return Ceilings(copy_gbps, gemm, gpu_name, time.strftime("%Y-%m-%d %H:%M:%S"), copy_kernel=copy_kernel)


# A GPU's ceilings are measured at its first CEILING_SAMPLES evaluator starts and the largest of each
# kept. One measurement taken while other processes used the GPU read half the GEMM rates, and the
# floor it gave stood above eager's time for the rest of that run (four test processes that started
# together on an H100, 2026-12-06).
CEILING_SAMPLES = 3


def get_ceilings(device: Any, gpu_name: str, gpu_key: str) -> Ceilings:
    cached = load_ceilings(gpu_key)
    if cached is not None and cached.samples >= CEILING_SAMPLES:
        return cached
    c = measure_ceilings(device, gpu_name)
    if cached is not None:
        c = cached.merged(c)
    save_json_atomic(ceilings_path(gpu_key), c.to_json())
    return c


_DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
                "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16}


def spec_bytes(shape: tuple[int, ...], dtype: str) -> int:
    n = 1
    for s in shape:
        n *= s
    return n * _DTYPE_BYTES.get(dtype, 4)


def minimum_bytes(task: Any) -> int:
    """Each input and weight read once, each output written once."""
    total = 0
    for spec in task.input_specs:
        if spec is not None:
            total += spec_bytes(spec.shape, spec.dtype)
    for spec in task.param_specs.values():
        total += spec_bytes(spec.shape, spec.dtype)
    for spec in task.output_specs:
        total += spec_bytes(spec.shape, spec.dtype)
    return total


def compute_dtype(task: Any) -> str:
    """The dtype whose GEMM rate bounds the task: its first floating input, else its output."""
    for spec in list(task.input_specs) + list(task.param_specs.values()) + list(task.output_specs):
        if spec is not None and spec.dtype in ("float16", "bfloat16", "float32", "float64"):
            return spec.dtype
    return "float32"


def floor_ms(min_bytes: int, flops: int, dtype: str, ceilings: Ceilings) -> float:
    mem_s = min_bytes / (ceilings.copy_gbps * 1e9) if ceilings.copy_gbps > 0 else 0.0
    rate = ceilings.gemm_tflops.get(dtype) or ceilings.gemm_tflops.get("float32") or 0.0
    flop_s = flops / (rate * 1e12) if rate > 0 else 0.0
    return max(mem_s, flop_s) * 1e3


# How far under the floor a time may fall and still count as reaching it, not beating it. The
# floor is one machine's measurement applied to every card of the model: four fresh H200s read
# copy ceilings 1.8 % apart (2026-12-04), and good pointwise kernels on an H100 timed up to 0.3 %
# under the cached floor (2026-12-07), each then re-verified at about 1.2 s. Work skipped or
# replayed beats the floor by far more than this.
FLOOR_MARGIN = 0.02


def below_floor(median_ms: float, floor: float) -> bool:
    """A time that beats the roofline floor by more than its measurement error: suspicious."""
    return median_ms < floor * (1.0 - FLOOR_MARGIN)
