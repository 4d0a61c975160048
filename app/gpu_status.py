"""Turn the GPU probe (run in a child process, never here) into status-bar text and Run's reason."""
from __future__ import annotations

from dataclasses import dataclass

from core.evaluation.probe import GpuProbe

STILL_WORKS = "replay runs, projects, source views, compile checks and export still work"
REPLAY_ONLY = "runs here can only replay recorded projects"
DEFAULT_ARCH = "sm_90"


@dataclass(frozen=True)
class GpuState:
    text: str             # one line for the status bar
    details: str          # tooltip: versions and every GPU
    run_tooltip: str      # what Run can do on this machine
    arch: str | None      # sm_XY of the first GPU, the default target of compile checks
    has_gpu: bool
    gpu_reason: str | None = None   # why kernels cannot be measured here (None: they can)


CHECKING = GpuState(text="Checking for GPUs…", details="A child process is asking torch for CUDA devices.",
                    run_tooltip="Run a search on the open task (checking for GPUs…)", arch=None, has_gpu=False,
                    gpu_reason="still checking for GPUs")


def _gpu_line(gpu: dict) -> str:
    capability = str(gpu.get("capability", "?"))
    memory = gpu.get("memory_bytes")
    parts = [f"sm_{capability.replace('.', '')}"]
    if memory:
        parts.append(f"{memory / 2**30:.0f} GiB")
    if gpu.get("sms"):
        parts.append(f"{gpu['sms']} SMs")
    return f"GPU {gpu.get('index', 0)}: {gpu.get('name', 'unknown')} ({', '.join(parts)})"


def gpu_state(probe: GpuProbe) -> GpuState:
    versions = [f"torch {probe.torch or 'not found'}" + (f" (CUDA {probe.torch_cuda})" if probe.torch_cuda else ""),
                f"CuPy {probe.cupy}" if probe.cupy else f"CuPy: {probe.cupy_error or 'not found'}"]
    if probe.driver:
        versions.append(f"driver API {probe.driver}")
    if not probe.gpus:
        reason = probe.reason
        return GpuState(text=f"No GPU: {reason} — {STILL_WORKS}",
                        details="\n".join([f"No GPU: {reason}", *versions]),
                        run_tooltip=f"Run a search on the open task. No GPU: {reason}; {REPLAY_ONLY}.",
                        arch=None, has_gpu=False, gpu_reason=f"no GPU: {reason}")
    first = probe.gpus[0]
    arch = "sm_" + str(first.get("capability", "9.0")).replace(".", "")
    lines = [_gpu_line(g) for g in probe.gpus]
    more = f" (+{len(probe.gpus) - 1} more)" if len(probe.gpus) > 1 else ""
    if probe.can_run:
        text = f"{lines[0]}{more}"
        run_tooltip = f"Run a search on the open task, measured on {first.get('name', 'the GPU')}."
        reason = None
    else:
        text = f"{lines[0]}{more} — kernels cannot run: {probe.reason}"
        run_tooltip = f"Run a search on the open task. Kernels cannot run here: {probe.reason}; {REPLAY_ONLY}."
        reason = f"kernels cannot run: {probe.reason}"
    return GpuState(text=text, details="\n".join([*lines, *versions]), run_tooltip=run_tooltip,
                    arch=arch, has_gpu=True, gpu_reason=reason)


def probe_failed(error: BaseException) -> GpuState:
    reason = f"the GPU probe failed ({type(error).__name__}: {error})"
    return GpuState(text=f"No GPU: {reason} — {STILL_WORKS}", details=reason,
                    run_tooltip=f"Run a search on the open task. No GPU: {reason}; {REPLAY_ONLY}.",
                    arch=None, has_gpu=False, gpu_reason=f"no GPU: {reason}")
