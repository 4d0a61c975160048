"""A KernelBench-style solution for act_gelu: ModelNew launching its own CUDA kernel through CuPy."""
import cupy
import torch
import torch.nn as nn

_SRC = r'''
extern "C" __global__ void gelu(const float4* __restrict__ x, float4* __restrict__ y, long long n4) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = x[i];
        v.x = 0.5f * v.x * (1.0f + erff(v.x * 0.70710678118654752f));
        v.y = 0.5f * v.y * (1.0f + erff(v.y * 0.70710678118654752f));
        v.z = 0.5f * v.z * (1.0f + erff(v.z * 0.70710678118654752f));
        v.w = 0.5f * v.w * (1.0f + erff(v.w * 0.70710678118654752f));
        y[i] = v;
    }
}
'''
_kernel = cupy.RawKernel(_SRC, "gelu")


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.is_contiguous() and x.numel() % 4 == 0
        y = torch.empty_like(x)
        n4 = x.numel() // 4
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        _kernel(((n4 + 255) // 256,), (256,), (cupy.uint64(x.data_ptr()), cupy.uint64(y.data_ptr()), cupy.int64(n4)), stream=stream)
        return y
