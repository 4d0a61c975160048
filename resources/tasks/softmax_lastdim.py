# family: softmax  minimum bytes: 536870912  flops: 335544320
"""Softmax over the last dim of an fp32 matrix with 16k-wide rows."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


ROWS, COLS = 4096, 16384


def get_inputs():
    return [torch.randn(ROWS, COLS) * 4.0]


def get_init_inputs():
    return []
