# family: activation  minimum bytes: 536870912  flops: 671088640
"""SiLU / swish, x * sigmoid(x), of a large bf16 matrix."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


ROWS, COLS = 8192, 16384


def get_inputs():
    return [torch.randn(ROWS, COLS, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
