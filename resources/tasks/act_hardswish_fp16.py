# family: activation  minimum bytes: 536870912  flops: 671088640
"""Hardswish, x * relu6(x + 3) / 6, of a large fp16 matrix."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.hardswish(x)


ROWS, COLS = 8192, 16384


def get_inputs():
    return [4.0 * torch.randn(ROWS, COLS, dtype=torch.float16)]


def get_init_inputs():
    return []
