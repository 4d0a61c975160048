"""Moving tensors between evaluator processes: by CUDA IPC, or through memory-mapped files.

IPC (a warm runner's outputs): the runner copies each output into a device block of its own and
hands over its handle; the judge maps the block and reads it in place while the runner waits,
then unmaps it (IpcMappings). Files (a ModelNew candidate's process, or no IPC): the runner copies
an output straight into a file-backed CPU tensor (one device-to-host copy); the judge maps the same
file and uploads it (one host-to-device copy). No pickling of tensor data either way, and the
judge's own memory (inputs, references) is never shared.
"""
from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .protocol import GpuTensorRef, TensorFile

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


# ---- device to device, by CUDA IPC --------------------------------------------------------------

class IpcExporter:
    """Runner side: copies outputs into dedicated device blocks and hands out IPC handles.

    A request's blocks are given back at the next request (the judge has read them by then) and
    kept for reuse, up to `pool_bytes`, instead of freed: freeing a block and allocating the next
    one cost more than the copy into it (1.1-1.7 and about 0.7 ms against 1.2 ms for a 1.75 GiB
    output on an H100; docs/performance.md). A block is reused only for an output of exactly its
    size, so the copy overwrites all of it and the judge never sees an earlier output's bytes.
    """

    def __init__(self, pool_bytes: int = 0) -> None:
        self.blocks: list[tuple[int, int]] = []     # (pointer, bytes) handed out in this request
        self.pool: dict[int, list[int]] = {}         # bytes -> blocks kept for reuse
        self.pool_bytes = pool_bytes
        self.broken: str | None = None     # IPC unavailable here: fall back to files
        self.files_only = False            # set by a runner short of GPU memory (Runner.go_lean)

    # The allocator (CuPy's cudaMalloc / cudaFree); tests replace these two.
    def _malloc(self, nbytes: int) -> int:
        import cupy

        return cupy.cuda.runtime.malloc(nbytes)

    def _free(self, ptr: int) -> None:
        import cupy

        cupy.cuda.runtime.free(ptr)

    @property
    def pooled_bytes(self) -> int:
        return sum(n * len(ptrs) for n, ptrs in self.pool.items())

    def take_block(self, nbytes: int) -> int:
        """A block of exactly `nbytes` for this request: a kept one, else a new one (after freeing
        the kept ones, if the GPU has no room for it beside them)."""
        kept = self.pool.get(nbytes)
        if kept:
            ptr = kept.pop()
        else:
            try:
                ptr = self._malloc(nbytes)
            except Exception as exc:
                if not (is_out_of_memory(exc) and self.trim()):
                    raise
                ptr = self._malloc(nbytes)
        self.blocks.append((ptr, nbytes))
        return ptr

    def export(self, tensor: "torch.Tensor") -> GpuTensorRef:
        import cupy
        import torch

        from .protocol import GpuTensorRef

        src = tensor.detach()
        if not src.is_contiguous():
            src = src.contiguous()
        nbytes = max(src.numel() * src.element_size(), 1)
        ptr = self.take_block(nbytes)
        dst = torch.as_tensor(_RawDevice(ptr, nbytes), device=src.device)
        if src.numel():
            dst[: src.numel() * src.element_size()].copy_(src.reshape(-1).view(torch.uint8))
        torch.cuda.synchronize()
        handle = cupy.cuda.runtime.ipcGetMemHandle(ptr)
        return GpuTensorRef(bytes(handle), src.numel() * src.element_size(), tuple(tensor.shape),
                            dtype_name(tensor.dtype))

    def release(self) -> None:
        """Give back this request's blocks: kept for reuse within pool_bytes, the rest freed."""
        room = 0 if self.files_only else self.pool_bytes - self.pooled_bytes
        for ptr, nbytes in self.blocks:
            if nbytes <= room:
                self.pool.setdefault(nbytes, []).append(ptr)
                room -= nbytes
            else:
                self._free_quietly(ptr)
        self.blocks.clear()

    def trim(self) -> int:
        """Free every kept block; returns the bytes freed."""
        freed = self.pooled_bytes
        for ptrs in self.pool.values():
            for ptr in ptrs:
                self._free_quietly(ptr)
        self.pool.clear()
        return freed

    def _free_quietly(self, ptr: int) -> None:
        try:
            self._free(ptr)
        except Exception:
            pass


class _RawDevice:
    """Lets torch view raw device bytes through __cuda_array_interface__."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


def import_gpu_tensor(ref: "GpuTensorRef", device) -> "torch.Tensor":
    """Judge side, as a copy in this process's memory: map the runner's block, copy it, unmap."""
    mappings = IpcMappings()
    try:
        return mappings.tensor(ref, device).clone()
    finally:
        mappings.close()            # synchronises first: the copy has finished


class IpcMappings:
    """Judge side: the runner's blocks mapped into this process and read in place, without the copy
    import_gpu_tensor makes. Safe only while the runner waits for the judge's verdict: nothing of
    the candidate runs then (the runner synchronised the device before it replied, and launches
    nothing until its next request, when it frees the blocks). Each handle is opened once and
    closed by close()."""

    def __init__(self) -> None:
        self.open: dict[bytes, int] = {}

    def tensor(self, ref: "GpuTensorRef", device) -> "torch.Tensor":
        import cupy
        import torch

        dtype = dtype_of(ref.dtype)
        if ref.nbytes == 0:
            return torch.empty(ref.shape, dtype=dtype, device=device)
        ptr = self.open.get(ref.handle)
        if ptr is None:
            ptr = self.open[ref.handle] = cupy.cuda.runtime.ipcOpenMemHandle(ref.handle, 1)
        return torch.as_tensor(_RawDevice(ptr, ref.nbytes), device=device).view(dtype).reshape(ref.shape)

    def close(self) -> None:
        import cupy
        import torch

        if self.open:
            try:
                torch.cuda.synchronize()    # nothing of ours still reads a block
            except Exception:
                pass                        # a broken context: the error that broke it propagates
        for ptr in self.open.values():
            try:
                cupy.cuda.runtime.ipcCloseMemHandle(ptr)
            except Exception:
                pass
        self.open.clear()


def write_output(folder: Path, exporter: "IpcExporter", tensor: "torch.Tensor", tag: str):
    """Hand an output to the judge: by IPC where it works, else through a file. A copy that finds no
    room on the GPU goes through a file too, this time only."""
    if exporter.broken is None and not exporter.files_only:
        try:
            return exporter.export(tensor)
        except Exception as exc:  # e.g. a sandbox without CUDA IPC
            if not is_out_of_memory(exc):
                exporter.broken = f"{type(exc).__name__}: {exc}"
    return write_tensor(folder, tensor, tag)


def is_out_of_memory(exc: BaseException) -> bool:
    """An allocation refused for want of memory (PyTorch's allocator, or cudaMalloc through CuPy),
    which leaves the CUDA context usable, unlike a fault."""
    text = str(exc)
    return ("OutOfMemory" in type(exc).__name__ or "cudaErrorMemoryAllocation" in text
            or "CUDA_ERROR_OUT_OF_MEMORY" in text or "out of memory" in text.lower())


def read_output(ref, device, remove: bool = True, mappings: IpcMappings | None = None) -> "torch.Tensor":
    """An output the runner handed over (write_output); a file is removed after it is read unless
    `remove` is False (the judge removes its files itself, once its verdict is final). With
    `mappings`, a device block is read in place (see IpcMappings) instead of copied."""
    if isinstance(ref, TensorFile):
        return read_tensor(ref, device, remove=remove)
    if mappings is not None:
        return mappings.tensor(ref, device)
    return import_gpu_tensor(ref, device)
