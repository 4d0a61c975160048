# family: matmul  minimum bytes: 155975996  flops: 89981990002
"""fp32 matmul with sizes that are not multiples of any tile: (3001 x 4999) @ (4999 x 2999)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


M, K, N = 3001, 4999, 2999


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N) / K ** 0.5]


def get_init_inputs():
    return []
