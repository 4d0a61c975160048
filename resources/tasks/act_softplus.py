# family: activation  minimum bytes: 536870912  flops: 335544320
"""Softplus with beta=2 and threshold=10 (linear above the threshold), fp32."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, beta: float, threshold: float):
        super().__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softplus(x, beta=self.beta, threshold=self.threshold)


ROWS, COLS = 16384, 4096


def get_inputs():
    # Wide enough that beta * x crosses the threshold for a good share of elements.
    return [4.0 * torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [2.0, 10.0]
