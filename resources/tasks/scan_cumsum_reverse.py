# family: scan  minimum bytes: 536870912  flops: 67108864
"""Reverse (suffix) cumulative sum along dim 1 of an fp32 matrix: out[i, j] = sum of x[i, j:]."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flip(torch.cumsum(torch.flip(x, dims=[1]), dim=1), dims=[1])


ROWS, COLS = 16384, 4096


def get_inputs():
    return [torch.rand(ROWS, COLS)]


def get_init_inputs():
    return []
