"""Comparing a candidate's outputs with references. Used by the judge, never by candidates."""
from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# Poison patterns written into output buffers before each run: quiet NaNs with a payload that no
# arithmetic produces (arithmetic NaNs are canonical), so "still equals the poison" means "never
# written". Integer outputs get two runs with two patterns (see runner).
POISON_BITS = {
    torch.float32: (0x7FC5A5A5, torch.int32),
    torch.float64: (0x7FF8A5A5A5A5A5A5, torch.int64),
    torch.float16: (0x7E5A, torch.int16),
    torch.bfloat16: (0x7FDA, torch.int16),
}
INT_POISON = (0x5A5A5A5A, -0x3C3C3C3D)


def _bits_value(value: int, bits_dtype: torch.dtype) -> int:
    width = torch.iinfo(bits_dtype).bits
    return value - (1 << width) if value >= 1 << (width - 1) else value


def _plain_poison(dtype: torch.dtype, variant: int) -> int | bool:
    """The poison value of a bool or integer dtype (INT_POISON clamped to the dtype's range)."""
    if dtype == torch.bool:
        return variant == 0
    info = torch.iinfo(dtype)
    return max(info.min, min(info.max, INT_POISON[variant]))


def poison_(t: torch.Tensor, variant: int = 0) -> None:
    """Fill `t` with the poison pattern for its dtype (variant 0 or 1 for integers)."""
    if t.dtype in POISON_BITS:
        bits, bits_dtype = POISON_BITS[t.dtype]
        t.view(bits_dtype).fill_(_bits_value(bits, bits_dtype))
    else:
        t.fill_(_plain_poison(t.dtype, variant))


def poisoned_mask(t: torch.Tensor, variant: int = 0) -> torch.Tensor:
    """Elements of `t` that still hold the poison pattern."""
    if t.dtype in POISON_BITS:
        bits, bits_dtype = POISON_BITS[t.dtype]
        return t.view(bits_dtype) == _bits_value(bits, bits_dtype)
    return t == _plain_poison(t.dtype, variant)


def _as_float64(out: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both in float64. A (float64) reference value beyond the output dtype's range becomes the
    infinity it rounds to in that dtype: a float32 output cannot hold 3.5e38, and inf is then the
    right answer, not a mismatch."""
    o = out.double() if out.dtype.is_floating_point else out.to(torch.float64)
    r = ref.double() if ref.dtype.is_floating_point else ref.to(torch.float64)
    if out.dtype.is_floating_point and ref.dtype.is_floating_point and \
            torch.finfo(out.dtype).max < torch.finfo(ref.dtype).max:
        rounded = ref.to(out.dtype).double()
        r = torch.where(torch.isinf(rounded) & torch.isfinite(r), rounded, r)
    return o, r


def close_mask(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """Elementwise pass mask: |out-ref| <= atol + rtol*|ref|, NaN matches NaN, Inf matches Inf."""
    o, r = _as_float64(out, ref)
    both_nan = torch.isnan(o) & torch.isnan(r)
    same_inf = torch.isinf(o) & torch.isinf(r) & (o == r)
    ok = (o - r).abs() <= atol + rtol * r.abs()
    return ok | both_nan | same_inf


def describe_index(flat_index: int, shape: tuple[int, ...]) -> str:
    idx = []
    for s in reversed(shape):
        idx.append(flat_index % s if s else 0)
        flat_index //= s if s else 1
    return "(" + ", ".join(str(i) for i in reversed(idx)) + ")"


# compare() works through an output in slices of this many elements: its float64 temporaries then
# take a few hundred MB however large the output (whole-tensor copies of a 3.5 GiB float64 output ran
# the judge out of memory on an 80 GB GPU).
COMPARE_CHUNK = 1 << 24


def compare(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float,
            chunk: int = COMPARE_CHUNK) -> str | None:
    """None when `out` matches `ref`; else a one-line reason with the worst element.

    Checks, in order: exact type/shape/dtype, NaN/Inf agreement, elementwise tolerance, and the
    relative error norm ||out - ref|| / ||ref|| <= rtol (a bias spread thinly over many elements
    passes elementwise checks but not the norm). Counted slice by slice (`chunk` elements), so
    the answer is the one a single pass over the whole tensors gives, in bounded memory.
    """
    if type(out) is not torch.Tensor:
        return f"output is a {type(out).__name__}, not a plain torch.Tensor"
    if tuple(out.shape) != tuple(ref.shape):
        return f"output has shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    n = out.numel()
    if n == 0:
        return None
    flat_out, flat_ref = out.reshape(-1), ref.reshape(-1)
    bad_nan = missing_nan = bad_inf = n_bad = 0
    worst, worst_excess = -1, 0.0
    ref_sq = err_sq = 0.0
    for begin in range(0, n, chunk):
        o, r = _as_float64(flat_out[begin:begin + chunk], flat_ref[begin:begin + chunk])
        o_nan, r_nan = torch.isnan(o), torch.isnan(r)
        bad_nan += int((o_nan & ~r_nan).sum())
        missing_nan += int((r_nan & ~o_nan).sum())
        del o_nan, r_nan
        bad_inf += int(((torch.isinf(o) | torch.isinf(r)) & (o != r)).sum())
        finite = torch.isfinite(r)
        diff = torch.where(finite, (o - r).abs(), torch.zeros((), dtype=torch.float64, device=o.device))
        excess = diff - (atol + rtol * r.abs())
        bad = excess > 0
        count = int(bad.sum())
        if count:
            n_bad += count
            i = int(torch.argmax(torch.where(bad, excess, torch.zeros_like(excess))))
            if worst < 0 or float(excess[i]) > worst_excess:    # the first of equal maxima, as argmax
                worst, worst_excess = begin + i, float(excess[i])
        ref_sq += float(torch.sum(torch.where(finite, r, 0.0) ** 2))
        err_sq += float(torch.sum(diff ** 2))
        del o, r, finite, diff, excess, bad
    if bad_nan:
        return f"NaN output: {bad_nan} of {n} elements are NaN where the reference is not"
    if missing_nan:
        return f"{missing_nan} of {n} elements are not NaN where the reference is NaN"
    if bad_inf:
        return f"{bad_inf} of {n} elements disagree with the reference on +-Inf"
    if n_bad:
        o, r = _as_float64(flat_out[worst:worst + 1], flat_ref[worst:worst + 1])
        return (f"{n_bad} of {n} elements outside atol={atol:g} rtol={rtol:g}; worst at "
                f"{describe_index(worst, tuple(out.shape))}: got {float(o[0]):.6g}, "
                f"expected {float(r[0]):.6g}")
    ref_norm, err_norm = ref_sq ** 0.5, err_sq ** 0.5
    if ref_norm > 0 and err_norm / ref_norm > rtol:
        return f"relative error norm {err_norm / ref_norm:.3g} exceeds {rtol:g}"
    if ref_norm == 0 and err_norm > atol * (n ** 0.5):
        return f"error norm {err_norm:.3g} against an all-zero reference"
    return None


def fingerprint(values: list) -> tuple[float, ...]:
    """A cheap, order-sensitive summary of a set of inputs, to confirm two processes drew the same.

    One full pass (a sum) plus a weighted float64 sum over a strided sample of at most 4096 values.
    The full sum is taken in the tensor's own precision (float32 for fp16/bf16, int64 for integers):
    both processes run the same deterministic reduction on the same GPU model, so the sums agree
    bitwise, and a float64 sum of a float32 tensor costs 5.4x as much (3.43 against 0.64 ms for
    1.75 GiB on an H100, twenty-sixth session).
    """
    out: list[float] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            flat = v.detach().reshape(-1)
            n = flat.numel()
            if n == 0:
                out.append(0.0)
                continue
            if flat.is_floating_point():
                total = torch.sum(flat, dtype=torch.float64 if flat.dtype == torch.float64 else torch.float32)
            elif flat.is_complex():
                total = torch.view_as_real(flat).sum(dtype=torch.float64)
            else:
                total = torch.sum(flat, dtype=torch.int64)
            sample = flat[:: max(1, n // 4096)][:4096].to(torch.float64)
            w = torch.arange(1, sample.numel() + 1, device=sample.device, dtype=torch.float64)
            out += [float(total), float((torch.nan_to_num(sample) * w).sum()), float(n)]
        elif isinstance(v, (int, float, bool)):
            out.append(float(v))
    return tuple(out)


# ---- counting the poison in one read -------------------------------------------------------------
# poisoned_mask(t).sum() writes a bool tensor and reads it back as int64: 3.7 ms for a 1.75 GiB
# float32 output on an H100 where writing the poison took 0.6 ms. count_poisoned reads each word
# once and compares its bits with the pattern.

_COUNT_SOURCE = r"""
typedef WORD_T word_t;
extern "C" __global__ void count_bits(const word_t* __restrict__ x, long long n, word_t pattern,
                                      unsigned long long* __restrict__ count) {
    unsigned long long mine = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        mine += (x[i] == pattern);
    for (int off = 16; off > 0; off >>= 1) mine += __shfl_down_sync(0xffffffffu, mine, off);
    if ((threadIdx.x & 31) == 0 && mine) atomicAdd(count, mine);
}
"""
_COUNT_WORDS = {1: ("unsigned char", "uint8"), 2: ("unsigned short", "uint16"),     # bytes: (C, numpy)
                4: ("unsigned int", "uint32"), 8: ("unsigned long long", "uint64")}
_count_kernels: dict[int, object] = {}


def _poison_word(t: torch.Tensor, variant: int) -> int:
    """The poison pattern of `t`'s dtype as an unsigned word of its element size."""
    value = POISON_BITS[t.dtype][0] if t.dtype in POISON_BITS else int(_plain_poison(t.dtype, variant))
    return value % (1 << (t.element_size() * 8))


def count_poisoned(t: torch.Tensor, variant: int = 0) -> int:
    """How many elements of `t` still hold the poison pattern: int(poisoned_mask(t, variant).sum()),
    in one read of a contiguous CUDA tensor; through the mask where CuPy cannot build the kernel."""
    if t.is_cuda and t.is_contiguous() and t.numel() and t.element_size() in _COUNT_WORDS \
            and (t.dtype in POISON_BITS or not (t.is_floating_point() or t.is_complex())):
        with torch.cuda.device(t.device):
            kernel = _count_kernel(t.element_size())
            if kernel is not None:
                return _count_on_gpu(kernel, t, _poison_word(t, variant))
    return int(poisoned_mask(t, variant).sum())


def _count_kernel(size: int):
    """The count kernel for words of `size` bytes, built once; None without CuPy or its compiler
    (a launch's errors are not caught: a CUDA error must reach the runner)."""
    if size not in _count_kernels:
        try:
            import cupy

            kernel = cupy.RawKernel(_COUNT_SOURCE.replace("WORD_T", _COUNT_WORDS[size][0]), "count_bits")
            kernel.attributes           # CuPy compiles on first use; this is one
        except Exception:
            kernel = None
        _count_kernels[size] = kernel
    return _count_kernels[size]


def _count_on_gpu(kernel, t: torch.Tensor, word: int) -> int:
    import cupy
    import numpy

    n = t.numel()
    count = torch.zeros(1, dtype=torch.int64, device=t.device)
    sms = torch.cuda.get_device_properties(t.device).multi_processor_count
    blocks = max(1, min((n + 255) // 256, sms * 16))
    pattern = getattr(numpy, _COUNT_WORDS[t.element_size()][1])(word)
    with cupy.cuda.ExternalStream(torch.cuda.current_stream(t.device).cuda_stream):     # on t's device (caller)
        kernel((blocks,), (256,), (numpy.uint64(t.data_ptr()), numpy.int64(n), pattern,
                                   numpy.uint64(count.data_ptr())))
    return int(count.item())        # synchronises with the kernel on torch's stream


# ---- one fused pass on the GPU -------------------------------------------------------------------
# compare() makes about thirty passes over float64 copies of an output; for a 256 MB output that
# is most of the judge's time per candidate. fast_match() computes the same counts and norms in
# one pass of a CUDA kernel and answers only "clearly matches" (True) or "ask compare()" (None),
# so a rejection and its message always come from compare() itself.

_FAST_SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
typedef OUT_T out_t;

__device__ __forceinline__ void warp_sum(unsigned long long& a, double& b) {
    for (int off = 16; off > 0; off >>= 1) {
        a += __shfl_down_sync(0xffffffffu, a, off);
        b += __shfl_down_sync(0xffffffffu, b, off);
    }
}

// counts: NaN where the reference is not, NaN missing, Inf disagreements, references beyond the
// output dtype's range (all four as flags), elements outside atol + rtol*|ref|; sums: squares of
// the finite reference and of the error (compare()'s norms).
extern "C" __global__ void match_stats(const out_t* __restrict__ o, const REF_T* __restrict__ r,
                                       long long n, double atol, double rtol,
                                       unsigned long long* counts, double* sums) {
    unsigned long long nan_bad = 0, nan_missing = 0, inf_bad = 0, beyond = 0, outside = 0;
    double ref_sq = 0.0, err_sq = 0.0;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double ov = TO_DOUBLE(o[i]);
        double rv = (double)r[i];
        // A reference beyond the output dtype's range: compare() counts it as the inf that torch's
        // conversion rounds it to. Left to compare(): a flag here.
        beyond += isfinite(rv) && fabs(rv) > OUT_MAX;
        bool on = isnan(ov), rn = isnan(rv);
        nan_bad += on && !rn;
        nan_missing += rn && !on;
        inf_bad += (isinf(ov) || isinf(rv)) && (ov != rv);
        bool finite = isfinite(rv);
        double d = finite ? fabs(ov - rv) : 0.0;
        outside += d > __dadd_rn(__dmul_rn(rtol, fabs(rv)), atol);   // rounded as torch does: no FMA
        ref_sq += finite ? rv * rv : 0.0;
        err_sq += d * d;
    }
    unsigned long long flags = nan_bad + nan_missing + inf_bad + beyond;
    warp_sum(flags, ref_sq);
    warp_sum(outside, err_sq);
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(&counts[0], flags);
        atomicAdd(&counts[1], outside);
        atomicAdd(&sums[0], ref_sq);
        atomicAdd(&sums[1], err_sq);
    }
}
"""

_FAST_TYPES = {   # output dtype -> (C type, conversion to double)
    torch.float16: ("__half", "__half2float"),
    torch.bfloat16: ("__nv_bfloat16", "__bfloat162float"),
    torch.float32: ("float", "(double)"),
    torch.float64: ("double", ""),
}
_FAST_REFS = {torch.float64: "double", torch.float32: "float"}     # reference dtype -> C type
_fast_kernels: dict[tuple[torch.dtype, torch.dtype], object] = {}
FAST_MARGIN = 0.99       # the error-norm test passes here only with this much room to spare


def kept_reference_dtype(out_dtype: torch.dtype) -> torch.dtype:
    """The dtype a float64 reference is kept in for outputs of `out_dtype`: float32 for float32 and
    narrower outputs, float64 for float64 ones. Rounding moves a reference by at most 6e-8 of its
    value, 0.06 % of the tightest tolerance it is compared with (1e-4; an output of these dtypes holds
    no more than that anyway), and halves the judge's memory and reading."""
    return torch.float64 if out_dtype == torch.float64 else torch.float32


def keep_reference(ref: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """A float64 reference as the judge keeps it (kept_reference_dtype); others as they are."""
    if ref.dtype == torch.float64 and out_dtype in FLOAT_DTYPES:
        return ref.to(kept_reference_dtype(out_dtype))
    return ref


def _fast_kernel(dtype: torch.dtype, ref_dtype: torch.dtype = torch.float64):
    key = (dtype, ref_dtype)
    if key not in _fast_kernels:
        import cupy

        c_type, to_double = _FAST_TYPES[dtype]
        source = (_FAST_SOURCE.replace("OUT_T", c_type).replace("TO_DOUBLE", to_double)
                  .replace("REF_T", _FAST_REFS[ref_dtype]).replace("OUT_MAX", repr(torch.finfo(dtype).max)))
        from core.toolchain.nvrtc import find_header_dirs

        _fast_kernels[key] = cupy.RawKernel(source, "match_stats",
                                            options=("--std=c++17", *find_header_dirs().options()))
    return _fast_kernels[key]


def fast_match_unavailable(dtype: torch.dtype) -> str | None:
    """Why fast_match cannot run its kernel for outputs of `dtype` against references as the judge
    keeps them (None: it can, or the dtype is not one it handles). Without it every output goes
    through compare(): about thirty passes over float64 copies, so the judge is slower; the
    verdicts are the same."""
    if dtype not in _FAST_TYPES:
        return None
    try:
        _fast_kernel(dtype, kept_reference_dtype(dtype)).attributes   # CuPy compiles on first use; this is one
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return None


def fast_match(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> bool | None:
    """True when one fused pass on the GPU shows compare(out, ref, atol, rtol) would return None
    (with FAST_MARGIN to spare on the norm test); None when it might not, or when the fast pass
    does not apply (a CPU tensor, an integer output or reference, a non-contiguous one, no CuPy)."""
    if (type(out) is not torch.Tensor or out.dtype not in _FAST_TYPES or ref.dtype not in _FAST_REFS
            or not out.is_cuda or not ref.is_cuda or out.device != ref.device or out.shape != ref.shape
            or not out.is_contiguous() or not ref.is_contiguous() or out.numel() == 0):
        return None
    try:
        import cupy
        import numpy

        kernel = _fast_kernel(out.dtype, ref.dtype)
        n = out.numel()
        counts = torch.zeros(2, dtype=torch.int64, device=out.device)
        sums = torch.zeros(2, dtype=torch.float64, device=out.device)
        sms = torch.cuda.get_device_properties(out.device).multi_processor_count
        blocks = max(1, min((n + 255) // 256, sms * 8))
        with torch.cuda.device(out.device):
            stream = torch.cuda.current_stream(out.device).cuda_stream
            with cupy.cuda.ExternalStream(stream):
                kernel((blocks,), (256,), (numpy.uint64(out.data_ptr()), numpy.uint64(ref.data_ptr()),
                                           numpy.int64(n), numpy.float64(atol), numpy.float64(rtol),
                                           numpy.uint64(counts.data_ptr()), numpy.uint64(sums.data_ptr())))
        flags, outside = counts.tolist()           # synchronises with the kernel on torch's stream
        ref_sq, err_sq = sums.tolist()
    except Exception:
        return None                                 # no CuPy, no compiler: compare() decides
    if flags or outside or not (err_sq == err_sq) or err_sq == float("inf") or ref_sq == float("inf"):
        return None
    # A (near-)zero reference is left to compare(): whether its norm underflows to zero decides which
    # of its two norm tests applies.
    if ref_sq > 1e-200 and (err_sq / ref_sq) ** 0.5 <= FAST_MARGIN * rtol:
        return True
    return None
