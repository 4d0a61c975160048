# family: pool  minimum bytes: 603979776  flops: 150994944
"""3-D average pooling, 2x2x2 window, stride 2, over an fp32 volume (N, C, D, H, W)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, kernel_size: int, stride: int):
        super().__init__()
        self.pool = nn.AvgPool3d(kernel_size, stride=stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


SHAPE = (8, 16, 64, 128, 128)


def get_inputs():
    return [torch.randn(*SHAPE)]


def get_init_inputs():
    return [2, 2]
