// Sum of each contiguous row, one block per row, float4 loads, warp-shuffle reduction.
#define WARPS (BLOCK / 32)
extern "C" __global__ void __launch_bounds__(BLOCK) row_sum(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float partial[WARPS];
    const float* row = x + (size_t)blockIdx.x * cols;
    float acc = 0.f;
    if ((cols & 3) == 0) {
        const float4* r4 = reinterpret_cast<const float4*>(row);
        for (int i = threadIdx.x; i < cols / 4; i += BLOCK) { float4 v = r4[i]; acc += (v.x + v.y) + (v.z + v.w); }
    } else {
        for (int i = threadIdx.x; i < cols; i += BLOCK) acc += row[i];
    }
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, off);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x < 32) {
        acc = threadIdx.x < WARPS ? partial[threadIdx.x] : 0.f;
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, off);
        if (threadIdx.x == 0) y[blockIdx.x] = acc;
    }
}
