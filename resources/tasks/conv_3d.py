# family: conv  minimum bytes: 201382016  flops: 29024583680
"""3-D convolution, 16 -> 32 channels, 3x3x3 kernel, padding 1, over fp32 volumes."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


BATCH, C_IN, C_OUT, D, H, W = 8, 16, 32, 32, 64, 64


def get_inputs():
    return [torch.randn(BATCH, C_IN, D, H, W)]


def get_init_inputs():
    return [C_IN, C_OUT]
