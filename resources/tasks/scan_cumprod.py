# family: scan  minimum bytes: 536870912  flops: 67108864
"""Inclusive prefix product (cumprod) along short rows of length 64, fp32."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumprod(x, dim=1)


ROWS, COLS = 1048576, 64


def get_inputs():
    # Factors in [0.5, 1.5) keep 64-long products well inside fp32 range.
    return [torch.rand(ROWS, COLS) + 0.5]


def get_init_inputs():
    return []
