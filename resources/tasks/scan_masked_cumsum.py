# family: scan  minimum bytes: 603979776  flops: 134217728
"""Masked cumulative sum along dim 1: only elements where the bool mask is set are summed."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x * mask, dim=1)


ROWS, COLS = 16384, 4096


def get_inputs():
    x = torch.rand(ROWS, COLS)
    mask = torch.rand(ROWS, COLS) < 0.5
    return [x, mask]


def get_init_inputs():
    return []
