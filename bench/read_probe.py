"""How close can a row reduction get to the copy-bandwidth floor on this GPU? (issue 3's small reductions)

The roofline floor of a reduction is its bytes over the *copy* bandwidth (read + write). A reduction
only reads, so this probe times, on the shape of resources/tasks/red_sum_dim1.py (4096 x 16384 fp32,
268 MB, far beyond L2): the copy ceiling as core.evaluation.roofline measures it, torch.sum, a
whole-buffer read with no rows (the read ceiling), and block-per-row kernels with several block
sizes, independent accumulators and rows per block. Prints one table (GB/s and fraction of the
copy-ceiling floor).

    PYTHONPATH=. python3 bench/read_probe.py
"""
from __future__ import annotations

import statistics

import cupy as cp
import torch

ROWS, COLS = 4096, 16384

SOURCE = r"""
// Load flavours: 0 = __ldg (what the generators emit), 1 = __ldcs (ld.global.cs: evict-first in L1 and L2),
// 2 = ld.global.nc.L1::no_allocate with an L2 evict_first cache policy (what Triton's evict_first emits).
__device__ __forceinline__ unsigned long long evict_first_policy() {
    unsigned long long pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}
template <int LD> __device__ __forceinline__ float4 ld4(const float4* p, unsigned long long pol) {
    if (LD == 0) return __ldg(p);
    if (LD == 1) return __ldcs(p);
    float4 v;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.f32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p), "l"(pol));
    return v;
}
template <int T, int ACC, int RPB, int LD = 0>
__device__ void rows_sum(const float4* __restrict__ x, float* __restrict__ out, int rows, int cols4) {
    const unsigned long long pol = LD == 2 ? evict_first_policy() : 0ull;
    __shared__ float partial[T / 32][RPB];
    for (int r = 0; r < RPB; ++r) {
        int row = blockIdx.x * RPB + r;
        float acc[ACC];
        #pragma unroll
        for (int a = 0; a < ACC; ++a) acc[a] = 0.f;
        const float4* p = x + (size_t)row * cols4;
        for (int i = threadIdx.x; i < cols4; i += T * ACC) {
            #pragma unroll
            for (int a = 0; a < ACC; ++a) {
                int j = i + a * T;
                if (j < cols4) { float4 v = ld4<LD>(p + j, pol); acc[a] += (v.x + v.y) + (v.z + v.w); }
            }
        }
        float s = 0.f;
        #pragma unroll
        for (int a = 0; a < ACC; ++a) s += acc[a];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
        if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5][r] = s;
    }
    __syncthreads();
    if (threadIdx.x < RPB) {
        float s = 0.f;
        for (int w = 0; w < T / 32; ++w) s += partial[w][threadIdx.x];
        out[blockIdx.x * RPB + threadIdx.x] = s;
    }
}
#define ROWS_KERNEL(T, ACC, RPB) \
extern "C" __global__ void __launch_bounds__(T) rows_##T##_##ACC##_##RPB(const float4* x, float* out, int rows, int cols4) \
{ rows_sum<T, ACC, RPB>(x, out, rows, cols4); }
ROWS_KERNEL(256, 1, 1)
ROWS_KERNEL(256, 4, 1)
ROWS_KERNEL(512, 1, 1)
ROWS_KERNEL(512, 2, 1)
ROWS_KERNEL(512, 4, 1)
ROWS_KERNEL(1024, 1, 1)
ROWS_KERNEL(1024, 2, 1)
ROWS_KERNEL(256, 4, 2)
ROWS_KERNEL(256, 2, 4)
extern "C" __global__ void __launch_bounds__(256) rows_cs(const float4* x, float* out, int rows, int cols4)
{ rows_sum<256, 2, 4, 1>(x, out, rows, cols4); }
extern "C" __global__ void __launch_bounds__(256) rows_evict_first(const float4* x, float* out, int rows, int cols4)
{ rows_sum<256, 2, 4, 2>(x, out, rows, cols4); }
// A copy (pointwise shape: reads and writes as much), with each load flavour; ST 1 stores with __stcs.
template <int LD, int ST> __device__ void copy4(const float4* __restrict__ x, float4* __restrict__ y, size_t n4) {
    const unsigned long long pol = LD == 2 ? evict_first_policy() : 0ull;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        float4 v = ld4<LD>(x + i, pol);
        if (ST == 0) y[i] = v; else __stcs(y + i, v);
    }
}
#define COPY_KERNEL(LD, ST) extern "C" __global__ void __launch_bounds__(256) \
copy_##LD##_##ST(const float4* x, float4* y, size_t n4) { copy4<LD, ST>(x, y, n4); }
COPY_KERNEL(0, 0)
COPY_KERNEL(1, 0)
COPY_KERNEL(2, 0)
COPY_KERNEL(0, 1)
COPY_KERNEL(1, 1)

// the read ceiling: every block reads a contiguous slice, no rows
extern "C" __global__ void __launch_bounds__(512) flat_read(const float4* __restrict__ x, float* out, size_t n4) {
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n4; i += 4 * stride) {
        float4 v0 = __ldg(x + i), v1 = __ldg(x + i + stride), v2 = __ldg(x + i + 2 * stride), v3 = __ldg(x + i + 3 * stride);
        a0 += v0.x + v0.y + v0.z + v0.w; a1 += v1.x + v1.y + v1.z + v1.w;
        a2 += v2.x + v2.y + v2.z + v2.w; a3 += v3.x + v3.y + v3.z + v3.w;
    }
    for (; i < n4; i += stride) { float4 v = __ldg(x + i); a0 += v.x + v.y + v.z + v.w; }
    float s = (a0 + a1) + (a2 + a3);
    if (s == 12345.678f) out[0] = s;     // keeps the loads alive
}
"""


def timed_ms(fn, reps: int = 40, before=None) -> float:
    """Median of `reps` calls queued back to back (so no launch gap is timed), each after
    `before()` (untimed) when given."""
    stream = torch.cuda.current_stream()
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    events = []
    for _ in range(reps):
        if before is not None:
            before()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(stream)
        fn()
        b.record(stream)
        events.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in events)


def copy_ms(n: int, dev: torch.device) -> float:
    src = torch.rand(n, device=dev)
    dst = torch.empty_like(src)
    return timed_ms(lambda: dst.copy_(src), 20)


def main() -> None:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    n = 1 << 28
    copy_gbps = 2 * n * 4 / (copy_ms(n, dev) / 1e3) / 1e9
    x = torch.randn(ROWS, COLS, device=dev)
    out = torch.empty(ROWS, device=dev)
    nbytes = ROWS * COLS * 4 + ROWS * 4
    floor_ms = nbytes / (copy_gbps * 1e9) * 1e3
    ref = torch.sum(x, 1)
    module = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    xp = cp.asarray(x)
    op = cp.asarray(out)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = [("the floor: bytes at the copy ceiling (1 GiB copy_)", floor_ms, True)]
    rows.append(("torch.sum(x, 1)", timed_ms(lambda: torch.sum(x, 1)), True))
    flat = module.get_function("flat_read")
    for blocks_per_sm in (4, 8, 16):
        grid = sms * blocks_per_sm
        with stream:
            t = timed_ms(lambda: flat((grid,), (512,), (xp, op, cp.uint64(ROWS * COLS // 4))))
        rows.append((f"flat read, {blocks_per_sm} x 512 threads per SM", t, True))
    for name in ("rows_256_1_1", "rows_256_4_1", "rows_512_1_1", "rows_512_2_1", "rows_512_4_1", "rows_1024_1_1",
                 "rows_1024_2_1", "rows_256_4_2", "rows_256_2_4"):
        _, threads, acc, rpb = name.split("_")
        f = module.get_function(name)
        call = lambda f=f, t=int(threads), r=int(rpb): f((ROWS // r,), (t,), (xp, op, cp.int32(ROWS), cp.int32(COLS // 4)))
        with stream:
            call()
            torch.cuda.synchronize()
            ok = torch.allclose(out, ref, rtol=1e-4, atol=1e-2)
            t = timed_ms(call)
        rows.append((f"block per row: {threads} threads, {acc} accumulators, {rpb} rows per block", t, ok))
    # The evaluator flushes L2 before every timed call by writing a buffer twice its size (as
    # triton.testing.do_bench does). The lines that write leaves in L2 are dirty: how much does the
    # timed call pay for writing them back? (2026-12-01: the same schedules timed with a clean flush
    # ran up to 10 us faster on 64 us reductions; docs/performance.md.)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    dirty = torch.empty(2 * l2 // 4, dtype=torch.int32, device=dev)
    clean = torch.zeros_like(dirty)
    flushes = {"no flush": None, "write flush (dirty L2)": dirty.zero_,
               "clean flush (write, then read 2 x L2)": lambda: (dirty.zero_(), clean.sum())}
    # Can a load's cache hint keep the flush's dirty lines from being written back inside the timed
    # call? (evict-first lines replace each other before the dirty ones.)
    for kernel, what in (("rows_256_2_4", "__ldg"), ("rows_cs", "__ldcs"), ("rows_evict_first", "nc, L2 evict_first")):
        f = module.get_function(kernel)
        call = lambda f=f: f((ROWS // 4,), (256,), (xp, op, cp.int32(ROWS), cp.int32(COLS // 4)))
        with stream:
            op.fill(0)
            call()
            torch.cuda.synchronize()
            ok = torch.allclose(out, ref, rtol=1e-4, atol=1e-2)
            for label, before in flushes.items():
                rows.append((f"row sum, 4 rows per block, {what} loads, {label}", timed_ms(call, before=before), ok))
    for label, before in flushes.items():
        rows.append((f"torch.sum, {label}", timed_ms(lambda: torch.sum(x, 1), before=before), True))
    # The pointwise shape: a 256 MB copy (its "bytes" column counts read + write: 512 MB).
    n4 = ROWS * COLS // 4
    y = torch.empty_like(x)
    yp = cp.asarray(y)
    copy_rows = []
    for kernel, what in (("copy_0_0", "__ldg loads"), ("copy_1_0", "__ldcs loads"), ("copy_2_0", "evict_first loads"),
                         ("copy_0_1", "__stcs stores"), ("copy_1_1", "__ldcs loads, __stcs stores")):
        f = module.get_function(kernel)
        call = lambda f=f: f((sms * 8,), (256,), (xp, yp, cp.uint64(n4)))
        with stream:
            y.zero_()
            call()
            torch.cuda.synchronize()
            ok = torch.equal(x, y)
            for label, before in flushes.items():
                copy_rows.append((f"copy, {what}, {label}", timed_ms(call, before=before), ok))
    for label, before in flushes.items():
        copy_rows.append((f"torch copy_, {label}", timed_ms(lambda: y.copy_(x), before=before), True))
    print(f"GPU {torch.cuda.get_device_name(0)}, copy ceiling {copy_gbps:.0f} GB/s, floor {floor_ms * 1e3:.1f} us "
          f"for {nbytes / 1e6:.0f} MB")
    print("| kernel | us | GB/s (bytes read) | fraction of floor | correct |")
    print("|---|---|---|---|---|")
    for label, t, ok in rows:
        print(f"| {label} | {t * 1e3:.1f} | {nbytes / (t / 1e3) / 1e9:.0f} | {floor_ms / t:.3f} | {ok} |")
    copy_bytes = 2 * ROWS * COLS * 4
    copy_floor = copy_bytes / (copy_gbps * 1e9) * 1e3
    print(f"\nCopies of {copy_bytes / 2e6:.0f} MB (floor {copy_floor * 1e3:.1f} us)")
    print("| kernel | us | GB/s (read + write) | fraction of floor | correct |")
    print("|---|---|---|---|---|")
    for label, t, ok in copy_rows:
        print(f"| {label} | {t * 1e3:.1f} | {copy_bytes / (t / 1e3) / 1e9:.0f} | {copy_floor / t:.3f} | {ok} |")


if __name__ == "__main__":
    main()
