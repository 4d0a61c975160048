# family: pool  minimum bytes: 335544320  flops: 150994944
"""1-D average pooling, kernel 8, stride 4, padding 2 (zero padding counted), fp32 (N, C, L)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.pool = nn.AvgPool1d(kernel_size, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


SHAPE = (16, 64, 65536)


def get_inputs():
    return [torch.randn(*SHAPE)]


def get_init_inputs():
    return [8, 4, 2]
