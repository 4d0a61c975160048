"""The no-fallback rule: while a candidate runs, PyTorch may only allocate, view and describe.

Any compute op (mm, conv, add, copy...) seen while the guard is active is recorded, and the
candidate is rejected as "calls PyTorch". The first violation is also raised at the call site,
so a candidate that swallows the exception is still caught by the recorded flag.
"""
from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

# Op packets that do no arithmetic on tensor values.
_ALLOCATION = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
    # Filling a fresh buffer with a constant (e.g. zeroed accumulators for atomics) computes nothing
    # from the inputs; constant outputs are caught by the correctness checks.
    "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like",
    "new_full", "fill_", "zero_", "fill",
}
_VIEWS = {
    "view", "_unsafe_view", "reshape", "as_strided", "t", "transpose", "permute", "expand",
    "expand_as", "squeeze", "unsqueeze", "slice", "select", "narrow", "split", "split_with_sizes",
    "chunk", "unbind", "detach", "alias", "view_as", "flatten", "unflatten", "unfold", "movedim",
    "diagonal", "view_as_real", "view_as_complex", "_reshape_alias", "lift_fresh", "numpy_T",
    "mT", "mH", "adjoint", "swapaxes", "swapdims", "real", "imag",
}
_METADATA = {
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "size", "stride", "numel",
    "dim", "is_contiguous", "is_same_size", "is_nonzero", "_local_scalar_dense", "storage_offset",
    "record_stream", "set_", "resize_", "is_pinned", "_has_compatible_shallow_copy_type",
}
ALLOWED_OPS = frozenset(_ALLOCATION | _VIEWS | _METADATA)


class CallsPyTorch(RuntimeError):
    """Raised when a candidate asks PyTorch to compute."""


class NoFallbackGuard(TorchDispatchMode):
    """Records every non-allowed ATen op dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.violations: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        namespace = getattr(func, "namespace", "aten")
        if namespace in ("aten", "prims") and name not in ALLOWED_OPS:
            self.violations.append(f"{namespace}.{name}")
            raise CallsPyTorch(
                f"calls PyTorch: the candidate ran torch op '{namespace}.{name}' while its own "
                "kernels should do the work")
        return func(*args, **(kwargs or {}))

    @property
    def reason(self) -> str | None:
        if not self.violations:
            return None
        ops = sorted(set(self.violations))
        return (f"calls PyTorch: the candidate ran torch op(s) {', '.join(ops)} while its own "
                "kernels should do the work (only allocation, view and metadata ops are allowed)")


def guarded(fn, *args, **kwargs):
    """Run fn under the guard; return (result, guard). Never lets a violation pass silently."""
    guard = NoFallbackGuard()
    with guard:
        try:
            result = fn(*args, **kwargs)
        except CallsPyTorch:
            result = None
    return result, guard


__all__ = ["ALLOWED_OPS", "CallsPyTorch", "NoFallbackGuard", "guarded"]
