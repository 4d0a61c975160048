# family: sort  minimum bytes: 524288  flops: 0
"""Each row sorted: an op no code generator lowers (tests of what the product says then)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sort(x, dim=1).values


def get_inputs():
    return [torch.randn(256, 256)]


def get_init_inputs():
    return []
