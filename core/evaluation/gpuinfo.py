"""Facts about a GPU, read in an evaluator process (the only place a CUDA context exists)."""
from __future__ import annotations

from typing import Any


def init_evaluator_process(device_index: int):
    """Common set-up of judge and runner processes; returns the torch device.

    Precision is the task's: no TF32 unless the reference itself asks for it. Nothing needs
    gradients.
    """
    import torch

    device = torch.device("cuda", device_index)
    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_grad_enabled(False)
    return device


def describe_gpu(device) -> dict[str, Any]:
    import torch

    p = torch.cuda.get_device_properties(device)
    info: dict[str, Any] = {
        "index": device.index,
        "name": p.name,
        "uuid": str(getattr(p, "uuid", "")),
        "capability": f"{p.major}.{p.minor}",
        "arch": f"sm_{p.major}{p.minor}",
        "sms": p.multi_processor_count,
        "memory_bytes": p.total_memory,
        "l2_bytes": int(getattr(p, "L2_cache_size", 50 << 20)),
        "max_threads_per_sm": int(getattr(p, "max_threads_per_multi_processor", 2048)),
        "shared_per_block_optin": int(getattr(p, "shared_memory_per_block_optin", 48 << 10)),
        "shared_per_sm": int(getattr(p, "shared_memory_per_multiprocessor", 0)),
        "regs_per_sm": int(getattr(p, "regs_per_multiprocessor", 65536)),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
    }
    try:
        import cupy

        info["driver"] = cupy.cuda.runtime.driverGetVersion()
        info["cupy"] = cupy.__version__
    except Exception as exc:  # CuPy missing: programs cannot run, ModelNew and baselines still can
        info["cupy_error"] = f"{type(exc).__name__}: {exc}"
    return info


def gpu_key(info: dict[str, Any]) -> str:
    """Stable identity of a GPU model + software stack, for caches of ceilings and baselines."""
    name = "".join(c if c.isalnum() else "-" for c in str(info.get("name", "gpu"))).strip("-")
    return f"{name}-{info.get('capability')}-torch{info.get('torch')}"


def _compute_apps() -> list[tuple[str, int]]:
    """(GPU UUID, pid) of every process with a CUDA context, as nvidia-smi lists them."""
    import subprocess

    done = subprocess.run(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=10)
    rows = []
    for line in done.stdout.splitlines():
        uuid, _, pid = (part.strip() for part in line.partition(","))
        if pid.isdigit():
            rows.append((uuid, int(pid)))
    return rows


def other_gpu_processes(gpu_uuid: str, own_pids: set[int], apps=_compute_apps) -> int:
    """How many processes other than ours have a CUDA context on this GPU; 0 where nvidia-smi cannot
    say. Where none of our pids is listed (a container's pid namespace), the count beyond ours."""
    try:
        rows = apps()
    except Exception:               # no nvidia-smi, a timeout, a driver that does not answer
        return 0
    want = gpu_uuid.lower().removeprefix("gpu-")
    on_gpu = {pid for uuid, pid in rows if not want or uuid.lower().removeprefix("gpu-") == want}
    if on_gpu & own_pids:
        return len(on_gpu - own_pids)
    return max(0, len(on_gpu) - len(own_pids))
