# family: reduction  minimum bytes: 268451840  flops: 268435456
"""Unbiased variance over dim 1 of an fp32 matrix with a non-zero mean."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.var(x, dim=1, correction=1)


ROWS, COLS = 4096, 16384


def get_inputs():
    # An offset mean punishes the one-pass sum-of-squares formula's cancellation.
    return [torch.randn(ROWS, COLS) * 2.0 + 3.0]


def get_init_inputs():
    return []
