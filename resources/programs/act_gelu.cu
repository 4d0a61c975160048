// Exact (erf) GELU, 16-byte loads and stores, grid-stride loop, scalar tail.
extern "C" __global__ void __launch_bounds__(BLOCK) gelu_f32(const float* __restrict__ x, float* __restrict__ y, long long n) {
    const long long n4 = n / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* y4 = reinterpret_cast<float4*>(y);
    const long long stride = (long long)gridDim.x * BLOCK;
    for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < n4; i += stride) {
        float4 v = x4[i];
        v.x = 0.5f * v.x * (1.0f + erff(v.x * 0.70710678118654752f));
        v.y = 0.5f * v.y * (1.0f + erff(v.y * 0.70710678118654752f));
        v.z = 0.5f * v.z * (1.0f + erff(v.z * 0.70710678118654752f));
        v.w = 0.5f * v.w * (1.0f + erff(v.w * 0.70710678118654752f));
        y4[i] = v;
    }
    for (long long i = n4 * 4 + (long long)blockIdx.x * BLOCK + threadIdx.x; i < n; i += stride) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
}
