# family: matmul  minimum bytes: 201326592  flops: 137438953472
"""Square fp32 matrix multiply, 4096 x 4096 x 4096 (full fp32: no TF32)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


N = 4096


def get_inputs():
    # b is scaled by 1/sqrt(K) so outputs are O(1): fp32 rounding then stays well below atol.
    return [torch.randn(N, N), torch.randn(N, N) / N ** 0.5]


def get_init_inputs():
    return []
