# family: matmul  minimum bytes: 536969216  flops: 268435456
"""Matrix-vector product, (16384 x 8192) @ (8192,), fp32: bandwidth bound."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.mv(a, v)


M, K = 16384, 8192


def get_inputs():
    return [torch.randn(M, K), torch.randn(K) / K ** 0.5]


def get_init_inputs():
    return []
