# family: matmul  minimum bytes: 335544320  flops: 34359738368
"""Batched fp32 matmul (bmm): 64 independent (512 x 1024) @ (1024 x 512) products."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


BATCH, M, K, N = 64, 512, 1024, 512


def get_inputs():
    return [torch.randn(BATCH, M, K), torch.randn(BATCH, K, N) / K ** 0.5]


def get_init_inputs():
    return []
