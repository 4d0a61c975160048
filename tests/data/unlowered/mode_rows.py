# family: mode  minimum bytes: 262144  flops: 0
"""The most frequent value of each row (torch.mode): no code generator lowers it (tests of what the
product says then)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mode(x, dim=1).values


def get_inputs():
    return [torch.randint(0, 16, (64, 1024)).float()]


def get_init_inputs():
    return []
