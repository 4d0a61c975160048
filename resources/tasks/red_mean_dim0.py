# family: reduction  minimum bytes: 268451840  flops: 67108864
"""Mean over dim 0 (down the columns, strided access) of a tall fp32 matrix."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=0)


ROWS, COLS = 16384, 4096


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
