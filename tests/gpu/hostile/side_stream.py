"""Hostile: launches its (correct) kernel on a private stream and returns before it finishes,
so that events on the current stream see almost nothing."""
import cupy
import torch
import torch.nn as nn

_SRC = r'''
extern "C" __global__ void gelu(const float* x, float* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678f));
}
'''
_kernel = cupy.RawKernel(_SRC, "gelu")
_side = cupy.cuda.Stream(non_blocking=True)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        n = x.numel()
        _kernel(((n + 255) // 256,), (256,), (cupy.uint64(x.data_ptr()), cupy.uint64(y.data_ptr()), cupy.int64(n)), stream=_side)
        return y
