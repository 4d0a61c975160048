# family: reduction  minimum bytes: 268697600  flops: 67108864
"""Argmax over the middle dim of a 3-D fp32 tensor (int64 result)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.argmax(x, dim=1)


SHAPE = (128, 2048, 256)


def get_inputs():
    return [torch.randn(*SHAPE)]


def get_init_inputs():
    return []
