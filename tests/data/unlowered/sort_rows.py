# family: sort  minimum bytes: 1048576  flops: 0
"""Each row sorted, rows of 8192: longer than the selection family takes (4096), so no code generator
lowers it (tests of what the product says then)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sort(x, dim=1).values


def get_inputs():
    return [torch.randn(16, 8192)]


def get_init_inputs():
    return []
