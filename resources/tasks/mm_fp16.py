# family: matmul  minimum bytes: 402653184  flops: 1099511627776
"""Half-precision matmul, 8192 x 8192 x 8192, fp16 inputs and output."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


N = 8192


def get_inputs():
    a = torch.randn(N, N, dtype=torch.float16)
    b = torch.randn(N, N, dtype=torch.float16) / N ** 0.5
    return [a, b]


def get_init_inputs():
    return []
