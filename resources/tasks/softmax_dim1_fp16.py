# family: softmax  minimum bytes: 536870912  flops: 671088640
"""Softmax over dim 1 (not the contiguous one) of a 3-D fp16 tensor."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


SHAPE = (32, 512, 8192)


def get_inputs():
    return [torch.randn(*SHAPE, dtype=torch.float16) * 3.0]


def get_init_inputs():
    return []
