// Row softmax, one block per row: one online pass for (max, sum), one pass to write.
#define WARPS (BLOCK / 32)
#define NEG_INF __int_as_float(0xff800000)  // NVRTC has no math.h

__device__ __forceinline__ void combine(float& m, float& s, float m2, float s2) {
    if (m2 == NEG_INF) return;
    if (m == NEG_INF) { m = m2; s = s2; return; }
    float nm = fmaxf(m, m2);
    s = s * expf(m - nm) + s2 * expf(m2 - nm);
    m = nm;
}

extern "C" __global__ void __launch_bounds__(BLOCK) softmax_rows(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float sm[WARPS], ss[WARPS];
    const float* row = x + (size_t)blockIdx.x * cols;
    float* out = y + (size_t)blockIdx.x * cols;
    float m = NEG_INF, s = 0.f;
    for (int i = threadIdx.x; i < cols; i += BLOCK) {
        float v = row[i];
        combine(m, s, v, 1.f);
    }
    for (int off = 16; off > 0; off >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffff, m, off);
        float s2 = __shfl_xor_sync(0xffffffff, s, off);
        combine(m, s, m2, s2);
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads();
    if (warp == 0) {
        m = lane < WARPS ? sm[lane] : NEG_INF;
        s = lane < WARPS ? ss[lane] : 0.f;
        for (int off = 16; off > 0; off >>= 1) {
            float m2 = __shfl_xor_sync(0xffffffff, m, off);
            float s2 = __shfl_xor_sync(0xffffffff, s, off);
            combine(m, s, m2, s2);
        }
        if (lane == 0) { sm[0] = m; ss[0] = s; }
    }
    __syncthreads();
    const float M = sm[0], inv = 1.f / ss[0];
    for (int i = threadIdx.x; i < cols; i += BLOCK) out[i] = expf(row[i] - M) * inv;
}
