# family: scan  minimum bytes: 536870912  flops: 67108864
"""Inclusive prefix sum (cumsum) along dim 1 of an fp32 matrix."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=self.dim)


ROWS, COLS = 16384, 4096


def get_inputs():
    # Non-negative values: prefix sums grow steadily, so fp32 rounding stays far below rtol.
    return [torch.rand(ROWS, COLS)]


def get_init_inputs():
    return [1]
