# family: pool  minimum bytes: 603979776  flops: 452984832
"""3-D max pooling, 3x3x3 window, stride 2, padding 1, over an fp32 volume (N, C, D, H, W)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.pool = nn.MaxPool3d(kernel_size, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


SHAPE = (8, 16, 64, 128, 128)


def get_inputs():
    return [torch.randn(*SHAPE)]


def get_init_inputs():
    return [3, 2, 1]
