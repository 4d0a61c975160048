# family: activation  minimum bytes: 536870912  flops: 134217728
"""Leaky ReLU with negative slope 0.01 of a long fp32 vector batch."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, negative_slope: float):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x, negative_slope=self.negative_slope)


BATCH, DIM = 64, 1048576


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [0.01]
