# family: reduction  minimum bytes: 268451840  flops: 67108864
"""Sum over dim 1 (the contiguous rows) of an fp32 matrix."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim)


ROWS, COLS = 4096, 16384


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [1]
