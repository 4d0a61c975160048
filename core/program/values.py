"""Plain value types shared by expressions and launch plans."""

from __future__ import annotations

from dataclasses import dataclass

# Bytes per element of every dtype a buffer may have (torch dtype names without "torch.").
DTYPE_SIZES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "complex64": 8,
    "complex128": 16,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint64": 8,
    "uint32": 4,
    "uint16": 2,
    "uint8": 1,
    "bool": 1,
}

# Scalar C types a kernel argument may have, with their inclusive value ranges.
INT_CTYPE_RANGES: dict[str, tuple[int, int]] = {
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
}
FLOAT_CTYPE_MAX: dict[str, float] = {
    "float32": 3.4028234663852886e38,
    "float64": 1.7976931348623157e308,
}
SCALAR_CTYPES: tuple[str, ...] = (*INT_CTYPE_RANGES, *FLOAT_CTYPE_MAX)


@dataclass(frozen=True)
class TensorInfo:
    """What expressions may know about a tensor: its shape and dtype, never its data."""

    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        # Accept torch.Size / lists and "torch.float32" so callers can pass tensor metadata as is.
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        dtype = str(self.dtype)
        object.__setattr__(self, "dtype", dtype[len("torch."):] if dtype.startswith("torch.") else dtype)

    @property
    def numel(self) -> int:
        count = 1
        for d in self.shape:
            count *= d
        return count

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class TensorArg:
    """A kernel argument that passes the device pointer of the named tensor."""

    name: str


@dataclass(frozen=True)
class ScalarArg:
    """A kernel argument passed by value with an explicit C type (also what typed casts return)."""

    ctype: str  # one of SCALAR_CTYPES
    value: int | float
