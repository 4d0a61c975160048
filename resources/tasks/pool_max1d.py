# family: pool  minimum bytes: 402653184  flops: 134217728
"""1-D max pooling, kernel 4, stride 2, padding 1, over long fp32 sequences (N, C, L)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.pool = nn.MaxPool1d(kernel_size, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


SHAPE = (16, 64, 65536)


def get_inputs():
    return [torch.randn(*SHAPE)]


def get_init_inputs():
    return [4, 2, 1]
