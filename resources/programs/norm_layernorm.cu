// LayerNorm over the last dim, one block per row: mean, then variance of (x - mean), then write.
#define WARPS (BLOCK / 32)
__device__ __forceinline__ float block_sum(float v, float* shared) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffff, v, off);
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
    __syncthreads();
    v = threadIdx.x < WARPS ? shared[threadIdx.x] : 0.f;
    if (threadIdx.x < 32)
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffff, v, off);
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}

extern "C" __global__ void __launch_bounds__(BLOCK) layernorm_rows(
        const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
        float* __restrict__ y, int cols, float eps) {
    __shared__ float shared[32];
    const float* row = x + (size_t)blockIdx.x * cols;
    float* out = y + (size_t)blockIdx.x * cols;
    float s = 0.f;
    for (int i = threadIdx.x; i < cols; i += BLOCK) s += row[i];
    const float mean = block_sum(s, shared) / cols;
    float q = 0.f;
    for (int i = threadIdx.x; i < cols; i += BLOCK) { float d = row[i] - mean; q += d * d; }
    const float rstd = rsqrtf(block_sum(q, shared) / cols + eps);
    for (int i = threadIdx.x; i < cols; i += BLOCK) out[i] = (row[i] - mean) * rstd * w[i] + b[i];
}
