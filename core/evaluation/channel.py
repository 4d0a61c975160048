"""Moving tensors between evaluator processes through memory-mapped files.

The runner copies a GPU output straight into a file-backed CPU tensor (one device-to-host copy);
the judge maps the same file and uploads it (one host-to-device copy). No pickling of tensor
data, no GPU memory shared between processes: a candidate's kernels can never reach the judge.
"""
from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .protocol import TensorFile

if TYPE_CHECKING:  # torch loads only where tensors move, not in the supervisor
    import torch

_counter = itertools.count()


def scratch_dir(min_free_bytes: int = 8 << 30) -> Path:
    """A private folder on tmpfs when it has room, else in the system temp folder."""
    shm = Path("/dev/shm")
    base: str | None = None
    try:
        st = os.statvfs(shm)
        if st.f_bavail * st.f_frsize >= min_free_bytes and os.access(shm, os.W_OK):
            base = str(shm)
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="cuda-agent-", dir=base))


def remove_scratch(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def dtype_of(name: str) -> "torch.dtype":
    import torch

    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def dtype_name(dtype: "torch.dtype") -> str:
    return str(dtype).removeprefix("torch.")


def write_tensor(folder: Path, tensor: "torch.Tensor", tag: str) -> TensorFile:
    """Copy `tensor` (any device) into a new file in `folder`."""
    import torch

    path = folder / f"{os.getpid()}-{next(_counter)}-{tag}.bin"
    numel = tensor.numel()
    flat = tensor.detach().reshape(-1) if tensor.is_contiguous() else tensor.detach().contiguous().reshape(-1)
    if numel == 0:
        path.write_bytes(b"")
    else:
        mapped = torch.from_file(str(path), shared=True, size=numel, dtype=tensor.dtype)
        mapped.copy_(flat)
        del mapped
    return TensorFile(str(path), tuple(tensor.shape), dtype_name(tensor.dtype))


def read_tensor(ref: TensorFile, device, remove: bool = True) -> "torch.Tensor":
    """Map a TensorFile and upload it; the file is removed afterwards unless told otherwise."""
    import torch

    dtype = dtype_of(ref.dtype)
    try:
        if ref.numel == 0:
            return torch.empty(ref.shape, dtype=dtype, device=device)
        expected = ref.numel * torch.empty((), dtype=dtype).element_size()
        actual = os.path.getsize(ref.path)
        if actual != expected:
            raise ValueError(f"tensor file {ref.path} holds {actual} bytes, expected {expected}")
        mapped = torch.from_file(ref.path, shared=True, size=ref.numel, dtype=dtype)
        return mapped.to(device).reshape(ref.shape)
    finally:
        if remove:
            try:
                os.unlink(ref.path)
            except OSError:
                pass
