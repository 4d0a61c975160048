// SiLU on bf16, 8 values per 16-byte load; bf16 <-> fp32 by bit operations (no headers needed).
__device__ __forceinline__ float bf2f(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ unsigned short f2bf(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                                  // round to nearest even
    return (unsigned short)(u >> 16);
}
__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

extern "C" __global__ void __launch_bounds__(BLOCK) silu_bf16(const unsigned short* __restrict__ x, unsigned short* __restrict__ y, long long n) {
    const long long n8 = n / 8;
    const uint4* x8 = reinterpret_cast<const uint4*>(x);
    uint4* y8 = reinterpret_cast<uint4*>(y);
    const long long stride = (long long)gridDim.x * BLOCK;
    for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < n8; i += stride) {
        uint4 v = x8[i];
        unsigned* w = reinterpret_cast<unsigned*>(&v);
        #pragma unroll
        for (int k = 0; k < 4; ++k) {
            unsigned lo = f2bf(silu(bf2f(w[k] & 0xffffu)));
            unsigned hi = f2bf(silu(bf2f(w[k] >> 16)));
            w[k] = lo | (hi << 16);
        }
        y8[i] = v;
    }
    for (long long i = n8 * 8 + (long long)blockIdx.x * BLOCK + threadIdx.x; i < n; i += stride)
        y[i] = f2bf(silu(bf2f(x[i])));
}
