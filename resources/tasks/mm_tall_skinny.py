# family: matmul  minimum bytes: 268697600  flops: 17179869184
"""Tall-skinny fp32 matmul: (131072 x 256) @ (256 x 256), a projection of many short rows."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


M, K, N = 131072, 256, 256


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N) / K ** 0.5]


def get_init_inputs():
    return []
