# family: reduction  minimum bytes: 268451840  flops: 536870912
"""Standard deviation over the last dim of a bf16 matrix, keepdim=True."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.std(x, dim=-1, keepdim=True)


ROWS, COLS = 8192, 16384


def get_inputs():
    return [torch.randn(ROWS, COLS, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
