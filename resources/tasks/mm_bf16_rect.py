# family: matmul  minimum bytes: 167772160  flops: 274877906944
"""bf16 rectangular matmul with a long reduction: (4096 x 8192) @ (8192 x 4096)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


M, K, N = 4096, 8192, 4096


def get_inputs():
    a = torch.randn(M, K, dtype=torch.bfloat16)
    b = torch.randn(K, N, dtype=torch.bfloat16) / K ** 0.5
    return [a, b]


def get_init_inputs():
    return []
