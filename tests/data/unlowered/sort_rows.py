# family: sort  minimum bytes: 2097152  flops: 0
"""Each row sorted, rows of 32768: longer than the selection family takes (16384), so no code generator
lowers it (tests of what the product says then)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sort(x, dim=1).values


def get_inputs():
    return [torch.randn(8, 32768)]


def get_init_inputs():
    return []
