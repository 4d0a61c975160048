# family: conv  minimum bytes: 536876032  flops: 1275068416
"""Depthwise 2-D convolution (groups = channels = 128), 3x3, padding 1, with bias, fp32."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2,
                              groups=channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


BATCH, CHANNELS, H, W = 32, 128, 128, 128


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, H, W)]


def get_init_inputs():
    return [CHANNELS, 3]
