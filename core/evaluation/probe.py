"""Find out what GPUs exist without creating a CUDA context in this process.

The GUI process must never own a CUDA context, so the question is asked of a short-lived child
process. The answer is cached for the life of this process.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

_PROBE = r"""
import json, sys
out = {"gpus": [], "error": None}
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out["gpus"].append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                                "memory_bytes": p.total_memory, "sms": p.multi_processor_count})
    else:
        out["error"] = "torch.cuda.is_available() is False" + (
            " (this torch build has no CUDA)" if torch.version.cuda is None else "")
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
try:
    import cupy
    out["cupy"] = cupy.__version__
    try:
        out["driver"] = cupy.cuda.runtime.driverGetVersion()
    except Exception as exc:
        out["driver_error"] = f"{type(exc).__name__}: {exc}"
except Exception as exc:
    out["cupy_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


@dataclass
class GpuProbe:
    gpus: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    torch: str | None = None
    torch_cuda: str | None = None
    cupy: str | None = None
    cupy_error: str | None = None
    driver: int | None = None

    @property
    def can_run(self) -> bool:
        return bool(self.gpus) and self.cupy is not None

    @property
    def reason(self) -> str:
        """Why candidates cannot run here, or '' when they can."""
        if not self.gpus:
            return f"no CUDA GPU found ({self.error or 'none visible'})"
        if self.cupy is None:
            return f"CuPy is missing, so compiled kernels cannot be loaded ({self.cupy_error}); " \
                   "install with pip install 'cuda-agent[cuda12]' or '[cuda13]'"
        return ""


@lru_cache(maxsize=1)
def probe_gpus(timeout: float = 120.0) -> GpuProbe:
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return GpuProbe(error=f"the GPU probe did not answer in {timeout:.0f} s")
    try:
        data = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return GpuProbe(error=f"the GPU probe failed: {done.stderr.strip()[-500:]}")
    return GpuProbe(gpus=data.get("gpus", []), error=data.get("error"), torch=data.get("torch"),
                    torch_cuda=data.get("torch_cuda"), cupy=data.get("cupy"), cupy_error=data.get("cupy_error"),
                    driver=data.get("driver"))
