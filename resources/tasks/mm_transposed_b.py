# family: matmul  minimum bytes: 167772160  flops: 103079215104
"""fp32 matmul with a transposed second operand: a @ b.T, b stored as (N, K) like a Linear weight."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b.T)


M, K, N = 4096, 4096, 3072


def get_inputs():
    return [torch.randn(M, K), torch.randn(N, K) / K ** 0.5]


def get_init_inputs():
    return []
